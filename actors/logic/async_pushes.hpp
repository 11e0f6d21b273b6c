#pragma once
// One key's dist_async pushes on a server shard: each worker's push is received into a staging
// buffer of its own and handed to the shard to apply as soon as its last byte has arrived, in
// whatever order the workers' pushes complete; and how many pushes of the key each worker has had
// applied, which bounded staleness (max_staleness = s) compares: a pull for round t is answered
// once every live worker has had t - s pushes applied. A plain object that the shard actor drives
// (actors/logic/shard_core.hpp).
//
// Memory per key: one staging buffer per worker, the key's size, and a counter per worker.

#include <cstdint>
#include <vector>

#include "actors/logic/push_chunk.hpp"
#include "engine/ndarray.hpp"

namespace troupe {

class async_pushes {
public:
  /// `like`: the key's value (shape and dtype of the buffers); `key` names it in messages.
  async_pushes(std::uint64_t key, const ndarray& like, std::uint32_t num_workers);

  /// Takes one chunk of chunk.sender's push: taken, completed (received(sender) holds the whole
  /// push) or refused.
  chunk_outcome add(const push_chunk& chunk);
  /// The push `sender` has just completed, to apply (or swap into the key's value) before its
  /// next chunk is added.
  ndarray& received(std::uint32_t sender) noexcept { return workers_[sender].staging; }
  /// Counts a push of `sender` as applied.
  void count_applied(std::uint32_t sender) noexcept;
  /// Continues a key restored from a checkpoint: worker w has had applied_per_worker[w] pushes
  /// applied (workers beyond the vector: none). Only before any chunk was added.
  void resume(const std::vector<std::uint64_t>& applied_per_worker) noexcept;

  /// Pushes applied to the key, over every worker.
  std::uint64_t applied() const noexcept { return applied_; }
  /// Pushes of `worker` applied to the key.
  std::uint64_t pushes_of(std::uint32_t worker) const noexcept { return workers_[worker].applied; }
  /// The fewest pushes any live worker has had applied (live[w]: worker w counts); the largest
  /// uint64 when no worker is live, so that nothing waits on a job without workers.
  std::uint64_t slowest(const std::vector<bool>& live) const noexcept;

private:
  struct worker_state {
    ndarray staging;
    std::uint64_t bytes = 0;
    std::uint64_t applied = 0;
  };

  std::uint64_t key_;
  value_layout layout_;
  std::uint64_t applied_ = 0;
  std::vector<worker_state> workers_;
};

} // namespace troupe
