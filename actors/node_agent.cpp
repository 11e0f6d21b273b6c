#include "actors/node_agent.hpp"

#include <algorithm>
#include <array>
#include <map>
#include <thread>
#include <utility>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/config/config.hpp"
#include "actors/data_link.hpp"
#include "actors/logic/node_identity.hpp"
#include "actors/logic/wire_conversions.hpp"
#include "actors/scheduler.hpp"

namespace troupe {

struct node_agent::joined {
  wire::admitted admitted;
  wire::membership membership;
  /// A worker's node key (empty at a server).
  node_key key;
};

namespace {

using steady = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr std::uint64_t registration_request_id = 1;
/// The tag of the control link (envelope::connection of its frames).
constexpr std::uint64_t control_link_tag = 1;
/// join()'s pauses between attempts to reach a scheduler that refuses: doubling from the first
/// to the last.
constexpr milliseconds first_backoff{50};
constexpr milliseconds longest_backoff{1'000};

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
  case wire::reject_reason::wrong_role:
    return "wrong_role";
  }
  return "unknown";
}

std::uint8_t group_bit(wire::role node_role) {
  return node_role == wire::role::server ? wire::group::servers : wire::group::workers;
}

using joined_result = result<node_agent::joined>;
using agent_pointer = node_agent_actor::pointer;

// The agent's phases: connecting (join() dials; the agent waits for the link) -> registering ->
// admitted -> joined (the first membership table: join() returns) -> finished (done acknowledged
// or stop received) or failed. failed is final and reached from any phase; after finished, the
// scheduler leaving is no loss.
class agent_state {
public:
  static inline const char* name = "troupe.node_agent";

  node_agent_actor::behavior_type start(agent_pointer self, agent_options options,
                                        completion<joined_result> joined, completion<status> ended,
                                        steady::time_point deadline) {
    self_ = self;
    options_ = std::move(options);
    joined_ = std::move(joined);
    ended_ = std::move(ended);
    deadline_ = deadline;
    log_ = options_.log;
    where_ = options_.scheduler_host + ":" + std::to_string(options_.scheduler_port);
    return {
        [this](caf::connect_atom, const caf::actor& link) { on_link(link); },
        [this](const link_authentication& what) {
          authenticated_ = true;
          session_ = what.session;
        },
        [this](envelope& frame) { on_frame(frame.msg); },
        [this](link_down_atom, std::uint64_t, const std::string& reason) { on_link_down(reason); },
        [this](control_call& call) { on_call(std::move(call)); },
        [this](subscribe_atom, const job_listener& listener) { on_subscribe(listener); },
        [this](failed_atom, std::string& why) {
          log_.error(why);
          send(wire::error_reply{0, std::nullopt, wire::error_code::internal, std::move(why)});
        },
        [this](tick_atom) {
          if (self_->current_sender().get() == self_->ctrl())
            on_tick();
        },
    };
  }

private:
  void on_link(const caf::actor& link) {
    if (link_ || failure_)
      return;
    link_ = caf::actor_cast<link_actor>(link);
    last_heard_ = steady::now();
    wire::registration reg;
    reg.request_id = registration_request_id;
    reg.node_role = options_.role;
    reg.job_id = options_.job_id;
    reg.host = options_.host;
    reg.port = options_.data_port;
    reg.rank_hint = options_.rank_hint;
    reg.recovering = options_.recovering;
    send(reg);
    self_->delayed_send(self_, options_.heartbeat_interval, tick_atom::value);
  }

  void on_frame(const wire::message& msg) {
    last_heard_ = steady::now();
    log_.debug([&] { return std::string{wire::kind_name(msg)} + " from the scheduler"; });
    if (const auto* admission = std::get_if<wire::admission>(&msg))
      on_admission(*admission);
    else if (const auto* table = std::get_if<wire::membership>(&msg))
      on_membership(*table);
    else if (const auto* release = std::get_if<wire::barrier_release>(&msg))
      on_release(*release);
    else if (const auto* acked = std::get_if<wire::ack>(&msg))
      complete(acked->request_id, ok());
    else if (const auto* cmd = std::get_if<wire::command>(&msg))
      on_command(*cmd);
    else if (const auto* err = std::get_if<wire::error_reply>(&msg))
      on_error(*err);
    else if (!std::holds_alternative<wire::heartbeat>(msg))
      log_.error("ignored a " + std::string{wire::kind_name(msg)} + " from the scheduler");
  }

