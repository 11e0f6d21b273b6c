#pragma once
// The one place where wire values (schema/messages.hpp) and engine values (engine/) meet. schema/
// cannot include engine/ and engine/ knows nothing of the wire, so actors/, which sees both,
// converts here; the static_asserts in the .cpp fail the build when the enumerations drift apart.

#include <cstdint>

#include "actors/config/config.hpp"
#include "engine/dtype.hpp"
#include "engine/error.hpp"
#include "engine/gradient_compression.hpp"
#include "schema/messages.hpp"

namespace troupe {

/// Element types: the same names and numbers on both sides (checked at compile time).
constexpr wire::dtype to_wire(dtype type) noexcept {
  return static_cast<wire::dtype>(type);
}
constexpr dtype from_wire(wire::dtype type) noexcept {
  return static_cast<dtype>(type);
}

/// Gradient compression: a packed chunk's rule (the same numbering, checked), and the rule back.
constexpr wire::compression_type to_wire(compression_type type) noexcept {
  return static_cast<wire::compression_type>(type);
}
constexpr gradient_compression from_wire(const wire::tensor_compression& packing) noexcept {
  return gradient_compression{static_cast<compression_type>(packing.type), packing.threshold};
}
/// A request's offer to read a packed reply (compressed pulls): its rule, or none.
constexpr gradient_compression from_wire(const wire::reply_packing& packing) noexcept {
  return gradient_compression{static_cast<compression_type>(packing.type), packing.threshold};
}

/// Roles: config's node_role and the wire's role have the same members (checked).
constexpr wire::role to_wire(node_role role) noexcept {
  return static_cast<wire::role>(role);
}
constexpr node_role from_wire(wire::role role) noexcept {
  return static_cast<node_role>(role);
}

/// The error code a reply carries for a failure of kind `code`.
wire::error_code to_wire(errc code) noexcept;

/// The error a caller sees for a reply's code. lost_peer and shutting_down are peer_lost (the
/// node that answered is going away), stale_round, not_admitted, not_permitted and
/// invalid_argument are invalid_argument, bad_frame is malformed_message.
errc from_wire(wire::error_code code) noexcept;

/// A reply's error as a troupe::error, its message prefixed with `context` ("pull of key 3 from
/// server 0: ").
error from_wire(const wire::error_reply& reply, const std::string& context = {});

} // namespace troupe
