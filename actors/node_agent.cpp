#include "actors/node_agent.hpp"

#include <map>
#include <thread>
#include <utility>
#include <variant>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/config/config.hpp"
#include "actors/data_link.hpp"
#include "actors/logic/wire_conversions.hpp"
#include "actors/scheduler.hpp"

namespace troupe {

struct node_agent::joined {
  wire::admitted admitted;
  wire::membership membership;
  /// A worker's node key (empty at a server).
  node_key key;
  /// A worker that joined at a barrier: what the others shared there.
  std::optional<std::vector<wire::gathered_values>> gathered;
};

namespace {

using steady = std::chrono::steady_clock;
using std::chrono::milliseconds;

/// The tag of the control link (envelope::connection of its frames).
constexpr std::uint64_t control_link_tag = 1;

std::uint8_t group_bit(wire::role node_role) {
  return node_role == wire::role::server ? wire::group::servers : wire::group::workers;
}

using joined_result = result<node_agent::joined>;
using agent_pointer = node_agent_actor::pointer;

/// The agent actor: agent_core's rules (actors/logic/agent_core.hpp) with the clock, the control
/// link, the completions of join(), of the job's end and of each waiting call, and the
/// subscribers around them.
class agent_state {
public:
  static inline const char* name = "troupe.node_agent";

  /// The behaviour: a thin dispatch to the core.
  node_agent_actor::behavior_type start(agent_pointer self, agent_options options,
                                        completion<joined_result> joined, completion<status> ended,
                                        steady::time_point started) {
    self_ = self;
    joined_ = std::move(joined);
    ended_ = std::move(ended);
    heartbeat_interval_ = options.heartbeat_interval;
    on_job_secret_ = options.on_job_secret;
    on_table_ = options.on_table;
    on_hand_over_ = options.on_hand_over;
    core_ = std::make_unique<agent_core>(std::move(options), started);
    return {
        [this](caf::connect_atom, const caf::actor& link) {
          if (!core_->wants_link())
            return;
          link_ = caf::actor_cast<link_actor>(link);
          carry_out(core_->on_connected(steady::now()));
          self_->delayed_send(self_, heartbeat_interval_, tick_atom::value);
        },
        [this](const link_authentication& what) { core_->on_authenticated(what.session); },
        [this](envelope& frame) { carry_out(core_->on_frame(frame.msg, steady::now())); },
        [this](link_down_atom, std::uint64_t, const std::string& reason) {
          link_ = nullptr;
          carry_out(core_->on_closed(reason, handshake_refusal(reason)));
        },
        [this](control_call& call) { on_call(std::move(call)); },
        [this](subscribe_atom, const job_listener& listener) {
          if (!listener)
            return;
          listeners_.push_back(listener);
          for (const auto& news : core_->news_for_new_subscriber())
            tell(listener, news);
        },
        [this](failed_atom, std::string& why) {
          carry_out(core_->on_local_failure(std::move(why)));
        },
        [this](held_atom, std::uint64_t request_id) { send(wire::ack{request_id}); },
        [this](failed_atom, std::uint64_t request_id, std::string& why) {
          send(wire::error_reply{request_id, std::nullopt, wire::error_code::invalid_argument,
                                 std::move(why)});
        },
        [this](tick_atom) {
          // Only the agent's own tick counts and schedules the next: ticks from elsewhere would
          // multiply the timers.
          if (self_->current_sender().get() != self_->ctrl() || !core_->ticking())
            return; // nobody left to talk to: stop ticking
          carry_out(core_->on_tick(steady::now()));
          if (core_->ticking())
            self_->delayed_send(self_, heartbeat_interval_, tick_atom::value);
        },
    };
  }

private:
  void on_call(control_call call) {
    // Calls whose caller stopped waiting are dropped here, so the tables stay as small as the
    // number of callers.
    std::erase_if(waiting_, [this](const auto& entry) {
      if (!entry.second.done.cancelled())
        return false;
      core_->abandon(entry.first);
      return true;
    });
    auto placed = core_->on_call(std::move(call.request), call.what);
    if (!placed) {
      call.done.deliver(placed.error());
      return;
    }
    send(std::move(placed->frame));
    waiting_.emplace(placed->request_id, std::move(call));
  }

  void carry_out(agent_core::actions actions) {
    for (auto& action : actions)
      std::visit([this](auto& step) { carry_out_one(step); }, action);
  }

  void carry_out_one(agent_core::to_scheduler& frame) { send(std::move(frame.msg)); }

  void carry_out_one(agent_core::job_secret_opened& opened) {
    if (on_job_secret_)
      on_job_secret_(opened.secret);
  }

  void carry_out_one(agent_core::joined& done) {
    if (on_table_)
      on_table_(done.membership);
    joined_.deliver(node_agent::joined{std::move(done.admitted), std::move(done.membership),
                                       std::move(done.key), std::move(done.gathered)});
  }

  void carry_out_one(agent_core::answer& answer) {
    auto found = waiting_.find(answer.request_id);
    if (found == waiting_.end())
      return;
    if (answer.gathered && found->second.gathered)
      *found->second.gathered = std::move(*answer.gathered);
    found->second.done.deliver(std::move(answer.outcome));
    waiting_.erase(found);
  }

  void carry_out_one(agent_core::job_failed& failed) {
    joined_.deliver(failed.failure);
    ended_.deliver(failed.failure);
  }

  void carry_out_one(agent_core::job_stopped&) { ended_.deliver(ok()); }

