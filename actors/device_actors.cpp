#include "actors/device_actors.hpp"

#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <utility>

#include <caf/exit_reason.hpp>
#include <caf/send.hpp>
#include <caf/spawn_options.hpp>
#include <caf/typed_event_based_actor.hpp>

#include "kernels/cuda/device.hpp"

namespace troupe {

namespace {

/// A gpu(i) actor's own CUDA stream and cuBLAS handle, made on its first work (on its own
/// thread). When they cannot be made (no such device), the work runs without them and its first
/// CUDA call reports why.
struct device_state {
  std::unique_ptr<kernels::cuda::stream> stream;
  bool stream_tried = false;
};

using device_actor_pointer = device_actor::stateful_pointer<device_state>;

device_actor::behavior_type device_behavior(device_actor_pointer self, context ctx) {
  return {
      [self, ctx](device_work& work) {
        auto& state = self->state;
        if (ctx.is_gpu() && !state.stream_tried) {
          state.stream_tried = true;
          try {
            state.stream = std::make_unique<kernels::cuda::stream>(ctx.id);
          } catch (const std::exception&) {
            state.stream.reset();
          }
        }
        std::optional<kernels::cuda::stream_scope> on_own_stream;
        if (state.stream)
          on_own_stream.emplace(*state.stream);
        work.run();
      },
  };
}

} // namespace

device_actors::~device_actors() {
  std::lock_guard lock(mutex_);
  for (auto& [ctx, actor] : actors_)
    caf::anon_send_exit(actor, caf::exit_reason::user_shutdown);
}

device_actor device_actors::actor_of(context ctx) {
  std::lock_guard lock(mutex_);
  auto& actor = actors_[ctx];
  if (!actor)
    actor = system_.spawn<caf::detached>(device_behavior, ctx);
  return actor;
}

void device_actors::post(context ctx, std::function<void()> work) {
  caf::anon_send(actor_of(ctx), device_work{std::move(work)});
}

result<bool> device_actors_requested() {
  const char* value = std::getenv("TROUPE_ENGINE_TYPE");
  const std::string text = value == nullptr ? "" : value;
  if (text.empty() || text == "device")
    return true;
  if (text == "naive")
    return false;
  return error{errc::invalid_argument,
               "TROUPE_ENGINE_TYPE='" + text + "': expected 'device' (device actors) or 'naive'"};
}

device_scope::device_scope() {
  own_config_.emplace();
  // The device actors are detached: the scheduler's threads have nothing to run.
  own_config_->set("scheduler.max-threads", 1);
  own_system_.emplace(*own_config_);
  actors_ = std::make_shared<device_actors>(*own_system_);
  previous_ = engine::set_backend(actors_);
}

device_scope::device_scope(caf::actor_system& system)
    : actors_(std::make_shared<device_actors>(system)) {
  previous_ = engine::set_backend(actors_);
}

device_scope::~device_scope() {
  engine::set_backend(std::move(previous_));
  actors_.reset();
}

} // namespace troupe
