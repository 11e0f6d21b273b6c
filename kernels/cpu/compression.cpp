#include "kernels/cpu/compression.hpp"

#include <algorithm>
#include <cstring>

namespace troupe::kernels::cpu {
namespace {

float widen(float value) noexcept {
  return value;
}
float widen(half_bits value) noexcept {
  return half_to_float(value);
}

// Element by element as MXNet's rule goes, in blocks of one packed word: each element's code and
// residual are computed without a branch (the same operations and roundings as MXNet's: r - (-t)
// is r + t exactly), which g++ -O3 vectorises, and the block's codes are then packed.
template <class T>
void quantize_2bit_impl(const T* grad, float* residual, std::uint8_t* out, std::size_t n,
                        float threshold) noexcept {
  const float negative = -1 * threshold;
  const std::size_t bytes = packed_bytes_2bit(n);
  for (std::size_t word = 0; word * 4 < bytes; ++word) {
    const std::size_t begin = word * 16;
    const std::size_t count = std::min<std::size_t>(16, n - begin);
    std::uint8_t codes[16] = {};
    auto code = [&](std::size_t i) {
      const float r = residual[i] + widen(grad[i]);
      const bool up = r >= threshold;
      const bool down = !up && r <= negative;
      residual[i] = r - (up ? threshold : down ? negative : 0.0f);
      return static_cast<std::uint8_t>(up ? 3 : down ? 2 : 0);
    };
    // A whole word's loop has a constant trip count, which is what g++ vectorises.
    if (count == 16)
      for (std::size_t k = 0; k < 16; ++k)
        codes[k] = code(begin + k);
    else
      for (std::size_t k = 0; k < count; ++k)
        codes[k] = code(begin + k);
    for (std::size_t b = 0; b < 4; ++b)
      out[word * 4 + b] = static_cast<std::uint8_t>(codes[4 * b] << 6 | codes[4 * b + 1] << 4 |
                                                    codes[4 * b + 2] << 2 | codes[4 * b + 3]);
  }
}

template <class T>
void quantize_1bit_impl(const T* grad, float* residual, std::uint8_t* out, std::size_t n,
                        float threshold) noexcept {
  const std::size_t bytes = packed_bytes_1bit(n);
  for (std::size_t word = 0; word * 4 < bytes; ++word) {
    const std::size_t begin = word * 32;
    const std::size_t count = std::min<std::size_t>(32, n - begin);
    std::uint8_t bits[32] = {};
    auto bit = [&](std::size_t i) {
      const float r = residual[i] + widen(grad[i]);
      const bool up = r > threshold;
      residual[i] = r - (up ? 1.0f : -1.0f);
      return static_cast<std::uint8_t>(up ? 1 : 0);
    };
    if (count == 32)
      for (std::size_t k = 0; k < 32; ++k)
        bits[k] = bit(begin + k);
    else
      for (std::size_t k = 0; k < count; ++k)
        bits[k] = bit(begin + k);
    for (std::size_t b = 0; b < 4; ++b) {
      std::uint8_t packed = 0;
      for (std::size_t k = 0; k < 8; ++k)
        packed = static_cast<std::uint8_t>(packed | bits[8 * b + k] << (7 - k));
      out[word * 4 + b] = packed;
    }
  }
}

/// The values a 2-bit code stands for: 00 and 01 are 0, 10 is -t, 11 is +t. A large array goes
/// a byte at a time through a table of the byte's four values (the table costs 256 bytes' work).
template <class T>
void dequantize_2bit_impl(const std::uint8_t* in, T* out, std::size_t n, T zero, T negative,
                          T positive) noexcept {
  const T values[4] = {zero, zero, negative, positive};
  std::size_t i = 0;
  if (n >= 4096) {
    T table[256][4];
    for (std::size_t byte = 0; byte < 256; ++byte)
      for (std::size_t k = 0; k < 4; ++k)
        table[byte][k] = values[(byte >> (6 - 2 * k)) & 3u];
    for (; i + 4 <= n; i += 4)
      std::memcpy(out + i, table[in[i >> 2]], sizeof table[0]);
  }
  for (; i < n; ++i)
    out[i] = values[(in[i >> 2] >> (6 - 2 * (i & 3))) & 3u];
}

template <class T>
void dequantize_1bit_impl(const std::uint8_t* in, T* out, std::size_t n, T minus_one,
                          T plus_one) noexcept {
  std::size_t i = 0;
  if (n >= 4096) {
    T table[256][8];
    for (std::size_t byte = 0; byte < 256; ++byte)
      for (std::size_t k = 0; k < 8; ++k)
        table[byte][k] = ((byte >> (7 - k)) & 1u) != 0 ? plus_one : minus_one;
    for (; i + 8 <= n; i += 8)
      std::memcpy(out + i, table[in[i >> 3]], sizeof table[0]);
  }
  for (; i < n; ++i)
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
