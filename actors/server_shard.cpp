#include "actors/server_shard.hpp"

#include <memory>
#include <utility>

#include <caf/stateful_actor.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "actors/logic/hop_probe.hpp"
#include "engine/dispatch.hpp"

namespace troupe {
namespace {

struct shard_actor_state {
  std::unique_ptr<shard_core> core;
  std::chrono::milliseconds sweep_interval{};
  static inline const char* name = "troupe.server_shard";
};

shard_actor::behavior_type shard_behavior(shard_actor::stateful_pointer<shard_actor_state> self,
                                          shard_options options) {
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
  auto restore_from = std::move(options.restore_from);
  const auto index = options.shard_index;
  self->state.core = std::make_unique<shard_core>(std::move(options));
  if (restore_from) {
    const engine::inline_scope here;
    if (auto restored = self->state.core->restore(*restore_from); !restored)
      self->quit(caf::make_error(caf::sec::runtime_error, "server shard " + std::to_string(index) +
                                                              ": " + restored.error().message()));
  }
  self->delayed_send(self, self->state.sweep_interval, tick_atom::value);
  return {
      [self](envelope& request, const reply_sink& sink) {
        // A shard's arrays are its own and its answers leave from this thread: its operations run
        // here, not on a device actor (a hop per operation would cost more than the operation).
        TROUPE_HOP(shard_in);
        const engine::inline_scope here;
        self->state.core->handle(std::move(request), [self, sink](envelope out) {
          TROUPE_HOP(shard_out);
          self->send(sink, std::move(out));
        });
      },
      [self](const wire::membership& table) { self->state.core->on_membership(table); },
      [self](closed_atom, std::uint64_t connection) {
        const engine::inline_scope here;
        self->state.core->on_connection_closed(connection);
      },
      [self](tick_atom) {
        // Only the shard's own tick sweeps and schedules the next: ticks from elsewhere would
        // multiply the timers.
        if (self->current_sender().get() != self->ctrl())
          return;
        const engine::inline_scope here;
        self->state.core->expire_pulls();
        self->state.core->drop_stalled_inits();
        self->state.core->checkpoint_if_due();
        self->delayed_send(self, self->state.sweep_interval, tick_atom::value);
      },
      [self](stats_atom) { return self->state.core->stats(); },
      [self](rank_atom, std::uint32_t rank) { self->state.core->set_server_rank(rank); },
  };
}

} // namespace

shard_actor spawn_server_shard(caf::actor_system& system, shard_options options) {
  return system.spawn(shard_behavior, std::move(options));
}

} // namespace troupe
