#include "actors/logic/wire_conversions.hpp"

namespace troupe {

static_assert(static_cast<int>(compression_type::none) ==
              static_cast<int>(wire::compression_type::none));
static_assert(static_cast<int>(compression_type::two_bit) ==
              static_cast<int>(wire::compression_type::two_bit));
static_assert(static_cast<int>(compression_type::one_bit) ==
              static_cast<int>(wire::compression_type::one_bit));
static_assert(static_cast<int>(dtype::float32) == static_cast<int>(wire::dtype::float32));
static_assert(static_cast<int>(dtype::float16) == static_cast<int>(wire::dtype::float16));
static_assert(static_cast<int>(dtype::int32) == static_cast<int>(wire::dtype::int32));
static_assert(static_cast<int>(dtype::int64) == static_cast<int>(wire::dtype::int64));
static_assert(static_cast<int>(dtype::float64) == static_cast<int>(wire::dtype::float64));

static_assert(static_cast<int>(node_role::scheduler) == static_cast<int>(wire::role::scheduler));
static_assert(static_cast<int>(node_role::server) == static_cast<int>(wire::role::server));
static_assert(static_cast<int>(node_role::worker) == static_cast<int>(wire::role::worker));

wire::error_code to_wire(errc code) noexcept {
  switch (code) {
  case errc::unknown_key:
    return wire::error_code::unknown_key;
  case errc::already_initialized:
    return wire::error_code::already_initialized;
  case errc::shape_mismatch:
    return wire::error_code::shape_mismatch;
  case errc::dtype_mismatch:
    return wire::error_code::dtype_mismatch;
  case errc::not_supported:
    return wire::error_code::unsupported;
  case errc::malformed_message:
    return wire::error_code::bad_frame;
  case errc::timeout:
    return wire::error_code::timeout;
  case errc::peer_lost:
    return wire::error_code::lost_peer;
  case errc::internal:
    return wire::error_code::internal;
  case errc::invalid_argument:
  case errc::context_mismatch:
  case errc::key_type_mix:
  case errc::empty_list:
  case errc::device_unavailable:
  case errc::io_error:
  case errc::corrupt_data:
    return wire::error_code::invalid_argument;
  }
  return wire::error_code::internal;
}

errc from_wire(wire::error_code code) noexcept {
  switch (code) {
  case wire::error_code::unknown_key:
    return errc::unknown_key;
  case wire::error_code::shape_mismatch:
    return errc::shape_mismatch;
  case wire::error_code::dtype_mismatch:
    return errc::dtype_mismatch;
  case wire::error_code::already_initialized:
    return errc::already_initialized;
  case wire::error_code::lost_peer:
  case wire::error_code::shutting_down:
  case wire::error_code::moved:
    return errc::peer_lost;
  case wire::error_code::timeout:
    return errc::timeout;
  case wire::error_code::unsupported:
    return errc::not_supported;
  case wire::error_code::bad_frame:
    return errc::malformed_message;
  case wire::error_code::stale_round:
  case wire::error_code::invalid_argument:
  case wire::error_code::not_admitted:
  case wire::error_code::not_permitted:
    return errc::invalid_argument;
  case wire::error_code::internal:
    break;
  }
  return errc::internal;
}

error from_wire(const wire::error_reply& reply, const std::string& context) {
  return error{from_wire(reply.code), context + reply.message};
}

} // namespace troupe
