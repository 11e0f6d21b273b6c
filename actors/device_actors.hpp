#pragma once
// The device actors: one CAF actor per device context, cpu(i) and gpu(i), each with a thread of
// its own, which run the work the dependency engine (engine/dispatch.hpp) queues on their context.
// With them installed, operations on arrays of different contexts run concurrently and the caller
// goes on while they run (MXNet's ThreadedEnginePerDevice); without them every operation runs on
// the caller's thread (the naive engine).
//
//   troupe::device_scope devices;          // device actors for this process, until it ends
//   auto y = nd::fully_connected(x, w, b, 10);   // queued on x's context
//   auto values = y.to_vector<float>();          // waits for it
//
// An actor is spawned when its context gets its first work. Exceptions inside the work are caught
// by the engine and kept on the arrays the work writes; none reaches the actor.

#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string_view>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>

#include "actors/protocols.hpp"
#include "engine/context.hpp"
#include "engine/dispatch.hpp"
#include "engine/error.hpp"

namespace troupe {

/// The engine's backend made of device actors spawned in `system`, which must outlive it.
class device_actors : public engine::device_backend {
public:
  explicit device_actors(caf::actor_system& system) : system_(system) {}
  ~device_actors() override;
  device_actors(const device_actors&) = delete;
  device_actors& operator=(const device_actors&) = delete;

  void post(context ctx, std::function<void()> work) override;

  /// The actor of `ctx`, spawned on first use.
  device_actor actor_of(context ctx);

private:
  caf::actor_system& system_;
  std::mutex mutex_;
  std::map<context, device_actor> actors_;
};

/// What TROUPE_ENGINE_TYPE asks for: "device" (or unset) for device actors, "naive" for none;
/// anything else is an error naming the value.
result<bool> device_actors_requested();

/// Installs device actors as the engine's backend while it lives (in its own small actor system,
/// or in a given one), and on destruction waits for all queued work and goes back to the naive
/// engine (or the backend installed before it).
class device_scope {
public:
  device_scope();
  explicit device_scope(caf::actor_system& system);
  ~device_scope();
  device_scope(const device_scope&) = delete;
  device_scope& operator=(const device_scope&) = delete;

private:
  std::optional<caf::actor_system_config> own_config_;
  std::optional<caf::actor_system> own_system_;
  std::shared_ptr<device_actors> actors_;
  std::shared_ptr<engine::device_backend> previous_;
};

} // namespace troupe
