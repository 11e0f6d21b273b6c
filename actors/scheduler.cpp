#include "actors/scheduler.hpp"

#include <algorithm>
#include <condition_variable>
#include <iostream>
#include <map>
#include <mutex>
#include <span>
#include <utility>

#include <caf/actor_system.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/io/middleman.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/system_messages.hpp>

#include "actors/protocols.hpp"

namespace troupe {

// --- helpers shared with the node agent ------------------------------------------------------

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

std::vector<char> encode_control(const wire::message& msg) {
  const auto frame = wire::encode(msg);
  std::vector<char> bytes(frame.size());
  frame.flatten_into(std::as_writable_bytes(std::span{bytes}));
  return bytes;
}

wire::result<wire::decoded_message> decode_control(const std::vector<char>& frame,
                                                   std::size_t max_frame_bytes) {
  wire::decode_limits limits;
  limits.max_frame_bytes = max_frame_bytes;
  // Control messages carry no tensors; the decoded strings and lists are copies, so the result
  // does not view `frame`.
  return wire::decode(std::as_bytes(std::span{frame}), limits);
}

// --- the outcome, shared between the actor and the handles ------------------------------------

struct scheduler_handle::outcome_state {
  std::mutex mutex;
  std::condition_variable changed;
  std::optional<status> value;

