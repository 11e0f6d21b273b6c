#pragma once
// The one bridge between a caller's thread and troupe's actors (docs/architecture.md; the actors
// include it as actors/bridge.hpp). Plain C++, no CAF: the actors' logic (worker_core) uses it too.
//
// A blocking facade (the KVStore, the node agent's calls, the scheduler handle) hands an actor a
// completion<T> with its request and waits on it; the actor delivers the value when the work is
// done. The waiting side bounds every wait (wait_until), and when it stops waiting it cancels:
// from then on the actor's deliver() is a no-op and while_live() no longer runs its writer, so
// an actor that writes into the caller's memory (a pull's output) through while_live() can never
// write into a buffer the caller has taken back.
//
//   // caller                                    // actor
//   completion<status> done;                     ...
//   caf::anon_send(worker, op{..., done});       done.while_live([&] { copy into output; });
//   auto got = done.wait_or_cancel(deadline);    done.deliver(ok());
//   if (!got) { ... timeout }
//
// Copies share one state. Thread-safe: any thread may call any member.
//
// A waiting consumer first polls for a while (spin_time), giving up its core to anything else
// that is ready, and only then sleeps: a small request's answer usually comes within it, and the
// caller is then neither put to sleep nor woken (a futex wait on its side, a futex wake and a
// thread switch on the producer's: docs/data-path.md, "Where a small request's time goes").

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <thread>
#include <utility>

#include "actors/logic/hop_probe.hpp"

namespace troupe {

template <class T>
class completion {
public:
  using clock = std::chrono::steady_clock;

  completion() : state_(std::make_shared<state>()) {}

  /// Producer: delivers `value` and wakes the waiters. False (and nothing happens) when a value
  /// was delivered before or the consumer cancelled.
  bool deliver(T value) const {
    {
      std::lock_guard lock{state_->mutex};
      if (state_->value || state_->cancelled)
        return false;
      state_->value.emplace(std::move(value));
      state_->delivered.store(true, std::memory_order_release);
    }
    TROUPE_HOP(delivered);
    state_->changed.notify_all();
    return true;
  }

  /// Producer: runs `write()` under the completion's lock unless a value was delivered or the
  /// consumer cancelled; returns whether it ran. Once cancel() has returned, no write runs.
  template <class Write>
  bool while_live(Write&& write) const {
    std::lock_guard lock{state_->mutex};
    if (state_->value || state_->cancelled)
      return false;
    std::forward<Write>(write)();
    return true;
  }

  /// Consumer: the value, waiting for it until `deadline`; nullopt when none came by then.
  std::optional<T> wait_until(clock::time_point deadline) const {
    poll_until(std::min(deadline, clock::now() + spin_time));
    std::unique_lock lock{state_->mutex};
    state_->changed.wait_until(lock, deadline, [&] { return state_->value.has_value(); });
    return state_->value;
  }

  /// Consumer: the value, waiting for it until `deadline`, then cancelling: nullopt when none
  /// came, and then the producer's calls do nothing. A value delivered between the wait and the
  /// cancel is returned, not lost.
  std::optional<T> wait_or_cancel(clock::time_point deadline) const {
    if (auto got = wait_until(deadline))
      return got;
    return cancel();
  }

  /// Consumer: the value if it has been delivered, without waiting.
  std::optional<T> peek() const {
    std::lock_guard lock{state_->mutex};
    return state_->value;
  }

  bool ready() const {
    std::lock_guard lock{state_->mutex};
    return state_->value.has_value();
  }

  /// Consumer: stops waiting. Returns the value when it was delivered after all (the caller
  /// should use it), else nullopt; from then on the producer's calls do nothing.
  std::optional<T> cancel() const {
    std::lock_guard lock{state_->mutex};
    if (!state_->value)
      state_->cancelled = true;
    return state_->value;
  }

  /// Producer: the consumer gave up, so the work may be dropped.
  bool cancelled() const {
    std::lock_guard lock{state_->mutex};
    return state_->cancelled;
  }

  /// How long a consumer polls before it sleeps. About a small request's round trip on a
  /// loaded machine; a longer wait costs at most this much of a core, which the polling thread
  /// yields to any other thread that is ready.
  static constexpr std::chrono::microseconds spin_time{50};

private:
  struct state {
    std::mutex mutex;
    std::condition_variable changed;
    std::optional<T> value;
    /// value has been set (read without the lock while polling).
    std::atomic<bool> delivered{false};
    bool cancelled = false;
  };

  void poll_until(clock::time_point until) const {
    while (!state_->delivered.load(std::memory_order_acquire) && clock::now() < until)
      std::this_thread::yield();
  }
  std::shared_ptr<state> state_;
};

} // namespace troupe
