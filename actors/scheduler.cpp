#include "actors/scheduler.hpp"

#include <algorithm>
#include <cstdio>
#include <optional>
#include <unordered_map>
#include <utility>

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/config/config.hpp"
#include "actors/job_barrier.hpp"
#include "actors/logic/node_identity.hpp"
#include "actors/logic/wire_conversions.hpp"

namespace troupe {

// --- helpers shared with the node agent ------------------------------------------------------

std::size_t scheduler_frame_bytes(std::uint32_t nodes) noexcept {
  // A membership row holds a host of at most max_host_bytes and a few integers.
  constexpr std::size_t base = std::size_t{64} << 10;
  constexpr std::size_t per_node = 512;
  return std::min(max_control_frame_bytes, base + per_node * (std::size_t{nodes} + 1));
}

data_link_tuning control_link_tuning(std::size_t max_frame_bytes, const logger& log,
                                     link_secret secret, link_tls tls) {
  data_link_tuning tuning;
  tuning.secret = std::move(secret);
  tuning.tls = std::move(tls);
  tuning.key_exchange = true;
  tuning.limits.max_frame_bytes = max_frame_bytes;
  tuning.shm_arena_bytes = 0;
  tuning.max_cached_buffer_bytes = max_frame_bytes;
  // Control frames are small and rare: a few frames' worth of window bounds what a node (or a
  // stranger) can make the scheduler hold.
  tuning.receive_window_bytes = 4 * max_frame_bytes;
  tuning.log = log;
  return tuning;
}

std::vector<wire::key_range> membership_key_ranges(std::uint32_t num_servers) {
  if (num_servers == 0)
    throw exception(errc::invalid_argument, "membership_key_ranges needs at least one server");
  std::vector<wire::key_range> ranges;
  ranges.reserve(num_servers);
  std::uint32_t server = 0;
  for (const auto& range : server_key_ranges(num_servers))
    ranges.push_back(wire::key_range{range.begin, range.end, server++, 0});
  return ranges;
}

status job_outcome::as_status() const {
  if (end != job_end::failed)
    return ok();
  return failure.value_or(error{errc::internal, "the job failed without a reason"});
}

// --- the handle --------------------------------------------------------------------------------

scheduler_handle::scheduler_handle(scheduler_actor actor, std::uint16_t port,
                                   completion<job_outcome> outcome)
    : actor_(std::move(actor)), port_(port), outcome_(std::move(outcome)) {}

std::optional<job_outcome> scheduler_handle::wait(std::chrono::milliseconds timeout) const {
  return outcome_.wait_until(completion<job_outcome>::clock::now() + timeout);
}

void scheduler_handle::stop() const {
  caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
}

namespace {

using steady = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// "2.3 s": a moment of the job, to a tenth of a second.
std::string seconds(milliseconds duration) {
  char text[32];
  std::snprintf(text, sizeof text, "%.1f s", static_cast<double>(duration.count()) / 1000.0);
  return text;
}

/// "1 of 2 servers" / "1 of 1 server".
std::string count_of(std::uint32_t have, std::uint32_t want, const char* noun) {
  return std::to_string(have) + " of " + std::to_string(want) + " " + noun + (want == 1 ? "" : "s");
}

/// Compares secrets in time independent of where they differ.
std::uint8_t group_bit(wire::role node_role) {
  switch (node_role) {
  case wire::role::scheduler:
    return wire::group::scheduler;
  case wire::role::server:
    return wire::group::servers;
  case wire::role::worker:
    return wire::group::workers;
  }
  return 0;
}

// The scheduler's phases:
//
//   registering --every server and worker admitted: membership sent--> running
//        |                                                                |
//        | startup_timeout, or an admitted node lost                      | every live worker
//        v                                                                v done: stop to servers
//      failed <--- a server lost, or more workers than the quorum allows - draining
//                                                                         |
//                                  every server gone, or drain_timeout    v
//                                                                       done
//
// done and failed are final: the outcome is set and the actor quits. A worker that said done and
// a server that was told to stop have "finished": their departure is expected, not a loss. A
// worker lost within the quorum (running only) leaves the phase as it is.
enum class phase { registering, running, draining, done, failed };

/// One admitted node.
struct node_entry {
  wire::node_info info;
  /// Its control connection: the server broker's id for it, and the broker.
  std::uint64_t connection = 0;
  reply_sink sink;
  /// Last frame of any kind from the node.
  steady::time_point last_seen;
  /// Worker: said done. Server: was sent stop.
  bool finished = false;
  /// Its control connection closed.
  bool gone = false;
  /// Declared lost (within the quorum; beyond it the job has failed).
  bool lost = false;
  /// Why it was lost, for its later frames.
  std::string lost_text;
  /// A lost server whose rank waits for a recovering server (server_rejoin) until then.
  std::optional<steady::time_point> rejoin_deadline;
};

using scheduler_pointer = scheduler_actor::pointer;

class scheduler_state {
public:
  /// CAF's name for the actor (logs, `name()`).
  static inline const char* name = "troupe.scheduler";

