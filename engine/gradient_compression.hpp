#pragma once
// Gradient compression as a KVStore applies it (MXNet's kvstore.set_gradient_compression): which
// rule, its threshold, and the quantize/dequantize steps on host buffers of float32 or float16.
// The rules, their packing and why residuals are float32: kernels/cpu/compression.hpp.
//
//   auto gc = troupe::gradient_compression::make("2bit", 0.5).value();
//   kv->set_gradient_compression(gc);

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "engine/dtype.hpp"
#include "engine/error.hpp"

namespace troupe {

/// The rules; numbered as wire::compression_type (schema/messages.hpp), so actors/ convert with a
/// static_cast.
enum class compression_type : std::uint8_t { none = 0, two_bit = 1, one_bit = 2 };

struct gradient_compression {
  compression_type type = compression_type::none;
  float threshold = default_threshold;
  /// troupe's extension (distributed stores): pulls of float32 and float16 keys come back packed
  /// by the same rule too, each server keeping per worker what its packed replies have not carried
  /// (docs/protocol.md, "Compressed pulls"). Off: MXNet's rule, pulls stay dense.
  bool pulls = false;

  /// MXNet's default for both rules.
  static constexpr float default_threshold = 0.5f;

  /// From MXNet's parameters: type "2bit" (threshold finite and > 0), "1bit" (finite and >= 0)
  /// or "none" (compression off, troupe's addition: MXNet has no way back); no threshold means
  /// 0.5. Anything else is an error naming the value and what is accepted.
  static result<gradient_compression> make(std::string_view type,
                                           std::optional<double> threshold = std::nullopt);

  bool enabled() const noexcept { return type != compression_type::none; }
  /// "2bit", "1bit" or "none".
  std::string_view type_name() const noexcept;
  /// "2bit with threshold 0.5", "none".
  std::string describe() const;

  friend bool operator==(const gradient_compression&, const gradient_compression&) = default;
};

/// Whether values of `type` can be compressed (float32, float16).
bool compressible(dtype type) noexcept;
/// Bytes of `elements` elements packed by `type` (0 for none).
std::size_t packed_bytes(compression_type type, std::size_t elements) noexcept;

/// residual[i] += values[i] for `elements` elements of `type` (compressible), packs the result
/// into `packed` (packed_bytes(rule.type, elements) bytes) and keeps the rest in the residual.
/// Precondition: rule.enabled().
void quantize(const gradient_compression& rule, dtype type, const void* values, float* residual,
              std::byte* packed, std::size_t elements) noexcept;
/// The values `packed` stands for, as `elements` elements of `type` (compressible).
void dequantize(const gradient_compression& rule, dtype type, const std::byte* packed, void* out,
                std::size_t elements) noexcept;

} // namespace troupe
