#pragma once
// Element-wise kernels on raw host buffers. Pure functions: explicit pointers and element
// counts, no allocation, no knowledge of ndarray. `out` may alias an input unless noted.
// Instantiated for float, double, std::int32_t and std::int64_t (float16 goes through half.hpp).

#include <cstddef>
#include <cstdint>

namespace troupe::kernels::cpu {

/// out[i] = a[i] + b[i]
template <class T>
void add(const T* a, const T* b, T* out, std::size_t n) noexcept;
/// out[i] = a[i] - b[i]
template <class T>
void sub(const T* a, const T* b, T* out, std::size_t n) noexcept;
/// out[i] = a[i] * b[i]
template <class T>
void mul(const T* a, const T* b, T* out, std::size_t n) noexcept;
/// out[i] = a[i] / b[i] (integer division for integer T; the caller checks for zero)
template <class T>
void div(const T* a, const T* b, T* out, std::size_t n) noexcept;
/// out[i] = alpha * x[i]
template <class T>
void scale(const T* x, T alpha, T* out, std::size_t n) noexcept;
/// out[i] = x[i] + value
template <class T>
void add_scalar(const T* x, T value, T* out, std::size_t n) noexcept;
/// y[i] += alpha * x[i]
template <class T>
void axpy(T alpha, const T* x, T* y, std::size_t n) noexcept;
/// out[i] = value
template <class T>
void fill(T* out, T value, std::size_t n) noexcept;
/// out[i] = inputs[0][i] + ... + inputs[count-1][i], summed in input order so that results are
/// reproducible; count == 0 zero-fills. `out` may alias inputs[0] but no other input.
template <class T>
void sum_n(const T* const* inputs, std::size_t count, T* out, std::size_t n) noexcept;

} // namespace troupe::kernels::cpu
