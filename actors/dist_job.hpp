#pragma once
// How one process of a distributed job is assembled from the cluster configuration
// (actors/config.hpp): the scheduler, a server (its shards behind a data server), or a worker
// (a dist_kvstore linked to every server). troupe-node runs the first two; kvstore::create runs
// whichever DMLC_ROLE names, as MXNet's `import mxnet` does for servers and schedulers.
//
// Each process's actor system is set up here, once: the middleman (for troupe's own framed
// links; no BASP port is opened) and the data path's tuning. A frozen peer is noticed by the
// control plane's heartbeats (timeouts.heartbeat, timeouts.peer).
//
// Exit codes of a scheduler process (troupe-node, or a program under DMLC_ROLE=scheduler):
//   0  every worker finished
//   3  the job finished, but some workers were lost within the quorum (sync.quorum < number of
//      workers); the summary line on stderr names them, when and why
//   1  the job failed (a lost server, more workers lost than the quorum allows, a startup
//      timeout), with the reason on stderr

#include <functional>
#include <memory>
#include <string>

#include "actors/config.hpp"
#include "actors/kvstore.hpp"
#include "actors/scheduler.hpp"

namespace troupe {

/// Runs the scheduler until the job ends and returns how it ended (the scheduler has logged its
/// summary line); an error when it could not start (a bad configuration, the port cannot be
/// bound). `on_listening` is told the bound port once it is known.
result<job_outcome> run_scheduler(const cluster_config& config,
                                  const std::function<void(std::uint16_t port)>& on_listening = {});

/// The exit code of a scheduler process for what run_scheduler returned: 0, 3 or 1 (see the
/// file comment).
int scheduler_exit_code(const result<job_outcome>& outcome) noexcept;

/// Runs a server until the scheduler stops the job (ok) or the job fails (the error, naming the
/// lost node). Membership updates (a worker lost within the quorum) go to every shard.
status run_server(const cluster_config& config);

/// Joins the job as a worker and returns its KVStore of `type` (dist_sync, dist_async, ...).
/// Worker rank 0 first tells the scheduler the job's sync settings (mode, sync.quorum, ...), so
/// that the scheduler knows how many workers the job needs alive.
result<std::unique_ptr<kvstore>> connect_worker(const std::string& type,
                                                const cluster_config& config);

/// kvstore::create's entry for distributed types: reads the configuration ($TROUPE_CONFIG, the
/// DMLC_* environment); with DMLC_ROLE=scheduler or server it runs that node and ends the
/// process with its outcome (a server 0 or 1, a scheduler 0, 3 or 1; as MXNet's server
/// processes never return from import);
/// otherwise it connects a worker.
result<std::unique_ptr<kvstore>> create_distributed(const std::string& type);

} // namespace troupe
