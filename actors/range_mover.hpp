#pragma once
// Elastic servers: one server hands key ranges of its shards to another server of the job
// (troupe.capnp HandOver, RangeData). Each shard gives its part of the ranges at once, with the
// rounds its keys completed (shard_core::hand_over), encoded as it travels; the mover links to the
// receiving
// server's data port as this server (proving K(server, rank): only a server of the job can), sends
// each shard's part to the shard of the same index there as RangeData chunks, and reports once
// every shard's part was acknowledged (taken there: shard_core::take_over), or why not.
//
// A part that leaves its shard and is then not taken (the link fails, the receiver refuses it) is
// lost to the job: the scheduler, told so, fails the job rather than run on without the keys.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>

#include "actors/data_link.hpp"
#include "actors/protocols.hpp"
#include "engine/error.hpp"
#include "engine/log.hpp"
#include "schema/chunking.hpp"

namespace troupe {

struct range_move {
  /// The key ranges to hand over (HandOver.ranges).
  std::vector<std::uint32_t> ranges;
  /// This server's shards, in index order.
  std::vector<shard_actor> shards;
  /// The receiving server's data port.
  std::string host;
  std::uint16_t port = 0;
  /// The link to it: tuning.node names this server and its key.
  data_link_options link;
  /// Largest tensor payload per RangeData frame.
  std::size_t chunk_bytes = wire::default_chunk_bytes;
  /// Bound on the whole move: the shards' parts, the copy and the acknowledgements.
  std::chrono::milliseconds timeout{60'000};
  logger log;
};

/// Starts `move` on a thread of its own (a detached actor); `done` gets its outcome there, once.
void move_key_ranges(caf::actor_system& system, range_move move, std::function<void(status)> done);

} // namespace troupe
