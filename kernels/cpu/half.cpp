#include "kernels/cpu/half.hpp"

#include <algorithm>
#include <bit>

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#include <immintrin.h>
#endif

namespace troupe::kernels::cpu {

half_bits float_to_half(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint32_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs = bits & 0x7fffffffu;

  if (abs >= 0x7f800000u) {
    if (abs == 0x7f800000u)
      return static_cast<half_bits>(sign | 0x7c00u);
    // NaN: keep the top payload bits and force the quiet bit, so a NaN whose payload lives only
    // in the low 13 bits cannot turn into an infinity.
    return static_cast<half_bits>(sign | 0x7e00u | ((abs >> 13) & 0x03ffu));
  }
  // 65520 is halfway between the largest half (65504) and 2^16; the tie goes to the even
  // neighbour, which is the infinity.
  if (abs >= 0x477ff000u)
    return static_cast<half_bits>(sign | 0x7c00u);

  if (abs < 0x38800000u) {
    // Below 2^-14: the result is a half subnormal (or zero) in units of 2^-24.
    if (abs < 0x33000000u) // below 2^-25, half of the smallest subnormal: rounds to zero
      return static_cast<half_bits>(sign);
    const std::uint32_t exponent = abs >> 23; // 102..112 here
    const std::uint32_t mantissa = (abs & 0x007fffffu) | 0x00800000u;
    const std::uint32_t shift = 126u - exponent; // 14..24
    std::uint32_t result = mantissa >> shift;
    const std::uint32_t rest = mantissa & ((1u << shift) - 1u);
    const std::uint32_t halfway = 1u << (shift - 1u);
    if (rest > halfway || (rest == halfway && (result & 1u)))
      ++result; // may carry into the smallest normal, which is the right answer
    return static_cast<half_bits>(sign | result);
  }

  // Normal: rebias the exponent from 127 to 15 and drop 13 mantissa bits, rounding to nearest
  // even. A carry out of the mantissa correctly bumps the exponent.
  std::uint32_t result = (abs - 0x38000000u) >> 13;
  const std::uint32_t rest = abs & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (result & 1u)))
    ++result;
  return static_cast<half_bits>(sign | result);
}

float half_to_float(half_bits value) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(value & 0x8000u) << 16;
  const std::uint32_t exponent = (value >> 10) & 0x1fu;
  std::uint32_t mantissa = value & 0x03ffu;
  std::uint32_t bits;
  if (exponent == 0x1fu) {
    bits = sign | 0x7f800000u | (mantissa << 13); // inf, or NaN with its payload
  } else if (exponent != 0) {
    bits = sign | ((exponent + 112u) << 23) | (mantissa << 13);
  } else if (mantissa == 0) {
    bits = sign;
  } else {
    // Subnormal half: every one is a normal float; shift the leading one into the hidden bit.
    std::uint32_t float_exponent = 113u;
    while ((mantissa & 0x0400u) == 0) {
      mantissa <<= 1;
      --float_exponent;
    }
    bits = sign | (float_exponent << 23) | ((mantissa & 0x03ffu) << 13);
  }
  return std::bit_cast<float>(bits);
}

void float_to_half(const float* in, half_bits* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = float_to_half(in[i]);
}

void half_to_float(const half_bits* in, float* out, std::size_t n) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    out[i] = half_to_float(in[i]);
}

