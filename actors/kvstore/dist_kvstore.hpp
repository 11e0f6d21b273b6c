#pragma once
// The distributed KVStore as its caller sees it (MXNet's KVStoreDist): `dist_sync`, `dist_async`,
// `dist_device_sync`, `dist_device_async` (and MXNet's aliases `dist_sync_device`,
// `dist_async_device`).
//
// A blocking facade over the store's worker actor (actors/kv_worker.hpp). A call is checked on
// the caller's thread against the keys' declarations (every mistake is reported before anything
// is sent), the values of a key are summed on the host (`dist_*`) or on the devices
// (`dist_device_*`), and the call goes to the worker actor, which sends it, tracks it and
// delivers its outcome; push_async / pull_async / pushpull_async return a kv_request at once.
//
// init is done by rank 0 and followed by a barrier, so every worker can pull an initialised key
// right after init returns (MXNet's InitImpl). set_optimizer is sent by rank 0 to every server
// and followed by a barrier: the optimizer runs on the servers (update_on_kvstore). Before its
// first init, rank 0 tells every server (and the scheduler) how the job applies pushes:
// sync or async, the quorum of a dist_sync round, bounded staleness for dist_async
// (wire::sync_settings).
//
// This class knows nothing of how the job was assembled: a worker_setup (actors/dist_job.hpp)
// hands it the links to the servers, the job's barrier and what to do at finalize. join_worker
// builds one from the cluster configuration (connect_worker below); tests build one from actors in
// their own process.

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/dist_job.hpp"
#include "actors/kv_worker.hpp"
#include "actors/kvstore/key_registry.hpp"
#include "actors/kvstore/kvstore.hpp"
#include "actors/protocols.hpp"
#include "engine/comm.hpp"
#include "engine/log.hpp"
#include "schema/chunking.hpp"

namespace troupe {

class dist_kvstore final : public kvstore {
public:
  /// A store running its worker actor in setup.system.
  static result<std::unique_ptr<dist_kvstore>> create(worker_setup setup);
  ~dist_kvstore() override;

  using kvstore::broadcast;
  using kvstore::init;
  using kvstore::pull;
  using kvstore::push;
  using kvstore::pushpull;
  using kvstore::row_sparse_pull;
  using kvstore::set_optimizer;

  const std::string& type() const noexcept override { return setup_.type; }
  int rank() const noexcept override { return static_cast<int>(setup_.rank); }
  /// The job's workers as the latest membership table says: workers that joined the running job
  /// count; workers that left or were lost still do (MXNet's N, which a program may have used for
  /// its own arithmetic until the end).
  int num_workers() const noexcept override;
  std::vector<int> worker_ranks() const override;
  std::optional<std::vector<std::vector<double>>> gathered_at_join() const override;

  status init(std::span<const kv_key> keys, std::span<const ndarray> values) override;
  status push(std::span<const kv_key> keys, std::span<const ndarray> values,
              int priority = 0) override;
  status pull(std::span<const kv_key> keys, std::span<ndarray> outputs, int priority = 0) override;
  status pushpull(std::span<const kv_key> keys, std::span<const ndarray> values,
                  std::span<ndarray> outputs, int priority = 0) override;
  kv_request push_async(std::span<const kv_key> keys, std::span<const ndarray> values,
                        int priority = 0) override;
  kv_request pull_async(std::span<const kv_key> keys, std::span<ndarray> outputs,
                        int priority = 0) override;
  kv_request pushpull_async(std::span<const kv_key> keys, std::span<const ndarray> values,
                            std::span<ndarray> outputs, int priority = 0) override;
  /// row_sparse keys: placed by rows over the servers (MXNet's rule, place_rows); a push sends
  /// each server only the rows it holds, and row_sparse_pull fetches only the rows asked for.
  status init(std::span<const kv_key> keys, std::span<const row_sparse_array> values) override;
  status push(std::span<const kv_key> keys, std::span<const row_sparse_array> values,
              int priority = 0) override;
  status row_sparse_pull(std::span<const kv_key> keys, std::span<row_sparse_array> outputs,
                         std::span<const ndarray> row_ids, int priority = 0) override;
  status barrier() override;
  result<std::vector<std::vector<double>>> gather_at_barrier(std::span<const double> mine) override;

  status set_optimizer(std::unique_ptr<optimizer> opt) override;
  /// A custom updater cannot run on the servers: not_supported (as in MXNet, where _set_updater
  /// on a dist store only applies to worker-side updates).
  using kvstore::set_gradient_compression;
  /// Rank 0 announces it to every server (SetGradientCompression) and waits for their acks;
  /// every worker compresses its own pushes from the next call on. Not a collective call.
  status set_gradient_compression(const gradient_compression& rule) override;
  status set_updater(updater_function update) override;
  bool is_capable(std::string_view capability) const noexcept override;
  /// True while this is the only distributed store of the process.
  bool lanes_may_wait_for_requests() const noexcept override;

