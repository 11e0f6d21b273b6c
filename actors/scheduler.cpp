#include "actors/scheduler.hpp"

#include <algorithm>
#include <memory>
#include <optional>
#include <unordered_map>
#include <utility>
#include <variant>

#include <caf/actor_system.hpp>
#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <caf/typed_event_based_actor.hpp>

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

/// The scheduler actor: scheduler_core's rules (actors/logic/scheduler_core.hpp) with the clock,
/// the control connections' sinks, the job barrier actor and the job's outcome around them.
class scheduler_state {
public:
  /// CAF's name for the actor (logs, `name()`).
  static inline const char* name = "troupe.scheduler";

  /// The behaviour: a thin dispatch to the core.
  scheduler_actor::behavior_type start(scheduler_actor::pointer self, scheduler_options options,
                                       completion<job_outcome> outcome) {
    self_ = self;
    outcome_ = std::move(outcome);
    log_ = options.log;
    heartbeat_interval_ = options.heartbeat_interval;
    barrier_ = spawn_job_barrier(self_->system(), options.num_servers, options.num_workers,
                                 log_.part("barrier"), scheduler_actor{self_});
    self_->attach_functor(
        [barrier = barrier_] { caf::anon_send_exit(barrier, caf::exit_reason::user_shutdown); });
    self_->set_default_handler([this](caf::scheduled_actor*, caf::message_view& msg) {
      log_.debug("dropped an unexpected message " + caf::to_string(msg.copy_content_to_message()));
      return caf::result<caf::message>{caf::sec::unexpected_message};
    });
    core_ = std::make_unique<scheduler_core>(std::move(options), steady::now());
    self_->delayed_send(self_, heartbeat_interval_, tick_atom::value);
    return {
        [this](envelope& frame, const reply_sink& sink) {
          // Every connection of the scheduler's port has the same sink (its broker); it is kept
          // per connection so that the core's answers need only name the connection.
          sinks_[frame.connection] = sink;
          carry_out(core_->on_frame(frame.connection, frame.msg, steady::now()));
        },
        [this](closed_atom, std::uint64_t connection) {
          carry_out(core_->on_closed(connection, steady::now()));
          sinks_.erase(connection);
        },
        [this](const certified_peer& peer) { core_->on_certified(peer.connection, peer.role); },
        [this](const authenticated_peer& peer) {
          core_->on_authenticated(peer.connection, peer.authentication.session);
        },
        [this](tick_atom) {
          // Only the scheduler's own tick counts and schedules the next: ticks from elsewhere
          // would multiply the timers.
          if (self_->current_sender().get() != self_->ctrl())
            return;
          carry_out(core_->on_tick(steady::now()));
          if (!core_->ended())
            self_->delayed_send(self_, heartbeat_interval_, tick_atom::value);
        },
        [this](barrier_held& held) {
          std::vector<std::uint32_t> joiners;
          for (const auto& arrival : held.arrivals)
            if (arrival.joins)
              joiners.push_back(arrival.member);
          held_barriers_.push_back(std::move(held.arrivals));
          carry_out(core_->on_joiners_taken_in(joiners, steady::now()));
        },
    };
  }

private:
  void carry_out(scheduler_core::actions actions) {
    for (auto& action : actions)
      std::visit([this](auto& step) { carry_out_one(step); }, action);
  }

  void carry_out_one(scheduler_core::control_frame& frame) {
    if (auto sink = sink_of(frame.connection))
      self_->send(*sink, envelope{std::move(frame.msg), nullptr, frame.connection});
  }

  void carry_out_one(scheduler_core::barrier_entry& entry) {
    auto sink = sink_of(entry.connection);
    if (!sink)
      return;
    self_->send(barrier_, barrier_arrival{std::move(entry), *sink});
  }

  void carry_out_one(scheduler_core::barrier_member_gone& gone) {
    self_->send(barrier_, barrier_member_lost{gone.member, gone.member_role});
  }

  void carry_out_one(scheduler_core::barrier_member_joined& joined) {
    self_->send(barrier_, barrier_member_joined{joined.member, std::move(joined.first_barrier),
                                                joined.at_next_barrier});
  }

  void carry_out_one(scheduler_core::release_held_barriers&) {
    // The workers' table counts the joiners now: sent to their sinks before these releases.
    for (const auto& arrivals : held_barriers_)
      for (auto& [sink, message] : release_messages(arrivals))
        self_->send(sink, std::move(message));
    held_barriers_.clear();
  }

  void carry_out_one(scheduler_core::job_ended& ended) {
    const bool success = !ended.outcome.failure;
    outcome_.deliver(std::move(ended.outcome));
    if (success)
      self_->quit();
    else
      self_->quit(caf::exit_reason::user_shutdown);
  }

  /// The sink of an open control connection; nullopt once it closed.
  std::optional<reply_sink> sink_of(std::uint64_t connection) const {
    auto found = sinks_.find(connection);
    if (found == sinks_.end())
      return std::nullopt;
    return found->second;
  }

  scheduler_actor::pointer self_ = nullptr;
  std::unique_ptr<scheduler_core> core_;
  completion<job_outcome> outcome_;
  logger log_;
  milliseconds heartbeat_interval_{};
  barrier_actor barrier_;
  /// Barriers the job barriers completed that take in a joiner, until its table is out.
  std::vector<std::vector<barrier_arrival>> held_barriers_;
  /// The sink of each open control connection that has sent a frame.
  std::unordered_map<std::uint64_t, reply_sink> sinks_;
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
  if (options.max_workers > max_nodes_per_role)
    return invalid("max_workers must be at most " + std::to_string(max_nodes_per_role) + ", not " +
                   std::to_string(options.max_workers));
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
      control_link_tuning(scheduler_frame_bytes(options.num_servers +
                                                std::max(options.num_workers, options.max_workers)),
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
