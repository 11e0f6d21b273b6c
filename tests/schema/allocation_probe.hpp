#pragma once
// Measures the largest single heap allocation made while a probe is alive, so tests can show
// that hostile frames never make the decoder allocate in proportion to a length field.
// allocation_probe.cpp replaces the global operator new of the schema_tests executable.

#include <cstddef>

namespace troupe::test {

/// While alive, records the largest size passed to operator new (any thread, any library that
/// allocates through operator new: the codec, Cap'n Proto's kj arrays, std containers). Probes do
/// not nest.
class allocation_probe {
public:
  allocation_probe() noexcept;
  ~allocation_probe();
  allocation_probe(const allocation_probe&) = delete;
  allocation_probe& operator=(const allocation_probe&) = delete;

  /// Largest single allocation since construction, in bytes.
  std::size_t largest() const noexcept;
};

} // namespace troupe::test
