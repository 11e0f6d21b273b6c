#pragma once
// Gradient compression (MXNet's 2bit rule, src/kvstore/gradient_compression-inl.h in 1.9.1, and
// its 1bit rule of 2.0): the sender adds each gradient to a residual it keeps, sends a value of a
// few states per element, and keeps in the residual what that value did not carry, so that
// nothing is lost over rounds, only delayed.
//
//   2bit, threshold t > 0: r += g; r >= t: send +t, r -= t; r <= -t: send -t, r += t; else 0.
//   1bit, threshold t >= 0: r += g; r > t: send +1, r -= 1; else send -1, r += 1.
//
// Packing is MXNet's, byte by byte, so it does not depend on the host's byte order: 2bit puts
// element i in byte i / 4 at bits 7-6 for i % 4 == 0 down to bits 1-0 (11 = +t, 10 = -t, 00 and 01
// = 0); 1bit puts element i in byte i / 8 at bit 7 - i % 8 (1 = +1, 0 = -1). A packed array is
// whole 32-bit words (16 or 32 elements each); the bits past the last element are zero.
//
// Residuals are float32 whatever the gradient's type (a float16 residual would lose what it
// exists to keep). Pure functions on raw buffers; `out` never aliases an input.

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/half.hpp"

namespace troupe::kernels::cpu {

/// Bytes of a packed array of `n` elements: whole words of 16 (2bit) or 32 (1bit) elements.
constexpr std::size_t packed_bytes_2bit(std::size_t n) noexcept {
  return (n + 15) / 16 * 4;
}
constexpr std::size_t packed_bytes_1bit(std::size_t n) noexcept {
  return (n + 31) / 32 * 4;
}

/// residual[i] += grad[i], then packs the 2bit value of residual[i] into out (packed_bytes_2bit(n)
/// bytes) and takes it from the residual.
void quantize_2bit(const float* grad, float* residual, std::uint8_t* out, std::size_t n,
                   float threshold) noexcept;
void quantize_2bit(const half_bits* grad, float* residual, std::uint8_t* out, std::size_t n,
                   float threshold) noexcept;
/// out[i] = +threshold, -threshold or 0 from the packed 2bit array `in`.
void dequantize_2bit(const std::uint8_t* in, float* out, std::size_t n, float threshold) noexcept;
void dequantize_2bit(const std::uint8_t* in, half_bits* out, std::size_t n,
                     float threshold) noexcept;

/// As quantize_2bit, with the 1bit rule (packed_bytes_1bit(n) bytes).
void quantize_1bit(const float* grad, float* residual, std::uint8_t* out, std::size_t n,
                   float threshold) noexcept;
void quantize_1bit(const half_bits* grad, float* residual, std::uint8_t* out, std::size_t n,
                   float threshold) noexcept;
/// out[i] = +1 or -1 from the packed 1bit array `in`.
void dequantize_1bit(const std::uint8_t* in, float* out, std::size_t n) noexcept;
void dequantize_1bit(const std::uint8_t* in, half_bits* out, std::size_t n) noexcept;

} // namespace troupe::kernels::cpu
