#include "actors/logic/scheduler_core.hpp"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "actors/config/config.hpp"
#include "actors/logic/key_placement.hpp"
#include "actors/logic/node_identity.hpp"

namespace troupe {

std::vector<wire::key_range> membership_key_ranges(std::uint32_t num_servers,
                                                   std::uint32_t num_ranges) {
  if (num_servers == 0)
    throw exception(errc::invalid_argument, "membership_key_ranges needs at least one server");
  num_ranges = std::max(num_ranges, num_servers);
  std::vector<wire::key_range> ranges;
  ranges.reserve(num_ranges);
  std::uint32_t index = 0;
  for (const auto& range : server_key_ranges(num_ranges))
    ranges.push_back(wire::key_range{range.begin, range.end, index++ % num_servers, 0});
  return ranges;
}

status job_outcome::as_status() const {
  if (end != job_end::failed)
    return ok();
  return failure.value_or(error{errc::internal, "the job failed without a reason"});
}

namespace {

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

/// Why a node whose control connection made no key exchange is not admitted.
constexpr const char* no_key_exchange =
    "its control connection made no key exchange, so its node secret cannot be sealed for it "
    "(a troupe build older than this scheduler?)";

wire::message error_reply(std::uint64_t request_id, wire::error_code code, std::string text) {
  return wire::error_reply{request_id, std::nullopt, code, std::move(text)};
}

/// The answer to a registration whose admission could not be sealed.
wire::message unsealed(std::uint64_t request_id) {
  return error_reply(request_id, wire::error_code::internal,
                     "the scheduler could not seal this node's secret (see its log)");
}

} // namespace

scheduler_core::scheduler_core(scheduler_options options, clock::time_point now)
    : options_(std::move(options)), log_(options_.log), now_(now),
      token_(link_secret(options_.auth_token)), started_(now) {
  quorum_ = options_.quorum == 0 || options_.quorum > options_.num_workers ? options_.num_workers
                                                                           : options_.quorum;
  for (const auto& range : membership_key_ranges(options_.num_servers, options_.max_servers))
    range_owner_.push_back(range.server_rank);
  log_.info("waiting for " + count_of(0, options_.num_servers, "server") + " and " +
            count_of(0, options_.num_workers, "worker"));
}

void scheduler_core::on_authenticated(std::uint64_t connection, session_key session) {
  if (!session.empty())
    sessions_[connection] = std::move(session);
}

void scheduler_core::on_certified(std::uint64_t connection, wire::role role) {
  certified_[connection] = role;
}

// --- incoming frames -----------------------------------------------------------------------------

scheduler_core::actions scheduler_core::on_frame(std::uint64_t connection, const wire::message& msg,
                                                 clock::time_point now) {
  now_ = now;
  if (ended())
    return {};
  const auto index = find(connection);
  log_.debug([&] { return std::string{wire::kind_name(msg)} + " from " + who(index); });
  if (index)
    nodes_[*index].last_seen = now_;
  if (const auto* reg = std::get_if<wire::registration>(&msg)) {
    on_registration(connection, *reg);
    return take();
  }
  if (!index) {
    reply(connection, error_reply(wire::request_id_of(msg), wire::error_code::not_admitted,
                                  "a " + std::string{wire::kind_name(msg)} +
                                      " on a connection that has not registered"));
    return take();
  }
  node_entry& node = nodes_[*index];
  const bool sign_of_life = std::holds_alternative<wire::heartbeat>(msg) ||
                            std::holds_alternative<wire::ack>(msg) ||
                            std::holds_alternative<wire::error_reply>(msg);
  if (node.lost) {
    if (!sign_of_life)
      send(node,
           error_reply(wire::request_id_of(msg), wire::error_code::lost_peer, node.lost_text));
    return take();
  }
  if (const auto* request = std::get_if<wire::barrier>(&msg))
    on_barrier(*index, *request);
  else if (const auto* cmd = std::get_if<wire::command>(&msg))
    on_command(*index, *cmd);
  else if (const auto* settings = std::get_if<wire::sync_settings>(&msg))
    on_sync_settings(*index, *settings);
  else if (const auto* acked = std::get_if<wire::ack>(&msg);
           acked && moving_.contains(acked->request_id))
    on_hand_over_answer(*index, acked->request_id, nullptr);
  else if (acked != nullptr)
    on_table_ack(*index, acked->request_id);
  else if (const auto* refused = std::get_if<wire::error_reply>(&msg);
           refused != nullptr && refused->request_id != 0 && moving_.contains(refused->request_id))
    on_hand_over_answer(*index, refused->request_id, refused);
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
  return take();
}

void scheduler_core::on_registration(std::uint64_t connection, const wire::registration& reg) {
  auto reject = [&](wire::reject_reason reason, std::string detail) {
    log_.info("rejected a " + std::string{wire::to_string(reg.node_role)} + " from " +
              reg.host.substr(0, max_host_bytes) + ":" + std::to_string(reg.port) + ": " + detail);
    reply(connection, wire::admission{reg.request_id, wire::rejected{reason, std::move(detail)}});
  };
  if (phase_ != scheduler_phase::registering && phase_ != scheduler_phase::running)
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
    return reply(connection, error_reply(reg.request_id, wire::error_code::invalid_argument,
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
  if (reg.recovering && phase_ == scheduler_phase::running)
    return on_rejoin(connection, reg);
  if (reg.port != 0)
    for (const auto& node : nodes_)
      if (node.info.host == reg.host && node.info.data_port == reg.port)
        return reject(wire::reject_reason::duplicate, reg.host + ":" + std::to_string(reg.port) +
                                                          " is already registered by " +
                                                          describe(node.info));
  const bool server = reg.node_role == wire::role::server;
  std::uint32_t& admitted = server ? servers_admitted_ : workers_admitted_;
  // A node that comes while the job runs joins it, while the job has ranks to give.
  const bool joins = phase_ == scheduler_phase::running;
  const std::uint32_t wanted = server ? (joins ? server_capacity() : options_.num_servers)
                                      : (joins ? worker_capacity() : options_.num_workers);
  if (admitted == wanted)
    return reject(
        wire::reject_reason::role_full,
        "all " + std::to_string(wanted) + (server ? " server" : " worker") +
            (wanted == 1 ? " rank is" : " ranks are") + " taken" +
            (server  ? (joins ? std::string{" (job.max_servers " + std::to_string(wanted) + ")"}
                              : std::string{})
             : joins ? std::string{" (job.max_workers " + std::to_string(wanted) + ")"}
             : worker_capacity() > options_.num_workers
                 ? std::string{"; a worker beyond job.num_workers joins only once the "
                               "job runs"}
                 : std::string{}));
  const auto session = sessions_.find(connection);
  if (session == sessions_.end())
    return reject(wire::reject_reason::protocol_version, no_key_exchange);

  const std::uint32_t rank = next_rank(reg.node_role, reg.rank_hint, wanted);
  node_entry entry;
  entry.info = wire::node_info{server ? server_node_id(rank) : worker_node_id(rank),
                               reg.node_role,
                               rank,
                               reg.host,
                               reg.port,
                               true};
  auto granted = admitted_as(entry.info, session->second);
  if (!granted)
    return reply(connection, unsealed(reg.request_id));
  ++admitted;
  entry.connection = connection;
  entry.last_seen = now_;
  if (joins && !server) {
    // Its barriers start where no member has been yet: those under way do not wait for it.
    granted->joined = true;
    for (const auto reached : barrier_reached_)
      granted->first_barrier.push_back(reached + 1);
    entry.waits_at_barrier = reg.join_at_barrier;
  }
  const auto first_barrier = granted->first_barrier;
  send(entry, wire::admission{reg.request_id, std::move(*granted)});
  const auto index = nodes_.size();
  by_connection_.emplace(connection, index);
  nodes_.push_back(std::move(entry));
  const auto& node = nodes_.back();
  if (node.waits_at_barrier) {
    pending_.emplace_back(
        barrier_member_joined{static_cast<std::uint32_t>(index), first_barrier, true});
    log_.info(describe(node.info) + " was admitted from " + reg.host + " (" +
              seconds(since_start()) +
              " after the job started) to join at the workers' next barrier; until then no "
              "table lists it");
    return;
  }
  if (joins && server) {
    log_.info(describe(node.info) + " joined the running job from " + reg.host + ":" +
              std::to_string(reg.port) + " (" + seconds(since_start()) +
              " after it started); key ranges move to it at their round boundaries");
    ++epoch_;
    server_changes_.push_back(
        server_change{node.info.rank, node.info.node_id, true, since_start(), epoch_});
    send_membership();
    rebalance();
    return;
  }
  if (joins) {
    joined_workers_.push_back(joined_worker{node.info.rank, node.info.node_id, since_start()});
    pending_.emplace_back(barrier_member_joined{static_cast<std::uint32_t>(index), first_barrier});
    log_.info(describe(node.info) + " joined the running job from " + reg.host +
              (reg.port != 0 ? ":" + std::to_string(reg.port) : std::string{}) + " (" +
              seconds(since_start()) + " after it started); the job goes on with " +
              count_of(workers_in(), worker_capacity(), "worker rank") +
              " in use; the servers hear of it first");
    ++epoch_;
    send_membership();
    return;
  }
  log_.info("admitted " + describe(node.info) + " at " + reg.host + ":" + std::to_string(reg.port) +
            "; " + count_of(servers_admitted_, options_.num_servers, "server") + " and " +
            count_of(workers_admitted_, options_.num_workers, "worker"));
  if (servers_admitted_ == options_.num_servers && workers_admitted_ == options_.num_workers)
    start_job();
}

std::uint32_t scheduler_core::next_rank(wire::role node_role, std::int32_t rank_hint,
                                        std::uint32_t wanted) const {
  // ps-lite assigns ranks in arrival order per role, and never reuses one; a node may ask for
  // its rank (troupe-launch numbers its nodes so that its output prefixes are ranks).
  auto taken = [&](std::uint32_t candidate) {
    for (const auto& node : nodes_)
      if (node.info.node_role == node_role && node.info.rank == candidate)
        return true;
    return false;
  };
  if (rank_hint >= 0 && static_cast<std::uint32_t>(rank_hint) < wanted &&
      !taken(static_cast<std::uint32_t>(rank_hint)))
    return static_cast<std::uint32_t>(rank_hint);
  std::uint32_t rank = 0;
  while (taken(rank))
    ++rank;
  return rank;
}

/// A server restarted from its checkpoint takes the place of the lost server of its rank: the
/// same rank and node id, at its new address; every node gets the new table. Only a rank that
/// waits for it (server_rejoin) is given.
void scheduler_core::on_rejoin(std::uint64_t connection, const wire::registration& reg) {
  auto reject = [&](wire::reject_reason reason, std::string detail) {
    log_.info("rejected a recovering server from " + reg.host + ":" + std::to_string(reg.port) +
              ": " + detail);
    reply(connection, wire::admission{reg.request_id, wire::rejected{reason, std::move(detail)}});
  };
  if (reg.node_role != wire::role::server)
    return reject(wire::reject_reason::role_full,
                  "only a server recovers from a checkpoint, not a " +
                      std::string{wire::to_string(reg.node_role)});
  std::optional<std::size_t> waiting;
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].info.node_role == wire::role::server && reg.rank_hint >= 0 &&
        nodes_[i].info.rank == static_cast<std::uint32_t>(reg.rank_hint))
      waiting = i;
  if (!waiting || !nodes_[*waiting].rejoin_deadline)
    return reject(
        wire::reject_reason::role_full,
        "server rank " + std::to_string(reg.rank_hint) + " is not waiting for a recovering server" +
            (options_.server_rejoin.count() > 0 ? std::string{}
                                                : std::string{" (timeouts.server_rejoin is 0)"}));
  const auto session = sessions_.find(connection);
  if (session == sessions_.end())
    return reply(connection, wire::admission{reg.request_id,
                                             wire::rejected{wire::reject_reason::protocol_version,
                                                            no_key_exchange}});
  if (reg.port != 0)
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (i != *waiting && nodes_[i].info.host == reg.host && nodes_[i].info.data_port == reg.port)
        return reply(connection,
                     wire::admission{reg.request_id,
                                     wire::rejected{wire::reject_reason::duplicate,
                                                    reg.host + ":" + std::to_string(reg.port) +
                                                        " is already registered by " +
                                                        describe(nodes_[i].info)}});
  node_entry& node = nodes_[*waiting];
  auto granted = admitted_as(node.info, session->second);
  if (!granted)
    return reply(connection, unsealed(reg.request_id));
  by_connection_.erase(node.connection);
  node.info.host = reg.host;
  node.info.data_port = reg.port;
  node.info.alive = true;
  node.connection = connection;
  node.last_seen = now_;
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

void scheduler_core::on_barrier(std::size_t index, const wire::barrier& request) {
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
  // A server that finished will never arrive: fail now rather than let the others time out. (A
  // worker that finished left the job, and barriers no longer wait for it.)
  for (const auto& other : nodes_)
    if ((request.group & group_bit(other.info.node_role)) != 0 && other.finished &&
        !other.info.left)
      return refuse(wire::error_code::shutting_down,
                    "barrier " + std::to_string(request.barrier_id) + " on group " +
                        std::to_string(request.group) +
                        " cannot complete: " + describe(other.info) + " has finished");
  log_.debug([&] {
    return describe(node.info) + " at barrier " + std::to_string(request.barrier_id) +
           " of group " + std::to_string(request.group);
  });
  if (node.waits_at_barrier) {
    // Its one arrival waits for the workers' next barrier (whatever id that has).
    nodes_[index].join_request = request.request_id;
    log_.info(describe(node.info) + " waits to join at the workers' next barrier");
  } else {
    auto& reached = barrier_reached_[request.group];
    reached = std::max(reached, request.barrier_id);
  }
  pending_.emplace_back(barrier_entry{
      request.group, request.barrier_id, static_cast<std::uint32_t>(index), node.info.node_role,
      request.request_id, node.info.rank, request.values, node.connection, request.start});
}

void scheduler_core::on_command(std::size_t index, const wire::command& cmd) {
  node_entry& node = nodes_[index];
  if (cmd.kind != wire::command_kind::stop)
    return send(node, error_reply(cmd.request_id, wire::error_code::unsupported,
                                  "the scheduler runs no checkpoint commands"));
  if (node.info.node_role == wire::role::server)
    return on_server_leave(index, cmd);
  if (node.info.node_role != wire::role::worker)
    return send(node,
                error_reply(cmd.request_id, wire::error_code::invalid_argument,
                            "only workers report done; " + describe(node.info) + " is not one"));
  // Idempotent: a worker that repeats its done gets the same ack.
  const bool leaves = !node.finished && !node.lost;
  if (leaves)
    node.rounds = cmd.rounds;
  node.finished = true;
  send(node, wire::ack{cmd.request_id});
  if (!leaves)
    return;
  log_.info(describe(node.info) + " is done");
  if (phase_ == scheduler_phase::registering) {
    leave(index); // the first table lists it left
    return;
  }
  // It leaves the job: the others go on without it. Every request of it was answered before it
  // said done, so the servers know its last push of each key when this table reaches them.
  maybe_drain();
  if (phase_ != scheduler_phase::running)
    return; // it was the last: the servers are told to stop instead
  leave(index);
  std::uint32_t still_in = 0;
  for (const auto& other : nodes_)
    still_in += other.info.node_role == wire::role::worker && !other.finished && !other.lost;
  log_.info(describe(node.info) + " left the job after " + std::to_string(node.rounds) +
            " rounds, " + seconds(since_start()) + " after it started; the job goes on with " +
            std::to_string(still_in) + (still_in == 1 ? " worker" : " workers"));
  ++epoch_;
  send_membership();
}

void scheduler_core::on_sync_settings(std::size_t index, const wire::sync_settings& settings) {
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

scheduler_core::actions scheduler_core::on_closed(std::uint64_t connection, clock::time_point now) {
  now_ = now;
  certified_.erase(connection);
  sessions_.erase(connection);
  auto index = find(connection);
  if (!index) {
    log_.debug("a connection that never registered closed");
    return {};
  }
  node_entry& node = nodes_[*index];
  node.gone = true;
  if (ended() || node.lost)
    return {};
  if (node.finished) {
    log_.info(describe(node.info) + " left");
    maybe_finish();
    return take();
  }
  lose(*index, "its control connection closed");
  return take();
}

// --- lifecycle -----------------------------------------------------------------------------------

void scheduler_core::start_job() {
  phase_ = scheduler_phase::running;
  epoch_ = 1;
  workers_announced_ = workers_admitted_;
  send_membership();
  log_.info("every node registered: membership sent, the job runs");
  maybe_drain(); // workers may have said done before the last node registered
}

void scheduler_core::rebalance() {
  if (phase_ != scheduler_phase::running || !moving_.empty())
    return;
  std::vector<std::uint32_t> servers;
  for (const auto& node : nodes_)
    if (node.info.node_role == wire::role::server && !node.gone && !node.lost && !node.finished &&
        !node.leaving)
      servers.push_back(node.info.rank);
  if (servers.empty())
    return;
  // As few moves as give every server its share, R / n ranges or one more: the servers that hold
  // the most now keep the larger shares, each keeps its ranges up to its share, and the rest
  // (a leaver's, a server's beyond its share) go to the servers below theirs, in rank order.
  std::map<std::uint32_t, std::uint32_t> held;
  for (const auto owner : range_owner_)
    ++held[owner];
  std::sort(servers.begin(), servers.end(), [&](std::uint32_t a, std::uint32_t b) {
    return held[a] != held[b] ? held[a] > held[b] : a < b;
  });
  const auto ranges = static_cast<std::uint32_t>(range_owner_.size());
  const auto n = static_cast<std::uint32_t>(servers.size());
  std::map<std::uint32_t, std::uint32_t> share, kept;
  for (std::uint32_t i = 0; i < n; ++i)
    share[servers[i]] = ranges / n + (i < ranges % n ? 1 : 0);
  std::sort(servers.begin(), servers.end());
  std::vector<std::uint32_t> unplaced;
  for (std::uint32_t r = 0; r < ranges; ++r) {
    const auto owner = range_owner_[r];
    if (share.contains(owner) && kept[owner] < share[owner])
      ++kept[owner];
    else
      unplaced.push_back(r);
  }
  // Per giving server, per receiving server, the ranges.
  std::map<std::uint32_t, std::map<std::uint32_t, std::vector<std::uint32_t>>> moves;
  auto receiver = servers.begin();
  for (const auto r : unplaced) {
    while (kept[*receiver] >= share[*receiver])
      ++receiver;
    ++kept[*receiver];
    moves[range_owner_[r]][*receiver].push_back(r);
  }
  for (const auto& [from, to_ranges] : moves) {
    const auto giver = std::find_if(nodes_.begin(), nodes_.end(), [from = from](const auto& n) {
      return n.info.node_role == wire::role::server && n.info.rank == from;
    });
    if (giver == nodes_.end() || giver->gone || giver->lost)
      continue; // its ranges wait for its recovery (server_rejoin) or the job fails
    for (const auto& [to, ranges] : to_ranges) {
      const auto id = ++next_request_id_;
      moving_[id] = range_hand_over{from, to, ranges};
      std::string names;
      for (auto r : ranges)
        names += (names.empty() ? "" : ",") + std::to_string(r);
      log_.info("key ranges " + names + " move from " + describe(giver->info) + " to server " +
                std::to_string(to));
      send(*giver, wire::hand_over{id, ranges, to});
    }
  }
}

void scheduler_core::on_hand_over_answer(std::size_t index, std::uint64_t request_id,
                                         const wire::error_reply* refusal) {
  auto found = moving_.find(request_id);
  const auto move = found->second;
  if (nodes_[index].info.node_role != wire::role::server || nodes_[index].info.rank != move.from)
    return; // only the server asked answers
  moving_.erase(found);
  if (refusal != nullptr)
    return finish(error{errc::peer_lost, describe(nodes_[index].info) +
                                             " could not hand key ranges over to server " +
                                             std::to_string(move.to) + ": " + refusal->message});
  for (auto r : move.ranges)
    range_owner_[r] = move.to;
  if (!moving_.empty())
    return;
  // Every move is done: the workers send the ranges' requests to their new servers from this
  // table on (the old ones refuse them as moved meanwhile), and servers that asked to leave and
  // hold nothing now go.
  release_leavers();
  ++epoch_;
  send_membership();
  log_.info("key ranges moved; membership epoch " + std::to_string(epoch_) +
            " names their servers");
  rebalance();
}

void scheduler_core::on_server_leave(std::size_t index, const wire::command& cmd) {
  node_entry& node = nodes_[index];
  if (node.leaving || node.finished)
    return send(node, wire::ack{cmd.request_id});
  std::uint32_t others = 0;
  for (const auto& other : nodes_)
    others += other.info.node_role == wire::role::server && &other != &node && !other.gone &&
              !other.lost && !other.finished && !other.leaving;
  if (phase_ != scheduler_phase::running || others == 0)
    return send(node, error_reply(cmd.request_id, wire::error_code::invalid_argument,
                                  describe(node.info) + " cannot leave: " +
                                      (phase_ != scheduler_phase::running
                                           ? std::string{"the job is not running"}
                                           : std::string{"no other server would hold its key "
                                                         "ranges"})));
  node.leaving = true;
  send(node, wire::ack{cmd.request_id});
  log_.info(describe(node.info) + " asked to leave the job (" + seconds(since_start()) +
            " after it started): its key ranges move to the other servers first");
  if (moving_.empty() && release_leavers()) {
    ++epoch_;
    send_membership();
  }
  rebalance();
}

bool scheduler_core::release_leavers() {
  bool released = false;
  for (auto& node : nodes_) {
    if (!node.leaving || node.finished || node.gone)
      continue;
    if (std::find(range_owner_.begin(), range_owner_.end(), node.info.rank) != range_owner_.end())
      continue;
    node.finished = true;
    node.info.left = true;
    released = true;
    // Listed left by the next table, which the callers send.
    server_changes_.push_back(
        server_change{node.info.rank, node.info.node_id, false, since_start(), epoch_ + 1});
    send(node, wire::command{++next_request_id_, wire::command_kind::stop, {}});
    log_.info(describe(node.info) + " left the job (" + seconds(since_start()) +
              " after it started): it holds no key range, and was told to stop");
  }
  return released;
}

/// The whole table as it is now, to every node still connected and not lost. A table that lists
/// a worker the workers have not been told of (it joined) goes to the servers first; the workers
/// get it once every server acked (release_table).
void scheduler_core::send_membership() {
  wire::membership table;
  table.epoch = epoch_;
  table.num_workers = workers_in();
  table.num_servers = options_.num_servers;
  table.nodes.push_back(
      wire::node_info{scheduler_node_id, wire::role::scheduler, 0, options_.host, 0, true});
  std::size_t listed_workers = 0;
  for (const auto& node : nodes_) {
    if (node.waits_at_barrier)
      continue;
    table.nodes.push_back(node.info);
    listed_workers += node.info.node_role == wire::role::worker ? 1 : 0;
  }
  std::sort(table.nodes.begin(), table.nodes.end(),
            [](const auto& a, const auto& b) { return a.node_id < b.node_id; });
  table.key_ranges = membership_key_ranges(options_.num_servers, options_.max_servers);
  for (std::size_t r = 0; r < table.key_ranges.size() && r < range_owner_.size(); ++r)
    table.key_ranges[r].server_rank = range_owner_[r];
  table.num_servers = std::max(options_.num_servers, servers_admitted_);
  auto reaches = [](const node_entry& node) {
    // A worker that said done needs no table: it is leaving.
    return !node.gone && !node.lost && !node.waits_at_barrier &&
           !(node.finished && node.info.node_role == wire::role::worker);
  };
  if (listed_workers <= workers_announced_) {
    for (const auto& node : nodes_)
      if (reaches(node))
        send(node, table);
    return;
  }
  held_table_ = table;
  table.request_id = ++next_request_id_;
  held_request_id_ = table.request_id;
  awaiting_table_ack_.clear();
  for (std::size_t i = 0; i < nodes_.size(); ++i)
    if (nodes_[i].info.node_role == wire::role::server && reaches(nodes_[i]) &&
        !nodes_[i].finished) {
      awaiting_table_ack_.push_back(i);
      send(nodes_[i], table);
    }
  if (awaiting_table_ack_.empty())
    release_table();
}

void scheduler_core::on_table_ack(std::size_t index, std::uint64_t request_id) {
  if (!held_table_ || request_id != held_request_id_)
    return;
  if (std::erase(awaiting_table_ack_, index) > 0 && awaiting_table_ack_.empty())
    release_table();
}

void scheduler_core::release_table() {
  const wire::membership table = std::move(*held_table_);
  held_table_.reset();
  workers_announced_ = static_cast<std::size_t>(
      std::count_if(table.nodes.begin(), table.nodes.end(),
                    [](const auto& node) { return node.node_role == wire::role::worker; }));
  for (const auto& node : nodes_)
    if (node.info.node_role == wire::role::worker && !node.gone && !node.lost && !node.finished &&
        !node.waits_at_barrier)
      send(node, table);
  // Joiners taken in at a barrier: every worker has the table that counts them before any leaves
  // the barrier.
  pending_.emplace_back(release_held_barriers{});
}

scheduler_core::actions
scheduler_core::on_joiners_taken_in(const std::vector<std::uint32_t>& joiners,
                                    clock::time_point now) {
  now_ = now;
  bool counted = false;
  for (const auto index : joiners) {
    if (index >= nodes_.size())
      continue;
    node_entry& node = nodes_[index];
    // One turned away at the drain (finished) or gone meanwhile is counted nowhere.
    if (!node.waits_at_barrier || node.lost || node.gone || node.finished)
      continue;
    node.waits_at_barrier = false;
    counted = true;
    joined_workers_.push_back(joined_worker{node.info.rank, node.info.node_id, since_start()});
    log_.info(describe(node.info) + " joined the running job at the workers' barrier (" +
              seconds(since_start()) + " after it started); the job goes on with " +
              count_of(workers_in(), worker_capacity(), "worker rank") +
              " in use; the servers hear of it first");
  }
  if (!counted || phase_ != scheduler_phase::running) {
    pending_.emplace_back(release_held_barriers{});
    return take();
  }
  ++epoch_;
  send_membership();
  return take();
}

std::uint32_t scheduler_core::workers_in() const {
  if (phase_ == scheduler_phase::registering)
    return options_.num_workers;
  std::uint32_t waiting = 0;
  for (const auto& node : nodes_)
    waiting += node.waits_at_barrier ? 1 : 0;
  return workers_admitted_ - waiting;
}

/// When every live worker is done: tell the servers to stop (ps-lite's kStopServer), then
/// wait (bounded) for them to leave.
void scheduler_core::maybe_drain() {
  if (phase_ != scheduler_phase::running)
    return;
  for (const auto& node : nodes_)
    if (node.info.node_role == wire::role::worker && !node.finished && !node.lost &&
        !node.waits_at_barrier)
      return;
  phase_ = scheduler_phase::draining;
  drain_deadline_ = now_ + options_.drain_timeout;
  log_.info("every live worker is done: stopping the servers");
  // No barrier of the workers comes any more: those waiting to join there are turned away.
  for (auto& node : nodes_)
    if (node.waits_at_barrier && !node.lost && !node.gone) {
      node.finished = true;
      send(node, error_reply(node.join_request.value_or(0), wire::error_code::shutting_down,
                             "the job's workers finished before they met at another barrier: " +
                                 describe(node.info) + " cannot join"));
    }
  for (auto& node : nodes_)
    if (node.info.node_role == wire::role::server && !node.gone) {
      node.finished = true;
      send(node, wire::command{++next_request_id_, wire::command_kind::stop, {}});
    }
  maybe_finish();
}

void scheduler_core::maybe_finish() {
  if (phase_ != scheduler_phase::draining)
    return;
  for (const auto& node : nodes_)
    if (node.info.node_role == wire::role::server && !node.gone)
      return;
  finish(std::nullopt);
}

scheduler_core::actions scheduler_core::on_tick(clock::time_point now) {
  now_ = now;
  if (ended())
    return {};
  if (phase_ == scheduler_phase::registering && now_ - started_ >= options_.startup_timeout) {
    on_startup_timeout();
    return take();
  }
  if (phase_ == scheduler_phase::draining && now_ >= drain_deadline_) {
    on_drain_timeout();
    return take();
  }
  for (auto& node : nodes_)
    if (node.rejoin_deadline && now_ >= *node.rejoin_deadline) {
      node.rejoin_deadline.reset();
      const std::string text = node.lost_text + "; it did not rejoin within " +
                               format_duration(options_.server_rejoin) +
                               " (timeouts.server_rejoin)";
      node.lost_text = text;
      log_.error(text);
      broadcast(error_reply(0, wire::error_code::lost_peer, text));
      finish(error{errc::peer_lost, text});
      return take();
    }
  for (std::size_t i = 0; i < nodes_.size(); ++i) {
    const auto& node = nodes_[i];
    if (node.gone || node.finished || node.lost)
      continue;
    const auto silent = std::chrono::duration_cast<milliseconds>(now_ - node.last_seen);
    if (silent > options_.peer_timeout) {
      lose(i, "nothing heard from it for " + format_duration(silent) + " (peer timeout " +
                  format_duration(options_.peer_timeout) + ")");
      if (ended())
        return take(); // the loss failed the job, or let it end
    }
  }
  const wire::message beat = wire::heartbeat{
      scheduler_node_id, ++heartbeat_sequence_,
      std::chrono::duration_cast<std::chrono::nanoseconds>(now_.time_since_epoch()).count()};
  for (const auto& node : nodes_)
    if (!node.gone && !node.lost)
      send(node, beat);
  return take();
}

void scheduler_core::on_startup_timeout() {
  const std::string text = count_of(servers_admitted_, options_.num_servers, "server") + " and " +
                           count_of(workers_admitted_, options_.num_workers, "worker") +
                           " registered after " + format_duration(options_.startup_timeout);
  log_.error("the job did not start: " + text);
  broadcast(error_reply(0, wire::error_code::timeout, text));
  finish(error{errc::timeout, text});
}

void scheduler_core::on_drain_timeout() {
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
void scheduler_core::lose(std::size_t index, const std::string& why) {
  node_entry& node = nodes_[index];
  node.lost = true;
  node.info.alive = false;
  node.lost_text = describe(node.info) + " was lost: " + why;
  if (node.waits_at_barrier) {
    // It never counted anywhere: the job goes on as it was.
    log_.info(node.lost_text + " while it waited to join at the workers' next barrier");
    pending_.emplace_back(
        barrier_member_gone{static_cast<std::uint32_t>(index), node.info.node_role});
    return maybe_drain();
  }
  const auto after = since_start();
  const bool worker = node.info.node_role == wire::role::worker;
  if (worker) {
    lost_workers_.push_back(lost_worker{node.info.rank, node.info.node_id, after, why});
    if (options_.on_worker_lost)
      options_.on_worker_lost(node.info.rank);
  }
  const std::size_t tolerated = options_.num_workers - quorum_;
  if (!worker && phase_ == scheduler_phase::running && options_.server_rejoin.count() > 0) {
    // Its rank stays open for a server restarted from its checkpoint; the workers hold their
    // calls to it, and barriers wait, until it rejoins or the time is up.
    node.rejoin_deadline = now_ + options_.server_rejoin;
    log_.error(node.lost_text + " (" + seconds(after) + " after the job started); waiting up to " +
               format_duration(options_.server_rejoin) + " for it to rejoin from its checkpoint");
    ++epoch_;
    send_membership();
    return;
  }
  if (!worker || phase_ != scheduler_phase::running || lost_workers_.size() > tolerated) {
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
  pending_.emplace_back(
      barrier_member_gone{static_cast<std::uint32_t>(index), node.info.node_role});
  ++epoch_;
  send_membership();
  maybe_drain();
}

/// A worker that said done while the job goes on: marked left in the next table, and the
/// barriers stop waiting for it.
void scheduler_core::leave(std::size_t index) {
  node_entry& node = nodes_[index];
  node.info.left = true;
  left_workers_.push_back(
      departed_worker{node.info.rank, node.info.node_id, node.rounds, since_start()});
  pending_.emplace_back(
      barrier_member_gone{static_cast<std::uint32_t>(index), node.info.node_role});
}

/// Ends the job: no failure means the workers finished (some perhaps lost within the quorum).
void scheduler_core::finish(std::optional<error> failure) {
  job_outcome outcome;
  outcome.end = failure                 ? job_end::failed
                : lost_workers_.empty() ? job_end::finished
                                        : job_end::finished_with_losses;
  outcome.failure = std::move(failure);
  outcome.lost_workers = lost_workers_;
  outcome.left_workers = left_workers_;
  outcome.joined_workers = joined_workers_;
  outcome.server_changes = server_changes_;
  for (const auto& node : nodes_)
    if (node.info.node_role == wire::role::worker && node.finished)
      ++outcome.workers_finished;
  outcome.summary = summary(outcome);
  phase_ = outcome.failure ? scheduler_phase::failed : scheduler_phase::done;
  log_.log(outcome.end == job_end::finished ? log_level::info : log_level::error, outcome.summary);
  pending_.emplace_back(job_ended{std::move(outcome)});
}

/// One line: how the job ended, the workers finished and lost, who, when and why.
std::string scheduler_core::summary(const job_outcome& outcome) const {
  std::string line = "summary: ";
  if (outcome.failure)
    line += "the job failed (" + outcome.failure->message() + "); ";
  else
    line += "the job finished; ";
  line += count_of(outcome.workers_finished, std::max(workers_admitted_, options_.num_workers),
                   "worker") +
          " finished";
  std::string ranks;
  for (const auto& node : nodes_)
    if (node.info.node_role == wire::role::worker && node.finished)
      ranks += (ranks.empty() ? "" : ", ") + std::to_string(node.info.rank);
  if (!ranks.empty())
    line += " (rank " + ranks + ")";
  // Workers that all finish their last round leave one after the other: only those that did
  // fewer rounds than another worker left early.
  std::uint64_t most_rounds = 0;
  for (const auto& node : nodes_)
    if (node.info.node_role == wire::role::worker && node.finished)
      most_rounds = std::max(most_rounds, node.rounds);
  std::string early;
  for (const auto& left : outcome.left_workers)
    if (left.rounds < most_rounds)
      early += (early.empty() ? "; left early: " : ", ") +
               wire::describe(wire::role::worker, left.rank, left.node_id) + " after " +
               std::to_string(left.rounds) + " of " + std::to_string(most_rounds) + " rounds, " +
               seconds(left.after) + " after the job started";
  line += early;
  for (std::size_t i = 0; i < outcome.joined_workers.size(); ++i) {
    const auto& joined = outcome.joined_workers[i];
    line += (i == 0 ? "; joined: " : ", ") +
            wire::describe(wire::role::worker, joined.rank, joined.node_id) + " " +
            seconds(joined.after) + " after the job started";
  }
  for (std::size_t i = 0; i < outcome.server_changes.size(); ++i) {
    const auto& change = outcome.server_changes[i];
    line += (i == 0 ? "; servers: " : ", ") +
            wire::describe(wire::role::server, change.rank, change.node_id) +
            (change.joined ? " joined " : " left ") + seconds(change.after) +
            " after the job started (membership epoch " + std::to_string(change.epoch) + ")";
  }
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

// --- admission and output ------------------------------------------------------------------------

/// The admission of `node`: its rank, node id and own secret sealed under its control
/// connection's session key (a worker's node key, a server's job secret); nullopt, logged, when
/// the secret cannot be sealed (OpenSSL or the kernel's random bytes failed).
std::optional<wire::admitted> scheduler_core::admitted_as(const wire::node_info& node,
                                                          const session_key& session) const {
  const wire::node_identity who{node.node_role, node.rank};
  try {
    const auto secret = node.node_role == wire::role::server
                            ? options_.secret.reveal()
                            : derive_node_key(token_, options_.secret, who).reveal();
    return wire::admitted{
        node.rank, node.node_id, seal_secret(session, secret, who, node.node_id), false, {}};
  } catch (const std::exception& e) {
    log_.error("cannot seal the secret of " + describe(node) + ": " + e.what());
    return std::nullopt;
  }
}

void scheduler_core::reply(std::uint64_t connection, wire::message msg) {
  pending_.emplace_back(control_frame{connection, std::move(msg)});
}

void scheduler_core::send(const node_entry& node, wire::message msg) {
  reply(node.connection, std::move(msg));
}

/// To every admitted node still connected.
void scheduler_core::broadcast(const wire::message& msg) {
  for (const auto& node : nodes_)
    if (!node.gone)
      send(node, msg);
}

scheduler_core::actions scheduler_core::take() {
  return std::exchange(pending_, {});
}

// --- lookups -------------------------------------------------------------------------------------

std::optional<std::size_t> scheduler_core::find(std::uint64_t connection) const {
  auto found = by_connection_.find(connection);
  if (found == by_connection_.end())
    return std::nullopt;
  return found->second;
}

std::string scheduler_core::who(std::optional<std::size_t> index) const {
  return index ? describe(nodes_[*index].info) : std::string{"an unregistered connection"};
}

std::chrono::milliseconds scheduler_core::since_start() const {
  return std::chrono::duration_cast<milliseconds>(now_ - started_);
}

} // namespace troupe
