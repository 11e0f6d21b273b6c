#pragma once
// The node side of the control plane: one agent per server or worker process. It connects to
// the scheduler (actors/scheduler.hpp), registers, waits for the membership table, then serves
// the process's blocking calls (barrier, done, sync settings, wait for stop) and tells its
// subscribers about the job.
//
// Transport: the agent's control connection is a data link (actors/data_link.hpp) to the
// scheduler's port, carrying Cap'n Proto frames (at most max_control_frame_bytes each, no
// shared memory); the agent actor (node_agent_actor of actors/protocols.hpp) is the link's
// receiver. Processes of a job start in any order, so join() retries a scheduler that refuses
// connections, with exponential backoff (50 ms doubling to 1 s, connect_backoff), for at most
// agent_options::connect_timeout.
//
// Rules and plumbing: the agent's rules (its phases, admission, membership epochs, request and
// barrier ids, which failures end the node, the deadlines) are agent_core's
// (actors/logic/agent_core.hpp, which also declares agent_options), tested without CAF; the actor
// around it holds the control link, the completions the blocking calls wait on and the
// subscribers.
//
// The agent is an actor behind a plain class whose calls block the calling thread, each for a
// bounded time, as MXNet's KVStore calls do; every wait goes through completion<T>
// (actors/bridge.hpp).
//
// Identity: the control link exchanges keys in its handshake, and the admission carries this
// node's own secret sealed under the session key (actors/logic/node_identity.hpp): a worker keeps
// its node key (key(), which its data links prove), a server hands the job secret to
// agent_options::on_job_secret (its data port checks its workers' keys against it).
//
// Failure, as the node sees it: a scheduler that refuses the control link's handshake (a wrong
// token) fails join() with errc::invalid_argument, "refused by the scheduler at host:port: the job
// token is wrong (...)". When the scheduler reports a lost peer, or the scheduler itself
// is lost (the control link closed, or nothing heard from it for peer_timeout), every waiting
// call and every later one returns errc::peer_lost with a message naming the node ("worker 2
// (node 13) was lost: ...", "scheduler (node 1) was lost: ..."), and every subscriber gets
// `(peer_lost_atom, std::string message)`. A worker lost within the job's quorum is no failure
// for the others: they get the new membership table instead. Nothing waits forever.
//
// Subscriber messages (job_listener of actors/protocols.hpp, see subscribe):
//   (peer_lost_atom, std::string)  the job failed; the text names the lost node's role and rank
//   (stop_atom)                    the scheduler told this server to stop (the job ended well)
//   (wire::membership)             every membership update after the first (a lost worker)

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include <caf/fwd.hpp>

#include "actors/bridge.hpp"
#include "actors/logic/agent_core.hpp"
#include "actors/protocols.hpp"
#include "engine/error.hpp"
#include "engine/log.hpp"
#include "schema/messages.hpp"

namespace troupe {

/// One server's or worker's membership in a job. Created by join(); thread-safe: any thread may
/// call any member. Destroying it stops the agent actor and so closes the control link; the
/// scheduler then sees the node leave, which is a lost node unless the node had finished (a
/// worker after notify_done(), a server after the stop command). The actor system must outlive
/// this object.
class node_agent {
public:
  /// Connects to the scheduler (retrying for up to options.connect_timeout), registers, and waits
  /// for the membership table, all within options.startup_timeout. `sys` needs the
  /// io::middleman. Errors: errc::invalid_argument for bad options, a rejected registration
  /// (the message names the reason: "registration rejected (wrong_job): ..."), a refused
  /// handshake ("refused by the scheduler at host:port: the job token is wrong (...)") or a
  /// secret that does not open; errc::timeout
  /// when the scheduler cannot be reached (the message names host:port, how long join tried and
  /// the last reason), does not answer, or the job did not start in time (the scheduler's
  /// message names the missing roles); errc::peer_lost when the job failed or the scheduler was
  /// lost meanwhile.
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
  /// A worker admitted into the job while it ran (job.max_workers; Admitted.joined).
  bool joined_running_job() const noexcept { return joined_running_job_; }
  /// A worker that joined at the workers' barrier (job.join_at_barrier): what the others shared
  /// there (barrier_gather's answer). nullopt otherwise.
  const std::optional<std::vector<wire::gathered_values>>& gathered_at_join() const noexcept {
    return gathered_at_join_;
  }
  /// The membership table received at join (every node, every server's key range); later
  /// tables go to the subscribers.
  const wire::membership& membership() const noexcept { return membership_; }
  /// A worker's node key, from its admission: what its data links prove (data_link_tuning::node).
  /// Empty at a server.
  const node_key& key() const noexcept { return key_; }