  /// The behaviour: a thin dispatch to the methods below.
  scheduler_actor::behavior_type start(scheduler_pointer self, scheduler_options options,
                                       completion<job_outcome> outcome) {
    self_ = self;
    options_ = std::move(options);
    outcome_ = std::move(outcome);
    token_ = link_secret(options_.auth_token);
    log_ = options_.log;
    quorum_ = options_.quorum == 0 || options_.quorum > options_.num_workers ? options_.num_workers
                                                                             : options_.quorum;
    started_ = steady::now();
    barrier_ = spawn_job_barrier(self_->system(), options_.num_servers, options_.num_workers,
                                 log_.part("barrier"));
    self_->attach_functor(
        [barrier = barrier_] { caf::anon_send_exit(barrier, caf::exit_reason::user_shutdown); });
    self_->set_default_handler([this](caf::scheduled_actor*, caf::message_view& msg) {
      log_.debug("dropped an unexpected message " + caf::to_string(msg.copy_content_to_message()));
      return caf::result<caf::message>{caf::sec::unexpected_message};
    });
    self_->delayed_send(self_, options_.heartbeat_interval, tick_atom::value);
    log_.info("waiting for " + count_of(0, options_.num_servers, "server") + " and " +
              count_of(0, options_.num_workers, "worker"));
    return {
        [this](envelope& frame, const reply_sink& sink) { on_frame(frame, sink); },
        [this](closed_atom, std::uint64_t connection) { on_closed(connection); },
        [this](const certified_peer& peer) { certified_[peer.connection] = peer.role; },
        [this](const authenticated_peer& peer) {
          if (!peer.authentication.session.empty())
            sessions_[peer.connection] = peer.authentication.session;
        },
        [this](tick_atom) {
          if (self_->current_sender().get() == self_->ctrl())
            on_tick();
        },
    };
  }

private:
  // --- incoming frames -----------------------------------------------------------------------

  void on_frame(const envelope& frame, const reply_sink& sink) {
    const auto index = find(frame.connection);
    const wire::message& msg = frame.msg;
    log_.debug([&] { return std::string{wire::kind_name(msg)} + " from " + who(index); });
    if (index)
      nodes_[*index].last_seen = steady::now();
    if (const auto* reg = std::get_if<wire::registration>(&msg))
      return on_registration(frame.connection, sink, *reg);
    if (!index)
      return reply(sink, frame.connection,
                   error_reply(wire::request_id_of(msg), wire::error_code::not_admitted,
                               "a " + std::string{wire::kind_name(msg)} +
                                   " on a connection that has not registered"));
    node_entry& node = nodes_[*index];
    const bool sign_of_life = std::holds_alternative<wire::heartbeat>(msg) ||
                              std::holds_alternative<wire::ack>(msg) ||
                              std::holds_alternative<wire::error_reply>(msg);
    if (node.lost) {
      if (!sign_of_life)
        send(node,
             error_reply(wire::request_id_of(msg), wire::error_code::lost_peer, node.lost_text));
      return;
    }
    if (const auto* request = std::get_if<wire::barrier>(&msg))
      on_barrier(*index, *request);
    else if (const auto* cmd = std::get_if<wire::command>(&msg))
      on_command(*index, *cmd);
    else if (const auto* settings = std::get_if<wire::sync_settings>(&msg))
      on_sync_settings(*index, *settings);
    else if (const auto* err = std::get_if<wire::error_reply>(&msg);
             err != nullptr && err->request_id == 0 && node.info.node_role == wire::role::server)
      // A server that says it failed (a shard died) holds keys nobody else has: the job fails
      // now, naming why, instead of when its requests time out.
      lose(*index, "it reported a failure: " + err->message);
    else if (err != nullptr)
      log_.error(describe(node.info) + " reported an error: " + err->message);
    else if (!sign_of_life)
      send(node, error_reply(wire::request_id_of(msg), wire::error_code::unsupported,
                             "the scheduler does not take " + std::string{wire::kind_name(msg)} +
                                 " messages"));
  }