namespace {

/// The portable sum: each element converted in software.
void sum_n_half_scalar(const half_bits* const* inputs, std::size_t count, half_bits* out,
                       std::size_t n) noexcept {
  // Accumulate a block in float32, input by input in order, then round once; the block keeps
  // the float partial sums in L1 and lets `out` alias any input (each element of `out` is
  // written only after all inputs have been read at that index).
  constexpr std::size_t block = 1024;
  float acc[block];
  for (std::size_t begin = 0; begin < n; begin += block) {
    const std::size_t len = std::min(block, n - begin);
    if (count == 0) {
      std::fill(acc, acc + len, 0.0f);
    } else {
      // Start from the first input rather than +0 so that a lone -0 stays -0.
      for (std::size_t i = 0; i < len; ++i)
        acc[i] = half_to_float(inputs[0][begin + i]);
    }
    for (std::size_t k = 1; k < count; ++k) {
      const half_bits* in = inputs[k] + begin;
      for (std::size_t i = 0; i < len; ++i)
        acc[i] += half_to_float(in[i]);
    }
    for (std::size_t i = 0; i < len; ++i)
      out[begin + i] = float_to_half(acc[i]);
  }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
// The same sum with the CPU's own conversions (F16C, eight lanes), which the software ones above
// are 20-40x slower than: a server merges float16 pushes with this. Same bits as the scalar sum:
// both round to nearest even and keep subnormals; that vcvtph2ps quiets a signalling NaN and
// half_to_float does not never reaches `out`, since the add quiets it in both and float_to_half
// sets the quiet bit itself. (Where two NaNs meet, which payload an add keeps depends on the
// order of its operands, which the compiler picks, in either path.) tests/kernels/half_test.cpp
// compares the two on every float16 value. g++ only, as the optimizer rules' clones: the clang of
// the fuzz build knows no "f16c" for __builtin_cpu_supports, and takes the software path.
inline __m128i eight_halves(const half_bits* from) noexcept {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(from));
}

__attribute__((target("avx,f16c"))) void sum_n_half_f16c(const half_bits* const* inputs,
                                                         std::size_t count, half_bits* out,
                                                         std::size_t n) noexcept {
  constexpr std::size_t block = 1024;
  alignas(32) float acc[block];
  for (std::size_t begin = 0; begin < n; begin += block) {
    const std::size_t len = std::min(block, n - begin);
    const std::size_t lanes = len & ~std::size_t{7};
    if (count == 0) {
      std::fill(acc, acc + len, 0.0f);
    } else {
      const half_bits* in = inputs[0] + begin;
      for (std::size_t i = 0; i < lanes; i += 8)
        _mm256_store_ps(acc + i, _mm256_cvtph_ps(eight_halves(in + i)));
      for (std::size_t i = lanes; i < len; ++i)
        acc[i] = half_to_float(in[i]);
    }
    for (std::size_t k = 1; k < count; ++k) {
      const half_bits* in = inputs[k] + begin;
      for (std::size_t i = 0; i < lanes; i += 8)
        _mm256_store_ps(
            acc + i, _mm256_add_ps(_mm256_load_ps(acc + i), _mm256_cvtph_ps(eight_halves(in + i))));
      for (std::size_t i = lanes; i < len; ++i)
        acc[i] += half_to_float(in[i]);
    }
    half_bits* to = out + begin;
    for (std::size_t i = 0; i < lanes; i += 8)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(to + i),
                       _mm256_cvtps_ph(_mm256_load_ps(acc + i), _MM_FROUND_TO_NEAREST_INT));
    for (std::size_t i = lanes; i < len; ++i)
      to[i] = float_to_half(acc[i]);
  }
}

bool cpu_converts_halves() noexcept {
  static const bool yes = __builtin_cpu_supports("avx") && __builtin_cpu_supports("f16c");
  return yes;
}
#endif

} // namespace

void sum_n_half(const half_bits* const* inputs, std::size_t count, half_bits* out,
                std::size_t n) noexcept {
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
  if (cpu_converts_halves())
    return sum_n_half_f16c(inputs, count, out, n);
#endif
  sum_n_half_scalar(inputs, count, out, n);
}

namespace detail {
void sum_n_half_portable(const half_bits* const* inputs, std::size_t count, half_bits* out,
                         std::size_t n) noexcept {
  sum_n_half_scalar(inputs, count, out, n);
}
} // namespace detail

} // namespace troupe::kernels::cpu
