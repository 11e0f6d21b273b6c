// kernels/cpu/elementwise.hpp against plain scalar loops, for every instantiated type and size.

#include <cstdint>
#include <limits>
#include <tuple>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "kernels/cpu/elementwise.hpp"
#include "tests/kernels/kernels_test_support.hpp"

namespace cpu = troupe::kernels::cpu;
using namespace troupe::kernels::testing;

namespace {

using element_types = std::tuple<float, double, std::int32_t, std::int64_t>;

// Ranges keep integer products and sums far from overflow (signed overflow is UB).
template <class T>
std::vector<T> operand(std::mt19937_64& rng, std::size_t n) {
  if constexpr (std::numeric_limits<T>::is_integer)
    return random_vector<T>(rng, n, T{-1000}, T{1000});
  else
    return random_vector<T>(rng, n, T{-10}, T{10});
}

template <class T>
std::vector<T> divisor(std::mt19937_64& rng, std::size_t n) {
  if constexpr (std::numeric_limits<T>::is_integer)
    return random_nonzero_vector<T>(rng, n, T{1}, T{97});
  else
    return random_nonzero_vector<T>(rng, n, T{0.5}, T{10});
}

/// The reference for binary ops, and a second run with `out` aliasing `a` (documented as allowed).
template <class T, class Kernel, class Op>
void check_binary(std::uint64_t seed, Kernel kernel, Op op, bool divide, const char* name) {
  for (std::size_t n : sizes) {
    auto rng = rng_for(seed, n);
    const auto a = operand<T>(rng, n);
    const auto b = divide ? divisor<T>(rng, n) : operand<T>(rng, n);
    std::vector<T> expected(n);
    for (std::size_t i = 0; i < n; ++i)
      expected[i] = op(a[i], b[i]);

    std::vector<T> out(n, T{7});
    kernel(a.data(), b.data(), out.data(), n);
    check_equal(out, expected, name);

    auto in_place = a;
    kernel(in_place.data(), b.data(), in_place.data(), n);
    check_equal(in_place, expected, name);
  }
}

} // namespace

BOOST_AUTO_TEST_SUITE(elementwise)

BOOST_AUTO_TEST_CASE_TEMPLATE(add_matches_the_scalar_reference_on_every_size, T, element_types) {
  check_binary<T>(
      11, cpu::add<T>, [](T x, T y) { return static_cast<T>(x + y); }, false, "add");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(sub_matches_the_scalar_reference_on_every_size, T, element_types) {
  check_binary<T>(
      12, cpu::sub<T>, [](T x, T y) { return static_cast<T>(x - y); }, false, "sub");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(mul_matches_the_scalar_reference_on_every_size, T, element_types) {
  check_binary<T>(
      13, cpu::mul<T>, [](T x, T y) { return static_cast<T>(x * y); }, false, "mul");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(div_matches_the_scalar_reference_on_every_size, T, element_types) {
  check_binary<T>(
      14, cpu::div<T>, [](T x, T y) { return static_cast<T>(x / y); }, true, "div");
}

BOOST_AUTO_TEST_CASE(integer_div_truncates_toward_zero) {
  const std::vector<std::int32_t> a = {7, -7, 7, -7, 0};
  const std::vector<std::int32_t> b = {2, 2, -2, -2, 5};
  std::vector<std::int32_t> out(a.size());
  cpu::div(a.data(), b.data(), out.data(), a.size());
  check_equal(out, std::vector<std::int32_t>{3, -3, -3, 3, 0}, "int32 div");
}

BOOST_AUTO_TEST_CASE_TEMPLATE(scale_and_add_scalar_match_the_scalar_reference_on_every_size, T,
                              element_types) {
  const T alpha = std::numeric_limits<T>::is_integer ? T{-3} : T(-1.75);
  const T value = std::numeric_limits<T>::is_integer ? T{42} : T(0.3);
  for (std::size_t n : sizes) {
    auto rng = rng_for(15, n);
    const auto x = operand<T>(rng, n);
    std::vector<T> scaled(n), shifted(n);
    for (std::size_t i = 0; i < n; ++i) {
      scaled[i] = static_cast<T>(alpha * x[i]);
      shifted[i] = static_cast<T>(x[i] + value);
    }
    std::vector<T> out(n);
    cpu::scale(x.data(), alpha, out.data(), n);
    check_equal(out, scaled, "scale");
    cpu::add_scalar(x.data(), value, out.data(), n);
    check_equal(out, shifted, "add_scalar");

    auto in_place = x;
    cpu::scale(in_place.data(), alpha, in_place.data(), n);
    check_equal(in_place, scaled, "scale in place");
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(axpy_matches_the_scalar_reference_on_every_size, T, element_types) {
  const T alpha = std::numeric_limits<T>::is_integer ? T{5} : T(0.625);
  for (std::size_t n : sizes) {
    auto rng = rng_for(16, n);
    const auto x = operand<T>(rng, n);
    auto y = operand<T>(rng, n);
    std::vector<double> expected(n);
    for (std::size_t i = 0; i < n; ++i)
      expected[i] = static_cast<double>(y[i]) + static_cast<double>(alpha) * x[i];
    cpu::axpy(alpha, x.data(), y.data(), n);
    // Floating point: the double reference rounds once, the kernel twice (or once with FMA).
    const double rel =
        std::numeric_limits<T>::is_integer ? 0.0 : 2 * std::numeric_limits<T>::epsilon();
    const double abs =
        std::numeric_limits<T>::is_integer ? 0.0 : 20 * std::numeric_limits<T>::epsilon();
    check_close(y, expected, rel, abs, "axpy");
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(fill_writes_the_value_everywhere_on_every_size, T, element_types) {
  for (std::size_t n : sizes) {
    std::vector<T> out(n, T{1});
    cpu::fill(out.data(), T{-3}, n);
    check_equal(out, std::vector<T>(n, T{-3}), "fill");
  }
}

BOOST_AUTO_TEST_CASE_TEMPLATE(sum_n_adds_inputs_left_to_right_on_every_size_and_count, T,
                              element_types) {
  for (std::size_t n : sizes) {
    for (std::size_t count : {0u, 1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 16u, 19u}) {
      auto rng = rng_for(17 + count, n);
      std::vector<std::vector<T>> inputs;
      std::vector<const T*> pointers;
      for (std::size_t k = 0; k < count; ++k)
        inputs.push_back(operand<T>(rng, n));
      for (const auto& in : inputs)
        pointers.push_back(in.data());

      std::vector<T> expected(n, T{0});
      for (std::size_t i = 0; i < n; ++i) {
        if (count == 0)
          continue;
        T acc = inputs[0][i];
        for (std::size_t k = 1; k < count; ++k)
          acc = static_cast<T>(acc + inputs[k][i]);
        expected[i] = acc;
      }
      std::vector<T> out(n, T{5});
      cpu::sum_n(pointers.data(), count, out.data(), n);
      check_equal(out, expected, "sum_n");

      if (count > 0) {
        // `out` may alias inputs[0]
        auto first = inputs[0];
        pointers[0] = first.data();
        cpu::sum_n(pointers.data(), count, first.data(), n);
        check_equal(first, expected, "sum_n into inputs[0]");
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
