#pragma once
// One key's dist_async pushes on a server shard: each worker's push is received into a staging
// buffer of its own and handed to the shard to apply as soon as its last byte has arrived, in
// whatever order the workers' pushes complete.
//
// Sequence numbers. A worker numbers its pushes of a ps-key 0, 1, 2, ... (Push.round), and the
// key keeps, per worker, the number its next push should have: one past the last push that
// completed. A push numbered below it was had already: sent again (Push.resent) after this server
// restarted from a checkpoint that holds it, it is acknowledged without being applied (the shard
// checks resent() before add()); sent as new, it is a replay and refused. A push numbered above it
// is taken: the pushes between were refused before they reached the key (a wrong shape, say), so
// the worker will not send them. The numbers are per worker rank, and a rank is admitted once per
// job (the scheduler never gives a lost worker's rank to another), so a rank's admission is its
// incarnation. The checkpoint keeps each worker's next number (key_snapshot::applied_per_worker).
//
// Bounded staleness (max_staleness = s) compares the same numbers: a pull for round t (the pushes
// its worker had sent of the key) is answered once every live worker has had t - s pushes
// completed. A plain object that the shard actor drives (actors/logic/shard_core.hpp).
//
// Memory per key: one staging buffer per worker, the key's size, and two counters per worker.

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
  /// push, and the sender's next sequence number is one past it) or refused (a push numbered
  /// below the sender's next, or a chunk whose number is not its push's).
  chunk_outcome add(const push_chunk& chunk);
  /// Takes a push that arrived whole and is applied from its own frame (a row-sparse push): the
  /// same checks of its number as add(), without staging. completed or refused.
  chunk_outcome take_whole(const push_chunk& chunk);
  /// A push sent again after a restart (Push.resent) that the key had already: numbered below
  /// the sender's next. Its chunks are not added; it is acknowledged once they are all in.
  bool had(const push_chunk& chunk) const noexcept {
    return chunk.round < workers_[chunk.sender].next_sequence;
  }
  /// The push `sender` has just completed, to apply (or swap into the key's value) before its
  /// next chunk is added.
  ndarray& received(std::uint32_t sender) noexcept { return workers_[sender].staging; }
  /// Counts a completed push as applied (one whose update failed is not).
  void count_applied() noexcept { ++applied_; }
  /// Continues a key restored from a checkpoint: worker w's next push is numbered
  /// next_per_worker[w] (workers beyond the vector: 0), and `applied` pushes were applied. Only
  /// before any chunk was added.
  void resume(const std::vector<std::uint64_t>& next_per_worker, std::uint64_t applied) noexcept;

  /// Drops what `sender`'s pushes hold (its connection closed): the push under way, whose chunks
  /// so far are forgotten (its next push starts afresh), and the staging buffer.
  void forget_unfinished(std::uint32_t sender) noexcept;

  /// Pushes applied to the key, over every worker.
  std::uint64_t applied() const noexcept { return applied_; }
  /// The sequence number of `worker`'s next push of the key: its pushes completed so far, when
  /// none was refused.
  std::uint64_t pushes_of(std::uint32_t worker) const noexcept {
    return workers_[worker].next_sequence;
  }
  /// The fewest pushes any live worker has had completed (live[w]: worker w counts); the largest
  /// uint64 when no worker is live, so that nothing waits on a job without workers.
  std::uint64_t slowest(const std::vector<bool>& live) const noexcept;
  /// `worker` joined the running job after `before` pushes of the slowest worker: bounded
  /// staleness counts its pushes from there (its own numbers still start at 0), so that it does
  /// not hold the others back until it has caught up with pushes it never made.
  void admit(std::uint32_t worker, std::uint64_t before) noexcept {
    workers_[worker].joined_at = before;
  }
  /// Where bounded staleness counts `worker`'s pushes from (0 for the job's first workers).
  std::uint64_t joined_at(std::uint32_t worker) const noexcept {
    return worker < workers_.size() ? workers_[worker].joined_at : 0;
  }

private:
  struct worker_state {
    ndarray staging;
    std::uint64_t bytes = 0;
    /// The sequence number of the push being received (bytes > 0).
    std::uint64_t receiving = 0;
    std::uint64_t next_sequence = 0;
    /// Bounded staleness counts the worker's pushes from here (admit).
    std::uint64_t joined_at = 0;
  };

  std::uint64_t key_;
  value_layout layout_;
  std::uint64_t applied_ = 0;
  std::vector<worker_state> workers_;
};

} // namespace troupe
