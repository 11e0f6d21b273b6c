#include "engine/error.hpp"

namespace troupe {

std::string_view to_string(errc code) noexcept {
  switch (code) {
  case errc::invalid_argument:
    return "invalid_argument";
  case errc::unknown_key:
    return "unknown_key";
  case errc::already_initialized:
    return "already_initialized";
  case errc::shape_mismatch:
    return "shape_mismatch";
  case errc::dtype_mismatch:
    return "dtype_mismatch";
  case errc::context_mismatch:
    return "context_mismatch";
  case errc::key_type_mix:
    return "key_type_mix";
  case errc::empty_list:
    return "empty_list";
  case errc::not_supported:
    return "not_supported";
  case errc::device_unavailable:
    return "device_unavailable";
  case errc::io_error:
    return "io_error";
  case errc::corrupt_data:
    return "corrupt_data";
  case errc::malformed_message:
    return "malformed_message";
  case errc::timeout:
    return "timeout";
  case errc::peer_lost:
    return "peer_lost";
  case errc::internal:
    return "internal";
  }
  return "unknown_error";
}

std::string error::to_string() const {
  std::string text{troupe::to_string(code_)};
  text += ": ";
  text += message_;
  return text;
}

} // namespace troupe
