#include <algorithm>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/ndarray.hpp"

using troupe::context;
using troupe::dtype;
using troupe::ndarray;

namespace {

// The expected strings were produced by numpy's str() (numpy 1.26, the last series MXNet 1.x
// runs with, default print options) on the same values, dtypes and shapes; MXNet's NDArray repr
// prints exactly that, then a line naming shape and context. (numpy 2.3 and later switch float16
// and float32 arrays to scientific form from 1e3 and 1e6 on; MXNet never saw that.)

constexpr double nan_value = std::numeric_limits<double>::quiet_NaN();
constexpr double inf_value = std::numeric_limits<double>::infinity();

std::vector<double> iota(std::size_t n, double step) {
  std::vector<double> values(n);
  for (std::size_t i = 0; i < n; ++i)
    values[i] = static_cast<double>(i) * step;
  return values;
}

std::vector<double> modulo(std::size_t n, int m) {
  std::vector<double> values(n);
  for (std::size_t i = 0; i < n; ++i)
    values[i] = static_cast<double>(static_cast<int>(i) % m);
  return values;
}

/// Exact float64 values converted to `type` as numpy's astype does.
ndarray make(const std::vector<double>& values, const troupe::shape_vector& shape, dtype type,
             context ctx = context::cpu()) {
  auto wide = ndarray::empty(shape, context::cpu(), dtype::float64);
  std::copy(values.begin(), values.end(), wide.data<double>());
  return wide.as_type(type).copy_to(ctx);
}

/// The values part of to_string(): everything before the "<NDArray ...>" line.
std::string values_part(const ndarray& array) {
  const std::string text = array.to_string();
  return text.substr(0, text.rfind('\n'));
}

struct print_case {
  const char* name;
  std::vector<double> values;
  troupe::shape_vector shape;
  dtype type;
  const char* expected;
};

const std::vector<print_case>& numpy_cases() {
  static const std::vector<print_case> cases{
      {"ones_2x3",
       std::vector<double>{1.0, 1.0, 1.0, 1.0, 1.0, 1.0},
       {2, 3},
       dtype::float32,
       R"([[1. 1. 1.]
 [1. 1. 1.]])"},
      {"mixed_signs",
       std::vector<double>{1.0, 0.5, -2.25},
       {3},
       dtype::float32,
       R"([ 1.    0.5  -2.25])"},
      {"tenths_float32",
       std::vector<double>{0.1, 0.2, 0.3},
       {3},
       dtype::float32,
       R"([0.1 0.2 0.3])"},
      {"ints_int32",
       std::vector<double>{1.0, -20.0, 300.0, 4.0, 5.0, 6.0},
       {2, 3},
       dtype::int32,
       R"([[  1 -20 300]
 [  4   5   6]])"},
      {"ints_int64",
       std::vector<double>{1.0, -20.0, 300.0, 4.0, 5.0, 6.0},
       {3, 2},
       dtype::int64,
       R"([[  1 -20]
 [300   4]
 [  5   6]])"},
      {"thirds_float64",
       std::vector<double>{0.3333333333333333, 0.6666666666666666, 1.0},
       {3},
       dtype::float64,
       R"([0.33333333 0.66666667 1.        ])"},
      {"float16_values",
       std::vector<double>{0.1, 1000.0, -3.5},
       {3},
       dtype::float16,
       R"([ 1.0e-01  1.0e+03 -3.5e+00])"},
      {"exponential_when_small",
       std::vector<double>{1e-05, 1.0, 123.0},
       {3},
       dtype::float32,
       R"([1.00e-05 1.00e+00 1.23e+02])"},
      {"exponential_when_ratio_large",
       std::vector<double>{0.001, 2.0},
       {2},
       dtype::float64,
       R"([1.e-03 2.e+00])"},
      {"exponential_when_large",
       std::vector<double>{100000000.0, 1.0},
       {2},
       dtype::float64,
       R"([1.e+08 1.e+00])"},
      {"non_finite",
       std::vector<double>{nan_value, inf_value, -inf_value, 1.5},
       {4},
       dtype::float32,
       R"([ nan  inf -inf  1.5])"},
      {"all_nan", std::vector<double>{nan_value, nan_value}, {2}, dtype::float32, R"([nan nan])"},
      {"scalar_float", std::vector<double>{2.5}, {}, dtype::float32, R"(2.5)"},
      {"scalar_one", std::vector<double>{1.0}, {}, dtype::float64, R"(1.0)"},
      {"scalar_int", std::vector<double>{7.0}, {}, dtype::int32, R"(7)"},
      {"empty_1d", std::vector<double>{}, {0}, dtype::float32, R"([])"},
      {"empty_2d", std::vector<double>{}, {2, 0}, dtype::int32, R"([])"},
      {"three_d",
       iota(24, 1.0),
       {2, 3, 4},
       dtype::float32,
       R"([[[ 0.  1.  2.  3.]
  [ 4.  5.  6.  7.]
  [ 8.  9. 10. 11.]]

 [[12. 13. 14. 15.]
  [16. 17. 18. 19.]
  [20. 21. 22. 23.]]])"},
      {"wraps_long_rows",
       iota(30, 1.5),
       {30},
       dtype::float32,
       R"([ 0.   1.5  3.   4.5  6.   7.5  9.  10.5 12.  13.5 15.  16.5 18.  19.5
 21.  22.5 24.  25.5 27.  28.5 30.  31.5 33.  34.5 36.  37.5 39.  40.5
 42.  43.5])"},
      {"wraps_rows_in_2d",
       iota(40, 0.25),
       {2, 20},
       dtype::float32,
       R"([[0.   0.25 0.5  0.75 1.   1.25 1.5  1.75 2.   2.25 2.5  2.75 3.   3.25
  3.5  3.75 4.   4.25 4.5  4.75]
 [5.   5.25 5.5  5.75 6.   6.25 6.5  6.75 7.   7.25 7.5  7.75 8.   8.25
  8.5  8.75 9.   9.25 9.5  9.75]])"},
      {"random_like_float32",
       std::vector<double>{0.5488135, 0.71518934, 0.60276335, 0.5448832},
       {2, 2},
       dtype::float32,
       R"([[0.5488135  0.71518934]
 [0.60276335 0.5448832 ]])"},
      {"negative_zero", std::vector<double>{-0.0, 1.0}, {2}, dtype::float32, R"([-0.  1.])"},
      {"many_digits_float64",
       std::vector<double>{1.0000000001, 2.123456789, -30.5},
       {3},
       dtype::float64,
       R"([  1.           2.12345679 -30.5       ])"},
      {"four_d",
       std::vector<double>{1.0, 2.0, 3.0, 4.0},
       {1, 1, 2, 2},
       dtype::float64,
       R"([[[[1. 2.]
   [3. 4.]]]])"},
      {"float16_integers_are_exact",
       std::vector<double>{7204.0, 12896.0, -13440.0},
       {3},
       dtype::float16,
       R"([  7204.  12896. -13440.])"},
      {"scalar_float32_fills_zeros_after_unique_digits",
       std::vector<double>{121453032.0},
       {},
       dtype::float32,
       R"(121453030.0)"},
      {"scalar_small_is_scientific", std::vector<double>{1e-05}, {}, dtype::float64, R"(1e-05)"},
      {"exponential_shows_true_digits",
       std::vector<double>{6.4471528e-06, -45688972.0, 287.30478},
       {3},
       dtype::float32,
       R"([ 6.4471528e-06 -4.5688972e+07  2.8730478e+02])"},
      {"summarized_1d",
       iota(2000, 1.0),
       {2000},
       dtype::float32,
       R"([0.000e+00 1.000e+00 2.000e+00 ... 1.997e+03 1.998e+03 1.999e+03])"},
      {"summarized_2d_int",
       iota(10000, 1.0),
       {100, 100},
       dtype::int32,
       R"([[   0    1    2 ...   97   98   99]
 [ 100  101  102 ...  197  198  199]
 [ 200  201  202 ...  297  298  299]
 ...
 [9700 9701 9702 ... 9797 9798 9799]
 [9800 9801 9802 ... 9897 9898 9899]
 [9900 9901 9902 ... 9997 9998 9999]])"},
      {"summarized_3d",
       modulo(1100, 7),
       {11, 10, 10},
       dtype::int64,
       R"([[[0 1 2 ... 0 1 2]
  [3 4 5 ... 3 4 5]
  [6 0 1 ... 6 0 1]
  ...
  [0 1 2 ... 0 1 2]
  [3 4 5 ... 3 4 5]
  [6 0 1 ... 6 0 1]]

 [[2 3 4 ... 2 3 4]
  [5 6 0 ... 5 6 0]
  [1 2 3 ... 1 2 3]
  ...
  [2 3 4 ... 2 3 4]
  [5 6 0 ... 5 6 0]
  [1 2 3 ... 1 2 3]]

 [[4 5 6 ... 4 5 6]
  [0 1 2 ... 0 1 2]
  [3 4 5 ... 3 4 5]
  ...
  [4 5 6 ... 4 5 6]
  [0 1 2 ... 0 1 2]
  [3 4 5 ... 3 4 5]]

 ...

 [[2 3 4 ... 2 3 4]
  [5 6 0 ... 5 6 0]
  [1 2 3 ... 1 2 3]
  ...
  [2 3 4 ... 2 3 4]
  [5 6 0 ... 5 6 0]
  [1 2 3 ... 1 2 3]]

 [[4 5 6 ... 4 5 6]
  [0 1 2 ... 0 1 2]
  [3 4 5 ... 3 4 5]
  ...
  [4 5 6 ... 4 5 6]
  [0 1 2 ... 0 1 2]
  [3 4 5 ... 3 4 5]]

 [[6 0 1 ... 6 0 1]
  [2 3 4 ... 2 3 4]
  [5 6 0 ... 5 6 0]
  ...
  [6 0 1 ... 6 0 1]
  [2 3 4 ... 2 3 4]
  [5 6 0 ... 5 6 0]]])"},
  };
  return cases;
}

} // namespace

