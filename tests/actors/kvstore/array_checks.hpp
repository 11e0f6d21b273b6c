#pragma once
// Exact checks of a float32 array's values, shared by the KVStore tests.

#include <cstddef>
#include <cstdint>

#include "engine/ndarray.hpp"

namespace troupe::testing {

/// The first element of `array` that differs from `expected`, or -1.
inline std::int64_t first_mismatch(const ndarray& array, float expected) {
  auto values = array.to_vector<float>();
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i] != expected)
      return static_cast<std::int64_t>(i);
  return -1;
}

/// Every element of `array` equals `expected` exactly.
inline bool all_equal(const ndarray& array, float expected) {
  return first_mismatch(array, expected) < 0;
}

} // namespace troupe::testing
