#pragma once
// The scheduler of a job (ps-lite's scheduler node): admits servers and workers, assigns their
// ranks, sends the membership table, runs the job barriers, watches every node, and ends the
// job, cleanly or not. It is never on the data path.
//
// Transport: the scheduler listens with a data server (actors/data_link.hpp) on its host:port,
// the same framed, validated links that carry tensors; no CAF remote-actor (BASP) port faces the
// network. Each node holds one control connection (a data link, actors/node_agent.hpp) and is
// known by that connection's id. Frames are Cap'n Proto messages (schema/codec.hpp), capped at
// scheduler_frame_bytes (64 KiB and a little per node), with a receive window of four such frames
// per connection (control_link_tuning): the broker checks every length prefix before it
// allocates, answers a frame that fails validation with error_reply{bad_frame} and closes a
// connection whose framing or link protocol breaks, so nothing a peer sends reaches the scheduler
// unchecked or makes it allocate more than that cap per frame and hold more than about a window
// per connection.
//
// Conversation (node -> scheduler, and what comes back):
//   registration                 -> admission (admitted{rank, node_id, sealed secret} or
//                                   rejected{reason}); the first frame of a connection after the
//                                   link hellos (a host name longer than max_host_bytes gets
//                                   error_reply{invalid_argument}). ... once S
//                                   servers and W workers are admitted, every node gets the
//                                   membership table (epoch 1): the job has started. A worker
//                                   that registers while the job runs, with ranks below
//                                   max_workers to spare, joins it (admitted{joined,
//                                   first_barrier}).
// Identity (actors/logic/node_identity.hpp): the scheduler draws the job secret when it starts.
// Each control connection's handshake exchanges keys (control_link_tuning), and an admission
// carries the node's own secret sealed under that connection's session key: a worker's node key,
// a server's job secret. A registration on a connection without a session key (a node that made
// no key exchange) is rejected{protocol_version}: its secret could not be sealed for it.
//   barrier{barrier_id, group,   -> barrier_release{request_id, barrier_id, group, gathered}, to
//           values}                 each member of `group` once every live member has sent the
//                                   same barrier (the job barrier actor, actors/job_barrier.hpp,
//                                   does this); `gathered` is every member's values.
//   sync_settings                -> ack{request_id}. From worker rank 0 only: the job's quorum K
//                                   (default num_workers).
//   command{stop} from a worker  -> ack{request_id}. It means "this worker is done" (MXNet's
//                                   finalize). When every live worker is done the scheduler sends
//                                   command{stop} to every server (ps-lite's kStopServer); while
//                                   others still run, the worker leaves the job: a new membership
//                                   table lists it left, and barriers stop waiting for it.
//   ack{request_id} from a server -> nothing: the server's shards hold the membership table sent
//                                   with that request id (one that lists a joiner); once every
//                                   server has acked it, the workers get it.
//   heartbeat                    -> nothing; any frame from a node counts as a sign of life.
// A request that cannot be served is answered with error_reply{its request_id, code}:
// not_admitted (a connection that has not registered), invalid_argument (a group the sender is
// not in, a second arrival at one barrier, sync settings from a node other than worker rank 0 or
// with a quorum outside 1..num_workers), shutting_down (a barrier whose group has a server told
// to stop), unsupported (checkpoint commands, data-path messages), lost_peer (anything from a node
// already declared lost).
// Scheduler -> node, unasked: heartbeat (so nodes notice a frozen scheduler); membership (epoch
// + 1, the whole table) to every node still connected whenever membership changes, i.e. when a
// worker is lost within the quorum, leaves or joins, or a server is lost or rejoins
// (server_rejoin) (a worker that said done gets no more tables; a table that lists a joiner goes
// to the servers first, with a request id, and to the workers once every server acked it); and,
// when the
// job fails, error_reply{request_id 0, lost_peer | timeout, message naming what is missing}.
//
// Losses. A node is lost when its control connection closes before it finished, or when nothing
// comes from it for peer_timeout. A lost server, or a lost worker beyond num_workers - K lost
// workers, fails the job: every node is told which node (role, rank, node id) and why. With
// server_rejoin > 0 a server lost while the job runs does not fail it at once: every node gets a
// table listing it not alive, and its rank stays open that long for a registration marked
// recovering with that rank hint (a server restarted from its checkpoint), which takes the same
// rank and node id at its new address; every node then gets the new table. Barriers wait
// meanwhile; a server that is not back in time fails the job, named as above. A worker
// lost within that bound is logged, marked not alive in a new membership table, told it was
// dropped (should it still listen), and the job goes on: barriers wait for the live workers only
// and the job drains when every live worker is done. The job's outcome (job_outcome) says which
// of the three ends it came to, and the scheduler logs one summary line naming the lost workers,
// when and why.
//
// Why "done" is a command{stop} sent by a worker rather than a barrier on the worker group: a
// worker that finishes early must be able to leave without waiting for the slowest one (in
// apache/mxnet#2412 rank 0 stopped the servers while other workers still pushed), and the
// scheduler must know which workers left on purpose so that their departure is not reported as a
// lost node.
//
// The rules are scheduler_core's (actors/logic/scheduler_core.hpp, with its phase diagram), which
// also declares the job's options (scheduler_options), its outcome (job_outcome) and ps-lite's node
// ids; the scheduler actor wraps it, and the job barriers run in an actor of their own
// (actors/job_barrier.hpp).

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/fwd.hpp>