  void on_admission(const wire::admission& admission) {
    if (admission.request_id != registration_request_id || admitted_) {
      log_.error("ignored an admission that answers no registration");
      return;
    }
    if (const auto* rejected = std::get_if<wire::rejected>(&admission.outcome))
      return fail(error{errc::invalid_argument, "registration rejected (" +
                                                    std::string{to_string(rejected->reason)} +
                                                    "): " + rejected->detail});
    const auto& granted = std::get<wire::admitted>(admission.outcome);
    const wire::node_identity who{options_.role, granted.rank};
    const auto secret = session_.empty() || !granted.secret
                            ? std::nullopt
                            : unseal_secret(session_, *granted.secret, who, granted.node_id);
    if (!secret)
      return fail(error{errc::invalid_argument,
                        "the scheduler at " + where_ + " admitted this node as " +
                            wire::describe(who) +
                            ", but its secret does not open under this control link's session "
                            "key (is it a scheduler of this job?)"});
    admitted_ = granted;
    node_id_ = admitted_->node_id;
    if (options_.role == wire::role::worker)
      key_ = node_key{*secret};
    else if (options_.on_job_secret)
      options_.on_job_secret(job_secret{*secret});
    log_ = options_.log.named(
        node_name(wire::to_string(options_.role), admitted_->rank, options_.host));
    log_.info("admitted as node " + std::to_string(node_id_));
    maybe_joined();
  }

  void on_membership(const wire::membership& table) {
    if (membership_ && membership_->epoch >= table.epoch)
      return;
    const bool first = !membership_;
    membership_ = table;
    std::size_t alive = 0;
    for (const auto& node : table.nodes)
      alive += node.alive ? 1 : 0;
    log_.info("membership epoch " + std::to_string(table.epoch) + ": " + std::to_string(alive) +
              " of " + std::to_string(table.nodes.size()) + " nodes alive");
    if (first)
      return maybe_joined();
    for (const auto& listener : listeners_)
      self_->send(listener, table);
  }

  void maybe_joined() {
    if (!admitted_ || !membership_ || joined_.ready())
      return;
    joined_.deliver(node_agent::joined{*admitted_, *membership_, key_});
  }

  void on_command(const wire::command& cmd) {
    if (cmd.kind != wire::command_kind::stop)
      return send(wire::error_reply{cmd.request_id, std::nullopt, wire::error_code::unsupported,
                                    "the node agent runs no checkpoint commands"});
    if (stopped_)
      return;
    stopped_ = true;
    finished_ = true;
    log_.info("stop received");
    ended_.deliver(ok());
    for (const auto& listener : listeners_)
      self_->send(listener, stop_atom::value);
  }

  void on_error(const wire::error_reply& err) {
    if (err.request_id != 0 && complete(err.request_id, from_wire(err)))
      return;
    // A refused registration, or unasked: the job failed (a lost peer, the startup timeout).
    // Anything else is the scheduler complaining about a frame of ours: worth a log, not the
    // end of the node.
    if ((err.request_id == registration_request_id && !admitted_) ||
        (err.request_id == 0 &&
         (err.code == wire::error_code::lost_peer || err.code == wire::error_code::timeout)))
      fail(from_wire(err));
    else
      log_.error("the scheduler reported: " + err.message);
  }

  void on_link_down(const std::string& reason) {
    link_ = nullptr;
    if (!authenticated_) {
      // Not a lost scheduler: this node never got in. A refusal is the scheduler's answer to
      // this node's proofs (a wrong token), said as such.
      if (auto refusal = handshake_refusal(reason))
        return fail(error{errc::invalid_argument,
                          "refused by the scheduler at " + where_ + ": " + *refusal});
      return fail(error{errc::peer_lost, "the scheduler at " + where_ +
                                             " closed the control link before its handshake was "
                                             "done: " +
                                             reason});
    }
    if (finished_ || failure_) {
      log_.info("the scheduler left");
      // Nothing can answer a call still waiting (a barrier after done): say so now.
      for (auto& [id, call] : pending_)
        call.done.deliver(left(call.what));
      pending_.clear();
      return;
    }
    fail(error{errc::peer_lost, "scheduler (node 1) was lost: " + reason});
  }

