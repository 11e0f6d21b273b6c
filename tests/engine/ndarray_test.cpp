#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/ndarray.hpp"
#include "engine/storage.hpp"
#include "engine_test_support.hpp"

using troupe::context;
using troupe::dtype;
using troupe::errc;
using troupe::ndarray;
using troupe::test::require_error;

namespace {

constexpr dtype all_dtypes[] = {dtype::float32, dtype::float16, dtype::int32, dtype::int64,
                                dtype::float64};

/// {first, first + step, ...}, n values.
std::vector<float> iota(std::size_t n, float first = 1.0f, float step = 1.0f) {
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i)
    values[i] = first + step * static_cast<float>(i);
  return values;
}

std::vector<double> closed_form(std::size_t n, double (*f)(double)) {
  std::vector<double> values(n);
  for (std::size_t i = 0; i < n; ++i)
    values[i] = f(static_cast<double>(i + 1));
  return values;
}

std::string name(dtype type) {
  return std::string{troupe::to_string(type)};
}

} // namespace

BOOST_AUTO_TEST_SUITE(ndarray_suite)

// --- shapes and factories -------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(shapes_print_as_mxnet_writes_them) {
  BOOST_TEST(troupe::shape_to_string({2, 3}) == "(2,3)");
  BOOST_TEST(troupe::shape_to_string({4}) == "(4,)");
  BOOST_TEST(troupe::shape_to_string({}) == "()");
  BOOST_TEST(troupe::shape_to_repr({2, 3}) == "2x3");
  BOOST_TEST(troupe::shape_to_repr({7}) == "7");
  BOOST_TEST(troupe::element_count({2, 3, 4}) == 24);
  BOOST_TEST(troupe::element_count({}) == 1);
  BOOST_TEST(troupe::element_count({5, 0}) == 0);
}

BOOST_AUTO_TEST_CASE(factories_make_arrays_of_the_requested_shape_dtype_context_and_value) {
  for (const dtype type : all_dtypes) {
    BOOST_TEST_CONTEXT(name(type)) {
      const auto zeros = ndarray::zeros({2, 3}, context::cpu(1), type);
      BOOST_TEST((zeros.shape() == troupe::shape_vector{2, 3}));
      BOOST_TEST(zeros.ndim() == 2u);
      BOOST_TEST(zeros.size() == 6);
      BOOST_TEST(zeros.nbytes() == 6 * troupe::size_of(type));
      BOOST_TEST((zeros.dtype() == type));
      BOOST_TEST((zeros.ctx() == context::cpu(1)));
      BOOST_TEST(!zeros.is_none());
      BOOST_TEST(zeros.to_vector<double>() == std::vector<double>(6, 0.0),
                 boost::test_tools::per_element());
      BOOST_TEST(ndarray::ones({3}, context::cpu(), type).to_vector<double>() ==
                     std::vector<double>(3, 1.0),
                 boost::test_tools::per_element());
      BOOST_TEST(ndarray::full({2, 2}, -7.0, context::cpu(), type).to_vector<double>() ==
                     std::vector<double>(4, -7.0),
                 boost::test_tools::per_element());
      BOOST_TEST(
          ndarray::from_values({1, -2, 3, 40}, {2, 2}, context::cpu(), type).to_vector<double>() ==
              (std::vector<double>{1, -2, 3, 40}),
          boost::test_tools::per_element());
      const auto empty = ndarray::empty({4, 1}, context::cpu(), type);
      BOOST_TEST(empty.size() == 4);
      const ndarray constructed({5}, context::cpu(2), type);
      BOOST_TEST((constructed.ctx() == context::cpu(2)));
    }
  }
}

BOOST_AUTO_TEST_CASE(from_values_needs_exactly_one_value_per_element) {
  require_error(
      [] {
        ndarray::from_values({1, 2, 3, 4, 5}, {2, 3});
      },
      errc::shape_mismatch, "from_values: 5 values do not fill shape (2,3) of 6 elements");
}

