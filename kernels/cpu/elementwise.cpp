#include "kernels/cpu/elementwise.hpp"

#include <algorithm>
#include <array>
#include <utility>

namespace troupe::kernels::cpu {

// Plain index loops: `out` may alias an input, so the compiler vectorises them behind a runtime
// overlap check rather than us promising no aliasing with __restrict.

template <class T>
void add(const T* a, const T* b, T* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = a[i] + b[i];
}

template <class T>
void sub(const T* a, const T* b, T* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = a[i] - b[i];
}

template <class T>
void mul(const T* a, const T* b, T* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = a[i] * b[i];
}

template <class T>
void div(const T* a, const T* b, T* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = a[i] / b[i];
}

template <class T>
void scale(const T* x, T alpha, T* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = alpha * x[i];
}

template <class T>
void add_scalar(const T* x, T value, T* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = x[i] + value;
}

template <class T>
void axpy(T alpha, const T* x, T* y, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    y[i] += alpha * x[i];
}

template <class T>
void fill(T* out, T value, std::size_t n) noexcept {
  std::fill(out, out + n, value);
}

namespace {

/// o[i] = (first ? in[0][i] : o[i] + in[0][i]) + in[1][i] + ... + in[G-1][i], left to right. All
/// G inputs stream in one pass. A pass per input over 16 KiB blocks (the previous way) read each
/// input in 16 KiB pieces and held the sum of 8 to 0.4x the bandwidth of `a += b`; one pass runs
/// it at 0.6-0.7x (bench/cpu_kernel_bench). in[0] may alias o (read before o[i] is written).
template <std::size_t G, class T>
void accumulate(const T* const* in, T* o, std::size_t len, bool first) noexcept {
  const T* p[G];
  for (std::size_t k = 0; k < G; ++k)
    p[k] = in[k];
  if (first) {
    for (std::size_t i = 0; i < len; ++i) {
      T acc = p[0][i];
      for (std::size_t k = 1; k < G; ++k)
        acc += p[k][i];
      o[i] = acc;
    }
  } else {
    for (std::size_t i = 0; i < len; ++i) {
      T acc = o[i];
      for (std::size_t k = 0; k < G; ++k)
        acc += p[k][i];
      o[i] = acc;
    }
  }
}

/// Most inputs one pass of sum_n adds.
constexpr std::size_t most_per_pass = 8;

/// accumulate<1> ... accumulate<most_per_pass>, indexed by group size - 1.
template <class T, std::size_t... less_one>
constexpr auto accumulators(std::index_sequence<less_one...>) {
  return std::array{&accumulate<less_one + 1, T>...};
}

} // namespace

template <class T>
void sum_n(const T* const* inputs, std::size_t count, T* out, std::size_t n) noexcept {
  if (count == 0) {
    fill(out, T{0}, n);
    return;
  }
  if (count == 1) {
    if (out != inputs[0])
      std::copy(inputs[0], inputs[0] + n, out);
    return;
  }
  // Up to 8 inputs per pass; with more, block by block so that the partial sums stay in L1/L2
  // between passes. The adds run in input order, so the result is the same left-to-right sum as
  // a scalar loop, bit for bit. inputs[0] may alias out, so it is read only by the first pass.
  static constexpr auto accumulate_group =
      accumulators<T>(std::make_index_sequence<most_per_pass>{});
  const std::size_t block = count <= most_per_pass ? n : 4096;
  for (std::size_t begin = 0; begin < n; begin += block) {
    const std::size_t len = std::min(block, n - begin);
    const T* in[most_per_pass];
    for (std::size_t k = 0; k < count; k += most_per_pass) {
      const std::size_t group = std::min(most_per_pass, count - k);
      for (std::size_t j = 0; j < group; ++j)
        in[j] = inputs[k + j] + begin;
      accumulate_group[group - 1](in, out + begin, len, k == 0);
    }
  }
}

#define TROUPE_INSTANTIATE_ELEMENTWISE(T)                                                          \
  template void add<T>(const T*, const T*, T*, std::size_t) noexcept;                              \
  template void sub<T>(const T*, const T*, T*, std::size_t) noexcept;                              \
  template void mul<T>(const T*, const T*, T*, std::size_t) noexcept;                              \
  template void div<T>(const T*, const T*, T*, std::size_t) noexcept;                              \
  template void scale<T>(const T*, T, T*, std::size_t) noexcept;                                   \
  template void add_scalar<T>(const T*, T, T*, std::size_t) noexcept;                              \
  template void axpy<T>(T, const T*, T*, std::size_t) noexcept;                                    \
  template void fill<T>(T*, T, std::size_t) noexcept;                                              \
  template void sum_n<T>(const T* const*, std::size_t, T*, std::size_t) noexcept;

TROUPE_INSTANTIATE_ELEMENTWISE(float)
TROUPE_INSTANTIATE_ELEMENTWISE(double)
TROUPE_INSTANTIATE_ELEMENTWISE(std::int32_t)
TROUPE_INSTANTIATE_ELEMENTWISE(std::int64_t)

#undef TROUPE_INSTANTIATE_ELEMENTWISE

} // namespace troupe::kernels::cpu
