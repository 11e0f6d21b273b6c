#pragma once
// What a server shard counts (shard_core::stats), and what its actor answers to stats_atom
// (actors/protocols.hpp). Plain data, no CAF.

#include <algorithm>
#include <cstdint>

namespace troupe {

/// What a shard counts, for logs, the job's summary and tests.
struct shard_stats {
  /// Rounds (sync) or pushes (async) applied, over every key of the shard.
  std::uint64_t updates = 0;
  /// Pushes that arrived after their round had closed with a quorum, dropped unapplied.
  std::uint64_t late_pushes_dropped = 0;
  /// Bounded staleness: the most rounds any worker's push was ahead of the slowest live worker
  /// when it arrived (the instrument that shows max_staleness holds).
  std::uint64_t max_lead = 0;
  /// Pulls that waited at the shard and expired with their request.
  std::uint64_t pulls_expired = 0;
  /// Requests refused with an error reply.
  std::uint64_t requests_refused = 0;
  /// Checkpoints written (periodic ones; save_optimizer_states files are not counted).
  std::uint64_t checkpoints_written = 0;
};

/// Sums stats of several shards (max_lead: the largest).
inline shard_stats& operator+=(shard_stats& total, const shard_stats& more) noexcept {
  total.updates += more.updates;
  total.late_pushes_dropped += more.late_pushes_dropped;
  total.max_lead = std::max(total.max_lead, more.max_lead);
  total.pulls_expired += more.pulls_expired;
  total.requests_refused += more.requests_refused;
  total.checkpoints_written += more.checkpoints_written;
  return total;
}

} // namespace troupe
