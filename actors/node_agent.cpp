#include "actors/node_agent.hpp"

#include <array>
#include <condition_variable>
#include <iostream>
#include <map>
#include <mutex>
#include <thread>
#include <utility>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/exit_reason.hpp>
#include <caf/io/middleman.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/system_messages.hpp>

#include "actors/protocols.hpp"
#include "actors/scheduler.hpp"
#include "actors/wire_conversions.hpp"

namespace troupe {

void configure_failure_detection(caf::actor_system_config& cfg, std::chrono::milliseconds heartbeat,
                                 std::chrono::milliseconds timeout) {
  if (heartbeat.count() <= 0 || timeout <= heartbeat)
    throw exception(errc::invalid_argument,
                    "configure_failure_detection needs 0 < heartbeat < timeout, got " +
                        std::to_string(heartbeat.count()) + " ms and " +
                        std::to_string(timeout.count()) + " ms");
  cfg.set("middleman.heartbeat-interval", caf::timespan{heartbeat});
  cfg.set("middleman.connection-timeout", caf::timespan{timeout});
}

/// What the blocking calls and the agent actor share; every field under `mutex`, and every
/// change announced on `changed`.
struct node_agent::shared_state {
  std::mutex mutex;
  std::condition_variable changed;
  std::optional<wire::admitted> admitted;
  std::optional<wire::membership> membership;
  /// First fatal error: rejection, job failure, scheduler lost. Later calls return it.
  std::optional<error> failure;
  bool stop_received = false;
  /// The node's part is over (done acknowledged, or stop received): the scheduler may go now
  /// without that being a loss.
  bool finished = false;
  /// Outstanding requests by request id; the actor fills in the outcome.
  std::map<std::uint64_t, std::optional<status>> pending;
  /// Request id of the worker's done, whose ack makes the node finished.
  std::optional<std::uint64_t> done_request;
  /// 1 is the registration's.
  std::uint64_t next_request_id = 2;
  /// Barriers this node entered, per group: the next barrier's id is one more. Every member
  /// calls barrier(group) in the same order (ps-lite's contract), so the ids agree.
  std::array<std::uint64_t, 8> barriers_entered{};
};

namespace {

// Requests from the node_agent object to its actor (never sent over the network).
using send_ctrl_atom = caf::atom_constant<caf::atom("send_ctrl")>;
using subscribe_atom = caf::atom_constant<caf::atom("subscribe")>;

using steady = std::chrono::steady_clock;
using shared_state = node_agent::shared_state;

constexpr std::uint64_t registration_request_id = 1;

std::string describe(std::chrono::milliseconds duration) {
  if (duration.count() % 1000 == 0)
    return std::to_string(duration.count() / 1000) + " s";
  return std::to_string(duration.count()) + " ms";
}

std::string_view to_string(wire::reject_reason reason) {
  switch (reason) {
  case wire::reject_reason::protocol_version:
    return "protocol_version";
  case wire::reject_reason::wrong_job:
    return "wrong_job";
  case wire::reject_reason::bad_token:
    return "bad_token";
  case wire::reject_reason::role_full:
    return "role_full";
  case wire::reject_reason::duplicate:
    return "duplicate";
  case wire::reject_reason::shutting_down:
    return "shutting_down";
  }
  return "unknown";
}

std::uint8_t group_bit(wire::role node_role) {
  return node_role == wire::role::server ? wire::group::servers : wire::group::workers;
}

/// The actor half of a node agent: talks to the scheduler, fills in the shared state.
class agent_state {
public:
  static inline const char* name = "troupe.node_agent";

  explicit agent_state(caf::event_based_actor* self) : self_(self) {}

