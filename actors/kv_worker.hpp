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

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

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
};

/// Spawns the worker actor of one store. It expects its server_links first. In a system with the
/// io::middleman it runs on the middleman's I/O thread, beside its links, so a request crosses no
/// scheduler thread between the caller and the socket (BENCHMARKS.md has the 4 KiB round trips);
/// otherwise, in an in-process job, on the scheduler.
worker_actor spawn_kv_worker(caf::actor_system& system, kv_worker_options options);

} // namespace troupe
