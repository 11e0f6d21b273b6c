#pragma once
// Watches the heap allocations made while a probe is alive: the largest single one, so tests can
// show that hostile frames never make the decoder allocate in proportion to a length field, and
// how many there were, so tests can show that a data path allocates nothing once warm.
// allocation_probe.cpp replaces the global operator new of the test executable it is linked into.

#include <cstddef>

namespace troupe::test {

/// While alive, records every operator new (any thread, any library that allocates through
/// operator new: the codec, Cap'n Proto's kj arrays, std containers; not malloc called
/// directly). Probes do not nest.
class allocation_probe {
public:
  allocation_probe() noexcept;
  ~allocation_probe();
  allocation_probe(const allocation_probe&) = delete;
  allocation_probe& operator=(const allocation_probe&) = delete;

  /// Largest single allocation since construction, in bytes.
  std::size_t largest() const noexcept;
  /// Allocations since construction.
  std::size_t count() const noexcept;
};

} // namespace troupe::test
