#pragma once
// The scheduler of a job (ps-lite's scheduler node): admits servers and workers, assigns their
// ranks, publishes the membership table, runs global barriers, watches every node, and ends the
// job, cleanly or not. It is never on the data path.
//
// Transport: the scheduler actor is published with the middleman (a BASP port); a node reaches
// it with remote_actor() (actors/node_agent.hpp does that). Every control message in either
// direction is `(control_atom, std::vector<char> frame)`, the frame being one codec-encoded
// wire::message (schema/codec.hpp). Frames are decoded and checked on arrival; a bad one is
// logged and answered with error_reply{bad_frame}, and changes nothing.
//
// Conversation (node -> scheduler, and what comes back):
//   registration                 -> admission (admitted{rank, node_id} or rejected{reason})
//                                   ... then, once S servers and W workers are admitted, every
//                                   node gets the membership table: the job has started.
//   barrier{barrier_id, group}   -> barrier_release{request_id, barrier_id, group}, to each member
//                                   of `group` once all of them have sent the same barrier.
//   command{stop} from a worker  -> ack{request_id}. It means "this worker is done" (MXNet's
//                                   finalize). When every worker is done the scheduler sends
//                                   command{stop} to every server (ps-lite's kStopServer).
//   heartbeat                    -> nothing; any frame from a node counts as a sign of life.
// A request that cannot be served is answered with error_reply{its request_id, code}:
// not_admitted (the sender never registered), invalid_argument (a group the sender is not in, a
// second arrival at one barrier), shutting_down (a barrier whose group has a finished member),
// unsupported (checkpoint commands, data-path messages).
// Scheduler -> node, unasked: heartbeat (so nodes notice a frozen scheduler) and, when the job
// fails, error_reply{request_id 0, lost_peer | timeout, message naming what is missing}.
//
// Why "done" is a command{stop} sent by a worker rather than a barrier on the worker group: a
// worker that finishes early must be able to leave without waiting for the slowest one (MXNet's
// complaint #10: rank 0 stopping servers while others still push), and the scheduler must know
// which workers left on purpose so that their departure is not reported as a lost node.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "actors/key_placement.hpp"
#include "engine/error.hpp"
#include "schema/codec.hpp"
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

/// The membership table's key ranges: server i owns ps-lite's range [max_key/S*i,
/// max_key/S*(i+1)) (actors/key_placement.hpp's server_key_ranges, so workers and the table
/// agree), as shard_index 0: a server splits its range over its shards itself. Like ps-lite, the
/// top max_key % S keys belong to no server; ps-keys are range.begin + key, far below them.
/// Precondition: num_servers >= 1.
std::vector<wire::key_range> membership_key_ranges(std::uint32_t num_servers);

/// A wire message as the payload of a control message; throws only std::bad_alloc.
std::vector<char> encode_control(const wire::message& msg);

/// Decodes the payload of a control message, capped at `max_frame_bytes` (control frames are
/// small: registration, barrier, membership). The result owns everything it holds.
wire::result<wire::decoded_message> decode_control(const std::vector<char>& frame,
                                                   std::size_t max_frame_bytes = 16u << 20);

/// How the scheduler of one job runs. Durations are wall-clock.
struct scheduler_options {
  /// Address the scheduler's port binds to (DMLC_PS_ROOT_URI). Default: loopback only.
  std::string host = "127.0.0.1";
  /// Port to bind (DMLC_PS_ROOT_PORT); 0 lets the OS pick one (spawn_scheduler reports it).
  std::uint16_t port = 0;
  /// DMLC_NUM_WORKER, >= 1.
  std::uint32_t num_workers = 1;
  /// DMLC_NUM_SERVER, >= 1.
  std::uint32_t num_servers = 1;
  /// Nodes of another job are rejected (wrong_job). Non-empty.
  std::string job_id;
  /// Shared secret; a registration must carry exactly these bytes (bad_token). Empty: no token.
  std::string auth_token;
  /// The job fails when not every node has registered this long after the spawn.
  std::chrono::milliseconds startup_timeout{60'000};
  /// A node that sends nothing (heartbeats included) for this long is declared lost.
  std::chrono::milliseconds peer_timeout{10'000};
  /// How often the scheduler checks for silent nodes and sends its own heartbeat to every node;
  /// must be below the nodes' peer timeout.
  std::chrono::milliseconds heartbeat_interval{1'000};
  /// After the stop command, how long the scheduler waits for the servers to leave before it
  /// ends anyway (the outcome is still success: every worker finished).
  std::chrono::milliseconds drain_timeout{5'000};
  /// ps-lite's PS_VERBOSE on std::clog: 0 failures only, 1 admissions and phases, 2 every frame.
  int verbose = 0;
};

/// The running scheduler of one job: its actor, its port, and the job's outcome. Copies share
/// the outcome. Valid as long as the actor system that spawned it. CAF's actor system waits for
/// its actors when it is destroyed, so a host that gives up on a running job calls stop() first
/// (otherwise the destructor waits until the job ends by itself, at the latest at its startup
/// or peer timeout).
class scheduler_handle {
public:
  /// Where the outcome is set; shared with the scheduler actor.
  struct outcome_state;

  scheduler_handle(caf::actor actor, std::uint16_t port, std::shared_ptr<outcome_state> outcome);

  /// The scheduler actor (published on port()).
  const caf::actor& actor() const noexcept { return actor_; }
  /// The port the scheduler is published on (the bound one when options.port was 0).
  std::uint16_t port() const noexcept { return port_; }

  /// Waits up to `timeout` for the job to end. nullopt: still running. Otherwise the outcome:
  /// ok() when every worker finished; errc::timeout when the job never completed its
  /// registration (the message names the missing roles); errc::peer_lost when a node was lost
  /// (the message names its role and rank) or the scheduler actor was stopped. The process
  /// hosting the scheduler exits non-zero unless the outcome is ok().
  std::optional<status> wait(std::chrono::milliseconds timeout) const;

  /// The outcome if the job has ended, without waiting.
  std::optional<status> outcome() const { return wait(std::chrono::milliseconds{0}); }

  /// Ends the job now (the host's SIGTERM): the scheduler actor exits, every node sees the
  /// scheduler lost, and the outcome becomes errc::peer_lost unless the job had already ended.
  void stop() const;

private:
  caf::actor actor_;
  std::uint16_t port_;
  std::shared_ptr<outcome_state> outcome_;
};

/// Spawns the scheduler of one job in `sys` (which must have the io::middleman loaded and,
/// for hung peers to be noticed, configure_failure_detection of actors/node_agent.hpp applied)
/// and publishes it on options.host:options.port. The startup timeout runs from here.
/// Errors: errc::invalid_argument for options out of range (the message names the field),
/// errc::io_error when the port cannot be bound (in use, bad address).
result<scheduler_handle> spawn_scheduler(caf::actor_system& sys, scheduler_options options);

} // namespace troupe
