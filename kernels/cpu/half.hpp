#pragma once
// IEEE 754 binary16 (float16) on the host, stored as raw bits. Conversion rounds to nearest even
// and keeps infinities, NaNs and subnormals, so float32 -> float16 -> float32 is exact for every
// value representable in float16.

#include <cstddef>
#include <cstdint>

namespace troupe::kernels::cpu {

using half_bits = std::uint16_t;

half_bits float_to_half(float value) noexcept;
float half_to_float(half_bits value) noexcept;

void float_to_half(const float* in, half_bits* out, std::size_t n) noexcept;
void half_to_float(const half_bits* in, float* out, std::size_t n) noexcept;

/// out[i] = Σ inputs[k][i] over float16 buffers, accumulated in float32 and rounded once. Uses the
/// CPU's float16 conversions (F16C) where it has them, with the same bits as without.
void sum_n_half(const half_bits* const* inputs, std::size_t count, half_bits* out,
                std::size_t n) noexcept;

namespace detail {
/// sum_n_half with the software conversions only: the reference its fast path is tested against.
void sum_n_half_portable(const half_bits* const* inputs, std::size_t count, half_bits* out,
                         std::size_t n) noexcept;
} // namespace detail

} // namespace troupe::kernels::cpu