BOOST_AUTO_TEST_CASE(negative_extents_and_context_ids_are_rejected) {
  require_error(
      [] {
        ndarray::zeros({2, -1});
      },
      errc::invalid_argument, "ndarray: shape (2,-1) has a negative extent");
  require_error([] { ndarray::zeros({2}, context::cpu(-1)); }, errc::invalid_argument,
                "ndarray: cpu(-1) is not a valid context");
  require_error(
      [] {
        ndarray::zeros({std::int64_t{1} << 40, std::int64_t{1} << 40});
      },
      errc::invalid_argument, "is too large");
}

BOOST_AUTO_TEST_CASE(a_gpu_context_without_a_device_throws_device_unavailable,
                     *boost::unit_test::precondition(troupe::test::gpu_absent)) {
  require_error(
      [] {
        ndarray::zeros({2, 3}, context::gpu(0));
      },
      errc::device_unavailable, "gpu(0) is not available: ");
  require_error(
      [] {
        ndarray::zeros({2, 3}, context::gpu(0));
      },
      errc::device_unavailable, "no CUDA device");
  const auto host = ndarray::ones({2});
  require_error([&] { host.copy_to(context::gpu(0)); }, errc::device_unavailable,
                "gpu(0) is not available");
  require_error([] { ndarray::random_normal(0, 1, {4}, 1, context::gpu(1)); },
                errc::device_unavailable, "gpu(1) is not available");
}

