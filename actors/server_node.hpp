#pragma once
// The actors of one server process: its shards, and a control actor (server_control_actor) that
// fans set_optimizer, sync_settings and commands out to every shard and answers once when all have
// answered (ps-lite's one server = many shards here, so that updates of different keys run on
// different cores).
//
//   router() / route(envelope): the request_handler for a request: keyed requests (init, push,
//     pushpull, pull_request) go to shard ps_key % shards, set_optimizer, sync_settings and
//     commands to the control actor, other kinds to nobody (answered unsupported by the caller).
//     The data server broker (actors/data_link) and in-process links call it.
//   broadcast(membership): every shard learns the job's membership (bounded staleness then waits
//     for live workers only).
//   connection_closed(connection): every shard hears that a data server connection closed (the
//     data server's on_disconnect calls it, through the router), and drops the inits it began
//     and what its workers' unfinished pushes hold.
//   stats(timeout): the shards' counters summed, for the server's end-of-job log line.

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/logic/key_placement.hpp"
#include "actors/protocols.hpp"
#include "actors/server_shard.hpp"
#include "engine/context.hpp"
#include "engine/log.hpp"

namespace troupe {

struct server_node_options {
  std::uint32_t num_workers = 1;
  /// shard_options::max_workers: ranks that may join the running job (0: num_workers).
  std::uint32_t max_workers = 0;
  std::uint32_t shards = 1;
  /// The job's servers and this one's rank (set_rank once the scheduler has given it): with
  /// `shards`, the layout its files record.
  std::uint32_t num_servers = 1;
  std::uint32_t server_rank = 0;
  /// shard_options::num_ranges: the key ranges keys are placed over (0: num_servers).
  std::uint32_t num_ranges = 0;
  /// shard_options::checkpoint: where the shards' files go, and how often they write checkpoints.
  checkpoint_schedule checkpoint;
  /// Until worker rank 0 says otherwise with sync_settings (or a sync_mode / async_mode command).
  consistency mode = consistency::sync;
  std::size_t chunk_bytes = wire::default_chunk_bytes;
  /// shard_options of the same names.
  std::chrono::milliseconds pull_timeout{30'000};
  std::chrono::milliseconds sweep_interval{1'000};
  std::uint64_t max_value_bytes = std::uint64_t{1} << 32;
  std::chrono::milliseconds stalled_init{30'000};
  /// The key budget of the whole server (shard_options::max_store_bytes, shared by its shards).
  /// 0: default_max_store_bytes().
  std::uint64_t max_store_bytes = 0;
  /// shard_options::update_device.
  context update_device = context::cpu();
  /// troupe-node --recover: shard i restores restore[i] (shard_options::restore_from) before it
  /// serves; empty: the shards start empty.
  std::vector<std::shared_ptr<const shard_snapshot>> restore;
  /// Each shard logs as "<who> shard <i>".
  logger log{};
  /// Called, on whichever thread, when a shard ends other than by the server_node's destruction
  /// (an exception escaped it, or it was killed): "shard 1 of this server failed: <why>". The
  /// server can no longer serve its keys; dist_job tells the scheduler, which fails the job.
  std::function<void(const std::string&)> on_shard_failure{};
};

/// The key budget of a server when the configuration names none (data.max_store_bytes = 0): half
/// of the machine's physical memory, so that a server's keys leave the rest of the machine room
/// (their footprint is a small multiple of their declared bytes).
std::uint64_t default_max_store_bytes() noexcept;

/// Picks the actor for a request: keyed requests go to shard ps_key % shards, set_optimizer,
/// sync_settings and commands to the control actor, and any other kind to nobody (an invalid
/// handler: the data server answers it with unsupported). A copy of immutable handles: any thread
/// may call it, as long as the server_node that made it lives.
class request_router {
public:
  /// `lanes`: the shards' lanes, in the order of `shards` (or none: take() takes nothing).
  request_router(std::vector<shard_actor> shards, request_handler control,
                 std::vector<std::shared_ptr<shard_lane>> lanes = {});

  request_handler operator()(const envelope& request) const;
  /// On the data server broker's thread (data_server_options::take_request): gives a keyed
  /// request to its shard's lane, which answers a small one on this thread or hands it to the
  /// shard (shard_lane::take), its replies going to `broker`; false for any other request, which
  /// operator() routes.
  bool take(envelope& request, const reply_sink& broker) const;
  /// Tells every shard that data server connection `connection` closed (closed_atom).
  void connection_closed(std::uint64_t connection) const;
  /// Hands every shard a membership table through its lane (shard_lane::hand), or as a plain
  /// message when the router has no lanes.
  void membership(const wire::membership& table) const;

private:
  std::vector<shard_actor> shards_;
  request_handler control_;
  std::vector<std::shared_ptr<shard_lane>> lanes_;
};

class server_node {
public:
  server_node(caf::actor_system& system, server_node_options options);
  ~server_node();
  server_node(const server_node&) = delete;
  server_node& operator=(const server_node&) = delete;

  /// The actor for `request`. Thread-safe (reads immutable state only).
  request_handler route(const envelope& request) const { return router_(request); }
  const request_router& router() const noexcept { return router_; }

  /// Sends the job's membership table to every shard.
  void broadcast(const wire::membership& table) const;
  /// router().connection_closed(connection).
  void connection_closed(std::uint64_t connection) const { router_.connection_closed(connection); }
  /// Tells every shard the rank the scheduler gave this server (it names their files).
  void set_rank(std::uint32_t rank) const;
  /// The shards' counters summed (shard_stats's operator+=), waiting at most `timeout` for every
  /// shard to answer; timeout otherwise. Blocks: call it from a thread that is not an actor's.
  result<shard_stats> stats(std::chrono::milliseconds timeout) const;

  const std::vector<shard_actor>& shards() const noexcept { return shards_; }
  const server_node_options& options() const noexcept { return options_; }

private:
  caf::actor_system& system_;
  server_node_options options_;
  std::vector<shard_actor> shards_;
  server_control_actor control_;
  request_router router_;
};

/// An in-process link from a worker to a server: (envelope) sent to it goes to
/// route(envelope) as (envelope, reply_to); stop_atom ends it; get_atom answers "in-process".
/// The same link_actor as a data_link client broker, so a worker cannot tell a server in its own
/// process from one across the network.
link_actor spawn_local_link(caf::actor_system& system,
                            std::function<request_handler(const envelope&)> route,
                            reply_sink reply_to);

} // namespace troupe
