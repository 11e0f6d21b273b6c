#pragma once
// How one process of a distributed job is assembled from the cluster configuration
// (actors/config.hpp): the scheduler, a server (its shards behind a data server), or a worker
// (a dist_kvstore linked to every server). troupe-node runs the first two; any troupe program
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
// A server process exits 0 when the scheduler stopped the job, 1 when the job failed, 2 as above.

#include <functional>
#include <memory>
#include <optional>
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
/// lost node). Membership updates (a worker lost within the quorum) go to every shard. Its shards
/// expire a waiting pull after timeouts.request and log as "server@HOST shard I"; at the end of
/// the job it logs (info) one line with the shards' counters summed.
status run_server(const cluster_config& config);

/// Whether `config` lets this process run the scheduler or the server it names: validate_for_role
/// and its listener's port free. The error is one line naming the variable, key or flag.
status check_node_config(const cluster_config& config);

/// Runs the scheduler or the server that `config` names (check_node_config has passed) until the
/// job ends, logs why it failed if it did, and returns the process's exit code: the scheduler 0,
/// 3 or 1, a server 0 or 1 (see the file comment). `on_listening` is told the scheduler's port
/// once it is bound. A configuration naming another role is a caller mistake: 2, logged.
int serve_node(const cluster_config& config,
               const std::function<void(std::uint16_t port)>& on_listening = {});

/// The first call of a troupe program's main. Reads the configuration as a worker's
/// kvstore::create does ($TROUPE_CONFIG or --config, the DMLC_* / TROUPE_* environment) plus the
/// cluster flags of add_config_flags found in argv (--role, --timeout, --quorum, ...: every
/// other argument is left to the program, which should accept the same flags and pass them to
/// kvstore::create). When it names the role scheduler or server, runs that node until the job
/// ends and returns the exit code the program should return (serve_node's; 2 for a bad
/// configuration, logged); for a worker, or no role, returns nullopt at once and the program goes
/// on. It never ends the process itself.
std::optional<int> serve_if_node_role(int argc, const char* const* argv);

/// Joins the job as a worker and returns its KVStore of `type` (dist_sync, dist_async, ...).
/// Worker rank 0 first tells the scheduler the job's sync settings (mode, sync.quorum, ...), so
/// that the scheduler knows how many workers the job needs alive.
result<std::unique_ptr<kvstore>> connect_worker(const std::string& type,
                                                const cluster_config& config);

/// kvstore::create's entry for distributed types: reads the configuration ($TROUPE_CONFIG or
/// --config, the DMLC_* environment, then `flags`) and connects a worker. A configuration naming
/// the role scheduler or server is an error that names DMLC_ROLE and serve_if_node_role: that
/// process should serve, not hold a store.
result<std::unique_ptr<kvstore>> create_distributed(const std::string& type,
                                                    const config_overrides& flags);

} // namespace troupe
