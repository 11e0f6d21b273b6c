#pragma once
// Shared helpers of the kernels tests: the sizes every kernel is swept over, seeded random
// inputs, and buffer comparisons that report the first mismatch instead of a million lines.

#include <cmath>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string_view>
#include <vector>

#include <boost/test/unit_test.hpp>

namespace troupe::kernels::testing {

/// Sizes every kernel is checked on: empty, single, odd (not a multiple of any vector width),
/// a few blocks, and large enough to cross any internal blocking.
inline constexpr std::size_t sizes[] = {0, 1, 7, 1000, 1'000'000};

/// A fixed seed per (test, size), so that a failure reproduces exactly.
inline std::mt19937_64 rng_for(std::uint64_t test_seed, std::size_t n) {
  return std::mt19937_64{test_seed * 1'000'003u + n};
}

/// n values uniform in [lo, hi]; integral T draws integers.
template <class T>
std::vector<T> random_vector(std::mt19937_64& rng, std::size_t n, T lo, T hi) {
  std::vector<T> v(n);
  if constexpr (std::floating_point<T>) {
    std::uniform_real_distribution<T> dist{lo, hi};
    for (auto& x : v)
      x = dist(rng);
  } else {
    std::uniform_int_distribution<T> dist{lo, hi};
    for (auto& x : v)
      x = dist(rng);
  }
  return v;
}

/// n values whose magnitude is uniform in [lo, hi] with a random sign: safe divisors.
template <class T>
std::vector<T> random_nonzero_vector(std::mt19937_64& rng, std::size_t n, T lo, T hi) {
  auto v = random_vector<T>(rng, n, lo, hi);
  std::bernoulli_distribution negative{0.5};
  for (auto& x : v)
    if (negative(rng))
      x = static_cast<T>(-x);
  return v;
}

/// Exact comparison, NaN equal to NaN. One BOOST_TEST for the whole buffer.
template <class T>
void check_equal(const std::vector<T>& actual, const std::vector<T>& expected,
                 std::string_view what) {
  BOOST_TEST_REQUIRE(actual.size() == expected.size());
  std::size_t mismatches = 0;
  std::size_t first = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    bool same = actual[i] == expected[i];
    if constexpr (std::floating_point<T>)
      same = same || (std::isnan(actual[i]) && std::isnan(expected[i]));
    if (!same && mismatches++ == 0)
      first = i;
  }
  BOOST_TEST(mismatches == 0u, what << " (n = " << actual.size() << "): " << mismatches
                                    << " elements differ, first at " << first << ": got "
                                    << (mismatches ? actual[first] : T{}) << ", expected "
                                    << (mismatches ? expected[first] : T{}));
}

/// |actual - expected| <= abs_tol + rel_tol * |expected| elementwise (expected may be double).
template <class A, class E>
void check_close(const std::vector<A>& actual, const std::vector<E>& expected, double rel_tol,
                 double abs_tol, std::string_view what) {
  BOOST_TEST_REQUIRE(actual.size() == expected.size());
  std::size_t mismatches = 0;
  std::size_t first = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const double a = static_cast<double>(actual[i]);
    const double e = static_cast<double>(expected[i]);
    // written so that a NaN on either side counts as a mismatch
    const bool close = std::abs(a - e) <= abs_tol + rel_tol * std::abs(e);
    if (!close && mismatches++ == 0)
      first = i;
  }
  BOOST_TEST(mismatches == 0u, what << " (n = " << actual.size() << "): " << mismatches
                                    << " elements outside tolerance, first at " << first << ": got "
                                    << (mismatches ? double(actual[first]) : 0.0) << ", expected "
                                    << (mismatches ? double(expected[first]) : 0.0));
}

} // namespace troupe::kernels::testing
