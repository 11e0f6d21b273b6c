#include "actors/logic/key_placement.hpp"

#include <cmath>

namespace troupe {

std::vector<server_key_range> server_key_ranges(std::uint32_t num_servers) {
  std::vector<server_key_range> ranges;
  ranges.reserve(num_servers);
  for (std::uint64_t i = 0; i < num_servers; ++i)
    ranges.push_back({max_key / num_servers * i, max_key / num_servers * (i + 1)});
  return ranges;
}

key_slices place_key(std::uint64_t key, std::int64_t num_elements, std::uint32_t num_servers,
                     std::int64_t bigarray_bound, std::int64_t max_slice_elements) {
  // Server i's range begins at max_key / S * i (server_key_ranges), computed here rather than
  // taken from that list: a call places every key it carries, and this path allocates nothing
  // more than the slices it returns.
  const std::uint64_t range_size = max_key / num_servers;
  const bool split = num_elements >= bigarray_bound;
  const std::uint32_t servers_used = split ? num_servers : 1;
  // MXNet multiplies in int: (key * 9973) % num_servers with key an int.
  const auto home = static_cast<std::uint32_t>((key * 9973u) % num_servers);
  std::int64_t per_server = 1;
  if (max_slice_elements > 0 && num_elements > 0) {
    const std::int64_t cap = servers_used * max_slice_elements;
    per_server = (num_elements + cap - 1) / cap;
    // Every slot's ps-key must stay inside the server's range.
    const auto room = (range_size - max_sliced_key) / slot_stride;
    per_server = static_cast<std::int64_t>(
        std::min<std::uint64_t>(static_cast<std::uint64_t>(per_server), room));
  }
  const std::int64_t parts = servers_used * per_server;
  key_slices slices;
  slices.reserve(static_cast<std::size_t>(parts));
  const auto per_part = static_cast<double>(num_elements) / static_cast<double>(parts);
  for (std::int64_t p = 0; p < parts; ++p) {
    const auto server = split ? static_cast<std::uint32_t>(p % num_servers) : home;
    const auto slot = static_cast<std::uint64_t>(p / servers_used);
    slices.push_back({server, range_size * server + key + slot * slot_stride,
                      static_cast<std::int64_t>(std::round(per_part * static_cast<double>(p))),
                      static_cast<std::int64_t>(std::round(per_part * static_cast<double>(p + 1))),
                      slot});
  }
  slices.back().end = num_elements; // guard the last rounding
  return slices;
}

key_slices place_rows(std::uint64_t key, std::int64_t num_rows, std::int64_t row_elements,
                      std::uint32_t num_servers, std::int64_t bigarray_bound) {
  const std::uint64_t range_size = max_key / num_servers;
  key_slices slices;
  if (num_rows * row_elements < bigarray_bound) {
    const auto home = static_cast<std::uint32_t>((key * 9973u) % num_servers);
    slices.push_back({home, range_size * home + key, 0, num_rows * row_elements, 0, 0, num_rows});
    return slices;
  }
  slices.reserve(num_servers);
  const auto per_server = static_cast<double>(num_rows) / static_cast<double>(num_servers);
  std::int64_t first = 0;
  for (std::uint32_t s = 0; s < num_servers; ++s) {
    const std::int64_t end =
        s + 1 == num_servers ? num_rows : std::llround(per_server * static_cast<double>(s + 1));
    slices.push_back(
        {s, range_size * s + key, first * row_elements, end * row_elements, 0, first, end});
    first = end;
  }
  return slices;
}

} // namespace troupe
