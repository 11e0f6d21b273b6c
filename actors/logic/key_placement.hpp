#pragma once
// Where a key's values live on the servers: MXNet's rule exactly
// (src/kvstore/kvstore_dist.h, EncodeDefaultKey; ps-lite's Postoffice::GetServerKeyRanges).
//
// The key space [0, 2^64-1) is cut into S equal ranges, one per server. A key of fewer than
// `bigarray_bound` elements lives whole on server (key * 9973) % S as ps-key range[s].begin + key.
// A larger one is split over all S servers: part i holds elements
// [round(N/S*i), round(N/S*(i+1))) as ps-key range[i].begin + key.
// Inside a server, a ps-key belongs to shard ps_key % shards_per_server.
//
// Key ranges (troupe's, job.max_servers = R >= S): the functions below take the number of key
// ranges in place of S, and a key's slice of range r goes to the server that holds range r
// (Membership.keyRanges: r mod S; worker_core_options::range_owner). With R == S range i is server
// i's and this is MXNet's rule; with R > S a server holds several ranges, whole, which is what
// lets a range change servers without any key changing its ps-keys or its cut. When servers join
// or leave a running job (elastic servers) the scheduler moves as few whole ranges as give each
// server its share, R / n or one more (scheduler_core::rebalance).
//
// Slices (troupe's, after P3 and BytePS's partitions; data.slice_bytes). A key larger than the
// slice size is cut further, so that its first slices are summed, updated and on their way back
// while its last ones are still being pushed: a server closes the round of each ps-key on its
// own, and a pull of the whole key no longer waits for the whole push. With m slices per server,
// a key placed on U servers (1, or all S when split) is cut into P = U·m equal parts in element
// order; part p goes to server U == 1 ? (key * 9973) % S : p % S (neighbouring parts on
// different servers, so that every server works from the start), as ps-key
// range[server].begin + key + (p / U)·slot_stride. With m == 1 this is MXNet's rule above. The
// stride is 2^32 + 1: keys are below 2^32 (max_sliced_key), so two (key, slot) pairs never share
// a ps-key, and neighbouring slots of a key fall on different shards.

#include <cstdint>
#include <vector>

#include <boost/container/small_vector.hpp>

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
  /// Its slot on its server (0 for the first slice there). Every server a key uses holds the
  /// same number of slots, so slot > 0 anywhere means several slices on each.
  std::uint64_t slot = 0;
  /// place_rows: the rows [first_row, end_row) of the key this part holds (begin and end are
  /// their elements). 0 for place_key's slices.
  std::int64_t first_row = 0;
  std::int64_t end_row = 0;
  std::int64_t size() const noexcept { return end - begin; }
};

/// Keys a distributed store takes are below this (MXNet's keys are C ints): what keeps the slices
/// of one key from taking another key's ps-keys.
inline constexpr std::uint64_t max_sliced_key = std::uint64_t{1} << 32;
/// The distance between the ps-keys of neighbouring slots of one key on one server.
inline constexpr std::uint64_t slot_stride = (std::uint64_t{1} << 32) + 1;

/// A key's slices: held inline for the usual key of one slice (a call may place 10,000 keys).
using key_slices = boost::container::small_vector<key_slice, 1>;

/// The slices of `key` with `num_elements` elements, in element order; they cover
/// [0, num_elements) without gaps. `max_slice_elements` (0: no limit) caps a slice's size, except
/// where the key space of a server has no room for more slots (then slices grow). Preconditions:
/// num_servers > 0, key < max_sliced_key.
key_slices place_key(std::uint64_t key, std::int64_t num_elements, std::uint32_t num_servers,
                     std::int64_t bigarray_bound, std::int64_t max_slice_elements = 0);

/// The parts of row_sparse key `key` of `num_rows` rows of `row_elements` elements each: MXNet's
/// rule for row_sparse keys (src/kvstore/kvstore_dist.h, EncodeRowSparseKey). A key of fewer than
/// `bigarray_bound` elements lives whole on server (key * 9973) % S as ps-key range[s].begin +
/// key; a larger one is split by rows over all S servers, part i holding rows
/// [llround(R/S*i), llround(R/S*(i+1))) as ps-key range[i].begin + key. Never sliced further: a
/// row-sparse push carries a few rows, not a stream of bytes to overlap. Preconditions as
/// place_key's.
key_slices place_rows(std::uint64_t key, std::int64_t num_rows, std::int64_t row_elements,
                      std::uint32_t num_servers, std::int64_t bigarray_bound);

/// The key range of `num_ranges` (server_key_ranges) that `ps_key` lies in. Precondition:
/// num_ranges > 0.
inline std::uint32_t key_range_of(std::uint64_t ps_key, std::uint32_t num_ranges) {
  const auto range = ps_key / (max_key / num_ranges);
  return static_cast<std::uint32_t>(range < num_ranges ? range : num_ranges - 1);
}

/// The shard of a server that owns `ps_key`.
inline std::uint32_t shard_of(std::uint64_t ps_key, std::uint32_t shards_per_server) {
  return static_cast<std::uint32_t>(ps_key % shards_per_server);
}

} // namespace troupe