  void on_registration(std::uint64_t connection, const reply_sink& sink,
                       const wire::registration& reg) {
    auto reject = [&](wire::reject_reason reason, std::string detail) {
      log_.info("rejected a " + std::string{wire::to_string(reg.node_role)} + " from " +
                reg.host.substr(0, max_host_bytes) + ":" + std::to_string(reg.port) + ": " +
                detail);
      reply(sink, connection,
            wire::admission{reg.request_id, wire::rejected{reason, std::move(detail)}});
    };
    if (phase_ != phase::registering && phase_ != phase::running)
      return reject(wire::reject_reason::shutting_down, "the job is ending");
    if (reg.protocol_version != wire::protocol_version)
      return reject(wire::reject_reason::protocol_version,
                    "the node speaks protocol version " + std::to_string(reg.protocol_version) +
                        ", the scheduler version " + std::to_string(wire::protocol_version));
    if (reg.job_id != options_.job_id)
      return reject(wire::reject_reason::wrong_job, "job id '" + reg.job_id +
                                                        "' is not this scheduler's job '" +
                                                        options_.job_id + "'");
    if (reg.host.size() > max_host_bytes)
      return reply(sink, connection,
                   error_reply(reg.request_id, wire::error_code::invalid_argument,
                               "a host name of " + std::to_string(reg.host.size()) +
                                   " bytes; at most " + std::to_string(max_host_bytes) +
                                   " are allowed"));
    if (auto index = find(connection))
      return reject(wire::reject_reason::duplicate,
                    "this connection is already registered as " + describe(nodes_[*index].info));
    if (reg.node_role == wire::role::scheduler)
      return reject(wire::reject_reason::role_full, "a job has exactly one scheduler");
    if (options_.tls) {
      // The port took the connection only with a certificate from the job's CA, which names
      // the role the node may act in.
      auto certified = certified_.find(connection);
      if (certified == certified_.end())
        return reject(wire::reject_reason::wrong_role,
                      "no TLS certificate is known for this connection");
      if (certified->second != reg.node_role)
        return reject(wire::reject_reason::wrong_role,
                      "it registers as a " + std::string{wire::to_string(reg.node_role)} +
                          ", but its TLS certificate is for a " +
                          std::string{wire::to_string(certified->second)});
    }
    if (reg.recovering && phase_ == phase::running)
      return on_rejoin(connection, sink, reg);
    if (reg.port != 0)
      for (const auto& node : nodes_)
        if (node.info.host == reg.host && node.info.data_port == reg.port)
          return reject(wire::reject_reason::duplicate, reg.host + ":" + std::to_string(reg.port) +
                                                            " is already registered by " +
                                                            describe(node.info));
    const bool server = reg.node_role == wire::role::server;
    std::uint32_t& admitted = server ? servers_admitted_ : workers_admitted_;
    const std::uint32_t wanted = server ? options_.num_servers : options_.num_workers;
    if (admitted == wanted)
      return reject(wire::reject_reason::role_full,
                    "all " + std::to_string(wanted) + (server ? " server" : " worker") +
                        (wanted == 1 ? " rank is" : " ranks are") + " taken");
    const auto session = sessions_.find(connection);
    if (session == sessions_.end())
      return reject(wire::reject_reason::protocol_version, no_key_exchange);

    // ps-lite assigns ranks in arrival order per role, and never reuses one; a node may ask for
    // its rank (troupe-launch numbers its nodes so that its output prefixes are ranks).
    auto taken = [&](std::uint32_t candidate) {
      for (const auto& node : nodes_)
        if (node.info.node_role == reg.node_role && node.info.rank == candidate)
          return true;
      return false;
    };
    std::uint32_t rank = 0;
    if (reg.rank_hint >= 0 && static_cast<std::uint32_t>(reg.rank_hint) < wanted &&
        !taken(static_cast<std::uint32_t>(reg.rank_hint))) {
      rank = static_cast<std::uint32_t>(reg.rank_hint);
    } else {
      while (taken(rank))
        ++rank;
    }
    node_entry entry;
    entry.info = wire::node_info{server ? server_node_id(rank) : worker_node_id(rank),
                                 reg.node_role,
                                 rank,
                                 reg.host,
                                 reg.port,
                                 true};
    auto granted = admitted_as(entry.info, session->second);
    if (!granted)
      return reply(sink, connection, unsealed(reg.request_id));
    ++admitted;
    entry.connection = connection;
    entry.sink = sink;
    entry.last_seen = steady::now();
    send(entry, wire::admission{reg.request_id, std::move(*granted)});
    log_.info("admitted " + describe(entry.info) + " at " + reg.host + ":" +
              std::to_string(reg.port) + "; " +
              count_of(servers_admitted_, options_.num_servers, "server") + " and " +
              count_of(workers_admitted_, options_.num_workers, "worker"));
    by_connection_.emplace(connection, nodes_.size());
    nodes_.push_back(std::move(entry));
    if (servers_admitted_ == options_.num_servers && workers_admitted_ == options_.num_workers)
      start_job();
  }

