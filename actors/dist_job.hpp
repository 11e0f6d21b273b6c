#pragma once
// How one process of a distributed job is assembled from the cluster configuration
// (actors/config/config.hpp): the scheduler, a server (its shards behind a data server), or a
// worker (its node agent, and the worker_setup its store runs on: join_worker; the store itself,
// dist_kvstore, sits above these actors). troupe-node runs the first two; any troupe program
// runs whichever role the configuration names when it starts with serve_if_node_role, which keeps
// MXNet's convention (one program for every role, the role from DMLC_ROLE) without the library
// ever ending the process:
//
//   int main(int argc, char** argv) {
//     if (auto served = troupe::serve_if_node_role(argc, argv))
//       return *served; // this process was a scheduler or a server, and the job is over
//     auto kv = troupe::kvstore::create("dist_sync");  // a worker
//     ...
//
// Each process's actor system is set up here, once: the middleman (for troupe's own framed
// links; no BASP port is opened) and the data path's tuning. A frozen peer is noticed by the
// control plane's heartbeats (timeouts.heartbeat, timeouts.peer).
//
// Exit codes of a scheduler process (troupe-node, or serve_if_node_role under
// DMLC_ROLE=scheduler):
//   0  every worker finished
//   3  the job finished, but some workers were lost within the quorum (sync.quorum < number of
//      workers); the summary line on stderr names them, when and why
//   1  the job failed (a lost server, more workers lost than the quorum allows, a startup
//      timeout), with the reason on stderr
//   2  (serve_if_node_role) a bad configuration or a port in use, before any network activity
// A server process exits 0 when the scheduler stopped the job, 1 when the job failed, 2 as above
// or (checkpoint.recover) when its checkpoint is missing, torn or of another layout.

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/config/config.hpp"
#include "actors/logic/shard_checkpoint.hpp"
#include "actors/protocols.hpp"
#include "actors/scheduler.hpp"
#include "engine/log.hpp"
#include "schema/chunking.hpp"