  caf::behavior start(caf::actor scheduler, agent_options options,
                      std::shared_ptr<shared_state> shared) {
    scheduler_ = std::move(scheduler);
    options_ = std::move(options);
    shared_ = std::move(shared);
    last_heard_ = steady::now();
    self_->monitor(scheduler_);
    self_->set_down_handler([this](caf::down_msg& msg) {
      if (msg.source == scheduler_.address())
        on_scheduler_down(msg.reason);
    });
    self_->set_default_handler([this](caf::scheduled_actor*, caf::message_view& msg) {
      log(2, "dropped an unexpected message " + caf::to_string(msg.copy_content_to_message()));
      return caf::result<caf::message>{caf::sec::unexpected_message};
    });
    wire::registration reg;
    reg.request_id = registration_request_id;
    reg.node_role = options_.role;
    reg.job_id = options_.job_id;
    reg.auth_token = options_.auth_token;
    reg.host = options_.host;
    reg.port = options_.data_port;
    reg.rank_hint = options_.rank_hint;
    send(reg);
    self_->delayed_send(self_, options_.heartbeat_interval, tick_atom::value);
    return {
        [this](control_atom, const std::vector<char>& frame) {
          if (caf::actor_cast<caf::actor_addr>(self_->current_sender()) == scheduler_.address())
            on_frame(frame);
          else
            log(0, "dropped a control frame that did not come from the scheduler");
        },
        [this](send_ctrl_atom, std::vector<char>& frame) {
          self_->send(scheduler_, control_atom::value, std::move(frame));
        },
        [this](subscribe_atom, const caf::actor& listener) { on_subscribe(listener); },
        [this](tick_atom) {
          if (self_->current_sender().get() == self_->ctrl())
            on_tick();
        },
    };
  }

private:
  void on_frame(const std::vector<char>& frame) {
    auto decoded = decode_control(frame);
    if (!decoded) {
      const std::string text = "bad control frame from the scheduler (" +
                               std::string{to_string(decoded.error().kind)} +
                               "): " + decoded.error().message;
      log(0, text);
      send(wire::error_reply{0, std::nullopt, wire::error_code::bad_frame, text});
      return;
    }
    last_heard_ = steady::now();
    const wire::message& msg = decoded->msg;
    log(2, std::string{wire::kind_name(msg)} + " from the scheduler");
    if (const auto* admission = std::get_if<wire::admission>(&msg))
      on_admission(*admission);
    else if (const auto* table = std::get_if<wire::membership>(&msg))
      on_membership(*table);
    else if (const auto* release = std::get_if<wire::barrier_release>(&msg))
      complete(release->request_id, ok());
    else if (const auto* acked = std::get_if<wire::ack>(&msg))
      complete(acked->request_id, ok());
    else if (const auto* cmd = std::get_if<wire::command>(&msg))
      on_command(*cmd);
    else if (const auto* err = std::get_if<wire::error_reply>(&msg))
      on_error(*err);
    else if (!std::holds_alternative<wire::heartbeat>(msg))
      log(0, "ignored a " + std::string{wire::kind_name(msg)} + " from the scheduler");
  }

  void on_admission(const wire::admission& admission) {
    if (admission.request_id != registration_request_id || admitted_) {
      log(0, "ignored an admission that answers no registration");
      return;
    }
    if (const auto* rejected = std::get_if<wire::rejected>(&admission.outcome)) {
      fail(error{errc::invalid_argument, "registration rejected (" +
                                             std::string{to_string(rejected->reason)} +
                                             "): " + rejected->detail});
      return;
    }
    const auto& admitted = std::get<wire::admitted>(admission.outcome);
    admitted_ = true;
    node_id_ = admitted.node_id;
    name_ = std::string{wire::to_string(options_.role)} + " " + std::to_string(admitted.rank) +
            " (node " + std::to_string(admitted.node_id) + ")";
    log(1, "admitted");
    {
      std::lock_guard lock{shared_->mutex};
      shared_->admitted = admitted;
    }
    shared_->changed.notify_all();
  }

  void on_membership(const wire::membership& table) {
    {
      std::lock_guard lock{shared_->mutex};
      if (shared_->membership && shared_->membership->epoch >= table.epoch)
        return;
      shared_->membership = table;
    }
    log(1, "membership epoch " + std::to_string(table.epoch) + " with " +
               std::to_string(table.nodes.size()) + " nodes");
    shared_->changed.notify_all();
  }

