#include "actors/logic/key_placement.hpp"

#include <cmath>

namespace troupe {

std::vector<server_key_range> server_key_ranges(std::uint32_t num_servers) {
  std::vector<server_key_range> ranges;
  for (std::uint64_t i = 0; i < num_servers; ++i)
    ranges.push_back({max_key / num_servers * i, max_key / num_servers * (i + 1)});
  return ranges;
}

std::vector<key_slice> place_key(std::uint64_t key, std::int64_t num_elements,
                                 std::uint32_t num_servers, std::int64_t bigarray_bound) {
  auto ranges = server_key_ranges(num_servers);
  if (num_elements < bigarray_bound) {
    // MXNet multiplies in int: (key * 9973) % num_servers with key an int.
    auto server = static_cast<std::uint32_t>((key * 9973u) % num_servers);
    return {{server, ranges[server].begin + key, 0, num_elements}};
  }
  std::vector<key_slice> slices;
  auto per_server = static_cast<double>(num_elements) / num_servers;
  for (std::uint32_t i = 0; i < num_servers; ++i) {
    auto begin = static_cast<std::int64_t>(std::round(per_server * i));
    auto end = static_cast<std::int64_t>(std::round(per_server * (i + 1)));
    slices.push_back({i, ranges[i].begin + key, begin, end});
  }
  slices.back().end = num_elements; // guard the last rounding
  return slices;
}

} // namespace troupe
