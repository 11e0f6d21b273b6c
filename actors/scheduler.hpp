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
//                                   membership table (epoch 1): the job has started.
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
//                                   command{stop} to every server (ps-lite's kStopServer).
//   heartbeat                    -> nothing; any frame from a node counts as a sign of life.
// A request that cannot be served is answered with error_reply{its request_id, code}:
// not_admitted (a connection that has not registered), invalid_argument (a group the sender is
// not in, a second arrival at one barrier, sync settings from a node other than worker rank 0 or
// with a quorum outside 1..num_workers), shutting_down (a barrier whose group has a finished
// member), unsupported (checkpoint commands, data-path messages), lost_peer (anything from a node
// already declared lost).
// Scheduler -> node, unasked: heartbeat (so nodes notice a frozen scheduler); membership (epoch
// + 1, the whole table) to every node still connected whenever membership changes, i.e. when a
// worker is lost within the quorum, or a server is lost or rejoins (server_rejoin); and, when the
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
#include "actors/protocols.hpp"
#include "engine/error.hpp"
#include "engine/log.hpp"
#include "schema/messages.hpp"

namespace troupe {

/// ps-lite's node ids: the scheduler is 1, server rank r is 8+2r, worker rank r is 9+2r.
inline constexpr std::uint32_t scheduler_node_id = 1;
constexpr std::uint32_t server_node_id(std::uint32_t rank) noexcept {
  return 8 + 2 * rank;
}
constexpr std::uint32_t worker_node_id(std::uint32_t rank) noexcept {
  return 9 + 2 * rank;
}

/// Most servers or workers one job may have (node ids must fit in 32 bits with room to spare).
inline constexpr std::uint32_t max_nodes_per_role = 1u << 20;

/// Longest host name a node may register with (DNS names have at most 253 bytes), which bounds a
/// node's row in the membership table.
inline constexpr std::size_t max_host_bytes = 255;

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

/// The membership table's key ranges: server i owns ps-lite's range [max_key/S*i,
/// max_key/S*(i+1)) (actors/logic/key_placement.hpp's server_key_ranges, so workers and the table
/// agree), as shard_index 0: a server splits its range over its shards itself. Like ps-lite, the
/// top max_key % S keys belong to no server; ps-keys are range.begin + key, far below them.
/// Precondition: num_servers >= 1.
std::vector<wire::key_range> membership_key_ranges(std::uint32_t num_servers);

/// How the scheduler of one job runs. Durations are wall-clock.
struct scheduler_options {
  /// Address nodes reach the scheduler at (DMLC_PS_ROOT_URI), as the membership table says.
  /// Default: loopback only.
  std::string host = "127.0.0.1";
  /// Address the scheduler's port binds (node.bind: "0.0.0.0" for every interface); empty: host.
  std::string bind;
  /// Port to bind (DMLC_PS_ROOT_PORT); 0 lets the OS pick one (spawn_scheduler reports it).
  std::uint16_t port = 0;
  /// DMLC_NUM_WORKER, >= 1.
  std::uint32_t num_workers = 1;
  /// DMLC_NUM_SERVER, >= 1.
  std::uint32_t num_servers = 1;
  /// How many workers the job needs alive (sync.quorum) until worker rank 0 announces its own:
  /// 1..num_workers, 0 meaning num_workers (a lost worker fails the job).
  std::uint32_t quorum = 0;
  /// Nodes of another job are rejected (wrong_job). Non-empty.
  std::string job_id;
  /// The job token: a node's control connection must prove it in its handshake before the
  /// scheduler reads anything from it (actors/logic/link_auth.hpp). Empty: no token.
  std::string auth_token;
  /// The job secret the nodes' keys derive from (actors/logic/node_identity.hpp). Empty:
  /// spawn_scheduler draws a fresh one, as every job should; a test may fix one to check keys.
  job_secret secret;
  /// TLS on the scheduler's port (actors/config/tls_credentials.hpp): its own credentials, a
  /// scheduler's. With them, only servers and workers with certificates from the job's CA get in,
  /// and each is admitted only in the role its certificate names (else rejected{wrong_role}).
  /// Null: plaintext.
  std::shared_ptr<const tls_credentials> tls;
  /// The job fails when not every node has registered this long after the spawn.
  std::chrono::milliseconds startup_timeout{60'000};
  /// A node that sends nothing (heartbeats included) for this long is declared lost.
  std::chrono::milliseconds peer_timeout{10'000};
  /// How often the scheduler checks for silent nodes and sends its own heartbeat to every node;
  /// must be below the nodes' peer timeout.
  std::chrono::milliseconds heartbeat_interval{1'000};
  /// How long a lost server's rank stays open for a server restarted from its checkpoint
  /// (Registration.recovering, troupe-node --recover) before the loss fails the job; meanwhile
  /// the job goes on without it (its workers hold their calls to it). 0: a lost server fails the
  /// job at once.
  std::chrono::milliseconds server_rejoin{0};
  /// After the stop command, how long the scheduler waits for the servers to leave before it
  /// ends anyway (the outcome is still that of the workers).
  std::chrono::milliseconds drain_timeout{5'000};
  /// Where the scheduler logs (ps-lite's PS_VERBOSE levels: errors always, 1 admissions and
  /// phases, 2 every frame); name it node_name("scheduler", nullopt, host). Default: silent.
  logger log;
};

/// How a job ended.
enum class job_end : std::uint8_t {
  finished,             ///< every worker finished
  finished_with_losses, ///< the live workers finished; some were lost within the quorum
  failed,               ///< the job failed (see job_outcome::failure)
};

/// A worker lost within the quorum.
struct lost_worker {
  std::uint32_t rank = 0;
  std::uint32_t node_id = 0;
  /// When, after the scheduler started.
  std::chrono::milliseconds after{0};
  /// "its control connection closed", "nothing heard from it for 5 s (peer timeout 5 s)".
  std::string why;
  friend bool operator==(const lost_worker&, const lost_worker&) = default;
};

/// The end of a job as the scheduler saw it.
struct job_outcome {
  job_end end = job_end::failed;
  /// failed: why. errc::timeout when the job never completed its registration (the message
  /// names the missing roles); errc::peer_lost when a node was lost beyond what the quorum
  /// allows (the message names its role, rank and node id) or the scheduler was stopped.
  std::optional<error> failure;
  /// Workers that said done.
  std::uint32_t workers_finished = 0;
  /// Workers lost, in the order they were lost: those within the quorum and, when a worker's
  /// loss failed the job, that one too.
  std::vector<lost_worker> lost_workers;
  /// The one line the scheduler logged at the end: workers finished and lost, who, when, why.
  std::string summary;

  /// The job's result as a status: ok() unless it failed.
  status as_status() const;
};

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