BOOST_AUTO_TEST_SUITE(ndarray_print_suite)

BOOST_AUTO_TEST_CASE(a_small_array_prints_like_mxnet_with_shape_and_context) {
  BOOST_TEST(ndarray::ones({2, 3}).to_string() ==
             "[[1. 1. 1.]\n [1. 1. 1.]]\n<NDArray 2x3 @cpu(0)>");
  BOOST_TEST(ndarray::from_values({1, 0.5f, -2.25f}, {3}, context::cpu(1)).to_string() ==
             "[ 1.    0.5  -2.25]\n<NDArray 3 @cpu(1)>");
  BOOST_TEST(ndarray::full({}, 4, context::cpu(), dtype::int64).to_string() ==
             "4\n<NDArray  @cpu(0)>");
  BOOST_TEST(ndarray::zeros({0}).to_string() == "[]\n<NDArray 0 @cpu(0)>");
  std::ostringstream out;
  out << ndarray::zeros({1, 2}, context::cpu(), dtype::int32);
  BOOST_TEST(out.str() == "[[0 0]]\n<NDArray 1x2 @cpu(0)>");
}

BOOST_AUTO_TEST_CASE(values_print_exactly_as_numpy_prints_them) {
  for (const auto& c : numpy_cases()) {
    BOOST_TEST_CONTEXT(c.name) {
      BOOST_TEST(values_part(make(c.values, c.shape, c.type)) == std::string{c.expected});
    }
  }
}

BOOST_AUTO_TEST_CASE(an_array_of_exactly_the_threshold_is_printed_whole) {
  const auto text = values_part(make(modulo(1000, 3), {1000}, dtype::int32));
  BOOST_TEST(text.find("...") == std::string::npos);
  BOOST_TEST(text.starts_with(
      "[0 1 2 0 1 2 0 1 2 0 1 2 0 1 2 0 1 2 0 1 2 0 1 2 0 1 2 0 1 2 0 1 2 0 1 2 0\n"
      " 1 2 0 1 2 0"));
  BOOST_TEST(std::count(text.begin(), text.end(), '\n') == 27);
  BOOST_TEST(text.ends_with("\n 0]"));
}

BOOST_AUTO_TEST_CASE(views_print_their_own_elements) {
  const auto a = make(iota(12, 1.0), {4, 3}, dtype::float32);
  BOOST_TEST(a.slice(1, 3).to_string() == "[[3. 4. 5.]\n [6. 7. 8.]]\n<NDArray 2x3 @cpu(0)>");
  BOOST_TEST(a.at(3).to_string() == "[ 9. 10. 11.]\n<NDArray 3 @cpu(0)>");
}

BOOST_AUTO_TEST_SUITE_END()
