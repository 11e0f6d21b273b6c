#pragma once
// 32 bytes a control-plane test can name by a number: the session keys and secrets that the
// scheduler's and the node agent's rules seal and open, the same every run.

#include <cstddef>
#include <cstdint>

#include "schema/messages.hpp"

namespace troupe::testing {

/// Distinct seeds give distinct bytes.
inline wire::link_digest digest_of(std::uint64_t seed) {
  wire::link_digest bytes{};
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = static_cast<std::uint8_t>(seed * 31 + i);
  return bytes;
}

} // namespace troupe::testing
