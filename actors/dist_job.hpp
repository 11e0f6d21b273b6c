#pragma once
// How one process of a distributed job is assembled from the cluster configuration
// (actors/config.hpp): the scheduler, a server (its shards behind a data server), or a worker
// (a dist_kvstore linked to every server). troupe-node runs the first two; kvstore::create runs
// whichever DMLC_ROLE names, as MXNet's `import mxnet` does for servers and schedulers.
//
// Each process's actor system is set up here, once: the middleman with heartbeats and a
// connection timeout (a frozen peer is noticed), and the data path's tuning.

#include <functional>
#include <memory>
#include <string>

#include "actors/config.hpp"
#include "actors/kvstore.hpp"

namespace troupe {

/// Runs the scheduler until the job ends: ok when every worker finished, the error that ended it
/// otherwise. `on_listening` is told the bound port once it is known.
status run_scheduler(const cluster_config& config,
                     const std::function<void(std::uint16_t port)>& on_listening = {});

/// Runs a server until the scheduler stops the job (ok) or the job fails (the error, naming the
/// lost node).
status run_server(const cluster_config& config);

/// Joins the job as a worker and returns its KVStore of `type` (dist_sync, dist_async, ...).
result<std::unique_ptr<kvstore>> connect_worker(const std::string& type,
                                                const cluster_config& config);

/// kvstore::create's entry for distributed types: reads the configuration ($TROUPE_CONFIG, the
/// DMLC_* environment); with DMLC_ROLE=scheduler or server it runs that node and ends the
/// process with its outcome (0 or 1, as MXNet's server processes never return from import);
/// otherwise it connects a worker.
result<std::unique_ptr<kvstore>> create_distributed(const std::string& type);

} // namespace troupe
