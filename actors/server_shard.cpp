#include "actors/server_shard.hpp"

#include <memory>
#include <utility>

#include <caf/actor_cast.hpp>
#include <caf/send.hpp>
#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/logic/hop_probe.hpp"
#include "engine/dispatch.hpp"

namespace troupe {
namespace {

/// Where a shard's replies go, from whichever thread answers: on the data server broker's own
/// thread, while it hands a request to shard_lane::take, into its reply_collector; elsewhere (the
/// shard's actor on a scheduler thread) to the sink as a message, which wakes the broker.
reply_function replies_to(const reply_sink& sink) {
  return [sink](envelope out) {
    TROUPE_HOP(shard_out);
    if (!reply_collector::collect_here(caf::actor_cast<caf::abstract_actor*>(sink), out))
      caf::anon_send(sink, std::move(out));
  };
}

/// Whether `request` is small enough for shard_lane::take to answer on its thread: its tensor
/// (all of it, not only this chunk) and its key's stored value.
bool answerable_here(const shard_core& core, const envelope& request) {
  if (const auto* tensor = wire::tensor_of(request.msg))
    if (tensor->total_bytes > shard_lane::answer_here_bytes)
      return false;
  const auto key = wire::key_of(request.msg);
  return key && core.value_bytes(*key) <= shard_lane::answer_here_bytes;
}

struct shard_actor_state {
  std::shared_ptr<shard_lane> lane;
  std::chrono::milliseconds sweep_interval{};
  static inline const char* name = "troupe.server_shard";

  ~shard_actor_state() {
    if (lane)
      lane->close();
  }
};

shard_actor::behavior_type shard_behavior(shard_actor::stateful_pointer<shard_actor_state> self,
                                          shard_options options, std::shared_ptr<shard_lane> lane) {
  // A request's own failures are answered by the core (shard_core::handle); whatever still
  // escapes ends the shard with the reason, which server_node reports.
  self->set_exception_handler(
      [index = options.shard_index](caf::scheduled_actor*, std::exception_ptr& thrown) {
        std::string what = "an exception of unknown type";
        try {
          std::rethrow_exception(thrown);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        return caf::make_error(caf::sec::runtime_error,
                               "server shard " + std::to_string(index) + ": " + what);
      });
  self->state.sweep_interval = options.sweep_interval;
  self->state.lane = lane;
  auto restore_from = std::move(options.restore_from);
  const auto index = options.shard_index;
  lane->open(std::make_unique<shard_core>(std::move(options)));
  if (restore_from) {
    const engine::inline_scope here;
    status restored = ok();
    lane->with_core([&](shard_core& core) { restored = core.restore(*restore_from); });
    if (!restored)
      self->quit(caf::make_error(caf::sec::runtime_error, "server shard " + std::to_string(index) +
                                                              ": " + restored.error().message()));
  }
  self->delayed_send(self, self->state.sweep_interval, tick_atom::value);
  // A shard's arrays are its own and its answers leave from this thread: its operations run
  // here, not on a device actor (a hop per operation would cost more than the operation).
  auto handle = [self](envelope& request, const reply_sink& sink, bool handed) {
    TROUPE_HOP(shard_in);
    const engine::inline_scope here;
    self->state.lane->with_core([&](shard_core& core) {
      core.handle(std::move(request), replies_to(sink));
      if (handed)
        self->state.lane->handled_one();
    });
  };
  return {
      [handle](envelope& request, const reply_sink& sink) { handle(request, sink, false); },
      [handle](handed_atom, envelope& request, const reply_sink& sink) {
        handle(request, sink, true);
      },
      [self](const wire::membership& table) {
        self->state.lane->with_core([&](shard_core& core) { core.on_membership(table); });
      },
      [self](handed_atom, const wire::membership& table) {
        self->state.lane->with_core([&](shard_core& core) {
          core.on_membership(table);
          self->state.lane->handled_one();
        });
      },
      [self](closed_atom, std::uint64_t connection) {
        const engine::inline_scope here;
        self->state.lane->with_core(
            [&](shard_core& core) { core.on_connection_closed(connection); });
      },
      [self](tick_atom) {
        // Only the shard's own tick sweeps and schedules the next: ticks from elsewhere would
        // multiply the timers.
        if (self->current_sender().get() != self->ctrl())
          return;
        const engine::inline_scope here;
        self->state.lane->with_core([](shard_core& core) {
          core.expire_pulls();
          core.drop_stalled_inits();
          core.checkpoint_if_due();
        });
        self->delayed_send(self, self->state.sweep_interval, tick_atom::value);
      },
      [self](stats_atom) {
        shard_stats stats;
        self->state.lane->with_core([&](const shard_core& core) { stats = core.stats(); });
        return stats;
      },
      [self](rank_atom, std::uint32_t rank) {
        self->state.lane->with_core([&](shard_core& core) { core.set_server_rank(rank); });
      },
      [self](hand_over_atom, shard_hand_over& call) {
        const engine::inline_scope here;
        result<shard_snapshot> keys = error{errc::internal, "the shard is closed"};
        self->state.lane->with_core(
            [&](shard_core& core) { keys = core.hand_over(std::move(call.ranges)); });
        if (!keys)
          call.done.deliver(keys.error());
        else
          call.done.deliver(std::make_shared<const encoded_hand_over>(encode_hand_over(*keys)));
      },
  };
}

} // namespace

bool shard_lane::take(envelope request, const reply_sink& sink) {
  if (answers_here_ && handed_.load(std::memory_order_relaxed) == 0) {
    std::unique_lock lock{mutex_, std::try_to_lock};
    // With the lock held the actor runs nothing, and it lowers handed_ under the lock: 0 here
    // means it has handled everything handed to it.
    if (lock && core_ && handed_.load(std::memory_order_relaxed) == 0 &&
        answerable_here(*core_, request)) {
      const engine::inline_scope here;
      core_->handle(std::move(request), replies_to(sink));
      return true;
    }
  }
  handed_.fetch_add(1, std::memory_order_relaxed);
  if (auto actor = caf::actor_cast<shard_actor>(actor_))
    caf::anon_send(actor, handed_atom::value, std::move(request), sink);
  return false;
}

void shard_lane::hand(const shard_actor& actor, const wire::membership& table) {
  handed_.fetch_add(1, std::memory_order_relaxed);
  caf::anon_send(actor, handed_atom::value, table);
}

void shard_lane::open(std::unique_ptr<shard_core> core) {
  std::lock_guard lock{mutex_};
  core_ = std::move(core);
}

void shard_lane::set_actor(const shard_actor& actor) {
  std::lock_guard lock{mutex_};
  actor_ = actor.address();
}

void shard_lane::close() noexcept {
  std::unique_ptr<shard_core> gone;
  {
    std::lock_guard lock{mutex_};
    gone = std::move(core_);
  }
  // The last checkpoint is written outside the lock: take() never waits for it.
}

shard_actor spawn_server_shard(caf::actor_system& system, shard_options options) {
  auto lane = std::make_shared<shard_lane>(options.update_device.is_cpu());
  return spawn_server_shard(system, std::move(options), std::move(lane));
}

shard_actor spawn_server_shard(caf::actor_system& system, shard_options options,
                               std::shared_ptr<shard_lane> lane) {
  auto actor = system.spawn(shard_behavior, std::move(options), lane);
  lane->set_actor(actor);
  return actor;
}

} // namespace troupe
