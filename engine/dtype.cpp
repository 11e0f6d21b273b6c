#include "engine/dtype.hpp"

namespace troupe {

std::size_t size_of(dtype type) noexcept {
  switch (type) {
  case dtype::float32:
    return 4;
  case dtype::float16:
    return 2;
  case dtype::int32:
    return 4;
  case dtype::int64:
    return 8;
  case dtype::float64:
    return 8;
  }
  return 0;
}

std::string_view to_string(dtype type) noexcept {
  switch (type) {
  case dtype::float32:
    return "float32";
  case dtype::float16:
    return "float16";
  case dtype::int32:
    return "int32";
  case dtype::int64:
    return "int64";
  case dtype::float64:
    return "float64";
  }
  return "unknown_dtype";
}

std::optional<dtype> parse_dtype(std::string_view name) noexcept {
  for (auto type : {dtype::float32, dtype::float16, dtype::int32, dtype::int64, dtype::float64})
    if (to_string(type) == name)
      return type;
  return std::nullopt;
}

} // namespace troupe