  /// A server restarted from its checkpoint takes the place of the lost server of its rank: the
  /// same rank and node id, at its new address; every node gets the new table. Only a rank that
  /// waits for it (server_rejoin) is given.
  void on_rejoin(std::uint64_t connection, const reply_sink& sink, const wire::registration& reg) {
    auto reject = [&](std::string detail) {
      log_.info("rejected a recovering server from " + reg.host + ":" + std::to_string(reg.port) +
                ": " + detail);
      reply(sink, connection,
            wire::admission{reg.request_id,
                            wire::rejected{wire::reject_reason::role_full, std::move(detail)}});
    };
    if (reg.node_role != wire::role::server)
      return reject("only a server recovers from a checkpoint, not a " +
                    std::string{wire::to_string(reg.node_role)});
    std::optional<std::size_t> waiting;
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].info.node_role == wire::role::server && reg.rank_hint >= 0 &&
          nodes_[i].info.rank == static_cast<std::uint32_t>(reg.rank_hint))
        waiting = i;
    if (!waiting || !nodes_[*waiting].rejoin_deadline)
      return reject("server rank " + std::to_string(reg.rank_hint) +
                    " is not waiting for a recovering server" +
                    (options_.server_rejoin.count() > 0
                         ? std::string{}
                         : std::string{" (timeouts.server_rejoin is 0)"}));
    const auto session = sessions_.find(connection);
    if (session == sessions_.end())
      return reply(
          sink, connection,
          wire::admission{reg.request_id,
                          wire::rejected{wire::reject_reason::protocol_version, no_key_exchange}});
    if (reg.port != 0)
      for (std::size_t i = 0; i < nodes_.size(); ++i)
        if (i != *waiting && nodes_[i].info.host == reg.host &&
            nodes_[i].info.data_port == reg.port)
          return reply(sink, connection,
                       wire::admission{reg.request_id,
                                       wire::rejected{wire::reject_reason::duplicate,
                                                      reg.host + ":" + std::to_string(reg.port) +
                                                          " is already registered by " +
                                                          describe(nodes_[i].info)}});
    node_entry& node = nodes_[*waiting];
    auto granted = admitted_as(node.info, session->second);
    if (!granted)
      return reply(sink, connection, unsealed(reg.request_id));
    by_connection_.erase(node.connection);
    node.info.host = reg.host;
    node.info.data_port = reg.port;
    node.info.alive = true;
    node.connection = connection;
    node.sink = sink;
    node.last_seen = steady::now();
    node.gone = false;
    node.lost = false;
    node.lost_text.clear();
    node.rejoin_deadline.reset();
    by_connection_.emplace(connection, *waiting);
    send(node, wire::admission{reg.request_id, std::move(*granted)});
    log_.info(describe(node.info) + " rejoined from its checkpoint at " + reg.host + ":" +
              std::to_string(reg.port) + " (" + seconds(since_start()) + " after the job started)");
    ++epoch_;
    send_membership();
  }

  void on_barrier(std::size_t index, const wire::barrier& request) {
    const node_entry& node = nodes_[index];
    auto refuse = [&](wire::error_code code, std::string text) {
      send(node, error_reply(request.request_id, code, std::move(text)));
    };
    if ((request.group & ~wire::group::all) != 0 || request.group == 0)
      return refuse(wire::error_code::invalid_argument,
                    "barrier group " + std::to_string(request.group) +
                        " is not a union of 1 (scheduler), 2 (servers), 4 (workers)");
    if ((request.group & group_bit(node.info.node_role)) == 0)
      return refuse(wire::error_code::invalid_argument, describe(node.info) +
                                                            " is not a member of barrier group " +
                                                            std::to_string(request.group));
    if (request.sender_node_id != node.info.node_id)
      return refuse(wire::error_code::invalid_argument, "barrier sent as node " +
                                                            std::to_string(request.sender_node_id) +
                                                            " by " + describe(node.info));
    // A member that finished will never arrive: fail now rather than let the others time out.
    for (const auto& other : nodes_)
      if ((request.group & group_bit(other.info.node_role)) != 0 && other.finished)
        return refuse(wire::error_code::shutting_down,
                      "barrier " + std::to_string(request.barrier_id) + " on group " +
                          std::to_string(request.group) +
                          " cannot complete: " + describe(other.info) + " has finished");
    log_.debug([&] {
      return describe(node.info) + " at barrier " + std::to_string(request.barrier_id) +
             " of group " + std::to_string(request.group);
    });
    self_->send(barrier_, barrier_arrival{request.group, request.barrier_id,
                                          static_cast<std::uint32_t>(index), node.info.node_role,
                                          request.request_id, node.info.rank, request.values,
                                          node.sink, node.connection});
  }

  void on_command(std::size_t index, const wire::command& cmd) {
    node_entry& node = nodes_[index];
    if (cmd.kind != wire::command_kind::stop)
      return send(node, error_reply(cmd.request_id, wire::error_code::unsupported,
                                    "the scheduler runs no checkpoint commands"));
    if (node.info.node_role != wire::role::worker)
      return send(node,
                  error_reply(cmd.request_id, wire::error_code::invalid_argument,
                              "only workers report done; " + describe(node.info) + " is not one"));
    // Idempotent: a worker that repeats its done gets the same ack.
    if (!node.finished)
      log_.info(describe(node.info) + " is done");
    node.finished = true;
    send(node, wire::ack{cmd.request_id});
    maybe_drain();
  }

