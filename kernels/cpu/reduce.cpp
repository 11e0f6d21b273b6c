#include "kernels/cpu/reduce.hpp"

#include <cmath>

namespace troupe::kernels::cpu {

namespace {

// Eight independent double accumulators: the loop is bound by add latency otherwise, and
// splitting the sum also lowers the rounding error against a single running total.
constexpr std::size_t lanes = 8;

template <class T>
double sum_impl(const T* x, std::size_t n) noexcept {
  double acc[lanes] = {};
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (std::size_t l = 0; l < lanes; ++l)
      acc[l] += static_cast<double>(x[i + l]);
  for (; i < n; ++i)
    acc[0] += static_cast<double>(x[i]);
  double total = 0.0;
  for (double a : acc)
    total += a;
  return total;
}

template <class T>
double sum_of_squares(const T* x, std::size_t n) noexcept {
  double acc[lanes] = {};
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (std::size_t l = 0; l < lanes; ++l) {
      const double v = static_cast<double>(x[i + l]);
      acc[l] += v * v;
    }
  for (; i < n; ++i) {
    const double v = static_cast<double>(x[i]);
    acc[0] += v * v;
  }
  double total = 0.0;
  for (double a : acc)
    total += a;
  return total;
}

} // namespace

double sum(const float* x, std::size_t n) noexcept {
  return sum_impl(x, n);
}
double sum(const double* x, std::size_t n) noexcept {
  return sum_impl(x, n);
}
double l2_norm(const float* x, std::size_t n) noexcept {
  return std::sqrt(sum_of_squares(x, n));
}
double l2_norm(const double* x, std::size_t n) noexcept {
  return std::sqrt(sum_of_squares(x, n));
}

} // namespace troupe::kernels::cpu
