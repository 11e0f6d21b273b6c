#pragma once
// A server shard as an actor: a shard_core (actors/logic/shard_core.hpp, where the shard's contract
// is written down) behind a thin shard_actor (actors/protocols.hpp). The actor replies to each
// request's reply_sink, sweeps expired pulls and stalled inits on a tick it sends itself, and
// hears of the data server's closed connections (closed_atom).
//
// The core sits in a shard_lane that the data server's broker may use too: a small request is
// answered on the broker's thread (the middleman's I/O thread) when the shard is idle, without
// the hop to a scheduler thread and back (two thread wake-ups per round trip: docs/data-path.md,
// "Where a small request's time goes"); anything else goes to the actor.

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>

#include <caf/actor_addr.hpp>
#include <caf/actor_system.hpp>

#include "actors/logic/shard_core.hpp"
#include "actors/protocols.hpp"

namespace troupe {

/// A shard's core, shared by its actor and the data server's broker. Every use of the core holds
/// the lane's lock. Thread-safe.
class shard_lane {
public:
  /// A request is answered on the broker's thread only when its key's value and its tensor hold
  /// at most this many bytes: a round that closes there sums and updates at most this much (a
  /// few microseconds), so the thread that reads every connection's sockets is never held up
  /// by a large key. Larger keys keep their work on the scheduler, shards side by side.
  static constexpr std::uint64_t answer_here_bytes = std::uint64_t{64} << 10;

  /// Whether small requests may be answered on the taker's thread: not when the shard updates
  /// on a device, whose work must not block that thread.
  explicit shard_lane(bool answers_here) : answers_here_(answers_here) {}
  shard_lane(const shard_lane&) = delete;
  shard_lane& operator=(const shard_lane&) = delete;

  /// On the data server broker's thread: a keyed request from connection request.connection,
  /// whose replies go to `sink`. Answered here when it is small (answer_here_bytes), the shard's
  /// actor is not running, and every request handed to the actor has been handled (so the
  /// requests of one connection are handled in the order they came); otherwise handed to the
  /// actor (handed_atom), in order. Never blocks on the actor. Returns whether it was answered
  /// here.
  bool take(envelope request, const reply_sink& sink);

  /// From any thread: hands the shard's actor a membership table, counted like a handed request,
  /// so that take() answers nothing it takes afterwards before the actor has handled the table.
  void hand(const shard_actor& actor, const wire::membership& table);

  // The actor's side.

  /// Runs `work(core)` under the lock; nothing when the core is gone (closed) or not yet there.
  template <class Work>
  void with_core(Work&& work) {
    std::lock_guard lock{mutex_};
    if (core_)
      std::forward<Work>(work)(*core_);
  }
  /// The actor's core, from its start.
  void open(std::unique_ptr<shard_core> core);
  /// The actor, where take() hands requests: set once, before the lane is shared.
  void set_actor(const shard_actor& actor);
  /// The actor handled a request that take() handed to it. Call with the lock held (in
  /// with_core).
  void handled_one() noexcept { handed_.fetch_sub(1, std::memory_order_relaxed); }
  /// The actor is ending: the core goes (its destructor writes a last checkpoint, as the shard
  /// does), and take() hands everything to the (gone) actor from now on.
  void close() noexcept;

private:
  const bool answers_here_;
  std::mutex mutex_;
  std::unique_ptr<shard_core> core_;
  /// Where take() hands requests; weak, as the actor holds the lane.
  caf::actor_addr actor_;
  /// Requests take() handed to the actor that it has not handled yet. Raised only on the taker's
  /// thread, lowered by the actor under the lock.
  std::atomic<std::size_t> handed_{0};
};

/// A shard_actor running a shard_core: replies go to each request's reply_sink; it sends itself
/// a tick every options.sweep_interval to expire pulls and drop stalled inits (ticks from anyone
/// else are ignored). The second form puts the core in `lane`, which a data server may then use
/// (shard_lane::take).
shard_actor spawn_server_shard(caf::actor_system& system, shard_options options);
shard_actor spawn_server_shard(caf::actor_system& system, shard_options options,
                               std::shared_ptr<shard_lane> lane);

} // namespace troupe