  void on_sync_settings(std::size_t index, const wire::sync_settings& settings) {
    const node_entry& node = nodes_[index];
    auto refuse = [&](std::string text) {
      log_.error("refused sync settings: " + text);
      send(node,
           error_reply(settings.request_id, wire::error_code::invalid_argument, std::move(text)));
    };
    if (node.info.node_role != wire::role::worker || node.info.rank != 0)
      return refuse("sync settings come from worker rank 0, not from " + describe(node.info));
    if (settings.quorum == 0 || settings.quorum > options_.num_workers)
      return refuse("a quorum of " + std::to_string(settings.quorum) + " is outside 1.." +
                    std::to_string(options_.num_workers) + " (the job's workers)");
    if (lost_workers_.size() > options_.num_workers - settings.quorum)
      return refuse("a quorum of " + std::to_string(settings.quorum) + " with " +
                    std::to_string(lost_workers_.size()) + " workers already lost");
    quorum_ = settings.quorum;
    log_.info("the job's quorum is " + count_of(quorum_, options_.num_workers, "worker") +
              (quorum_ < options_.num_workers
                   ? ": it survives the loss of " + std::to_string(options_.num_workers - quorum_)
                   : std::string{": any lost worker fails it"}));
    send(node, wire::ack{settings.request_id});
  }

  void on_closed(std::uint64_t connection) {
    certified_.erase(connection);
    sessions_.erase(connection);
    auto index = find(connection);
    if (!index) {
      log_.debug("a connection that never registered closed");
      return;
    }
    node_entry& node = nodes_[*index];
    node.gone = true;
    if (phase_ == phase::done || phase_ == phase::failed || node.lost)
      return;
    if (node.finished) {
      log_.info(describe(node.info) + " left");
      maybe_finish();
      return;
    }
    lose(*index, "its control connection closed");
  }

  // --- lifecycle -----------------------------------------------------------------------------

  void start_job() {
    phase_ = phase::running;
    epoch_ = 1;
    send_membership();
    log_.info("every node registered: membership sent, the job runs");
    maybe_drain(); // workers may have said done before the last node registered
  }

  /// The whole table as it is now, to every node still connected and not lost.
  void send_membership() {
    wire::membership table;
    table.epoch = epoch_;
    table.num_workers = options_.num_workers;
    table.num_servers = options_.num_servers;
    table.nodes.push_back(
        wire::node_info{scheduler_node_id, wire::role::scheduler, 0, options_.host, 0, true});
    for (const auto& node : nodes_)
      table.nodes.push_back(node.info);
    std::sort(table.nodes.begin(), table.nodes.end(),
              [](const auto& a, const auto& b) { return a.node_id < b.node_id; });
    table.key_ranges = membership_key_ranges(options_.num_servers);
    for (const auto& node : nodes_)
      if (!node.gone && !node.lost)
        send(node, table);
  }

  /// When every live worker is done: tell the servers to stop (ps-lite's kStopServer), then
  /// wait (bounded) for them to leave.
  void maybe_drain() {
    if (phase_ != phase::running)
      return;
    for (const auto& node : nodes_)
      if (node.info.node_role == wire::role::worker && !node.finished && !node.lost)
        return;
    phase_ = phase::draining;
    drain_deadline_ = steady::now() + options_.drain_timeout;
    log_.info("every live worker is done: stopping the servers");
    for (auto& node : nodes_)
      if (node.info.node_role == wire::role::server && !node.gone) {
        node.finished = true;
        send(node, wire::command{++next_request_id_, wire::command_kind::stop, {}});
      }
    maybe_finish();
  }

  void maybe_finish() {
    if (phase_ != phase::draining)
      return;
    for (const auto& node : nodes_)
      if (node.info.node_role == wire::role::server && !node.gone)
        return;
    finish(std::nullopt);
  }

