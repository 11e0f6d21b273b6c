#pragma once
// What a server shard counts (shard_core::stats), and what its actor answers to stats_atom
// (actors/protocols.hpp). Plain data, no CAF.

#include <algorithm>
#include <array>
#include <cstdint>
#include <vector>

namespace troupe {

/// One key's traffic at its shard: push requests and their tensor bytes received, pull replies
/// and their tensor bytes sent.
struct key_traffic {
  std::uint64_t key = 0;
  std::uint64_t pushes = 0;
  std::uint64_t push_bytes = 0;
  std::uint64_t pulls = 0;
  std::uint64_t pull_bytes = 0;
};

/// dist_async's staleness: lead_counts[n] pushes arrived n pushes ahead of the slowest live
/// worker (the last bucket: that many or more).
using lead_histogram = std::array<std::uint64_t, 17>;

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
  /// Inits whose value still misses bytes, and the inits dropped unfinished (their connection
  /// closed, or they stalled).
  std::uint64_t inits_under_way = 0;
  std::uint64_t inits_dropped = 0;
  /// The declared bytes of the shard's keys, inits under way included: its part of the server's
  /// key budget (data.max_store_bytes).
  std::uint64_t store_bytes = 0;
  /// Every initialised key's traffic, by key.
  std::vector<key_traffic> keys;
  lead_histogram lead_counts{};
};

/// Sums stats of several shards (max_lead: the largest).
inline shard_stats& operator+=(shard_stats& total, const shard_stats& more) noexcept {
  total.updates += more.updates;
  total.late_pushes_dropped += more.late_pushes_dropped;
  total.max_lead = std::max(total.max_lead, more.max_lead);
  total.pulls_expired += more.pulls_expired;
  total.requests_refused += more.requests_refused;
  total.checkpoints_written += more.checkpoints_written;
  total.inits_under_way += more.inits_under_way;
  total.inits_dropped += more.inits_dropped;
  total.store_bytes += more.store_bytes;
  // Shards hold disjoint keys.
  total.keys.insert(total.keys.end(), more.keys.begin(), more.keys.end());
  std::sort(total.keys.begin(), total.keys.end(),
            [](const key_traffic& a, const key_traffic& b) { return a.key < b.key; });
  for (std::size_t i = 0; i < total.lead_counts.size(); ++i)
    total.lead_counts[i] += more.lead_counts[i];
  return total;
}

} // namespace troupe