  /// MXNet's KVStore::barrier() generalised to ps-lite groups: blocks until every live member of
  /// `group` (a union of wire::group bits that includes this node's role) has called barrier
  /// with the same group as many times as this node. Errors: errc::invalid_argument for a bad
  /// group; errc::timeout when `timeout` passes first (the barrier is then out of step with the
  /// other members: treat it as fatal); errc::peer_lost when the job failed.
  /// `start`: the barrier ends this worker's init or set_optimizer (Barrier.start), where no
  /// worker joining at a barrier is taken in.
  status barrier(std::uint8_t group, std::chrono::milliseconds timeout, bool start = false);
  /// barrier() that also shares `values` (at most wire::max_barrier_values) with the other
  /// members: returns every live member's values that shared any (this node's included), by
  /// role, then rank. KVStore::gather_at_barrier runs on it.
  result<std::vector<wire::gathered_values>> barrier_gather(std::uint8_t group,
                                                            std::span<const double> values,
                                                            std::chrono::milliseconds timeout,
                                                            bool start = false);

  /// Workers, at finalize: tells the scheduler this worker is done and waits for its
  /// acknowledgement, so that leaving afterwards is not a loss. When every live worker is done
  /// the servers are told to stop. Errors: errc::invalid_argument on a server; errc::timeout;
  /// errc::peer_lost. `rounds`: the most pushes the worker made of any one key, for the
  /// scheduler's summary.
  status notify_done(std::chrono::milliseconds timeout, std::uint64_t rounds = 0);
  /// Servers of an elastic job (job.max_servers): asks the scheduler to let this server leave
  /// (Command stop from a server). Answered at once; the scheduler then moves the server's key
  /// ranges to the others and sends it stop (wait_for_stop returns). Errors: errc::invalid_argument
  /// on a worker, or naming why the scheduler refused (the job's last server, a job not running);
  /// errc::timeout.
  status ask_to_leave(std::chrono::milliseconds timeout);

  /// Worker rank 0: tells the scheduler the job's sync settings (its quorum: how many workers
  /// the job needs alive) and waits for the acknowledgement. Errors: errc::invalid_argument when
  /// the scheduler refuses them (another node sent them, a quorum outside 1..num_workers; the
  /// message says which); errc::timeout; errc::peer_lost.
  status send_sync_settings(wire::sync_settings settings, std::chrono::milliseconds timeout);

  /// Servers: blocks until the scheduler says stop (every live worker is done): ok(). Errors:
  /// errc::timeout; errc::peer_lost when the job failed instead.
  status wait_for_stop(std::chrono::milliseconds timeout) const;

  /// Has the stop command arrived?
  bool stop_received() const;

  /// `listener` gets the subscriber messages of the file comment from now on; when the job has
  /// already failed or stopped, it gets that message right away.
  void subscribe(const job_listener& listener);

  /// The error that ended this node's part in the job, if any.
  std::optional<error> failure() const;

  /// The agent actor (the control link's receiver); for tests and diagnostics.
  const node_agent_actor& actor() const noexcept { return actor_; }

  /// What join() learns (defined in node_agent.cpp).
  struct joined;

private:
  node_agent(node_agent_actor actor, completion<status> ended, wire::role role,
             const joined& admitted);

  /// Hands `request` to the agent and waits for its answer.
  status call(wire::message request, std::string what, std::chrono::milliseconds timeout,
              std::shared_ptr<std::vector<wire::gathered_values>> gathered = nullptr);

  node_agent_actor actor_;
  /// ok() when the stop command arrived, the failure when the job failed.
  completion<status> ended_;
  wire::role role_;
  std::uint32_t rank_;
  std::uint32_t node_id_;
  bool joined_running_job_ = false;
  wire::membership membership_;
  node_key key_;
  std::optional<std::vector<wire::gathered_values>> gathered_at_join_;
};

} // namespace troupe