  void on_command(const wire::command& cmd) {
    if (cmd.kind != wire::command_kind::stop) {
      send(wire::error_reply{cmd.request_id, std::nullopt, wire::error_code::unsupported,
                             "the node agent runs no checkpoint commands"});
      return;
    }
    {
      std::lock_guard lock{shared_->mutex};
      if (shared_->stop_received)
        return;
      shared_->stop_received = true;
      shared_->finished = true;
    }
    log(1, "stop received");
    shared_->changed.notify_all();
    for (const auto& listener : listeners_)
      self_->send(listener, stop_atom::value);
  }

  void on_error(const wire::error_reply& err) {
    if (err.request_id != 0 && complete(err.request_id, error{from_wire(err.code), err.message}))
      return;
    // Unasked: the job failed (a lost peer, the startup timeout). Anything else is the
    // scheduler complaining about a frame of ours: worth a log, not the end of the node.
    if (err.code == wire::error_code::lost_peer || err.code == wire::error_code::timeout)
      fail(error{from_wire(err.code), err.message});
    else
      log(0, "the scheduler reported: " + err.message);
  }

  void on_scheduler_down(const caf::error& reason) {
    scheduler_gone_ = true;
    {
      std::lock_guard lock{shared_->mutex};
      if (shared_->finished || shared_->failure) {
        log(1, "the scheduler left");
        return;
      }
    }
    fail(error{errc::peer_lost, "scheduler (node 1) was lost: its actor terminated (" +
                                    self_->system().render(reason) + ")"});
  }

  void on_tick() {
    bool done = false;
    bool finished = false;
    {
      std::lock_guard lock{shared_->mutex};
      done = shared_->failure.has_value();
      finished = shared_->finished;
    }
    if (done || scheduler_gone_)
      return; // nobody left to talk to: stop ticking
    if (admitted_) {
      const auto now = steady::now();
      send(wire::heartbeat{
          node_id_, ++heartbeat_sequence_,
          std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count()});
      const auto silent = std::chrono::duration_cast<std::chrono::milliseconds>(now - last_heard_);
      if (!finished && silent > options_.peer_timeout) {
        fail(error{errc::peer_lost, "scheduler (node 1) was lost: nothing heard from it for " +
                                        describe(silent) + " (peer timeout " +
                                        describe(options_.peer_timeout) + ")"});
        return;
      }
    }
    self_->delayed_send(self_, options_.heartbeat_interval, tick_atom::value);
  }

  void on_subscribe(const caf::actor& listener) {
    if (!listener)
      return;
    listeners_.push_back(listener);
    std::optional<error> failure;
    bool stopped = false;
    {
      std::lock_guard lock{shared_->mutex};
      failure = shared_->failure;
      stopped = shared_->stop_received;
    }
    if (stopped)
      self_->send(listener, stop_atom::value);
    if (failure && failure->code() == errc::peer_lost)
      self_->send(listener, peer_lost_atom::value, failure->message());
  }

  /// Fills in the outcome of request `request_id`; false when no such request is waiting.
  bool complete(std::uint64_t request_id, status outcome) {
    {
      std::lock_guard lock{shared_->mutex};
      auto pending = shared_->pending.find(request_id);
      if (pending == shared_->pending.end() || pending->second)
        return false;
      if (outcome && shared_->done_request == request_id)
        shared_->finished = true;
      pending->second = std::move(outcome);
    }
    shared_->changed.notify_all();
    return true;
  }

  /// The node's part in the job is over with `err`; the first failure wins.
  void fail(error err) {
    {
      std::lock_guard lock{shared_->mutex};
      if (shared_->failure)
        return;
      shared_->failure = err;
    }
    log(0, err.to_string());
    shared_->changed.notify_all();
    if (err.code() == errc::peer_lost)
      for (const auto& listener : listeners_)
        self_->send(listener, peer_lost_atom::value, err.message());
  }

