#pragma once
// The actors of one server process: its shards, and a control actor that fans set_optimizer and
// commands out to every shard and answers once when all have answered (ps-lite's one server =
// many shards here, so that updates of different keys run on different cores).
//
//   route(envelope): the actor that handles a request; keyed requests go to shard
//   ps_key % shards, set_optimizer and commands to the control actor. The data server broker
//   (actors/data_link) and in-process links call it.

#include <cstdint>
#include <functional>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/key_placement.hpp"
#include "actors/protocols.hpp"
#include "actors/server_shard.hpp"

namespace troupe {

struct server_node_options {
  std::uint32_t num_workers = 1;
  std::uint32_t shards = 1;
  /// Until worker rank 0 says otherwise with a sync_mode or async_mode command.
  consistency mode = consistency::sync;
  std::size_t chunk_bytes = wire::default_chunk_bytes;
};

class server_node {
public:
  server_node(caf::actor_system& system, server_node_options options);
  ~server_node();
  server_node(const server_node&) = delete;
  server_node& operator=(const server_node&) = delete;

  /// The actor for `request`. Thread-safe (reads immutable state only).
  const caf::actor& route(const envelope& request) const;
  std::function<caf::actor(const envelope&)> router() const;

  /// Sends the job's new membership table to every shard (a worker was lost within the quorum).
  /// Thread-safe.
  void broadcast(const wire::membership& table) const;

  const std::vector<caf::actor>& shards() const noexcept { return shards_; }
  const server_node_options& options() const noexcept { return options_; }

private:
  server_node_options options_;
  std::vector<caf::actor> shards_;
  caf::actor control_;
};

/// An in-process link from a worker to a server: (envelope) sent to it goes to
/// route(envelope) as (envelope, reply_to). The same form as a data_link client broker, so a
/// worker cannot tell a server in its own process from one across the network.
caf::actor spawn_local_link(caf::actor_system& system,
                            std::function<caf::actor(const envelope&)> route, caf::actor reply_to);

} // namespace troupe
