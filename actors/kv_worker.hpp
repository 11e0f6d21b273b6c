#pragma once
// The worker of a distributed KVStore: one actor per store that owns everything between a call
// and the servers (MXNet's KVStoreDist / ps-lite's KVWorker).
//
//   facade (dist_kvstore) ──kv_operation──> worker actor ──envelope──> link to server s
//                         <──completion────             <──envelope── (replies, tag s + 1)
//
// Its rules (routing, sync credit, the requests under way and their timeouts, the reassembly of
// pull replies, failure, server recovery) are a worker_core, described in full in
// actors/logic/worker_core.hpp and tested there without CAF. The actor around it owns the links to
// the servers, the copier that copies large replies off the I/O thread, the helper thread that
// relinks a server restarted from its checkpoint, and the ticks that sweep for timeouts. Calls
// from one facade are handled in the order they were made, and the requests of one ps-key leave in
// that order on that server's link, so a pull after a push sees the push.

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

#include <caf/actor_addr.hpp>
#include <caf/actor_system.hpp>

#include "actors/logic/worker_core.hpp"
#include "actors/protocols.hpp"
#include "engine/error.hpp"
#include "engine/log.hpp"
#include "schema/chunking.hpp"

namespace troupe {

/// Opens a link to `server` whose replies go to `receiver` (kv_worker_options::reconnect).
using reconnect_function =
    std::function<result<link_actor>(const wire::node_info& server, const caf::actor& receiver)>;

/// The worker's core as the facade's threads may use it: a small call runs on the caller's thread,
/// under the lane's lock, which the worker actor holds while it runs, and its frame goes from there
/// straight to the socket through the server link's link_lane (actors/data_link.hpp). So a
/// small request does not wait for the middleman's I/O thread to wake up for it (docs/data-path.md,
/// "Where a small request's time goes"). Anything else is handed to the actor as before.
/// Thread-safe.
class worker_lane {
public:
  /// A call runs on the caller's thread only when its tensor holds at most this many bytes
  /// (worker_core::sends_at_once says the rest: one key, one server, nothing queued before it).
  static constexpr std::size_t call_here_bytes = std::size_t{64} << 10;

  worker_lane() = default;
  worker_lane(const worker_lane&) = delete;
  worker_lane& operator=(const worker_lane&) = delete;

  /// On the caller's thread: runs `op` here when the actor is open, every call handed to it has
  /// been handled (so one thread's calls keep their order) and its runner takes it; otherwise
  /// hands it to the actor (handed_atom), in order. Its outcome goes to op.done either way.
  void call(kv_operation op);

  // The actor's side.

  /// The lock the actor holds while it runs. Why it cannot deadlock: the actor runs on the
  /// middleman's I/O thread, which must never wait long for it, and no holder ever blocks. A
  /// message from another thread to a broker (this actor, a data link) may block: CAF 0.17's
  /// multiplexer wakes a broker by writing to a pipe whose write end blocks when the pipe is
  /// full, and only the I/O thread drains it. So a caller's thread holding this lock sends no
  /// message to a broker: its call runs here only when its one frame goes into the link's lane
  /// (link_lane::take, whose wake-ups of the broker wait for the locks' release, as do the socket
  /// sends) or to a link the scheduler runs, and is otherwise handed to the actor after the lock
  /// is released. The link lane's lock is taken under this one, or alone, never the other way
  /// round, and its holders do not block either.
  std::mutex& mutex() noexcept { return mutex_; }
  /// Set once, before the lane is shared: where call() hands what it does not run.
  void set_actor(const worker_actor& actor);
  /// With the lock held: call() offers each call to `runner` (true: it ran it), from now on;
  /// null: to nobody (the actor is gone).
  void set_runner(std::function<bool(kv_operation&)> runner) { runner_ = std::move(runner); }
  /// With the lock held, before the actor runs a call handed by call(): it counts as handled
  /// (the lock is held until it is).
  void handled_one() noexcept { handed_.fetch_sub(1, std::memory_order_relaxed); }

private:
  std::mutex mutex_;
  std::function<bool(kv_operation&)> runner_;
  /// Weak, as the actor holds the lane.
  caf::actor_addr actor_;
  /// Calls handed to the actor and not handled yet. Raised by callers, lowered under the lock.
  std::atomic<std::size_t> handed_{0};
};

/// The worker's rules' settings (rank, servers, sync, chunking, timeouts, credit, server_rejoin,
/// logs: worker_core_options), and what the actor adds. The actor sets can_relink (from
/// `reconnect`) and summary_footer itself.
struct kv_worker_options : worker_core_options {
  /// A link that goes down is reported after this grace, so that the scheduler's notice naming
  /// the node that was really lost (the server may only be closing because the job failed) wins.
  std::chrono::milliseconds link_down_grace{250};
  /// Opens a link to a server at the address a membership table gives it, replies to `receiver`
  /// tagged rank + 1 (as server_links' links); called on a helper thread. Null: no recovery
  /// (server_rejoin then changes nothing).
  reconnect_function reconnect;
  /// Shared with the facade, which calls through it (worker_lane). Null: the actor makes its own,
  /// and calls come as messages only.
  std::shared_ptr<worker_lane> lane;
};

/// Spawns the worker actor of one store. It expects its server_links first. In a system with the
/// io::middleman it runs on the middleman's I/O thread, beside its links, so a request crosses no
/// scheduler thread between the caller and the socket (BENCHMARKS.md has the 4 KiB round trips);
/// otherwise, in an in-process job, on the scheduler.
worker_actor spawn_kv_worker(caf::actor_system& system, kv_worker_options options);

} // namespace troupe