  void send(const wire::message& msg) {
    self_->send(scheduler_, control_atom::value, encode_control(msg));
  }

  void log(int level, const std::string& text) const {
    if (options_.verbose >= level)
      std::clog << ("troupe " + name_ + ": " + text + "\n") << std::flush;
  }

  caf::event_based_actor* self_;
  caf::actor scheduler_;
  agent_options options_;
  std::shared_ptr<shared_state> shared_;
  std::vector<caf::actor> listeners_;
  std::string name_ = "node (joining)";
  std::uint32_t node_id_ = 0;
  std::uint64_t heartbeat_sequence_ = 0;
  steady::time_point last_heard_;
  bool admitted_ = false;
  bool scheduler_gone_ = false;
};

caf::behavior agent_actor(caf::stateful_actor<agent_state>* self, caf::actor scheduler,
                          agent_options options, std::shared_ptr<shared_state> shared) {
  return self->state.start(std::move(scheduler), std::move(options), std::move(shared));
}

} // namespace

result<std::unique_ptr<node_agent>> node_agent::join(caf::actor_system& sys,
                                                     const agent_options& options) {
  auto invalid = [](std::string text) { return error{errc::invalid_argument, std::move(text)}; };
  if (!sys.has_middleman())
    return invalid("node_agent::join needs an actor system with the io::middleman loaded");
  if (options.role != wire::role::server && options.role != wire::role::worker)
    return invalid("only a server or a worker joins a job, not a " +
                   std::string{wire::to_string(options.role)});
  if (options.job_id.empty())
    return invalid("job_id must not be empty");
  if (options.host.empty() || options.scheduler_host.empty())
    return invalid("host and scheduler_host must not be empty");
  if (options.scheduler_port == 0)
    return invalid("scheduler_port must not be 0");
  for (const auto& [value, field] :
       {std::pair{options.startup_timeout, "startup_timeout"},
        std::pair{options.connect_retry_interval, "connect_retry_interval"},
        std::pair{options.heartbeat_interval, "heartbeat_interval"},
        std::pair{options.peer_timeout, "peer_timeout"}})
    if (value.count() <= 0)
      return invalid(std::string{field} + " must be positive, not " +
                     std::to_string(value.count()) + " ms");

  const std::string where = options.scheduler_host + ":" + std::to_string(options.scheduler_port);
  const auto deadline = steady::now() + options.startup_timeout;
  // Processes of a job start in any order: retry until the scheduler listens.
  caf::actor scheduler;
  for (;;) {
    auto found = sys.middleman().remote_actor(options.scheduler_host, options.scheduler_port);
    if (found && *found) {
      scheduler = std::move(*found);
      break;
    }
    const std::string why = found ? "no actor published there" : sys.render(found.error());
    if (steady::now() + options.connect_retry_interval >= deadline)
      return error{errc::timeout, "could not reach the scheduler at " + where + " within " +
                                      describe(options.startup_timeout) + ": " + why};
    std::this_thread::sleep_for(options.connect_retry_interval);
  }

  auto shared = std::make_shared<shared_state>();
  auto actor = sys.spawn(agent_actor, scheduler, options, shared);
  std::unique_lock lock{shared->mutex};
  shared->changed.wait_until(
      lock, deadline, [&] { return shared->failure || (shared->admitted && shared->membership); });
  if (shared->failure || !shared->admitted || !shared->membership) {
    error err =
        shared->failure ? *shared->failure
        : shared->admitted
            ? error{errc::timeout, "admitted as " + std::string{wire::to_string(options.role)} +
                                       " " + std::to_string(shared->admitted->rank) +
                                       ", but no membership table from the scheduler at " + where +
                                       " within " + describe(options.startup_timeout)}
            : error{errc::timeout, "no answer to the registration from the scheduler at " + where +
                                       " within " + describe(options.startup_timeout)};
    lock.unlock();
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    return err;
  }
  const auto admitted = *shared->admitted;
  lock.unlock();
  return std::unique_ptr<node_agent>{new node_agent(std::move(actor), std::move(shared),
                                                    options.role, admitted.rank, admitted.node_id)};
}

node_agent::node_agent(caf::actor actor, std::shared_ptr<shared_state> shared, wire::role role,
                       std::uint32_t rank, std::uint32_t node_id)
    : actor_(std::move(actor)), shared_(std::move(shared)), role_(role), rank_(rank),
      node_id_(node_id) {}

node_agent::~node_agent() {
  caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
}

wire::membership node_agent::membership() const {
  std::lock_guard lock{shared_->mutex};
  return *shared_->membership;
}

status node_agent::request(std::uint64_t request_id, const wire::message& msg,
                           std::chrono::milliseconds timeout, const std::string& what) {
  auto frame = encode_control(msg);
  std::unique_lock lock{shared_->mutex};
  if (shared_->failure)
    return *shared_->failure;
  shared_->pending.emplace(request_id, std::nullopt);
  lock.unlock();
  caf::anon_send(actor_, send_ctrl_atom::value, std::move(frame));
  lock.lock();
  shared_->changed.wait_for(lock, timeout, [&] {
    return shared_->pending[request_id].has_value() || shared_->failure.has_value();
  });
  auto outcome = std::move(shared_->pending.extract(request_id).mapped());
  if (outcome)
    return *outcome;
  if (shared_->failure)
    return *shared_->failure;
  return error{errc::timeout, what + " not answered within " + describe(timeout)};
}

status node_agent::barrier(std::uint8_t group, std::chrono::milliseconds timeout) {
  if (group == 0 || (group & ~wire::group::all) != 0)
    return error{errc::invalid_argument, "barrier group " + std::to_string(group) +
                                             " is not a union of 1 (scheduler), 2 (servers) and "
                                             "4 (workers)"};
  if ((group & group_bit(role_)) == 0)
    return error{errc::invalid_argument, "a " + std::string{wire::to_string(role_)} +
                                             " is not a member of barrier group " +
                                             std::to_string(group)};
  std::uint64_t request_id = 0;
  std::uint64_t barrier_id = 0;
  {
    std::lock_guard lock{shared_->mutex};
    request_id = shared_->next_request_id++;
    barrier_id = ++shared_->barriers_entered[group];
  }
  return request(request_id, wire::barrier{request_id, barrier_id, group, node_id_}, timeout,
                 "barrier " + std::to_string(barrier_id) + " of group " + std::to_string(group));
}

status node_agent::notify_done(std::chrono::milliseconds timeout) {
  if (role_ != wire::role::worker)
    return error{errc::invalid_argument, "only a worker reports done; this node is a " +
                                             std::string{wire::to_string(role_)}};
  std::uint64_t request_id = 0;
  {
    std::lock_guard lock{shared_->mutex};
    request_id = shared_->next_request_id++;
    shared_->done_request = request_id;
  }
  return request(request_id, wire::command{request_id, wire::command_kind::stop, {}}, timeout,
                 "done");
}

status node_agent::wait_for_stop(std::chrono::milliseconds timeout) {
  std::unique_lock lock{shared_->mutex};
  shared_->changed.wait_for(lock, timeout,
                            [&] { return shared_->stop_received || shared_->failure; });
  if (shared_->stop_received)
    return ok();
  if (shared_->failure)
    return *shared_->failure;
  return error{errc::timeout, "no stop command within " + describe(timeout)};
}

bool node_agent::stop_received() const {
  std::lock_guard lock{shared_->mutex};
  return shared_->stop_received;
}

void node_agent::subscribe(const caf::actor& listener) {
  caf::anon_send(actor_, subscribe_atom::value, listener);
}

std::optional<error> node_agent::failure() const {
  std::lock_guard lock{shared_->mutex};
  return shared_->failure;
}

} // namespace troupe