  void on_call(control_call call) {
    if (failure_) {
      call.done.deliver(*failure_);
      return;
    }
    if (!link_) {
      call.done.deliver(left(call.what));
      return;
    }
    const std::uint64_t id = next_request_id_++;
    if (auto* field = wire::request_id_field(call.request))
      *field = id;
    if (auto* request = std::get_if<wire::barrier>(&call.request)) {
      // Every member calls barrier(group) in the same order (ps-lite's contract), so the ids of
      // the members agree.
      request->barrier_id = ++barriers_entered_[request->group & wire::group::all];
      request->sender_node_id = node_id_;
    }
    if (const auto* cmd = std::get_if<wire::command>(&call.request);
        cmd && cmd->kind == wire::command_kind::stop)
      done_request_ = id;
    // Calls whose caller stopped waiting are dropped here, so the table stays as small as the
    // number of callers.
    std::erase_if(pending_, [](const auto& entry) { return entry.second.done.cancelled(); });
    send(call.request);
    pending_.emplace(id, std::move(call));
  }

  /// A barrier's release: its gathered values go to the caller that asked for them.
  void on_release(const wire::barrier_release& release) {
    if (auto found = pending_.find(release.request_id);
        found != pending_.end() && found->second.gathered)
      *found->second.gathered = release.gathered;
    complete(release.request_id, ok());
  }

  /// Delivers the outcome of request `request_id`; false when no such request is waiting.
  bool complete(std::uint64_t request_id, status outcome) {
    auto found = pending_.find(request_id);
    if (found == pending_.end())
      return false;
    if (outcome && done_request_ == request_id)
      finished_ = true;
    found->second.done.deliver(std::move(outcome));
    pending_.erase(found);
    return true;
  }

  void on_subscribe(const job_listener& listener) {
    if (!listener)
      return;
    listeners_.push_back(listener);
    if (stopped_)
      self_->send(listener, stop_atom::value);
    if (failure_ && failure_->code() == errc::peer_lost)
      self_->send(listener, peer_lost_atom::value, failure_->message());
  }

  void on_tick() {
    if (failure_ || !link_)
      return; // nobody left to talk to: stop ticking
    const auto now = steady::now();
    if (!joined_.ready() && now >= deadline_) {
      const auto waited = format_duration(options_.startup_timeout);
      return fail(admitted_ ? error{errc::timeout,
                                    "admitted as " + std::string{wire::to_string(options_.role)} +
                                        " " + std::to_string(admitted_->rank) +
                                        ", but no membership table from the scheduler at " +
                                        where_ + " within " + waited}
                            : error{errc::timeout, "no answer to the registration from the "
                                                   "scheduler at " +
                                                       where_ + " within " + waited});
    }
    if (admitted_) {
      send(wire::heartbeat{
          node_id_, ++heartbeat_sequence_,
          std::chrono::duration_cast<std::chrono::nanoseconds>(now.time_since_epoch()).count()});
      const auto silent = std::chrono::duration_cast<milliseconds>(now - last_heard_);
      if (!finished_ && silent > options_.peer_timeout)
        return fail(
            error{errc::peer_lost, "scheduler (node 1) was lost: nothing heard from it for " +
                                       format_duration(silent) + " (peer timeout " +
                                       format_duration(options_.peer_timeout) + ")"});
    }
    self_->delayed_send(self_, options_.heartbeat_interval, tick_atom::value);
  }

  /// The node's part in the job is over with `err`; the first failure wins. Every waiting call
  /// and every later one gets it.
  void fail(error err) {
    if (failure_)
      return;
    failure_ = err;
    log_.error(err.to_string());
    const bool had_joined = joined_.ready();
    joined_.deliver(err);
    ended_.deliver(err);
    for (auto& [id, call] : pending_)
      call.done.deliver(err);
    pending_.clear();
    if (had_joined && err.code() == errc::peer_lost)
      for (const auto& listener : listeners_)
        self_->send(listener, peer_lost_atom::value, err.message());
  }

  /// The answer to a call that the scheduler, gone after the node finished, cannot give.
  error left(const std::string& what) const {
    return error{errc::peer_lost,
                 what + ": the scheduler at " + where_ + " has left (the job ended)"};
  }

  void send(wire::message msg) {
    if (link_)
      self_->send(link_, envelope{std::move(msg), nullptr, control_link_tag});
  }

