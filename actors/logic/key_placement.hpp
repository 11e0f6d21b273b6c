#pragma once
// Where a key's values live on the servers: MXNet's rule exactly
// (src/kvstore/kvstore_dist.h, EncodeDefaultKey; ps-lite's Postoffice::GetServerKeyRanges).
//
// The key space [0, 2^64-1) is cut into S equal ranges, one per server. A key of fewer than
// `bigarray_bound` elements lives whole on server (key * 9973) % S as ps-key range[s].begin + key.
// A larger one is split over all S servers: part i holds elements
// [round(N/S*i), round(N/S*(i+1))) as ps-key range[i].begin + key.
// Inside a server, a ps-key belongs to shard ps_key % shards_per_server.

#include <cstdint>
#include <vector>

namespace troupe {

/// ps-lite's kMaxKey: the key space is [0, max_key).
inline constexpr std::uint64_t max_key = ~std::uint64_t{0};

/// Server i's key range [begin, end) of S.
struct server_key_range {
  std::uint64_t begin = 0;
  std::uint64_t end = 0;
};
std::vector<server_key_range> server_key_ranges(std::uint32_t num_servers);

/// One server's part of a key: elements [begin, end) of the flattened value, kept as `ps_key`.
struct key_slice {
  std::uint32_t server = 0;
  std::uint64_t ps_key = 0;
  std::int64_t begin = 0;
  std::int64_t end = 0;
  std::int64_t size() const noexcept { return end - begin; }
};

/// The slices of `key` with `num_elements` elements, in server order; they cover
/// [0, num_elements) without gaps. Precondition: num_servers > 0.
std::vector<key_slice> place_key(std::uint64_t key, std::int64_t num_elements,
                                 std::uint32_t num_servers, std::int64_t bigarray_bound);

/// The shard of a server that owns `ps_key`.
inline std::uint32_t shard_of(std::uint64_t ps_key, std::uint32_t shards_per_server) {
  return static_cast<std::uint32_t>(ps_key % shards_per_server);
}

} // namespace troupe