// --- handles and views ----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_handle_copy_shares_storage_and_copy_does_not) {
  auto a = ndarray::ones({2, 3});
  ndarray b = a; // MXNet's b = a
  const ndarray c = a.copy();
  b += 1.0;
  BOOST_TEST(a.shares_storage_with(b));
  BOOST_TEST(!a.shares_storage_with(c));
  BOOST_TEST(a.to_vector<float>() == std::vector<float>(6, 2.0f), boost::test_tools::per_element());
  BOOST_TEST(c.to_vector<float>() == std::vector<float>(6, 1.0f), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(the_none_handle_is_none_and_every_use_throws) {
  const ndarray none;
  BOOST_TEST(none.is_none());
  BOOST_TEST(none.nbytes() == 0u);
  BOOST_TEST(!none.shares_storage_with(none));
  BOOST_TEST(none.to_string() == "<NDArray none>");
  require_error([&] { (void)none.sum(); }, errc::invalid_argument, "sum: the ndarray is none");
  require_error([&] { (void)none.raw_data(); }, errc::invalid_argument, "raw_data:");
  require_error([&] { (void)(none + ndarray::ones({1})); }, errc::invalid_argument, "add:");
  require_error([&] { (void)none.copy(); }, errc::invalid_argument, "copy_to:");
  ndarray target = ndarray::zeros({1});
  require_error([&] { none.copy_to(target); }, errc::invalid_argument, "copy_to:");
}

BOOST_AUTO_TEST_CASE(reshape_slice_and_at_are_views_that_write_through) {
  auto a = ndarray::from_values(iota(6, 0.0f), {3, 2});

  auto flat = a.reshape({6});
  BOOST_TEST(flat.shares_storage_with(a));
  flat.data<float>()[5] = 50.0f;
  BOOST_TEST(a.to_vector<float>()[5] == 50.0f);

  auto rows = a.slice(1, 3);
  BOOST_TEST((rows.shape() == troupe::shape_vector{2, 2}));
  BOOST_TEST(rows.to_vector<float>() == (std::vector<float>{2, 3, 4, 50}),
             boost::test_tools::per_element());
  rows += 100.0;
  BOOST_TEST(a.to_vector<float>() == (std::vector<float>{0, 1, 102, 103, 104, 150}),
             boost::test_tools::per_element());

  auto row = a.at(2);
  BOOST_TEST((row.shape() == troupe::shape_vector{2}));
  row.fill(-1.0);
  BOOST_TEST(a.to_vector<float>() == (std::vector<float>{0, 1, 102, 103, -1, -1}),
             boost::test_tools::per_element());

  // Views of views compose their offsets.
  auto element = a.slice(1, 3).at(1).at(0);
  BOOST_TEST(element.shape().empty());
  BOOST_TEST(element.as_scalar() == -1.0);
  element.fill(7.0);
  BOOST_TEST(a.to_vector<float>()[4] == 7.0f);
  BOOST_TEST(a.slice(2, 2).size() == 0);
}

BOOST_AUTO_TEST_CASE(arithmetic_between_shifted_views_of_one_array_reads_the_old_values) {
  auto a = ndarray::from_values({1, 2, 3, 4, 5}, {5});
  auto tail = a.slice(1, 5);
  tail += a.slice(0, 4);
  BOOST_TEST(a.to_vector<float>() == (std::vector<float>{1, 3, 5, 7, 9}),
             boost::test_tools::per_element());
  auto b = ndarray::from_values({1, 2, 3, 4, 5}, {5});
  auto head = b.slice(0, 4);
  head -= b.slice(1, 5);
  BOOST_TEST(b.to_vector<float>() == (std::vector<float>{-1, -1, -1, -1, 5}),
             boost::test_tools::per_element());
  auto c = ndarray::from_values({1, 2, 3, 4, 5}, {5});
  auto shifted = c.slice(1, 5);
  troupe::axpy(10.0, c.slice(0, 4), shifted);
  BOOST_TEST(c.to_vector<float>() == (std::vector<float>{1, 12, 23, 34, 45}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(reshape_infers_one_minus_one_axis) {
  const auto a = ndarray::zeros({2, 3, 4});
  BOOST_TEST((a.reshape({-1, 4}).shape() == troupe::shape_vector{6, 4}));
  BOOST_TEST((a.reshape({2, -1}).shape() == troupe::shape_vector{2, 12}));
  BOOST_TEST((a.reshape({24}).shape() == troupe::shape_vector{24}));
  BOOST_TEST((ndarray::zeros({1}).reshape({}).shape().empty()));
}

BOOST_AUTO_TEST_CASE(reshape_to_another_element_count_names_both_shapes) {
  const auto a = ndarray::zeros({2, 3});
  require_error(
      [&] {
        (void)a.reshape({4, 2});
      },
      errc::shape_mismatch, "reshape: cannot reshape (2,3) of 6 elements into (4,2) of 8 elements");
  require_error(
      [&] {
        (void)a.reshape({4, -1});
      },
      errc::shape_mismatch, "reshape: cannot infer the -1 of (4,-1) from (2,3) of 6 elements");
  require_error([&] { (void)a.reshape({-1, -1}); }, errc::invalid_argument, "has more than one -1");
  require_error([&] { (void)a.reshape({-2, -3}); }, errc::invalid_argument, "negative extent");
}

BOOST_AUTO_TEST_CASE(slicing_out_of_range_names_the_range_and_the_shape) {
  const auto a = ndarray::zeros({3, 2});
  require_error([&] { (void)a.slice(1, 5); }, errc::invalid_argument,
                "slice: [1, 5) is out of range for the first axis of shape (3,2)");
  require_error([&] { (void)a.slice(2, 1); }, errc::invalid_argument, "[2, 1) is out of range");
  require_error([&] { (void)a.slice(-1, 1); }, errc::invalid_argument, "[-1, 1)");
  require_error([&] { (void)a.at(3); }, errc::invalid_argument,
                "at: index 3 is out of range for the first axis of shape (3,2)");
  require_error([] { (void)ndarray::zeros({}).at(0); }, errc::invalid_argument,
                "at: a scalar array (shape ()) has no first axis");
}

BOOST_AUTO_TEST_CASE(typed_access_with_the_wrong_element_type_names_both_types) {
  auto a = ndarray::zeros({2});
  BOOST_TEST(a.data<float>() == static_cast<float*>(a.raw_data()));
  require_error([&] { (void)a.data<double>(); }, errc::dtype_mismatch,
                "data: requested element type float64 does not match dtype float32");
  const auto h = ndarray::zeros({2}, context::cpu(), dtype::float16);
  BOOST_TEST(h.data<std::uint16_t>() != nullptr);
  require_error([&] { (void)h.data<std::int32_t>(); }, errc::dtype_mismatch,
                "requested element type int32 does not match dtype float16");
}

BOOST_AUTO_TEST_CASE(as_scalar_returns_the_only_element_and_rejects_more) {
  BOOST_TEST(ndarray::full({1, 1}, 2.5).as_scalar() == 2.5);
  BOOST_TEST(ndarray::full({}, -3.0, context::cpu(), dtype::int64).as_scalar() == -3.0);
  require_error(
      [] {
        (void)ndarray::zeros({2, 3}).as_scalar();
      },
      errc::invalid_argument, "as_scalar: the array has 6 elements (shape (2,3)), not 1");
}

// --- copies and conversions -----------------------------------------------------------------

BOOST_AUTO_TEST_CASE(copy_to_another_cpu_context_copies_values_and_sets_the_context) {
  const auto a = ndarray::from_values({1, 2, 3}, {3});
  const auto b = a.copy_to(context::cpu(1));
  BOOST_TEST((b.ctx() == context::cpu(1)));
  BOOST_TEST(!b.shares_storage_with(a));
  BOOST_TEST(b.to_vector<float>() == a.to_vector<float>(), boost::test_tools::per_element());
  auto c = ndarray::zeros({3}, context::cpu(2));
  b.copy_to(c);
  BOOST_TEST(c.to_vector<float>() == a.to_vector<float>(), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(copy_to_converts_between_every_pair_of_dtypes) {
  const std::vector<float> values{0, 1, -2, 3, 100, -2048};
  for (const dtype from : all_dtypes) {
    for (const dtype to : all_dtypes) {
      BOOST_TEST_CONTEXT(name(from) << " -> " << name(to)) {
        const auto source = ndarray::from_values(values, {2, 3}, context::cpu(0), from);
        auto destination = ndarray::zeros({2, 3}, context::cpu(1), to);
        source.copy_to(destination);
        BOOST_TEST(destination.to_vector<float>() == values, boost::test_tools::per_element());
        BOOST_TEST(source.as_type(to).to_vector<float>() == values,
                   boost::test_tools::per_element());
        BOOST_TEST((source.as_type(to).dtype() == to));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(float_to_integer_conversion_truncates_toward_zero_and_saturates) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const auto source = ndarray::from_values({2.7f, -2.7f, 1e10f, -1e10f, nan}, {5});
  BOOST_TEST(source.as_type(dtype::int32).to_vector<std::int32_t>() ==
                 (std::vector<std::int32_t>{2, -2, std::numeric_limits<std::int32_t>::max(),
                                            std::numeric_limits<std::int32_t>::min(), 0}),
             boost::test_tools::per_element());
  BOOST_TEST(source.as_type(dtype::int64).to_vector<std::int64_t>()[2] == 10000000000);
}

BOOST_AUTO_TEST_CASE(conversion_to_float16_rounds_to_the_nearest_half) {
  const auto third = ndarray::from_values({1.0f / 3.0f, 2049.0f, 70000.0f}, {3});
  const auto half = third.as_type(dtype::float16).to_vector<double>();
  BOOST_TEST(half[0] == 0.333251953125);
  BOOST_TEST(half[1] == 2048.0); // ties to even
  BOOST_TEST(std::isinf(half[2]));
}

BOOST_AUTO_TEST_CASE(copy_to_a_destination_of_another_shape_names_both_shapes) {
  const auto a = ndarray::zeros({2, 3});
  auto b = ndarray::zeros({6});
  require_error([&] { a.copy_to(b); }, errc::shape_mismatch,
                "copy_to: shape (2,3) does not match (6,)");
}

// --- arithmetic -----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(arithmetic_matches_closed_forms_for_every_dtype) {
  constexpr std::size_t n = 6;
  for (const dtype type : all_dtypes) {
    BOOST_TEST_CONTEXT(name(type)) {
      // a[i] = i + 1, b[i] = 2 (i + 1); every result below is exact in every dtype.
      const auto a = ndarray::from_values(iota(n), {2, 3}, context::cpu(), type);
      const auto b = ndarray::from_values(iota(n, 2.0f, 2.0f), {2, 3}, context::cpu(), type);
      const auto check = [](const ndarray& result, double (*f)(double)) {
        BOOST_TEST(result.to_vector<double>() == closed_form(n, f),
                   boost::test_tools::per_element());
      };
      check(a + b, [](double x) { return 3 * x; });
      check(b - a, [](double x) { return x; });
      check(a - b, [](double x) { return -x; });
      check(a * b, [](double x) { return 2 * x * x; });
      check(b / a, [](double) { return 2.0; });
      check(a + 1.0, [](double x) { return x + 1; });
      check(a - 1.0, [](double x) { return x - 1; });
      check(a * 3.0, [](double x) { return 3 * x; });
      check(b / 2.0, [](double x) { return x; });
      check(2.0 + a, [](double x) { return x + 2; });
      check(3.0 * a, [](double x) { return 3 * x; });
      check(-a, [](double x) { return -x; });

      auto c = a.copy();
      c += b;
      check(c, [](double x) { return 3 * x; });
      c -= a;
      check(c, [](double x) { return 2 * x; });
      c *= a;
      check(c, [](double x) { return 2 * x * x; });
      c /= a;
      check(c, [](double x) { return 2 * x; });
      c += 4.0;
      check(c, [](double x) { return 2 * x + 4; });
      c -= 2.0;
      check(c, [](double x) { return 2 * x + 2; });
      c *= 0.5 * 2;
      check(c, [](double x) { return 2 * x + 2; });
      c /= 2.0;
      check(c, [](double x) { return x + 1; });
      BOOST_TEST((c.dtype() == type));
      BOOST_TEST(a.sum() == 21.0);
      BOOST_TEST(a.l2_norm() == std::sqrt(91.0));
    }
  }
}

BOOST_AUTO_TEST_CASE(integer_arithmetic_truncates_like_mxnet) {
  const auto a = ndarray::from_values({7, -7, 9}, {3}, context::cpu(), dtype::int32);
  BOOST_TEST((a / 2.0).to_vector<std::int32_t>() == (std::vector<std::int32_t>{3, -3, 4}),
             boost::test_tools::per_element());
  // The scalar is converted to the array's dtype first: 0.5 becomes 0.
  BOOST_TEST((a * 0.5).to_vector<std::int32_t>() == (std::vector<std::int32_t>{0, 0, 0}),
             boost::test_tools::per_element());
  const auto b = ndarray::from_values({2, 2, 4}, {3}, context::cpu(), dtype::int64);
  const auto c = ndarray::from_values({7, -7, 9}, {3}, context::cpu(), dtype::int64);
  BOOST_TEST((c / b).to_vector<std::int64_t>() == (std::vector<std::int64_t>{3, -3, 2}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(integer_division_by_zero_throws) {
  const auto a = ndarray::from_values({1, 2}, {2}, context::cpu(), dtype::int32);
  const auto z = ndarray::from_values({1, 0}, {2}, context::cpu(), dtype::int32);
  // Queued (engine/dispatch.hpp), the error comes at the wait.
  require_error([&] { (a / z).wait_to_read(); }, errc::invalid_argument,
                "div: integer division by zero (element 1 of the divisor)");
  require_error([&] { (a / 0.5).wait_to_read(); }, errc::invalid_argument,
                "div: integer division by zero (the divisor 0.5 converts to 0)");
  // Floats follow IEEE.
  const auto f = ndarray::from_values({1, -1}, {2}) / ndarray::zeros({2});
  BOOST_TEST(std::isinf(f.to_vector<float>()[0]));
}

BOOST_AUTO_TEST_CASE(a_one_element_operand_acts_as_a_scalar) {
  for (const dtype type : all_dtypes) {
    BOOST_TEST_CONTEXT(name(type)) {
      const auto a = ndarray::from_values({1, 2, 3, 4}, {2, 2}, context::cpu(), type);
      const auto two = ndarray::full({}, 2.0, context::cpu(), type);
      const auto ten = ndarray::full({1}, 10.0, context::cpu(), type);
      BOOST_TEST((a * two).to_vector<double>() == (std::vector<double>{2, 4, 6, 8}),
                 boost::test_tools::per_element());
      BOOST_TEST((ten - a).to_vector<double>() == (std::vector<double>{9, 8, 7, 6}),
                 boost::test_tools::per_element());
      BOOST_TEST(((ten - a).shape() == troupe::shape_vector{2, 2}));
      auto b = a.copy();
      b += ten;
      BOOST_TEST(b.to_vector<double>() == (std::vector<double>{11, 12, 13, 14}),
                 boost::test_tools::per_element());
      auto one = ten.copy();
      require_error([&] { one += a; }, errc::shape_mismatch,
                    "add: shape (1,) does not match (2,2)");
    }
  }
}

BOOST_AUTO_TEST_CASE(operands_of_another_shape_dtype_or_context_throw_naming_both_values) {
  const auto a = ndarray::zeros({2, 3});
  require_error(
      [&] {
        (void)(a + ndarray::zeros({3, 2}));
      },
      errc::shape_mismatch, "add: shape (2,3) does not match (3,2)");
  require_error(
      [&] {
        (void)(a - ndarray::zeros({2, 3}, context::cpu(), dtype::int32));
      },
      errc::dtype_mismatch, "sub: dtype float32 does not match int32");
  require_error(
      [&] {
        (void)(a * ndarray::zeros({2, 3}, context::cpu(1)));
      },
      errc::context_mismatch, "mul: context cpu(0) does not match cpu(1)");
  auto b = a.copy();
  require_error([&] { b /= ndarray::zeros({4}); }, errc::shape_mismatch,
                "div: shape (2,3) does not match (4,)");
}

BOOST_AUTO_TEST_CASE(float16_arithmetic_is_rounded_once_and_correct_across_chunks) {
  constexpr std::size_t n = 5000; // more than one of the engine's float16 chunks
  std::vector<float> values(n);
  for (std::size_t i = 0; i < n; ++i)
    values[i] = static_cast<float>(i % 100);
  const auto a =
      ndarray::from_values(values, {static_cast<std::int64_t>(n)}, context::cpu(), dtype::float16);
  const auto doubled = (a + a).to_vector<float>();
  const auto scaled = (a * 0.5).to_vector<float>();
  for (std::size_t i = 0; i < n; ++i) {
    BOOST_TEST_REQUIRE(doubled[i] == 2 * values[i]);
    BOOST_TEST_REQUIRE(scaled[i] == values[i] / 2);
  }
  // 2048 + 1 is not representable in float16: the float32 sum 2049 rounds to even, 2048.
  const auto big = ndarray::full({1}, 2048.0, context::cpu(), dtype::float16);
  BOOST_TEST((big + 1.0).as_scalar() == 2048.0);
  BOOST_TEST((big + 2.0).as_scalar() == 2050.0);
}

BOOST_AUTO_TEST_CASE(sum_and_l2_norm_accumulate_in_double) {
  const auto a = ndarray::full({1000, 1000}, 0.1, context::cpu(), dtype::float32);
  BOOST_TEST(a.sum() == 1e6 * static_cast<double>(0.1f), boost::test_tools::tolerance(1e-9));
  BOOST_TEST(a.l2_norm() == std::sqrt(1e6) * static_cast<double>(0.1f),
             boost::test_tools::tolerance(1e-9));
  const auto i = ndarray::from_values({3, -4}, {2}, context::cpu(), dtype::int64);
  BOOST_TEST(i.sum() == -1.0);
  BOOST_TEST(i.l2_norm() == 5.0);
}

// --- the KVStore's reductions ---------------------------------------------------------------

BOOST_AUTO_TEST_CASE(sum_into_adds_every_input_for_every_dtype) {
  constexpr std::size_t n = 3000;
  for (const dtype type : all_dtypes) {
    BOOST_TEST_CONTEXT(name(type)) {
      // inputs[k][i] = (k + 1) (i % 50 + 1): the sum is 10 (i % 50 + 1), exact in float16 too.
      std::vector<ndarray> inputs;
      for (int k = 0; k < 4; ++k) {
        std::vector<float> values(n);
        for (std::size_t i = 0; i < n; ++i)
          values[i] = static_cast<float>((k + 1) * (i % 50 + 1));
        inputs.push_back(
            ndarray::from_values(values, {static_cast<std::int64_t>(n)}, context::cpu(), type));
      }
      auto out = ndarray::empty({static_cast<std::int64_t>(n)}, context::cpu(), type);
      troupe::sum_into(inputs, out);
      const auto sum = out.to_vector<double>();
      for (std::size_t i = 0; i < n; ++i)
        BOOST_TEST_REQUIRE(sum[i] == 10.0 * static_cast<double>(i % 50 + 1));
    }
  }
}

BOOST_AUTO_TEST_CASE(sum_into_an_empty_list_zero_fills) {
  auto out = ndarray::ones({4});
  troupe::sum_into({}, out);
  BOOST_TEST(out.to_vector<float>() == std::vector<float>(4, 0.0f),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(sum_into_may_write_over_any_of_its_inputs) {
  const auto check = [](std::size_t target) {
    std::vector<ndarray> inputs{ndarray::full({3}, 1.0), ndarray::full({3}, 2.0),
                                ndarray::full({3}, 4.0)};
    ndarray out = inputs[target];
    troupe::sum_into(inputs, out);
    BOOST_TEST(out.to_vector<float>() == std::vector<float>(3, 7.0f),
               boost::test_tools::per_element());
  };
  check(0);
  check(1);
  check(2);
  // A view that overlaps an input only in part.
  auto buffer = ndarray::from_values({1, 2, 3, 4}, {4});
  const std::vector<ndarray> inputs{buffer.slice(0, 3), buffer.slice(1, 4)};
  auto out = buffer.slice(1, 4);
  troupe::sum_into(inputs, out);
  BOOST_TEST(buffer.to_vector<float>() == (std::vector<float>{1, 3, 5, 7}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(sum_into_rejects_an_input_unlike_the_output_naming_it) {
  auto out = ndarray::zeros({4});
  const std::vector<ndarray> shapes{ndarray::zeros({4}), ndarray::zeros({3})};
  require_error([&] { troupe::sum_into(shapes, out); }, errc::shape_mismatch,
                "sum_into: input 1 shape (3,) does not match (4,)");
  const std::vector<ndarray> dtypes{ndarray::zeros({4}, context::cpu(), dtype::float64)};
  require_error([&] { troupe::sum_into(dtypes, out); }, errc::dtype_mismatch,
                "sum_into: input 0 dtype float64 does not match float32");
}

BOOST_AUTO_TEST_CASE(sum_into_reads_inputs_of_other_cpu_contexts_where_they_are) {
  auto out = ndarray::zeros({4});
  const std::vector<ndarray> inputs{ndarray::full({4}, 1.5, context::cpu(3)),
                                    ndarray::full({4}, 2.0, context::cpu(0))};
  troupe::sum_into(inputs, out);
  BOOST_TEST(out.to_vector<float>() == std::vector<float>(4, 3.5f),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(axpy_adds_alpha_times_x_for_every_dtype) {
  for (const dtype type : all_dtypes) {
    BOOST_TEST_CONTEXT(name(type)) {
      const auto x = ndarray::from_values(iota(3000, 1.0f, 0.0f), {3000}, context::cpu(), type);
      auto y = ndarray::from_values(iota(3000, 5.0f, 0.0f), {3000}, context::cpu(), type);
      troupe::axpy(2.0, x, y);
      BOOST_TEST(y.to_vector<double>() == std::vector<double>(3000, 7.0),
                 boost::test_tools::per_element());
      troupe::axpy(-1.0, y, y);
      BOOST_TEST(y.sum() == 0.0);
    }
  }
  auto y = ndarray::zeros({3});
  require_error([&] { troupe::axpy(1.0, ndarray::zeros({4}), y); }, errc::shape_mismatch,
                "axpy: shape (4,) does not match (3,)");
}

// --- zero-size arrays and the pool ----------------------------------------------------------

BOOST_AUTO_TEST_CASE(arrays_of_zero_elements_work_everywhere) {
  for (const dtype type : all_dtypes) {
    BOOST_TEST_CONTEXT(name(type)) {
      auto a = ndarray::zeros({0}, context::cpu(), type);
      BOOST_TEST(a.size() == 0);
      BOOST_TEST(a.nbytes() == 0u);
      BOOST_TEST(!a.is_none());
      BOOST_TEST(a.raw_data() != nullptr);
      const auto b = ndarray::ones({2, 0}, context::cpu(1), type);
      BOOST_TEST((a + a).size() == 0);
      a += 1.0;
      BOOST_TEST(b.sum() == 0.0);
      BOOST_TEST(b.l2_norm() == 0.0);
      BOOST_TEST(b.copy_to(context::cpu()).size() == 0);
      BOOST_TEST(b.as_type(dtype::float64).size() == 0);
      BOOST_TEST((b.reshape({0, 7}).shape() == troupe::shape_vector{0, 7}));
      BOOST_TEST(b.to_vector<double>().empty());
      const std::vector<ndarray> inputs{a, a};
      troupe::sum_into(inputs, a);
      troupe::axpy(1.0, a, a);
      BOOST_TEST(a.to_string().starts_with("[]"));
      BOOST_TEST(ndarray::from_values(std::vector<float>{}, {0, 3}, context::cpu(), type).size() ==
                 0);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_freed_array_leaves_its_block_to_the_next_array_of_that_size) {
  auto& pool = troupe::storage_pool::shared();
  // An odd size, so that no block of its class is cached already.
  const troupe::shape_vector shape{12345, 7};
  const void* first_address = nullptr;
  {
    auto a = ndarray::empty(shape);
    first_address = a.raw_data();
  }
  const auto hits_before = pool.stats().hits;
  const auto b = ndarray::empty(shape);
  BOOST_TEST(b.raw_data() == first_address);
  BOOST_TEST(pool.stats().hits == hits_before + 1);
}

BOOST_AUTO_TEST_CASE(a_borrowed_array_reads_and_writes_the_lenders_memory_in_place) {
  std::vector<float> memory{1, 2, 3, 4, 5, 6};
  bool released = false;
  auto lender = std::shared_ptr<const void>(memory.data(), [&](const void*) { released = true; });
  const auto live_before = troupe::storage_pool::shared().stats().live_blocks;
  {
    auto array = ndarray::borrow(memory.data(), {2, 3}, dtype::float32, std::move(lender));
    BOOST_TEST(array.raw_data() == static_cast<void*>(memory.data()));
    BOOST_TEST(array.block()->is_borrowed());
    BOOST_TEST(array.sum() == 21.0);
    // Not from the pool: nothing was allocated for it.
    BOOST_TEST(troupe::storage_pool::shared().stats().live_blocks == live_before);
    array *= 2.0;
    ndarray::from_values({7, 8, 9, 10, 11, 12}, {2, 3}).copy_to(array);
    auto row = array.at(1); // a view shares the borrowed block
    row.fill(0.5);
    const ndarray copy = array;
    array = ndarray{};
    BOOST_TEST(!released); // `copy` still refers to the memory
    BOOST_TEST(copy.to_vector<float>() == memory, boost::test_tools::per_element());
  }
  BOOST_TEST(released); // the last handle let go of the lender, and only of it
  BOOST_TEST((memory == std::vector<float>{7, 8, 9, 0.5f, 0.5f, 0.5f}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(borrow_takes_every_dtype_and_an_empty_array_without_an_address) {
  std::vector<std::int64_t> memory(4, 3);
  for (const auto type : all_dtypes) {
    auto array = ndarray::borrow(memory.data(), {1}, type, std::make_shared<int>(0));
    BOOST_TEST(array.dtype() == type);
    BOOST_TEST(array.raw_data() == static_cast<void*>(memory.data()));
  }
  const auto empty = ndarray::borrow(nullptr, {0, 5}, dtype::float32, nullptr);
  BOOST_TEST(empty.size() == 0);
}

BOOST_AUTO_TEST_CASE(borrow_refuses_what_it_cannot_use_in_place_naming_it) {
  alignas(8) std::byte memory[64] = {};
  const auto lender = std::make_shared<int>(0);
  require_error([&] { ndarray::borrow(nullptr, {2}, dtype::float32, lender); },
                errc::invalid_argument, "borrow: the address of 8 bytes is null");
  require_error([&] { ndarray::borrow(memory + 2, {2}, dtype::float32, lender); },
                errc::invalid_argument,
                "borrow: the address is not aligned to the 4 bytes of a float32 element");
  require_error([&] { ndarray::borrow(memory, {2}, dtype::float32, nullptr); },
                errc::invalid_argument, "no keep-alive handle");
  require_error([&] { ndarray::borrow(memory, {2}, dtype::float32, lender, context::gpu(0)); },
                errc::invalid_argument,
                "only host memory can be borrowed (a cpu context), not gpu(0)");
  require_error([&] { ndarray::borrow(memory, {-1}, dtype::float32, lender); },
                errc::invalid_argument, "negative extent");
}

BOOST_AUTO_TEST_SUITE_END()
