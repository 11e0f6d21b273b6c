#pragma once
// The worker of a distributed KVStore: one actor per store that owns everything between a call
// and the servers (MXNet's KVStoreDist / ps-lite's KVWorker).
//
//   facade (dist_kvstore) ──kv_operation──> worker actor ──envelope──> link to server s
//                         <──completion────             <──envelope── (replies, tag s + 1)
//
// It owns routing (a key's slices and their servers, actors/logic/key_placement.hpp), the requests
// under way, the reassembly of pull replies into the caller's outputs, and the round numbers of
// every ps-key. Calls from one facade are handled in the order they were made, and the requests
// of one ps-key leave in that order on that server's link, so a pull after a push sees the push.
//
// Sync credit. In dist_sync a server accepts pushes at most max_rounds_ahead rounds beyond the
// round it is collecting (sync_settings). The worker sends the push of round t of a ps-key only
// while t < completed + max_rounds_ahead, `completed` being the latest Ack.round or
// PullReply.round of that key; later requests of the key wait here, in order, holding their
// tensors (no copy), until an answer brings credit. A push acked `dropped` (its round closed with
// a quorum of other workers) is counted and leaves the key's round numbers as they are: a
// straggler keeps pushing the rounds in order, its late ones dropped, so that every round of
// every worker reaches its quorum and the last rounds of a job close.
//
// Timeouts and cancellation. A request's timeout runs from when it was sent (not from when it was
// queued behind others); the worker sweeps every tick and fails a request that is overdue, with
// the requests of its ps-key waiting behind it. Outputs are written only inside the call's
// completion (completion::while_live), so once the caller has stopped waiting (a failure was
// delivered, or it cancelled), a late reply never writes into a buffer it took back.
//
// Failure. A link that goes down, or the node agent's notice that the job failed, fails every
// call under way and every later one with errc::peer_lost naming the lost node and its role. A
// server that refused the link's handshake (this worker's node key or token) fails them at once
// with errc::invalid_argument, "server 0 (node 8) at host:port refused this worker: ...".
//
// Server recovery (server_rejoin > 0). Every push is copied when it leaves, and the copy is kept
// until the server says that the push is durable (Ack.durable, PullReply.durable: the rounds in
// the shard's last checkpoint written to disk in dist_sync; in dist_async the number of this
// worker's next push there, a push's round being its sequence number). A server link
// that goes down then fails nothing: the requests to that server stay under way (their timeouts
// stop) and new ones queue, until a membership table lists the server alive again after one
// listed it lost. The worker links to its new address (on a helper thread: connecting blocks)
// and sends again, per ps-key and in order, every kept push (Push.resent: the shard acks without
// applying one that its restored checkpoint already holds) and every pull under way, with the
// credit counted from the durable round. So an acked push lost with the server is applied exactly
// once, in dist_async too (a push the server refused is not kept: it was never applied). Commands
// under way to that server (every_server calls) and an init or a large reply being copied when the
// server went fail with errc::peer_lost. If the server is not back within server_rejoin +
// request_timeout, everything fails as above.

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>

#include <caf/actor_system.hpp>

#include "actors/protocols.hpp"
#include "engine/error.hpp"
#include "engine/log.hpp"
#include "schema/chunking.hpp"

namespace troupe {

/// Opens a link to `server` whose replies go to `receiver` (kv_worker_options::reconnect).
using reconnect_function =
    std::function<result<link_actor>(const wire::node_info& server, const caf::actor& receiver)>;

struct kv_worker_options {
  std::uint32_t rank = 0;
  std::uint32_t num_servers = 1;
  /// dist_sync (rounds, credit) or dist_async.
  bool sync = true;
  /// MXNET_KVSTORE_BIGARRAY_BOUND.
  std::int64_t bigarray_bound = 1'000'000;
  /// Largest tensor payload per frame.
  std::size_t chunk_bytes = wire::default_chunk_bytes;
  /// Keys larger than this many bytes are cut into slices (key_placement.hpp); 0: none.
  std::size_t slice_bytes = 0;
  /// A request not answered this long after it was sent fails with errc::timeout.
  std::chrono::milliseconds request_timeout{30'000};
  /// The servers' sync_settings::max_rounds_ahead.
  std::uint32_t max_rounds_ahead = 2;
  /// A link that goes down is reported after this grace, so that the scheduler's notice naming
  /// the node that was really lost (the server may only be closing because the job failed) wins.
  std::chrono::milliseconds link_down_grace{250};
  /// How long the job keeps a lost server's rank open for a server restarted from its
  /// checkpoint (timeouts.server_rejoin). Above 0, with `reconnect`, a server link that goes
  /// down holds the calls to that server instead of failing them (see "Server recovery").
  std::chrono::milliseconds server_rejoin{0};
  /// Opens a link to a server at the address a membership table gives it, replies to `receiver`
  /// tagged rank + 1 (as server_links' links); called on a helper thread. Null: no recovery.
  reconnect_function reconnect;
  logger log;
  /// Where the end-of-job summary goes (observe.summary): per server the requests and bytes, and
  /// the p50 / p99 time of pushes, pulls and pushpulls. A silent logger: none.
  logger summary_log;
};

/// Spawns the worker actor of one store. It expects its server_links first. In a system with the
/// io::middleman it runs on the middleman's I/O thread, beside its links, so a request crosses no
/// scheduler thread between the caller and the socket (BENCHMARKS.md has the 4 KiB round trips);
/// otherwise, in an in-process job, on the scheduler.
worker_actor spawn_kv_worker(caf::actor_system& system, kv_worker_options options);

} // namespace troupe