  agent_pointer self_ = nullptr;
  agent_options options_;
  completion<joined_result> joined_;
  completion<status> ended_;
  steady::time_point deadline_;
  logger log_;
  /// "host:port" of the scheduler.
  std::string where_;
  link_actor link_;
  /// The control link's handshake is done, and the session key it agreed.
  bool authenticated_ = false;
  session_key session_;
  /// A worker's node key, from its admission.
  node_key key_;
  std::optional<wire::admitted> admitted_;
  std::optional<wire::membership> membership_;
  std::optional<error> failure_;
  std::uint32_t node_id_ = 0;
  bool stopped_ = false;
  /// Done acknowledged or stop received: the scheduler may leave without that being a loss.
  bool finished_ = false;
  std::map<std::uint64_t, control_call> pending_;
  std::optional<std::uint64_t> done_request_;
  /// 1 is the registration's.
  std::uint64_t next_request_id_ = registration_request_id + 1;
  /// Barriers this node entered, per group: the next barrier's id is one more.
  std::array<std::uint64_t, 8> barriers_entered_{};
  std::vector<job_listener> listeners_;
  std::uint64_t heartbeat_sequence_ = 0;
  steady::time_point last_heard_;
};

node_agent_actor::behavior_type agent_behavior(node_agent_actor::stateful_pointer<agent_state> self,
                                               agent_options options,
                                               completion<joined_result> joined,
                                               completion<status> ended,
                                               steady::time_point deadline) {
  return self->state.start(self, std::move(options), std::move(joined), std::move(ended), deadline);
}

/// Dials the scheduler until it accepts, pausing first_backoff, doubling to longest_backoff,
/// between attempts; gives up at `deadline` naming host:port, the time tried and the last
/// reason.
result<caf::actor> connect_with_backoff(caf::actor_system& sys, const agent_options& options,
                                        const node_agent_actor& receiver,
                                        steady::time_point deadline) {
  const std::string where = options.scheduler_host + ":" + std::to_string(options.scheduler_port);
  const auto started = steady::now();
  data_link_options link_options;
  link_options.tuning =
      control_link_tuning(max_control_frame_bytes, options.log.part("control link"),
                          link_secret(options.auth_token), {options.tls, {node_role::scheduler}});
  link_options.tag = control_link_tag;
  // The session key reaches the agent before the admission whose secret is sealed under it.
  link_options.on_authenticated = [agent = receiver](const link_authentication& what) {
    caf::anon_send(agent, what);
  };
  auto backoff = first_backoff;
  for (int attempts = 1;; ++attempts) {
    auto link = connect_data_link(sys, options.scheduler_host, options.scheduler_port,
                                  caf::actor_cast<caf::actor>(receiver), link_options);
    if (link)
      return link;
    const auto now = steady::now();
    if (now >= deadline) {
      const auto tried = std::chrono::duration_cast<milliseconds>(now - started);
      return error{errc::timeout, "could not reach the scheduler at " + where + ": tried for " +
                                      format_duration(tried) + " (" + std::to_string(attempts) +
                                      " attempts, connect timeout " +
                                      format_duration(options.connect_timeout) +
                                      "); last: " + link.error().message()};
    }
    options.log.debug("the scheduler at " + where + " refused (" + link.error().message() +
                      "); retrying");
    std::this_thread::sleep_for(std::min<steady::duration>(backoff, deadline - now));
    backoff = std::min(backoff * 2, longest_backoff);
  }
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
  if (options.host.size() > max_host_bytes)
    return invalid("host must have at most " + std::to_string(max_host_bytes) + " bytes");
  if (options.scheduler_port == 0)
    return invalid("scheduler_port must not be 0");
  if (options.tls && to_wire(options.tls->role()) != options.role)
    return invalid("the TLS certificate " + options.tls->cert_file() + " is for a " +
                   std::string{to_string(options.tls->role())} + ", but this node joins as a " +
                   std::string{wire::to_string(options.role)});
  for (const auto& [value, field] : {std::pair{options.connect_timeout, "connect_timeout"},
                                     std::pair{options.startup_timeout, "startup_timeout"},
                                     std::pair{options.heartbeat_interval, "heartbeat_interval"},
                                     std::pair{options.peer_timeout, "peer_timeout"}})
    if (value.count() <= 0)
      return invalid(std::string{field} + " must be positive, not " +
                     std::to_string(value.count()) + " ms");

  const auto started = steady::now();
  const auto deadline = started + options.startup_timeout;
  completion<joined_result> joined_done;
  completion<status> ended;
  auto actor = sys.spawn(agent_behavior, options, joined_done, ended, deadline);
  auto give_up = [&](error err) -> result<std::unique_ptr<node_agent>> {
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
    return err;
  };
  auto link = connect_with_backoff(
      sys, options, actor, started + std::min(options.connect_timeout, options.startup_timeout));
  if (!link)
    return give_up(link.error());
  caf::anon_send(actor, caf::connect_atom::value, *link);
  // The agent ends the wait itself at `deadline` (checked at its heartbeats); this bound only
  // covers an actor system that stopped answering.
  auto got =
      joined_done.wait_or_cancel(deadline + options.heartbeat_interval + std::chrono::seconds{1});
  if (!got)
    return give_up(error{errc::timeout, "the node agent did not report within " +
                                            format_duration(options.startup_timeout)});
  if (!*got)
    return give_up(got->error());
  return std::unique_ptr<node_agent>{
      new node_agent(std::move(actor), std::move(ended), options.role, got->value())};
}

node_agent::node_agent(node_agent_actor actor, completion<status> ended, wire::role role,
                       const joined& admitted)
    : actor_(std::move(actor)), ended_(std::move(ended)), role_(role),
      rank_(admitted.admitted.rank), node_id_(admitted.admitted.node_id),
      membership_(admitted.membership), key_(admitted.key) {}

node_agent::~node_agent() {
  caf::anon_send_exit(actor_, caf::exit_reason::user_shutdown);
}

status node_agent::call(wire::message request, std::string what, std::chrono::milliseconds timeout,
                        std::shared_ptr<std::vector<wire::gathered_values>> gathered) {
  completion<status> done;
  caf::anon_send(actor_, control_call{std::move(request), what, done, std::move(gathered)});
  if (auto got = done.wait_or_cancel(completion<status>::clock::now() + timeout))
    return *got;
  return error{errc::timeout, what + " not answered within " + format_duration(timeout)};
}

status node_agent::barrier(std::uint8_t group, std::chrono::milliseconds timeout) {
  auto waited = barrier_gather(group, {}, timeout);
  if (!waited)
    return waited.error();
  return ok();
}

result<std::vector<wire::gathered_values>>
node_agent::barrier_gather(std::uint8_t group, std::span<const double> values,
                           std::chrono::milliseconds timeout) {
  if (values.size() > wire::max_barrier_values)
    return error{errc::invalid_argument, std::to_string(values.size()) +
                                             " values to share at a barrier; at most " +
                                             std::to_string(wire::max_barrier_values)};
  if (group == 0 || (group & ~wire::group::all) != 0)
    return error{errc::invalid_argument, "barrier group " + std::to_string(group) +
                                             " is not a union of 1 (scheduler), 2 (servers) and "
                                             "4 (workers)"};
  if ((group & group_bit(role_)) == 0)
    return error{errc::invalid_argument, "a " + std::string{wire::to_string(role_)} +
                                             " is not a member of barrier group " +
                                             std::to_string(group)};
  auto gathered = std::make_shared<std::vector<wire::gathered_values>>();
  auto waited = call(wire::barrier{0, 0, group, node_id_, {values.begin(), values.end()}},
                     "barrier of group " + std::to_string(group), timeout, gathered);
  if (!waited)
    return waited.error();
  return std::move(*gathered);
}

status node_agent::notify_done(std::chrono::milliseconds timeout) {
  if (role_ != wire::role::worker)
    return error{errc::invalid_argument, "only a worker reports done; this node is a " +
                                             std::string{wire::to_string(role_)}};
  return call(wire::command{0, wire::command_kind::stop, {}}, "done", timeout);
}

status node_agent::send_sync_settings(wire::sync_settings settings,
                                      std::chrono::milliseconds timeout) {
  // The protocol cannot carry a quorum of 0 (the scheduler's port would refuse the frame with no
  // request id to answer), so it is refused here.
  if (settings.quorum == 0)
    return error{errc::invalid_argument, "a quorum of 0 workers; it must be in 1.." +
                                             std::to_string(membership_.num_workers)};
  return call(std::move(settings), "sync settings", timeout);
}

status node_agent::wait_for_stop(std::chrono::milliseconds timeout) const {
  if (auto got = ended_.wait_until(completion<status>::clock::now() + timeout))
    return *got;
  return error{errc::timeout, "no stop command within " + format_duration(timeout)};
}

bool node_agent::stop_received() const {
  auto got = ended_.peek();
  return got && got->has_value();
}

void node_agent::subscribe(const job_listener& listener) {
  caf::anon_send(actor_, subscribe_atom::value, listener);
}

std::optional<error> node_agent::failure() const {
  auto got = ended_.peek();
  if (got && !got->has_value())
    return got->error();
  return std::nullopt;
}

} // namespace troupe