  /// Heartbeats, silent nodes and the start-up and drain deadlines, every heartbeat_interval.
  void on_tick() {
    if (phase_ == phase::done || phase_ == phase::failed)
      return;
    const auto now = steady::now();
    if (phase_ == phase::registering && now - started_ >= options_.startup_timeout)
      return on_startup_timeout();
    if (phase_ == phase::draining && now >= drain_deadline_)
      return on_drain_timeout();
    for (auto& node : nodes_)
      if (node.rejoin_deadline && now >= *node.rejoin_deadline) {
        node.rejoin_deadline.reset();
        const std::string text = node.lost_text + "; it did not rejoin within " +
                                 format_duration(options_.server_rejoin) +
                                 " (timeouts.server_rejoin)";
        node.lost_text = text;
        log_.error(text);
        broadcast(error_reply(0, wire::error_code::lost_peer, text));
        return finish(error{errc::peer_lost, text});
      }
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const auto& node = nodes_[i];
      if (node.gone || node.finished || node.lost)
        continue;
      const auto silent = std::chrono::duration_cast<milliseconds>(now - node.last_seen);
      if (silent > options_.peer_timeout) {
        lose(i, "nothing heard from it for " + format_duration(silent) + " (peer timeout " +
                    format_duration(options_.peer_timeout) + ")");
        if (phase_ == phase::done || phase_ == phase::failed)
          return; // the loss failed the job, or let it end
      }
    }
    const wire::message beat = wire::heartbeat{
        scheduler_node_id, ++heartbeat_sequence_,
        std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count()};
    for (const auto& node : nodes_)
      if (!node.gone && !node.lost)
        send(node, beat);
    self_->delayed_send(self_, options_.heartbeat_interval, tick_atom::value);
  }

  void on_startup_timeout() {
    const std::string text = count_of(servers_admitted_, options_.num_servers, "server") + " and " +
                             count_of(workers_admitted_, options_.num_workers, "worker") +
                             " registered after " + format_duration(options_.startup_timeout);
    log_.error("the job did not start: " + text);
    broadcast(error_reply(0, wire::error_code::timeout, text));
    finish(error{errc::timeout, text});
  }

  void on_drain_timeout() {
    std::string late;
    for (const auto& node : nodes_)
      if (node.info.node_role == wire::role::server && !node.gone)
        late += (late.empty() ? "" : ", ") + describe(node.info);
    log_.error(late + " had not left " + format_duration(options_.drain_timeout) +
               " after the stop command; ending the job anyway");
    finish(std::nullopt);
  }

  /// A node is lost. A worker within the quorum: the job goes on without it. Otherwise every
  /// node still connected learns who, and the job fails. The lost node itself hears it too when
  /// it is still there: a frozen process that wakes up learns it was dropped, not that the
  /// scheduler vanished.
  void lose(std::size_t index, const std::string& why) {
    node_entry& node = nodes_[index];
    node.lost = true;
    node.info.alive = false;
    node.lost_text = describe(node.info) + " was lost: " + why;
    const auto after = since_start();
    const bool worker = node.info.node_role == wire::role::worker;
    if (worker)
      lost_workers_.push_back(lost_worker{node.info.rank, node.info.node_id, after, why});
    const std::size_t tolerated = options_.num_workers - quorum_;
    if (!worker && phase_ == phase::running && options_.server_rejoin.count() > 0) {
      // Its rank stays open for a server restarted from its checkpoint; the workers hold their
      // calls to it, and barriers wait, until it rejoins or the time is up.
      node.rejoin_deadline = steady::now() + options_.server_rejoin;
      log_.error(node.lost_text + " (" + seconds(after) +
                 " after the job started); waiting up to " +
                 format_duration(options_.server_rejoin) + " for it to rejoin from its checkpoint");
      ++epoch_;
      send_membership();
      return;
    }
    if (!worker || phase_ != phase::running || lost_workers_.size() > tolerated) {
      log_.error(node.lost_text + " (" + seconds(after) + " after the job started)");
      broadcast(error_reply(0, wire::error_code::lost_peer, node.lost_text));
      return finish(error{errc::peer_lost, node.lost_text});
    }
    log_.error(node.lost_text + " (" + seconds(after) + " after the job started); the job goes on" +
               " with " +
               count_of(options_.num_workers - lost_count(), options_.num_workers, "worker") +
               " (quorum " + std::to_string(quorum_) + ")");
    if (!node.gone)
      send(node, error_reply(0, wire::error_code::lost_peer,
                             node.lost_text + "; the job goes on without it"));
    self_->send(barrier_,
                barrier_member_lost{static_cast<std::uint32_t>(index), node.info.node_role});
    ++epoch_;
    send_membership();
    maybe_drain();
  }

  /// Ends the job: no failure means the workers finished (some perhaps lost within the quorum).
  void finish(std::optional<error> failure) {
    job_outcome outcome;
    outcome.end = failure                 ? job_end::failed
                  : lost_workers_.empty() ? job_end::finished
                                          : job_end::finished_with_losses;
    outcome.failure = std::move(failure);
    outcome.lost_workers = lost_workers_;
    for (const auto& node : nodes_)
      if (node.info.node_role == wire::role::worker && node.finished)
        ++outcome.workers_finished;
    outcome.summary = summary(outcome);
    phase_ = outcome.failure ? phase::failed : phase::done;
    log_.log(outcome.end == job_end::finished ? log_level::info : log_level::error,
             outcome.summary);
    const bool success = !outcome.failure;
    outcome_.deliver(std::move(outcome));
    if (success)
      self_->quit();
    else
      self_->quit(caf::exit_reason::user_shutdown);
  }

  /// One line: how the job ended, the workers finished and lost, who, when and why.
  std::string summary(const job_outcome& outcome) const {
    std::string line = "summary: ";
    if (outcome.failure)
      line += "the job failed (" + outcome.failure->message() + "); ";
    else
      line += "the job finished; ";
    line += count_of(outcome.workers_finished, options_.num_workers, "worker") + " finished";
    std::string ranks;
    for (const auto& node : nodes_)
      if (node.info.node_role == wire::role::worker && node.finished)
        ranks += (ranks.empty() ? "" : ", ") + std::to_string(node.info.rank);
    if (!ranks.empty())
      line += " (rank " + ranks + ")";
    line += "; " + std::to_string(outcome.lost_workers.size()) + " lost";
    if (outcome.lost_workers.empty())
      return line;
    line += " (quorum " + std::to_string(quorum_) + ")";
    for (std::size_t i = 0; i < outcome.lost_workers.size(); ++i) {
      const auto& lost = outcome.lost_workers[i];
      line += (i == 0 ? ": " : "; ") + wire::describe(wire::role::worker, lost.rank, lost.node_id) +
              " " + seconds(lost.after) + " after the job started: " + lost.why;
    }
    return line;
  }

  // --- sending -------------------------------------------------------------------------------

  /// Why a node whose control connection made no key exchange is not admitted.
  static constexpr const char* no_key_exchange =
      "its control connection made no key exchange, so its node secret cannot be sealed for it "
      "(a troupe build older than this scheduler?)";

  /// The admission of `node`: its rank, node id and own secret sealed under its control
  /// connection's session key (a worker's node key, a server's job secret); nullopt, logged, when
  /// the secret cannot be sealed (OpenSSL or the kernel's random bytes failed).
  std::optional<wire::admitted> admitted_as(const wire::node_info& node,
                                            const session_key& session) const {
    const wire::node_identity who{node.node_role, node.rank};
    try {
      const auto secret = node.node_role == wire::role::server
                              ? options_.secret.reveal()
                              : derive_node_key(token_, options_.secret, who).reveal();
      return wire::admitted{node.rank, node.node_id,
                            seal_secret(session, secret, who, node.node_id)};
    } catch (const std::exception& e) {
      log_.error("cannot seal the secret of " + describe(node) + ": " + e.what());
      return std::nullopt;
    }
  }

  /// The answer to a registration whose admission could not be sealed.
  static wire::message unsealed(std::uint64_t request_id) {
    return error_reply(request_id, wire::error_code::internal,
                       "the scheduler could not seal this node's secret (see its log)");
  }

  static wire::message error_reply(std::uint64_t request_id, wire::error_code code,
                                   std::string text) {
    return wire::error_reply{request_id, std::nullopt, code, std::move(text)};
  }

  void reply(const reply_sink& sink, std::uint64_t connection, wire::message msg) {
    if (sink)
      self_->send(sink, envelope{std::move(msg), nullptr, connection});
  }

  void send(const node_entry& node, wire::message msg) {
    reply(node.sink, node.connection, std::move(msg));
  }

  /// To every admitted node still connected.
  void broadcast(const wire::message& msg) {
    for (const auto& node : nodes_)
      if (!node.gone)
        send(node, msg);
  }

  // --- lookups -------------------------------------------------------------------------------

  std::optional<std::size_t> find(std::uint64_t connection) const {
    auto found = by_connection_.find(connection);
    if (found == by_connection_.end())
      return std::nullopt;
    return found->second;
  }

  std::string who(std::optional<std::size_t> index) const {
    return index ? describe(nodes_[*index].info) : std::string{"an unregistered connection"};
  }

  std::uint32_t lost_count() const { return static_cast<std::uint32_t>(lost_workers_.size()); }

  milliseconds since_start() const {
    return std::chrono::duration_cast<milliseconds>(steady::now() - started_);
  }

  scheduler_pointer self_ = nullptr;
  scheduler_options options_;
  completion<job_outcome> outcome_;
  logger log_;
  barrier_actor barrier_;
  phase phase_ = phase::registering;
  /// Admitted nodes in arrival order; never shrinks (a gone node keeps its rank and index).
  std::vector<node_entry> nodes_;
  std::unordered_map<std::uint64_t, std::size_t> by_connection_;
  /// Under TLS: the role each open control connection's certificate names.
  std::unordered_map<std::uint64_t, wire::role> certified_;
  /// The session key of each open control connection (its handshake's key exchange).
  std::unordered_map<std::uint64_t, session_key> sessions_;
  /// The job token, which node keys derive from with options_.secret.
  link_secret token_;
  std::uint32_t servers_admitted_ = 0;
  std::uint32_t workers_admitted_ = 0;
  /// Live workers the job needs (worker rank 0's sync settings; num_workers until then).
  std::uint32_t quorum_ = 1;
  std::vector<lost_worker> lost_workers_;
  std::uint64_t epoch_ = 0;
  std::uint64_t next_request_id_ = 0;
  std::uint64_t heartbeat_sequence_ = 0;
  steady::time_point started_;
  steady::time_point drain_deadline_;
};