#include "actors/bridge.hpp"
#include "actors/data_link.hpp"
#include "actors/logic/key_placement.hpp"
#include "actors/logic/scheduler_core.hpp"
#include "actors/protocols.hpp"
#include "engine/error.hpp"
#include "engine/log.hpp"
#include "schema/messages.hpp"

namespace troupe {

/// Largest control frame a node accepts from the scheduler: a membership table of well over
/// 10,000 nodes.
inline constexpr std::size_t max_control_frame_bytes = std::size_t{4} << 20;

/// Largest control frame the scheduler of a job of `nodes` servers and workers accepts and sends:
/// 64 KiB (registration, barrier, heartbeat and sync settings are a few hundred bytes) plus room
/// for every node's row in a membership table, at most max_control_frame_bytes.
std::size_t scheduler_frame_bytes(std::uint32_t nodes) noexcept;

/// The tuning of a control connection: frames capped at `max_frame_bytes`, a receive window of
/// four such frames, no shared-memory arena (control frames carry no tensors), the link's
/// diagnostics through `log` as its "control link" part, the job token its handshake proves, a
/// key exchange (the session key an admission's secret is sealed under), and its TLS (none
/// without credentials).
data_link_tuning control_link_tuning(std::size_t max_frame_bytes, const logger& log,
                                     link_secret secret, link_tls tls = {});

/// The running scheduler of one job: its actor, its port, and the job's outcome. Copies share
/// the outcome. Valid as long as the actor system that spawned it. CAF's actor system waits for
/// its actors when it is destroyed, so a host that gives up on a running job calls stop() first
/// (otherwise the destructor waits until the job ends by itself, at the latest at its startup
/// or peer timeout).
class scheduler_handle {
public:
  scheduler_handle(scheduler_actor actor, std::uint16_t port, completion<job_outcome> outcome);

  /// The scheduler actor.
  const scheduler_actor& actor() const noexcept { return actor_; }
  /// The port the scheduler listens on (the bound one when options.port was 0).
  std::uint16_t port() const noexcept { return port_; }

  /// Waits up to `timeout` for the job to end. nullopt: still running. The process hosting the
  /// scheduler exits 0 for finished, 3 for finished_with_losses and 1 for failed
  /// (actors/dist_job.hpp).
  std::optional<job_outcome> wait(std::chrono::milliseconds timeout) const;

  /// The outcome if the job has ended, without waiting.
  std::optional<job_outcome> outcome() const { return outcome_.peek(); }

  /// Ends the job now (the host's SIGTERM): the scheduler actor exits and its port closes, every
  /// node sees the scheduler lost, and the outcome becomes failed (errc::peer_lost) unless the
  /// job had already ended.
  void stop() const;

private:
  scheduler_actor actor_;
  std::uint16_t port_;
  completion<job_outcome> outcome_;
};

/// Spawns the scheduler of one job in `sys` (which must have the io::middleman loaded) and
/// listens for control connections on options.host:options.port. The startup timeout runs from
/// here. Errors: errc::invalid_argument for options out of range (the message names the field),
/// errc::io_error when the port cannot be bound (in use, bad address).
result<scheduler_handle> spawn_scheduler(caf::actor_system& sys, scheduler_options options);

} // namespace troupe
