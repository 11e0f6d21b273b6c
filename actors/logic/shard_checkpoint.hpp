#pragma once
// What a server shard writes to disk, and reads back: a checkpoint (every key's value, its
// completed rounds or per-worker sequence numbers, and the optimizer with its state) or the
// optimizer states alone (save_optimizer_states). One file per shard, self-checking and
// self-describing:
//
//   "troupe shard checkpoint", format version, kind (checkpoint | optimizer states),
//   layout (servers, this server's rank, shards per server, this shard's index, workers, key
//   ranges),
//   sync policy, the key ranges of a hand-over, keys (ps-key, dtype, shape, completed,
//   row_sparse, per-worker sequence numbers, the workers that joined or left with their rounds,
//   and for a checkpoint the value), the updater's saved states (or none), then SHA-256 of all
//   of it.
//
// A ps-key is where a key lives under one layout (actors/logic/key_placement.hpp): the same key is
// another ps-key, on another server or shard, under another number of servers or shards per
// server. So a file loads only into the shard of the same layout, and otherwise the refusal names
// every field that differs. Files are written with write_file (temporary file, fsync,
// rename, fsync of the directory: engine/serialize.hpp's write_file): a crash leaves the previous
// file or the new one, and a torn or altered file fails its checksum and is never loaded.
//
// Where files go is the server's business, never a peer's: checkpoint_file() and
// states_file() build every path under the server's checkpoint directory, and a name a worker
// sends (save_optimizer_states) must be a plain relative name.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/error.hpp"
#include "engine/ndarray.hpp"
#include "schema/messages.hpp"

namespace troupe {

/// How a shard applies pushes (troupe.capnp SyncSettings).
struct sync_policy {
  wire::consistency_mode mode = wire::consistency_mode::sync;
  /// dist_sync: workers whose whole push closes a round, 1..num_workers; 0: all of them.
  std::uint32_t quorum = 0;
  /// dist_sync with quorum < num_workers: multiply a round's sum by num_workers / quorum.
  bool rescale_quorum = false;
  /// dist_async: -1 none; s >= 0 bounds how far a worker's pulls run ahead of the slowest.
  std::int64_t max_staleness = -1;
  /// Rounds beyond the one being collected whose pushes a key keeps (>= 1).
  std::uint32_t max_rounds_ahead = 2;
  friend bool operator==(const sync_policy&, const sync_policy&) = default;
};

/// Where a shard sits in its job: what decides which keys it holds, under which ps-keys.
struct shard_layout {
  std::uint32_t num_servers = 1;
  std::uint32_t server_rank = 0;
  std::uint32_t shards_per_server = 1;
  std::uint32_t shard_index = 0;
  std::uint32_t num_workers = 1;
  /// The key ranges keys are placed over (job.max_servers; num_servers when there are no more):
  /// a ps-key is another one under another count.
  std::uint32_t num_ranges = 1;
  friend bool operator==(const shard_layout&, const shard_layout&) = default;
};

/// Where a server's files go and when its shards write checkpoints: the [checkpoint] section of
/// the cluster file, as server_node_options and shard_options carry it.
struct checkpoint_schedule {
  /// The server's checkpoint directory: periodic checkpoints and save_optimizer_states files go
  /// there and nowhere else. Empty: the shard writes and reads no files.
  std::filesystem::path dir;
  /// A checkpoint each time every key of the shard has completed another K rounds (dist_sync) or
  /// had another K pushes applied (dist_async); 0: not by rounds.
  std::uint64_t every_rounds = 0;
  /// A checkpoint when this long has passed since the last one and a key has changed (checked
  /// at each sweep); 0: not by time.
  std::chrono::milliseconds every{0};

  /// Whether the shards write checkpoints on their own (a directory and a period).
  bool periodic() const noexcept { return !dir.empty() && (every_rounds > 0 || every.count() > 0); }
};

/// "num_servers 2 (here 1), shards_per_server 2 (here 1)": every field of `saved` that differs
/// from `here`; empty when none does.
std::string layout_differences(const shard_layout& saved, const shard_layout& here);

enum class snapshot_kind : std::uint8_t {
  /// Values, rounds and optimizer state: what --recover loads.
  checkpoint = 0,
  /// The optimizer's state alone (save_optimizer_states / load_optimizer_states).
  optimizer_states = 1,
};

struct key_snapshot {
  std::uint64_t ps_key = 0;
  troupe::dtype type = troupe::dtype::float32;
  std::vector<std::int64_t> shape;
  /// Rounds completed (dist_sync) or pushes applied (dist_async).
  std::uint64_t completed = 0;
  /// Declared row_sparse (Init.rowSparse).
  bool row_sparse = false;
  /// dist_async: the sequence number each worker's next push of the key has (its pushes
  /// completed, when none was refused; actors/logic/async_pushes.hpp); empty in dist_sync.
  std::vector<std::uint64_t> applied_per_worker;
  /// A checkpoint's value of the key (shape and dtype as above); none in optimizer states.
  ndarray value;
  /// dist_sync: the workers that joined the running job and the first round each counts in, and
  /// those that left with the first round each no longer counts in (round_membership).
  struct worker_round {
    std::uint32_t worker = 0;
    std::uint64_t round = 0;
    friend bool operator==(const worker_round&, const worker_round&) = default;
  };
  std::vector<worker_round> joined;
  std::vector<worker_round> left;
};

struct shard_snapshot {
  snapshot_kind kind = snapshot_kind::checkpoint;
  shard_layout layout;
  sync_policy policy;
  std::vector<key_snapshot> keys;
  /// A hand-over (shard_core::hand_over): the key ranges whose keys it holds, in order; empty for
  /// a whole shard (a checkpoint, optimizer states).
  std::vector<std::uint32_t> ranges;
  /// updater::save_states(dump_optimizer) when an optimizer runs on the server (for a hand-over,
  /// the states of its keys only).
  std::optional<std::vector<std::byte>> optimizer_states;
};

/// The file's bytes, checksum included.
std::vector<std::byte> encode_snapshot(const shard_snapshot& snapshot);
/// Reads what encode_snapshot wrote. errc::corrupt_data naming what is wrong for anything else:
/// another format or version, a checksum that does not match (a torn or altered file), a length
/// or shape the bytes do not hold. `what` names the file in messages.
result<shard_snapshot> decode_snapshot(std::span<const std::byte> bytes, std::string_view what);

/// A shard's hand-over as it travels to another server (troupe.capnp RangeData): encode_snapshot's
/// bytes padded with zeros to whole int64 words, and how many of them are the snapshot.
struct encoded_hand_over {
  std::vector<std::byte> words;
  std::uint64_t bytes = 0;
};
encoded_hand_over encode_hand_over(const shard_snapshot& keys);
/// The range_data request that carries `encoded` to shard `shard` of another server, whole (the
/// link cuts it in chunks); its tensor views encoded.words.
wire::range_data range_data_of(std::uint64_t request_id, std::uint32_t shard,
                               const encoded_hand_over& encoded);

/// The file of shard `layout.shard_index` of server `layout.server_rank`'s periodic checkpoint.
std::filesystem::path checkpoint_file(const std::filesystem::path& directory,
                                      const shard_layout& layout);
/// `name` + ".server<r>.shard<i>" in `directory`; errc::invalid_argument naming the name when it
/// is empty, absolute, holds a ".." component or a NUL, or when there is no directory.
result<std::filesystem::path> states_file(const std::filesystem::path& directory,
                                          std::string_view name, const shard_layout& layout);

} // namespace troupe