  void carry_out_one(agent_core::hand_over_asked& asked) {
    const auto id = asked.order.request_id;
    if (!on_hand_over_) {
      send(wire::error_reply{id, std::nullopt, wire::error_code::unsupported,
                             "this server does not hand key ranges over"});
      return;
    }
    on_hand_over_(asked.order, [agent = caf::actor_cast<node_agent_actor>(self_), id](status how) {
      if (how)
        caf::anon_send(agent, held_atom::value, id);
      else
        caf::anon_send(agent, failed_atom::value, id, how.error().message());
    });
  }

  void carry_out_one(agent_core::tell_subscribers& told) {
    if (const auto* table = std::get_if<wire::membership>(&told.what); table && on_table_)
      on_table_(*table);
    for (const auto& listener : listeners_)
      tell(listener, told.what);
  }

  void tell(const job_listener& listener, const agent_core::news& news) {
    std::visit(
        [&](const auto& what) {
          using type = std::decay_t<decltype(what)>;
          if constexpr (std::is_same_v<type, agent_core::stop_news>)
            self_->send(listener, stop_atom::value);
          else if constexpr (std::is_same_v<type, agent_core::lost_news>)
            self_->send(listener, peer_lost_atom::value, what.message);
          else
            self_->send(listener, what);
        },
        news);
  }

  void send(wire::message msg) {
    if (link_)
      self_->send(link_, envelope{std::move(msg), nullptr, control_link_tag});
  }

  agent_pointer self_ = nullptr;
  std::unique_ptr<agent_core> core_;
  completion<joined_result> joined_;
  completion<status> ended_;
  milliseconds heartbeat_interval_{};
  std::function<void(const job_secret&)> on_job_secret_;
  std::function<void(const wire::membership&)> on_table_;
  std::function<void(const wire::hand_over&, std::function<void(status)>)> on_hand_over_;
  link_actor link_;
  /// The calls waiting for the scheduler's answer, by request id.
  std::map<std::uint64_t, control_call> waiting_;
  std::vector<job_listener> listeners_;
};

node_agent_actor::behavior_type agent_behavior(node_agent_actor::stateful_pointer<agent_state> self,
                                               agent_options options,
                                               completion<joined_result> joined,
                                               completion<status> ended,
                                               steady::time_point started) {
  return self->state.start(self, std::move(options), std::move(joined), std::move(ended), started);
}

/// Dials the scheduler until it accepts, pausing as connect_backoff says between attempts; gives
/// up at `deadline` naming host:port, the time tried and the last reason.
result<caf::actor> connect_with_backoff(caf::actor_system& sys, const agent_options& options,
                                        const node_agent_actor& receiver,
                                        steady::time_point deadline) {
  const std::string where = options.scheduler_host + ":" + std::to_string(options.scheduler_port);
  data_link_options link_options;
  link_options.tuning =
      control_link_tuning(max_control_frame_bytes, options.log.part("control link"),
                          link_secret(options.auth_token), {options.tls, {node_role::scheduler}});
  link_options.tag = control_link_tag;
  // The session key reaches the agent before the admission whose secret is sealed under it.
  link_options.on_authenticated = [agent = receiver](const link_authentication& what) {
    caf::anon_send(agent, what);
  };
  connect_backoff backoff{steady::now(), deadline};
  for (;;) {
    auto link = connect_data_link(sys, options.scheduler_host, options.scheduler_port,
                                  caf::actor_cast<caf::actor>(receiver), link_options);
    if (link)
      return link;
    const auto pause = backoff.failed(steady::now(), link.error().message());
    if (!pause)
      return backoff.give_up(where, options.connect_timeout);
    options.log.debug("the scheduler at " + where + " refused (" + link.error().message() +
                      "); retrying");
    std::this_thread::sleep_for(*pause);
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
  auto actor = sys.spawn(agent_behavior, options, joined_done, ended, started);
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
      joined_running_job_(admitted.admitted.joined), membership_(admitted.membership),
      key_(admitted.key), gathered_at_join_(admitted.gathered) {}

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

status node_agent::barrier(std::uint8_t group, std::chrono::milliseconds timeout, bool start) {
  auto waited = barrier_gather(group, {}, timeout, start);
  if (!waited)
    return waited.error();
  return ok();
}

result<std::vector<wire::gathered_values>>
node_agent::barrier_gather(std::uint8_t group, std::span<const double> values,
                           std::chrono::milliseconds timeout, bool start) {
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
  auto waited = call(wire::barrier{0, 0, group, node_id_, {values.begin(), values.end()}, start},
                     "barrier of group " + std::to_string(group), timeout, gathered);
  if (!waited)
    return waited.error();
  return std::move(*gathered);
}

status node_agent::notify_done(std::chrono::milliseconds timeout, std::uint64_t rounds) {
  if (role_ != wire::role::worker)
    return error{errc::invalid_argument, "only a worker reports done; this node is a " +
                                             std::string{wire::to_string(role_)}};
  return call(wire::command{0, wire::command_kind::stop, {}, false, rounds}, "done", timeout);
}

status node_agent::ask_to_leave(std::chrono::milliseconds timeout) {
  if (role_ != wire::role::server)
    return error{errc::invalid_argument, "only a server asks to leave; this node is a " +
                                             std::string{wire::to_string(role_)}};
  return call(wire::command{0, wire::command_kind::stop, {}}, "leave", timeout);
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