  /// Asks every server to write (or read) its shards' optimizer state to
  /// <checkpoint dir>/`path`.server<r>.shard<k> on the server's file system: `path` is a name
  /// relative to the servers' checkpoint directory (checkpoint.dir), which a server must have.
  /// dump_optimizer writes the optimizer itself too, which a load then restores. In dist_sync a
  /// save waits on each server until no round is being collected, so it holds the rounds of the
  /// pushes this worker made before it. Only worker rank 0 sends commands to the servers (they
  /// refuse one from another rank: actors/logic/node_identity.hpp), so on another rank both fail
  /// at once with errc::invalid_argument naming the rule, and nothing is sent; the other workers
  /// wait at a barrier meanwhile. Loading needs a job of the same num_servers, node.shards and
  /// num_workers; the refusal names what differs.
  status save_optimizer_states(const std::string& path, bool dump_optimizer = false) const override;
  status load_optimizer_states(const std::string& path) override;

  /// Waits for this worker's requests, tells the job it is done (on_finalize) and closes the
  /// links. Called by the destructor if not before; later calls are no-ops.
  status finalize();
  /// finalize(): the worker leaves the job, which goes on without it (kvstore::leave).
  status leave() override;

  /// The worker actor: it takes the node agent's notices (job_listener) and membership updates.
  const worker_actor& worker() const noexcept { return worker_; }

private:
  explicit dist_kvstore(worker_setup setup);

  bool sync_mode() const noexcept;
  /// Stops the worker and the links of a store that failed to start, without telling the job.
  void abandon();
  /// ok() until the store has left the job; then the error for calling `what`.
  status still_in_job(std::string_view what) const;
  /// Hands `op` to the worker actor; the request ends when the worker delivers.
  kv_request start(kv_operation op);
  /// init's work once the values are checked: declares the keys (`row_sparse`: of row_sparse
  /// values, whose dense forms `values` are) and, on rank 0, sends them; then the barrier.
  status declare_and_send(std::span<const kv_key> keys, std::span<const ndarray> values,
                          bool row_sparse);
  /// The operation for `keys` grouped from a batch call, `values` summed per key when given.
  result<kv_operation> make_operation(kv_call call, std::span<const kv_key> keys,
                                      std::span<const ndarray> values, std::span<ndarray> outputs,
                                      const char* what);
  /// Sends a keyless message to every server and waits for the acks.
  status
  to_every_server(std::function<wire::message(std::uint64_t request_id, std::uint32_t server)> make,
                  std::string what) const;
  wire::sync_settings settings() const;
  /// ok() on worker rank 0; elsewhere the error for `what`, which only rank 0 may do.
  status rank_zero_only(const std::string& what) const;
  /// A worker that joined the running job: the first pull of each of `keys` (see init); a key not
  /// initialised yet is waited for (worker rank 0's init), within the request timeout, asked again
  /// at most every max_init_wait_step.
  status pull_to_join(std::span<const kv_key> keys, std::span<const ndarray> values,
                      bool row_sparse);
  /// The barrier that ends init and set_optimizer; none for a worker that joined the running job.
  status start_barrier();
  static constexpr std::chrono::milliseconds max_init_wait_step{100};

  std::shared_ptr<void> owned_resources_; // first member: released last
  worker_setup setup_;
  worker_actor worker_;
  /// How calls reach the worker: small ones run on the caller's thread (worker_lane).
  std::shared_ptr<worker_lane> lane_ = std::make_shared<worker_lane>();
  /// set_gradient_compression: stamped on every push and pushpull this store starts.
  gradient_compression compression_;
  std::vector<link_actor> links_; // closed at finalize
  key_registry keys_;
  std::unique_ptr<comm> comm_;
  bool finalized_ = false;
};

/// Joins the job as a worker (join_worker) and returns its store of `type` (dist_sync, dist_async,
/// ...). Worker rank 0 first tells the scheduler the job's sync settings (mode, sync.quorum, ...),
/// so that the scheduler knows how many workers the job needs alive.
result<std::unique_ptr<kvstore>> connect_worker(const std::string& type,
                                                const cluster_config& config);

/// kvstore::create's entry for distributed types: reads the configuration ($TROUPE_CONFIG or
/// --config, the DMLC_* environment, then `flags`) and connects a worker. A configuration naming
/// the role scheduler or server is an error that names DMLC_ROLE and serve_if_node_role: that
/// process should serve, not hold a store.
result<std::unique_ptr<kvstore>> create_distributed(const std::string& type,
                                                    const config_overrides& flags);

} // namespace troupe