namespace troupe {

/// Makes a running server print its summary (observe.summary's lines) within a second, whatever
/// node.verbose says. Async-signal-safe: troupe-node calls it on SIGUSR1.
void ask_for_summary() noexcept;

/// Makes a running server ask the scheduler to leave the job within a second (elastic servers):
/// its key ranges move to the other servers, then the scheduler tells it to stop and it exits 0.
/// Async-signal-safe: troupe-node calls it on SIGUSR2.
void ask_to_leave() noexcept;

/// Runs the scheduler until the job ends and returns how it ended (the scheduler has logged its
/// summary line); an error when it could not start (a bad configuration, the port cannot be
/// bound). `on_listening` is told the bound port once it is known.
/// `on_worker_lost` is told the rank of each worker the scheduler declares lost
/// (scheduler_options::on_worker_lost).
result<job_outcome> run_scheduler(const cluster_config& config,
                                  const std::function<void(std::uint16_t port)>& on_listening = {},
                                  std::function<void(std::uint32_t rank)> on_worker_lost = {});

/// The exit code of a scheduler process for what run_scheduler returned: 0, 3 or 1 (see the
/// file comment).
int scheduler_exit_code(const result<job_outcome>& outcome) noexcept;

/// Runs a server until the scheduler stops the job (ok) or the job fails (the error, naming the
/// lost node). Membership updates (a worker lost within the quorum) go to every shard. Its shards
/// expire a waiting pull after timeouts.request and log as "server@HOST shard I"; at the end of
/// the job it logs (info) one line with the shards' counters summed.
status run_server(const cluster_config& config, std::vector<shard_snapshot> restore = {});

/// checkpoint.recover (troupe-node --recover): every shard's checkpoint of server rank
/// node.rank_hint from checkpoint.dir (shard_checkpoint.hpp's checkpoint_file), for run_server to
/// restore before the server joins as the recovering server of that rank; empty without
/// checkpoint.recover. An error naming the file when one is missing, torn (its checksum fails) or
/// of another layout (the fields that differ): like a bad key, the answer to the command line
/// (one line, exit 2), said before serve_node.
result<std::vector<shard_snapshot>> load_server_checkpoint(const cluster_config& config);

/// Whether `config` lets this process run the scheduler or the server it names: validate_for_role
/// and its listener's port free. The error is one line naming the variable, key or flag.
status check_node_config(const cluster_config& config);

/// Runs the scheduler or the server that `config` names (check_node_config has passed) until the
/// job ends, logs why it failed if it did, and returns the process's exit code: the scheduler 0,
/// 3 or 1, a server 0 or 1 (see the file comment). A server restores `restore`
/// (load_server_checkpoint's) first. `on_listening` is told the scheduler's port once it is
/// bound, `on_worker_lost` each worker it declares lost. A configuration naming another role is a
/// caller mistake: 2, logged.
int serve_node(const cluster_config& config, std::vector<shard_snapshot> restore = {},
               const std::function<void(std::uint16_t port)>& on_listening = {},
               std::function<void(std::uint32_t rank)> on_worker_lost = {});

/// The first call of a troupe program's main. Reads the configuration as a worker's
/// kvstore::create does ($TROUPE_CONFIG or --config, the DMLC_* / TROUPE_* environment) plus the
/// cluster flags of add_config_flags found in argv (--role, --timeout, --quorum, ...: every
/// other argument is left to the program, which should accept the same flags and pass them to
/// kvstore::create). When it names the role scheduler or server, runs that node until the job
/// ends and returns the exit code the program should return (serve_node's; 2 for a bad
/// configuration or a role that is none of scheduler, server and worker, printed as the one line
/// "<program>: <message>", <program> being argv[0]'s file name); for a worker, or no role,
/// returns nullopt at once and the program goes on. It never ends the process itself.
std::optional<int> serve_if_node_role(int argc, const char* const* argv);

/// What a worker's store (actors/kvstore/dist_kvstore.hpp) runs on: its type and options, its place
/// in the job, and how to reach the rest of the job. join_worker builds one from the cluster
/// configuration; tests build one from actors in their own process.
struct worker_setup {
  /// The actor system the store's worker actor runs in; it must outlive the store (join_worker's
  /// is kept alive by owned_resources).
  caf::actor_system* system = nullptr;
  /// One of dist_sync, dist_async, dist_device_sync, dist_device_async, dist_sync_device,
  /// dist_async_device.
  std::string type = "dist_sync";
  std::uint32_t rank = 0;
  /// The job's workers when this worker joined it.
  std::uint32_t num_workers = 1;
  std::uint32_t num_servers = 1;
  /// The server that holds each key range (Membership.keyRanges, in range order;
  /// worker_core_options::range_owner). Empty: range i on server i.
  std::vector<std::uint32_t> range_owner;
  /// The worker joined the running job (Admitted.joined): its init declares its keys and pulls
  /// their current values, without pushing or waiting at a barrier, and the job's setup calls
  /// (set_optimizer, compression) are the first workers' to make.
  bool joined = false;
  /// The job's workers now, as the latest membership table says (workers that joined count,
  /// those that left still do). Optional: num_workers.
  std::function<std::uint32_t()> workers_now;
  /// The ranks of the workers the latest membership table counts as in the job (alive, not
  /// left), ascending. Optional: every rank below num_workers.
  std::function<std::vector<int>()> ranks_in;
  /// A worker that joined at the workers' barrier (job.join_at_barrier): what the others shared
  /// there, as node_agent::barrier_gather answers.
  std::optional<std::vector<wire::gathered_values>> gathered_at_join;
  /// MXNET_KVSTORE_BIGARRAY_BOUND: keys with at least this many elements are split over servers.
  std::int64_t bigarray_bound = 1'000'000;
  /// Largest tensor payload per frame.
  std::size_t chunk_bytes = wire::default_chunk_bytes;
  /// data.max_frame_bytes: the servers' largest frame, which a row-sparse push must fit.
  std::uint64_t max_frame_bytes = std::uint64_t{256} << 20;
  /// data.slice_bytes: keys larger than this are cut into slices of at most this size; 0: none.
  std::size_t slice_bytes = 0;
  /// Bytes of tensor handed to each server's link at a time (data.send_window_bytes).
  std::size_t send_window_bytes = default_send_window_bytes;
  /// data.slice_credit: pushes of one key's slices on one server awaiting answers at once; 0: no
  /// bound.
  std::uint32_t slice_credit = default_slice_credit;
  /// data.fuse_item_bytes, data.fuse_frame_bytes (worker_core_options).
  std::size_t fuse_item_bytes = default_fuse_item_bytes;
  std::size_t fuse_frame_bytes = default_fuse_frame_bytes;
  /// A request not answered this long after it was sent fails with errc::timeout.
  std::chrono::milliseconds timeout{30'000};

  /// The job's consistency, announced by rank 0 (sync.* of the cluster configuration):
  /// dist_sync rounds close with `quorum` workers (0: all of them), scaled by
  /// num_workers / quorum when `rescale_quorum`; a dist_async pull waits until every live worker
  /// is at most `max_staleness` rounds behind (-1: no bound); a server accepts pushes at most
  /// `max_rounds_ahead` rounds beyond the one it collects.
  std::uint32_t quorum = 0;
  bool rescale_quorum = false;
  std::int64_t max_staleness = -1;
  std::uint32_t max_rounds_ahead = 2;

  /// Opens one link per server rank, each sending its replies to `receiver` as (envelope) with
  /// the tag rank + 1 and its loss as (link_down_atom, tag, why).
  std::function<result<server_links>(const caf::actor& receiver)> connect_servers;
  /// Server recovery (kv_worker_options::server_rejoin, ::reconnect): how long the job waits for
  /// a lost server to come back from its checkpoint (0: it does not), and how to link to one at
  /// its new address. Optional.
  std::chrono::milliseconds server_rejoin{0};
  std::function<result<link_actor>(const wire::node_info& server, const caf::actor& receiver)>
      reconnect_server;
  /// Blocks until every (live) worker of the job has arrived.
  std::function<status()> barrier;
  /// The same, for the barrier that ends init and set_optimizer (Barrier.start: no worker that
  /// joins at a barrier is taken in there). Optional: barrier.
  std::function<status()> start_barrier;
  /// The same barrier, sharing values with the other workers (node_agent::barrier_gather).
  /// Optional.
  std::function<result<std::vector<wire::gathered_values>>(std::span<const double>)> gather;
  /// Rank 0: tells the scheduler the job's consistency (it decides how many lost workers the
  /// job survives). Optional.
  std::function<status(const wire::sync_settings&)> announce_settings;
  /// Called once with the worker actor, e.g. to subscribe it to the node agent. Optional.
  std::function<void(const worker_actor&)> on_started;
  /// Called once when the store is finalized, after its requests were answered, with the most
  /// pushes it made of any one key: tells the job this worker is done (it leaves the job); how
  /// that went. Optional.
  std::function<status(std::uint64_t rounds)> on_finalize;
  /// Whatever must outlive the store (the actor system it runs in, the node agent); released
  /// after everything else of the store.
  std::shared_ptr<void> owned_resources;
  logger log;
  /// The end-of-job summary's logger (observe.summary; kv_worker_options::summary_log).
  logger summary_log;
};

/// Joins the job that `config` names as a worker whose store will be of `type`: the node agent
/// registers with the scheduler and waits for the first membership table; the links to the
/// servers open when the store calls connect_servers. The setup owns the actor system and the
/// agent (owned_resources).
result<worker_setup> join_worker(const std::string& type, const cluster_config& config);

} // namespace troupe
