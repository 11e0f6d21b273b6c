#include "kernels/cpu/compression.hpp"

#include <algorithm>

namespace troupe::kernels::cpu {
namespace {

float widen(float value) noexcept {
  return value;
}
float widen(half_bits value) noexcept {
  return half_to_float(value);
}

// Element by element as MXNet writes it, one output byte at a time: the residual update decides
// each element's state, so there is nothing to reorder, and g++ -O3 vectorises the byte's loop.
template <class T>
void quantize_2bit_impl(const T* grad, float* residual, std::uint8_t* out, std::size_t n,
                        float threshold) noexcept {
  const float negative = -1 * threshold;
  const std::size_t bytes = packed_bytes_2bit(n);
  for (std::size_t byte = 0; byte < bytes; ++byte) {
    const std::size_t begin = byte * 4;
    const std::size_t end = std::min(begin + 4, n);
    std::uint8_t packed = 0;
    for (std::size_t i = begin; i < end; ++i) {
      const int shift = 6 - 2 * static_cast<int>(i & 3);
      float r = residual[i] + widen(grad[i]);
      if (r >= threshold) {
        packed |= static_cast<std::uint8_t>(3u << shift);
        r -= threshold;
      } else if (r <= negative) {
        packed |= static_cast<std::uint8_t>(2u << shift);
        r -= negative;
      }
      residual[i] = r;
    }
    out[byte] = packed;
  }
}

template <class T>
void quantize_1bit_impl(const T* grad, float* residual, std::uint8_t* out, std::size_t n,
                        float threshold) noexcept {
  const std::size_t bytes = packed_bytes_1bit(n);
  for (std::size_t byte = 0; byte < bytes; ++byte) {
    const std::size_t begin = byte * 8;
    const std::size_t end = std::min(begin + 8, n);
    std::uint8_t packed = 0;
    for (std::size_t i = begin; i < end; ++i) {
      float r = residual[i] + widen(grad[i]);
      if (r > threshold) {
        packed |= static_cast<std::uint8_t>(0x80u >> (i & 7));
        r -= 1;
      } else {
        r += 1;
      }
      residual[i] = r;
    }
    out[byte] = packed;
  }
}

/// The values a 2-bit code stands for: 00 and 01 are 0, 10 is -t, 11 is +t.
template <class T>
void dequantize_2bit_impl(const std::uint8_t* in, T* out, std::size_t n, T zero, T negative,
                          T positive) noexcept {
  const T values[4] = {zero, zero, negative, positive};
  for (std::size_t i = 0; i < n; ++i)
    out[i] = values[(in[i >> 2] >> (6 - 2 * (i & 3))) & 3u];
}

template <class T>
void dequantize_1bit_impl(const std::uint8_t* in, T* out, std::size_t n, T minus_one,
                          T plus_one) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = ((in[i >> 3] >> (7 - (i & 7))) & 1u) != 0 ? plus_one : minus_one;
}

} // namespace

void quantize_2bit(const float* grad, float* residual, std::uint8_t* out, std::size_t n,
                   float threshold) noexcept {
  quantize_2bit_impl(grad, residual, out, n, threshold);
}
void quantize_2bit(const half_bits* grad, float* residual, std::uint8_t* out, std::size_t n,
                   float threshold) noexcept {
  quantize_2bit_impl(grad, residual, out, n, threshold);
}
void dequantize_2bit(const std::uint8_t* in, float* out, std::size_t n, float threshold) noexcept {
  dequantize_2bit_impl(in, out, n, 0.0f, -1 * threshold, threshold);
}
void dequantize_2bit(const std::uint8_t* in, half_bits* out, std::size_t n,
                     float threshold) noexcept {
  dequantize_2bit_impl(in, out, n, float_to_half(0.0f), float_to_half(-1 * threshold),
                       float_to_half(threshold));
}

void quantize_1bit(const float* grad, float* residual, std::uint8_t* out, std::size_t n,
                   float threshold) noexcept {
  quantize_1bit_impl(grad, residual, out, n, threshold);
}
void quantize_1bit(const half_bits* grad, float* residual, std::uint8_t* out, std::size_t n,
                   float threshold) noexcept {
  quantize_1bit_impl(grad, residual, out, n, threshold);
}
void dequantize_1bit(const std::uint8_t* in, float* out, std::size_t n) noexcept {
  dequantize_1bit_impl(in, out, n, -1.0f, 1.0f);
}
void dequantize_1bit(const std::uint8_t* in, half_bits* out, std::size_t n) noexcept {
  dequantize_1bit_impl(in, out, n, float_to_half(-1.0f), float_to_half(1.0f));
}

} // namespace troupe::kernels::cpu