scheduler_actor::behavior_type
scheduler_behavior(scheduler_actor::stateful_pointer<scheduler_state> self,
                   scheduler_options options, completion<job_outcome> outcome) {
  return self->state.start(self, std::move(options), std::move(outcome));
}

} // namespace

result<scheduler_handle> spawn_scheduler(caf::actor_system& sys, scheduler_options options) {
  auto invalid = [](std::string text) { return error{errc::invalid_argument, std::move(text)}; };
  if (!sys.has_middleman())
    return invalid("spawn_scheduler needs an actor system with the io::middleman loaded");
  if (options.num_workers == 0 || options.num_workers > max_nodes_per_role)
    return invalid("num_workers must be in [1, " + std::to_string(max_nodes_per_role) + "], not " +
                   std::to_string(options.num_workers));
  if (options.num_servers == 0 || options.num_servers > max_nodes_per_role)
    return invalid("num_servers must be in [1, " + std::to_string(max_nodes_per_role) + "], not " +
                   std::to_string(options.num_servers));
  if (options.job_id.empty())
    return invalid("job_id must not be empty");
  if (options.host.empty())
    return invalid("host must not be empty");
  if (options.secret.empty()) {
    try {
      options.secret = fresh_job_secret();
    } catch (const std::exception& e) {
      return error{errc::io_error,
                   std::string("the scheduler cannot draw its job secret: ") + e.what()};
    }
  }
  for (const auto& [value, field] : {std::pair{options.startup_timeout, "startup_timeout"},
                                     std::pair{options.peer_timeout, "peer_timeout"},
                                     std::pair{options.heartbeat_interval, "heartbeat_interval"},
                                     std::pair{options.drain_timeout, "drain_timeout"}})
    if (value <= milliseconds{0})
      return invalid(std::string{field} + " must be positive, not " +
                     std::to_string(value.count()) + " ms");

  completion<job_outcome> outcome;
  const std::string host = options.bind.empty() ? options.host : options.bind;
  const std::uint16_t port = options.port;
  data_server_options listening;
  listening.tuning =
      control_link_tuning(scheduler_frame_bytes(options.num_servers + options.num_workers),
                          options.log.part("control port"), link_secret(options.auth_token),
                          {options.tls, {node_role::server, node_role::worker}});
  auto actor = sys.spawn(scheduler_behavior, std::move(options), outcome);
  // An exit the scheduler did not choose (its host's stop(), the system shutting down).
  actor->attach_functor([outcome, &sys](const caf::error& reason) {
    job_outcome stopped;
    stopped.failure = error{errc::peer_lost, "the scheduler stopped before the job ended (" +
                                                 sys.render(reason) + ")"};
    stopped.summary = "summary: " + stopped.failure->message();
    outcome.deliver(std::move(stopped));
  });
  // The broker holds the scheduler weakly: the scheduler's exit stops the broker (below), and a
  // strong handle each way would keep both alive forever.
  listening.route = [scheduler = actor.address()](const envelope&) {
    return caf::actor_cast<request_handler>(scheduler);
  };
  listening.on_disconnect = [scheduler = actor.address()](std::uint64_t connection) {
    if (auto target = caf::actor_cast<caf::actor>(scheduler))
      caf::anon_send(target, closed_atom::value, connection);
  };
  listening.on_certified = [scheduler = actor.address()](std::uint64_t connection, node_role role) {
    if (auto target = caf::actor_cast<caf::actor>(scheduler))
      caf::anon_send(target, certified_peer{connection, to_wire(role)});
  };
  listening.on_authenticated = [scheduler = actor.address()](std::uint64_t connection,
                                                             const link_authentication& what) {
    if (auto target = caf::actor_cast<caf::actor>(scheduler))
      caf::anon_send(target, authenticated_peer{connection, what});
  };
  auto server = spawn_data_server(sys, host, port, std::move(listening));
  if (!server) {
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    return error{errc::io_error, "the scheduler cannot listen: " + server.error().message()};
  }
  // Close the port when the job ends, so that a late node is refused rather than admitted into
  // nothing. The broker handles the scheduler's last frames (stop commands, the failure notice)
  // before this stop, which comes after them in its mailbox.
  actor->attach_functor([broker = server->broker] { caf::anon_send(broker, stop_atom::value); });
  return scheduler_handle{std::move(actor), server->port, std::move(outcome)};
}

} // namespace troupe
