// kernels/cpu/reduce.hpp against a sequential double loop and against closed forms.

#include <cmath>
#include <tuple>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "kernels/cpu/reduce.hpp"
#include "tests/kernels/kernels_test_support.hpp"

namespace cpu = troupe::kernels::cpu;
using namespace troupe::kernels::testing;

namespace {

using real_types = std::tuple<float, double>;

} // namespace

BOOST_AUTO_TEST_SUITE(reduce)

BOOST_AUTO_TEST_CASE_TEMPLATE(sum_and_l2_norm_match_a_sequential_double_loop_on_every_size, T,
                              real_types) {
  for (std::size_t n : sizes) {
    auto rng = rng_for(41, n);
    const auto x = random_vector<T>(rng, n, T{-3}, T{5});
    double sum = 0.0, squares = 0.0, magnitude = 0.0;
    for (T v : x) {
      sum += static_cast<double>(v);
      squares += static_cast<double>(v) * static_cast<double>(v);
      magnitude += std::abs(static_cast<double>(v));
    }
    // Both are double sums, possibly in different orders: each is within (n - 1) double
    // roundings of the running magnitude of the exact sum (a float accumulator would miss this
    // bound by five orders of magnitude on 1M elements).
    const double slack = static_cast<double>(n) * 0x1p-52 * (magnitude + squares);
    BOOST_TEST(std::abs(cpu::sum(x.data(), n) - sum) <= slack, "sum, n = " << n);
    BOOST_TEST(std::abs(cpu::l2_norm(x.data(), n) - std::sqrt(squares)) <=
                   slack / std::max(1.0, std::sqrt(squares)) + 1e-300,
               "l2_norm, n = " << n);
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(an_empty_buffer_sums_to_zero, T, real_types) {
  BOOST_TEST(cpu::sum(static_cast<const T*>(nullptr), 0) == 0.0);
  BOOST_TEST(cpu::l2_norm(static_cast<const T*>(nullptr), 0) == 0.0);
}

BOOST_AUTO_TEST_CASE_TEMPLATE(sums_of_small_integers_are_exact_on_every_size, T, real_types) {
  for (std::size_t n : sizes) {
    std::vector<T> x(n);
    for (std::size_t i = 0; i < n; ++i)
      x[i] = static_cast<T>(i + 1);
    const double nd = static_cast<double>(n);
    // every partial sum is an integer below 2^53, so any summation order is exact
    BOOST_TEST(cpu::sum(x.data(), n) == nd * (nd + 1) / 2);
    const std::vector<T> ones(n, T{1});
    BOOST_TEST(cpu::l2_norm(ones.data(), n) == std::sqrt(nd));
  }
}

BOOST_AUTO_TEST_CASE(float_sums_accumulate_in_double) {
  // 2^24 + 1 + 1 ... is lost in a float accumulator but not in a double one.
  std::vector<float> x(1001, 1.0f);
  x[0] = 16777216.0f;
  BOOST_TEST(cpu::sum(x.data(), x.size()) == 16777216.0 + 1000.0);
}

BOOST_AUTO_TEST_SUITE_END()