  /// The first outcome wins: a later one (the exit functor after a clean end) is ignored.
  void set(status outcome) {
    {
      std::lock_guard lock{mutex};
      if (value)
        return;
      value = std::move(outcome);
    }
    changed.notify_all();
  }
};

scheduler_handle::scheduler_handle(caf::actor actor, std::uint16_t port,
                                   std::shared_ptr<outcome_state> outcome)
    : actor_(std::move(actor)), port_(port), outcome_(std::move(outcome)) {}

std::optional<status> scheduler_handle::wait(std::chrono::milliseconds timeout) const {
  std::unique_lock lock{outcome_->mutex};
  outcome_->changed.wait_for(lock, timeout, [&] { return outcome_->value.has_value(); });
  return outcome_->value;
}

void scheduler_handle::stop() const {
  caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
}

namespace {

// Timers the scheduler sends itself; accepted only with the scheduler as sender, so a peer that
// knows the atoms cannot end the job.
using startup_timeout_atom = caf::atom_constant<caf::atom("startup_to")>;
using drain_timeout_atom = caf::atom_constant<caf::atom("drain_to")>;

using steady = std::chrono::steady_clock;
using outcome_state = scheduler_handle::outcome_state;

/// "60 s" for whole seconds, "250 ms" otherwise.
std::string describe(std::chrono::milliseconds duration) {
  if (duration.count() % 1000 == 0)
    return std::to_string(duration.count() / 1000) + " s";
  return std::to_string(duration.count()) + " ms";
}

/// "worker 2 (node 13)".
std::string describe(const wire::node_info& node) {
  return std::string{wire::to_string(node.node_role)} + " " + std::to_string(node.rank) +
         " (node " + std::to_string(node.node_id) + ")";
}

/// "1 of 2 servers" / "1 of 1 server".
std::string count_of(std::uint32_t have, std::uint32_t want, const char* noun) {
  return std::to_string(have) + " of " + std::to_string(want) + " " + noun + (want == 1 ? "" : "s");
}

/// Compares secrets in time independent of where they differ.
bool same_secret(const std::string& a, const std::string& b) {
  if (a.size() != b.size())
    return false;
  unsigned char difference = 0;
  for (std::size_t i = 0; i < a.size(); ++i)
    difference |= static_cast<unsigned char>(a[i] ^ b[i]);
  return difference == 0;
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

// The scheduler's phases:
//
//   registering --every server and worker admitted: membership sent--> running
//        |                                                                |
//        | startup_timeout, or an admitted node lost                      | every worker done:
//        v                                                                v  stop to servers
//      failed <------- a node lost that had not finished ------------- draining
//                                                                         |
//                                  every server gone, or drain_timeout    v
//                                                                       done
//
// done and failed are final: the outcome is set and the actor quits. A worker that said done and
// a server that was told to stop have "finished": their departure is expected, not a loss.
enum class phase { registering, running, draining, done, failed };

/// One admitted node.
struct node_entry {
  /// The node's agent actor: the sender of its registration, monitored.
  caf::actor agent;
  wire::node_info info;
  /// Last frame of any kind from the node.
  steady::time_point last_seen;
  /// Worker: said done. Server: was sent stop.
  bool finished = false;
  /// Its agent terminated (down_msg).
  bool gone = false;
};

/// Nodes that arrived at one barrier (group, barrier_id), with the request id to echo.
struct barrier_arrivals {
  std::vector<std::pair<std::size_t, std::uint64_t>> nodes; // index into nodes_, request id
};

class scheduler_state {
public:
  /// CAF's name for the actor (logs, `name()`).
  static inline const char* name = "troupe.scheduler";

  explicit scheduler_state(caf::event_based_actor* self) : self_(self) {}

  /// The behaviour: a thin dispatch to the methods below.
  caf::behavior start(scheduler_options options, std::shared_ptr<outcome_state> outcome) {
    options_ = std::move(options);
    outcome_ = std::move(outcome);
    self_->set_down_handler([this](caf::down_msg& msg) { on_down(msg); });
    self_->set_default_handler([this](caf::scheduled_actor*, caf::message_view& msg) {
      log(2, "dropped an unexpected message " + caf::to_string(msg.copy_content_to_message()));
      return caf::result<caf::message>{caf::sec::unexpected_message};
    });
    self_->delayed_send(self_, options_.startup_timeout, startup_timeout_atom::value);
    self_->delayed_send(self_, options_.heartbeat_interval, tick_atom::value);
    log(1, "waiting for " + count_of(0, options_.num_servers, "server") + " and " +
               count_of(0, options_.num_workers, "worker"));
    return {
        [this](control_atom, const std::vector<char>& frame) { on_frame(frame); },
        [this](tick_atom) {
          if (from_self())
            on_tick();
        },
        [this](startup_timeout_atom) {
          if (from_self())
            on_startup_timeout();
        },
        [this](drain_timeout_atom) {
          if (from_self())
            on_drain_timeout();
        },
    };
  }

private:
  // --- incoming frames -----------------------------------------------------------------------

  void on_frame(const std::vector<char>& frame) {
    const auto& sender = self_->current_sender();
    const auto index = find(sender);
    auto decoded = decode_control(frame, max_incoming_frame_bytes);
    if (!decoded) {
      const std::string text = "bad control frame (" +
                               std::string{to_string(decoded.error().kind)} +
                               "): " + decoded.error().message;
      log(0, who(index) + " sent a " + text);
      reply_error(sender, 0, wire::error_code::bad_frame, text);
      return;
    }
    const wire::message& msg = decoded->msg;
    log(2, std::string{wire::kind_name(msg)} + " from " + who(index));
    if (index)
      nodes_[*index].last_seen = steady::now();
    if (const auto* reg = std::get_if<wire::registration>(&msg)) {
      on_registration(sender, *reg);
      return;
    }
    if (!index) {
      reply_error(sender, wire::request_id_of(msg), wire::error_code::not_admitted,
                  "a " + std::string{wire::kind_name(msg)} + " from a node that is not admitted");
      return;
    }
    if (const auto* request = std::get_if<wire::barrier>(&msg))
      on_barrier(*index, *request);
    else if (const auto* cmd = std::get_if<wire::command>(&msg))
      on_command(*index, *cmd);
    else if (std::holds_alternative<wire::heartbeat>(msg) || std::holds_alternative<wire::ack>(msg))
      ; // a sign of life, counted above
    else if (const auto* err = std::get_if<wire::error_reply>(&msg))
      log(0, describe(nodes_[*index].info) + " reported an error: " + err->message);
    else
      reply_error(sender, wire::request_id_of(msg), wire::error_code::unsupported,
                  "the scheduler does not take " + std::string{wire::kind_name(msg)} + " messages");
  }

  void on_registration(const caf::strong_actor_ptr& sender, const wire::registration& reg) {
    if (!sender) {
      log(0, "dropped a registration without a sender (it cannot be answered)");
      return;
    }
    auto reject = [&](wire::reject_reason reason, std::string detail) {
      log(1, "rejected a " + std::string{wire::to_string(reg.node_role)} + " from " + reg.host +
                 ":" + std::to_string(reg.port) + ": " + detail);
      send(sender, wire::admission{reg.request_id, wire::rejected{reason, std::move(detail)}});
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
    if (!same_secret(reg.auth_token, options_.auth_token))
      return reject(wire::reject_reason::bad_token, "the auth token does not match the job's");
    if (auto index = find(sender))
      return reject(wire::reject_reason::duplicate,
                    "this agent is already registered as " + describe(nodes_[*index].info));
    if (reg.node_role == wire::role::scheduler)
      return reject(wire::reject_reason::role_full, "a job has exactly one scheduler");
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
    ++admitted;
    node_entry entry;
    entry.agent = caf::actor_cast<caf::actor>(sender);
    entry.info = wire::node_info{server ? server_node_id(rank) : worker_node_id(rank),
                                 reg.node_role,
                                 rank,
                                 reg.host,
                                 reg.port,
                                 true};
    entry.last_seen = steady::now();
    self_->monitor(entry.agent);
    send(entry.agent, wire::admission{reg.request_id, wire::admitted{rank, entry.info.node_id}});
    log(1, "admitted " + describe(entry.info) + " at " + reg.host + ":" + std::to_string(reg.port) +
               "; " + count_of(servers_admitted_, options_.num_servers, "server") + " and " +
               count_of(workers_admitted_, options_.num_workers, "worker"));
    nodes_.push_back(std::move(entry));
    if (servers_admitted_ == options_.num_servers && workers_admitted_ == options_.num_workers)
      start_job();
  }

  void on_barrier(std::size_t index, const wire::barrier& request) {
    const node_entry& node = nodes_[index];
    const auto& sender = node.agent;
    if ((request.group & ~wire::group::all) != 0 || request.group == 0)
      return reply_error(sender, request.request_id, wire::error_code::invalid_argument,
                         "barrier group " + std::to_string(request.group) +
                             " is not a union of 1 (scheduler), 2 (servers), 4 (workers)");
    if ((request.group & group_bit(node.info.node_role)) == 0)
      return reply_error(sender, request.request_id, wire::error_code::invalid_argument,
                         describe(node.info) + " is not a member of barrier group " +
                             std::to_string(request.group));
    if (request.sender_node_id != node.info.node_id)
      return reply_error(sender, request.request_id, wire::error_code::invalid_argument,
                         "barrier sent as node " + std::to_string(request.sender_node_id) + " by " +
                             describe(node.info));
    // A member that finished will never arrive: fail now rather than let the others time out.
    for (const auto& other : nodes_)
      if ((request.group & group_bit(other.info.node_role)) != 0 && other.finished)
        return reply_error(sender, request.request_id, wire::error_code::shutting_down,
                           "barrier " + std::to_string(request.barrier_id) + " on group " +
                               std::to_string(request.group) +
                               " cannot complete: " + describe(other.info) + " has finished");
    const auto key = std::make_pair(request.group, request.barrier_id);
    auto& arrivals = barriers_[key];
    for (const auto& [arrived, request_id] : arrivals.nodes)
      if (arrived == index)
        return reply_error(sender, request.request_id, wire::error_code::invalid_argument,
                           describe(node.info) + " already arrived at barrier " +
                               std::to_string(request.barrier_id) + " of group " +
                               std::to_string(request.group));
    arrivals.nodes.emplace_back(index, request.request_id);
    // The scheduler itself is always at the barrier (group bit 1); the counts are the
    // configured ones, so a barrier sent before the job started waits for the late nodes too.
    const std::size_t expected =
        ((request.group & wire::group::servers) ? options_.num_servers : 0) +
        ((request.group & wire::group::workers) ? options_.num_workers : 0);
    log(2, describe(node.info) + " at barrier " + std::to_string(request.barrier_id) +
               " of group " + std::to_string(request.group) + " (" +
               std::to_string(arrivals.nodes.size()) + " of " + std::to_string(expected) + ")");
    if (arrivals.nodes.size() < expected)
      return;
    for (const auto& [member, request_id] : arrivals.nodes)
      send(nodes_[member].agent,
           wire::barrier_release{request_id, request.barrier_id, request.group});
    barriers_.erase(key);
  }

  void on_command(std::size_t index, const wire::command& cmd) {
    node_entry& node = nodes_[index];
    if (cmd.kind != wire::command_kind::stop)
      return reply_error(node.agent, cmd.request_id, wire::error_code::unsupported,
                         "the scheduler runs no checkpoint commands");
    if (node.info.node_role != wire::role::worker)
      return reply_error(node.agent, cmd.request_id, wire::error_code::invalid_argument,
                         "only workers report done; " + describe(node.info) + " is not one");
    // Idempotent: a worker that repeats its done gets the same ack.
    if (!node.finished)
      log(1, describe(node.info) + " is done");
    node.finished = true;
    send(node.agent, wire::ack{cmd.request_id});
    maybe_drain();
  }

  // --- lifecycle -----------------------------------------------------------------------------

  void start_job() {
    phase_ = phase::running;
    wire::membership table;
    table.epoch = 1;
    table.num_workers = options_.num_workers;
    table.num_servers = options_.num_servers;
    table.nodes.push_back(
        wire::node_info{scheduler_node_id, wire::role::scheduler, 0, options_.host, 0, true});
    for (const auto& node : nodes_)
      table.nodes.push_back(node.info);
    std::sort(table.nodes.begin(), table.nodes.end(),
              [](const auto& a, const auto& b) { return a.node_id < b.node_id; });
    table.key_ranges = membership_key_ranges(options_.num_servers);
    const auto frame = encode_control(table);
    for (const auto& node : nodes_)
      self_->send(node.agent, control_atom::value, frame);
    log(1, "every node registered: membership sent, the job runs");
    maybe_drain(); // workers may have said done before the last node registered
  }

  /// When every worker is done: tell the servers to stop (ps-lite's kStopServer), then wait
  /// (bounded) for them to leave.
  void maybe_drain() {
    if (phase_ != phase::running)
      return;
    for (const auto& node : nodes_)
      if (node.info.node_role == wire::role::worker && !node.finished)
        return;
    phase_ = phase::draining;
    log(1, "every worker is done: stopping the servers");
    for (auto& node : nodes_)
      if (node.info.node_role == wire::role::server && !node.gone) {
        node.finished = true;
        send(node.agent, wire::command{++next_request_id_, wire::command_kind::stop, {}});
      }
    self_->delayed_send(self_, options_.drain_timeout, drain_timeout_atom::value);
    maybe_finish();
  }

  void maybe_finish() {
    if (phase_ != phase::draining)
      return;
    for (const auto& node : nodes_)
      if (node.info.node_role == wire::role::server && !node.gone)
        return;
    finish(ok());
  }

  void on_down(const caf::down_msg& msg) {
    auto index = find(msg.source);
    if (!index)
      return;
    node_entry& node = nodes_[*index];
    node.gone = true;
    if (phase_ == phase::done || phase_ == phase::failed)
      return;
    if (node.finished) {
      log(1, describe(node.info) + " left");
      maybe_finish();
      return;
    }
    lose(*index, "its agent terminated (" + self_->system().render(msg.reason) + ")");
  }

  void on_tick() {
    if (phase_ == phase::done || phase_ == phase::failed)
      return;
    const auto now = steady::now();
    for (std::size_t i = 0; i < nodes_.size(); ++i) {
      const auto& node = nodes_[i];
      if (node.gone || node.finished)
        continue;
      const auto silent =
          std::chrono::duration_cast<std::chrono::milliseconds>(now - node.last_seen);
      if (silent > options_.peer_timeout) {
        lose(i, "nothing heard from it for " + describe(silent) + " (peer timeout " +
                    describe(options_.peer_timeout) + ")");
        return;
      }
    }
    const auto frame = encode_control(wire::heartbeat{
        scheduler_node_id, ++heartbeat_sequence_,
        std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count()});
    for (const auto& node : nodes_)
      if (!node.gone)
        self_->send(node.agent, control_atom::value, frame);
    self_->delayed_send(self_, options_.heartbeat_interval, tick_atom::value);
  }

  void on_startup_timeout() {
    if (phase_ != phase::registering)
      return;
    const std::string text = count_of(servers_admitted_, options_.num_servers, "server") + " and " +
                             count_of(workers_admitted_, options_.num_workers, "worker") +
                             " registered after " + describe(options_.startup_timeout);
    log(0, "the job did not start: " + text);
    broadcast(wire::error_reply{0, std::nullopt, wire::error_code::timeout, text});
    finish(error{errc::timeout, text});
  }

  void on_drain_timeout() {
    if (phase_ != phase::draining)
      return;
    std::string late;
    for (const auto& node : nodes_)
      if (node.info.node_role == wire::role::server && !node.gone)
        late += (late.empty() ? "" : ", ") + describe(node.info);
    log(0, late + " had not left " + describe(options_.drain_timeout) +
               " after the stop command; ending the job anyway");
    finish(ok());
  }

  /// A node is lost: every node still connected learns who, and the job fails (continuing
  /// without the node is not supported yet). The lost node itself hears it too when it is still
  /// there: a frozen process that wakes up learns it was dropped, not that the scheduler vanished.
  void lose(std::size_t index, const std::string& why) {
    node_entry& node = nodes_[index];
    node.info.alive = false;
    const std::string text = describe(node.info) + " was lost: " + why;
    log(0, text);
    broadcast(wire::error_reply{0, std::nullopt, wire::error_code::lost_peer, text});
    finish(error{errc::peer_lost, text});
  }

  void finish(status outcome) {
    const bool success = outcome.has_value();
    phase_ = success ? phase::done : phase::failed;
    log(success ? 1 : 0, success ? "the job ended" : "the job failed");
    outcome_->set(std::move(outcome));
    if (success)
      self_->quit();
    else
      self_->quit(caf::exit_reason::user_shutdown);
  }

  // --- sending -------------------------------------------------------------------------------

  template <class Handle>
  void send(const Handle& to, const wire::message& msg) {
    self_->send(caf::actor_cast<caf::actor>(to), control_atom::value, encode_control(msg));
  }

  template <class Handle>
  void reply_error(const Handle& to, std::uint64_t request_id, wire::error_code code,
                   std::string text) {
    if (!to)
      return;
    send(to, wire::error_reply{request_id, std::nullopt, code, std::move(text)});
  }

  /// To every admitted node still there.
  void broadcast(const wire::message& msg) {
    const auto frame = encode_control(msg);
    for (const auto& node : nodes_)
      if (!node.gone)
        self_->send(node.agent, control_atom::value, frame);
  }

  // --- lookups and logs ----------------------------------------------------------------------

  std::optional<std::size_t> find(const caf::strong_actor_ptr& sender) const {
    if (!sender)
      return std::nullopt;
    return find(caf::actor_cast<caf::actor_addr>(sender));
  }

  std::optional<std::size_t> find(const caf::actor_addr& address) const {
    for (std::size_t i = 0; i < nodes_.size(); ++i)
      if (nodes_[i].agent.address() == address)
        return i;
    return std::nullopt;
  }

  std::string who(std::optional<std::size_t> index) const {
    return index ? describe(nodes_[*index].info) : std::string{"an unregistered peer"};
  }

  bool from_self() const { return self_->current_sender().get() == self_->ctrl(); }

  void log(int level, const std::string& text) const {
    if (options_.verbose >= level)
      std::clog << ("troupe scheduler [" + options_.job_id + "]: " + text + "\n") << std::flush;
  }

  /// Registration, barrier, command, heartbeat: a few hundred bytes at most.
  static constexpr std::size_t max_incoming_frame_bytes = 64u << 10;

  caf::event_based_actor* self_;
  scheduler_options options_;
  std::shared_ptr<outcome_state> outcome_;
  phase phase_ = phase::registering;
  /// Admitted nodes in arrival order; never shrinks (a gone node keeps its rank).
  std::vector<node_entry> nodes_;
  std::uint32_t servers_admitted_ = 0;
  std::uint32_t workers_admitted_ = 0;
  std::map<std::pair<std::uint8_t, std::uint64_t>, barrier_arrivals> barriers_;
  std::uint64_t next_request_id_ = 0;
  std::uint64_t heartbeat_sequence_ = 0;
};

caf::behavior scheduler_behavior(caf::stateful_actor<scheduler_state>* self,
                                 scheduler_options options,
                                 std::shared_ptr<outcome_state> outcome) {
  return self->state.start(std::move(options), std::move(outcome));
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
  using std::chrono::milliseconds;
  for (const auto& [value, field] : {std::pair{options.startup_timeout, "startup_timeout"},
                                     std::pair{options.peer_timeout, "peer_timeout"},
                                     std::pair{options.heartbeat_interval, "heartbeat_interval"},
                                     std::pair{options.drain_timeout, "drain_timeout"}})
    if (value <= milliseconds{0})
      return invalid(std::string{field} + " must be positive, not " +
                     std::to_string(value.count()) + " ms");

  auto outcome = std::make_shared<outcome_state>();
  const std::string host = options.host;
  const std::uint16_t port = options.port;
  auto actor = sys.spawn(scheduler_behavior, std::move(options), outcome);
  // An exit the scheduler did not choose (its host's stop(), the system shutting down).
  actor->attach_functor([outcome, &sys](const caf::error& reason) {
    outcome->set(error{errc::peer_lost,
                       "the scheduler stopped before the job ended (" + sys.render(reason) + ")"});
  });
  auto bound = sys.middleman().publish(actor, port, host.c_str(), true);
  if (!bound) {
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    return error{errc::io_error, "cannot publish the scheduler on " + host + ":" +
                                     std::to_string(port) + ": " + sys.render(bound.error())};
  }
  // Close the port when the job ends, so that a late node is refused rather than admitted into
  // nothing; connections already open stay.
  actor->attach_functor([middleman = sys.middleman().actor_handle(), port = *bound] {
    caf::anon_send(middleman, caf::close_atom::value, port);
  });
  return scheduler_handle{std::move(actor), *bound, std::move(outcome)};
}

} // namespace troupe
