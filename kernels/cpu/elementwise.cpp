#include "kernels/cpu/elementwise.hpp"

#include <algorithm>

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
  // Work block by block so that the partial sums stay in L1/L2 while every input streams
  // through once; within a block the adds run in input order, so the result is the same
  // left-to-right sum as a scalar loop, bit for bit.
  constexpr std::size_t block = 4096;
  for (std::size_t begin = 0; begin < n; begin += block) {
    const std::size_t len = std::min(block, n - begin);
    T* o = out + begin;
    // inputs[0] may alias out, so it is read only by this first pass.
    add(inputs[0] + begin, inputs[1] + begin, o, len);
    for (std::size_t k = 2; k < count; ++k) {
      const T* in = inputs[k] + begin;
      for (std::size_t i = 0; i < len; ++i)
        o[i] += in[i];
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
