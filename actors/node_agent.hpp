#pragma once
// The node side of the control plane: one agent per server or worker process. It finds the
// scheduler (actors/scheduler.hpp), registers, waits for the membership table, then serves the
// process's blocking calls (barrier, done, wait for stop) and tells it when the job fails.
//
// The agent is an actor (the scheduler knows the node by it and monitors it) behind a plain
// class whose calls block the calling thread, each for a bounded time, as MXNet's KVStore calls
// do. Control frames travel as `(control_atom, std::vector<char>)` in both directions.
//
// Failure, as the node sees it: when the scheduler reports a lost peer, or the scheduler itself
// is lost (its actor terminated, its connection closed, or nothing heard from it for
// peer_timeout), every waiting call and every later one returns errc::peer_lost with a message
// naming the node ("worker 2 (node 13) was lost: ...", "scheduler (node 1) was lost: ..."), and
// every subscriber gets `(peer_lost_atom, std::string message)`. Nothing waits forever.
//
// Subscriber messages (see subscribe):
//   (peer_lost_atom, std::string)  the job failed; the text names the lost node's role and rank
//   (stop_atom)                    the scheduler told this server to stop (the job ended well)

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include <caf/actor.hpp>
#include <caf/fwd.hpp>

#include "engine/error.hpp"
#include "schema/messages.hpp"

namespace troupe {

/// Turns on CAF's own connection-level failure detection: every `heartbeat` a BASP heartbeat on
/// each connection, and a connection that receives nothing for `timeout` is closed, which turns
/// into a down_msg for every monitor of an actor behind it (STACK.md §3: without this a frozen
/// peer is never noticed). These are actor_system_config settings
/// ("middleman.heartbeat-interval", "middleman.connection-timeout"), so the process's main calls
/// this before creating the actor system; every process of a job (scheduler, servers, workers)
/// must, since each side only times out what it receives. Throws troupe::exception
/// (invalid_argument) unless 0 < heartbeat < timeout.
void configure_failure_detection(caf::actor_system_config& cfg, std::chrono::milliseconds heartbeat,
                                 std::chrono::milliseconds timeout);

/// How a node joins its job. Durations are wall-clock.
struct agent_options {
  /// The scheduler's address and port (DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT).
  std::string scheduler_host = "127.0.0.1";
  std::uint16_t scheduler_port = 0;
  /// server or worker (DMLC_ROLE); a scheduler does not join.
  wire::role role = wire::role::worker;
  /// Must match the scheduler's job id and token.
  std::string job_id;
  std::string auth_token;
  /// Where this node's data port listens (servers: where workers connect), as peers should dial
  /// it; published in the membership table. data_port 0: the node accepts no data connections.
  std::string host = "127.0.0.1";
  std::uint16_t data_port = 0;
  /// The rank to ask the scheduler for, or -1 to take the next one.
  std::int32_t rank_hint = -1;
  /// Bound on join(): reaching the scheduler (processes start in any order, so join retries),
  /// registering and receiving the membership table.
  std::chrono::milliseconds startup_timeout{60'000};
  /// Pause between attempts to reach a scheduler that is not listening yet.
  std::chrono::milliseconds connect_retry_interval{100};
  /// How often the agent sends the scheduler a heartbeat frame; must be well below the
  /// scheduler's peer_timeout. This catches a node whose process is frozen (SIGSTOP) while its
  /// socket stays open, whatever the middleman settings.
  std::chrono::milliseconds heartbeat_interval{1'000};
  /// The scheduler is declared lost when nothing (its heartbeats included) has come from it for
  /// this long; must exceed the scheduler's heartbeat_interval.
  std::chrono::milliseconds peer_timeout{10'000};
  /// ps-lite's PS_VERBOSE on std::clog: 0 failures only, 1 admission and job events, 2 frames.
  int verbose = 0;
};

/// One server's or worker's membership in a job. Created by join(); thread-safe: any thread may
/// call any member. Destroying it stops the agent actor; the scheduler then sees the node leave,
/// which ends the job as a lost node unless the node had finished (a worker after notify_done(),
/// a server after the stop command). The actor system must outlive this object.
class node_agent {
public:
  /// Reaches the scheduler (retrying until options.startup_timeout), registers, and waits for the
  /// membership table, all within options.startup_timeout. `sys` needs the io::middleman.
  /// Errors: errc::invalid_argument for bad options or a rejected registration (the message
  /// names the reason: "registration rejected (wrong_job): ..."); errc::timeout when the
  /// scheduler cannot be reached, does not answer, or the job did not start in time (the
  /// scheduler's message names the missing roles); errc::peer_lost when the job failed or the
  /// scheduler was lost meanwhile.
  static result<std::unique_ptr<node_agent>> join(caf::actor_system& sys,
                                                  const agent_options& options);

  node_agent(const node_agent&) = delete;
  node_agent& operator=(const node_agent&) = delete;
  ~node_agent();

  wire::role role() const noexcept { return role_; }
  /// Rank within the role (worker rank is MXNet's kv.rank), assigned in arrival order.
  std::uint32_t rank() const noexcept { return rank_; }
  /// ps-lite node id: server 8+2*rank, worker 9+2*rank.
  std::uint32_t node_id() const noexcept { return node_id_; }
  /// The membership table received at join (every node, every server's key range).
  wire::membership membership() const;

  /// MXNet's KVStore::barrier() generalised to ps-lite groups: blocks until every member of
  /// `group` (a union of wire::group bits that includes this node's role) has called barrier
  /// with the same group as many times as this node. Errors: errc::invalid_argument for a bad
  /// group; errc::timeout when `timeout` passes first (the barrier is then out of step with the
  /// other members: treat it as fatal); errc::peer_lost when the job failed.
  status barrier(std::uint8_t group, std::chrono::milliseconds timeout);

  /// Workers, at finalize: tells the scheduler this worker is done and waits for its
  /// acknowledgement, so that leaving afterwards is not a loss. When every worker is done the
  /// servers are told to stop. Errors: errc::invalid_argument on a server; errc::timeout;
  /// errc::peer_lost.
  status notify_done(std::chrono::milliseconds timeout);

  /// Servers: blocks until the scheduler says stop (every worker is done): ok(). Errors:
  /// errc::timeout; errc::peer_lost when the job failed instead.
  status wait_for_stop(std::chrono::milliseconds timeout);

  /// Has the stop command arrived?
  bool stop_received() const;

  /// `listener` gets `(peer_lost_atom, std::string)` when the job fails and `(stop_atom)` when
  /// this server is told to stop; if either already happened, it gets that message right away.
  void subscribe(const caf::actor& listener);

  /// The error that ended this node's part in the job, if any.
  std::optional<error> failure() const;

  /// The agent actor (what the scheduler monitors); for tests and diagnostics.
  const caf::actor& actor() const noexcept { return actor_; }

  /// State shared between this object and its actor (defined in node_agent.cpp).
  struct shared_state;

private:
  node_agent(caf::actor actor, std::shared_ptr<shared_state> shared, wire::role role,
             std::uint32_t rank, std::uint32_t node_id);

  /// Sends `msg` (whose request id is `request_id`) and waits for its reply.
  status request(std::uint64_t request_id, const wire::message& msg,
                 std::chrono::milliseconds timeout, const std::string& what);

  caf::actor actor_;
  std::shared_ptr<shared_state> shared_;
  wire::role role_;
  std::uint32_t rank_;
  std::uint32_t node_id_;
};

} // namespace troupe
