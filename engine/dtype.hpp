#pragma once
// Element types of ndarray, with MXNet's names.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string_view>

namespace troupe {

enum class dtype : std::uint8_t {
  float32 = 0,
  float16 = 1,
  int32 = 2,
  int64 = 3,
  float64 = 4,
};

/// Bytes per element.
std::size_t size_of(dtype type) noexcept;
/// "float32", "float16", "int32", "int64", "float64".
std::string_view to_string(dtype type) noexcept;
/// Inverse of to_string; nullopt for an unknown name.
std::optional<dtype> parse_dtype(std::string_view name) noexcept;

inline std::ostream& operator<<(std::ostream& out, dtype type) {
  return out << to_string(type);
}

} // namespace troupe
