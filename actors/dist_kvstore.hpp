#pragma once
// The worker side of the distributed KVStore (MXNet's KVStoreDist): `dist_sync`, `dist_async`,
// `dist_device_sync`, `dist_device_async` (and MXNet's alias `dist_sync_device`).
//
// A push sums the worker's list on the host (`dist_*`) or on the devices (`dist_device_*`), cuts
// the sum into the key's server slices (actors/key_placement.hpp) and streams each slice to its
// server in chunks; a pull asks every server for its slice of the round this worker has pushed
// and reassembles the replies straight into the output. Requests go out at once and complete in
// the background (push_async / pull_async return a kv_request); pushes and pulls of one key travel
// on one connection per server, so they take effect in the order issued.
//
// init is done by rank 0 and followed by a barrier, so every worker can pull an initialised key
// right after init returns (MXNet's InitImpl). set_optimizer is sent by rank 0 to every server and
// followed by a barrier: the optimizer runs on the servers (update_on_kvstore).
//
// This class knows nothing of how the job was assembled: dist_kvstore_setup hands it the links to
// the servers, the job's barrier and what to do at finalize. actors/dist_job.hpp builds a setup
// from the cluster configuration; tests build one from actors in their own process.

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>

#include "actors/key_registry.hpp"
#include "actors/kvstore.hpp"
#include "actors/protocols.hpp"
#include "engine/comm.hpp"
#include "schema/chunking.hpp"

namespace troupe {

struct dist_kvstore_setup {
  /// One of dist_sync, dist_async, dist_device_sync, dist_device_async, dist_sync_device.
  std::string type = "dist_sync";
  std::uint32_t rank = 0;
  std::uint32_t num_workers = 1;
  std::uint32_t num_servers = 1;
  /// MXNET_KVSTORE_BIGARRAY_BOUND: keys with at least this many elements are split over servers.
  std::int64_t bigarray_bound = 1'000'000;
  /// Largest tensor payload per frame.
  std::size_t chunk_bytes = wire::default_chunk_bytes;
  /// Bound of every wait: a request not complete by then fails with errc::timeout.
  std::chrono::milliseconds timeout{5000};
  /// Opens one link per server rank; `replies` is the actor that must receive every reply as
  /// (envelope) and link failures as (link_down_atom, std::string).
  std::function<result<std::vector<caf::actor>>(caf::actor replies)> connect_servers;
  /// Blocks until every worker of the job has arrived.
  std::function<status()> barrier;
  /// Called once when the store is finalized (tell the job this worker is done).
  std::function<void()> on_finalize;
  /// Whatever must outlive the store (the actor system it runs in, the node agent); released
  /// after everything else of the store.
  std::shared_ptr<void> owned_resources;
};

class dist_kvstore final : public kvstore {
public:
  static result<std::unique_ptr<dist_kvstore>> create(caf::actor_system& system,
                                                      dist_kvstore_setup setup);
  ~dist_kvstore() override;

  using kvstore::broadcast;
  using kvstore::init;
  using kvstore::pull;
  using kvstore::push;
  using kvstore::pushpull;
  using kvstore::set_optimizer;

  const std::string& type() const noexcept override { return setup_.type; }
  int rank() const noexcept override { return static_cast<int>(setup_.rank); }
  int num_workers() const noexcept override { return static_cast<int>(setup_.num_workers); }

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
  status barrier() override;

  status set_optimizer(std::unique_ptr<optimizer> opt) override;
  /// A custom updater cannot run on the servers: not_supported (as in MXNet, where _set_updater
  /// on a dist store only applies to worker-side updates).
  status set_updater(updater_function update) override;
  bool is_capable(std::string_view capability) const noexcept override;

  /// Asks every server to write (or read) its shards' optimizer state to `path`.server<r>.shard<k>
  /// on the server's file system. Any worker may call it; typically rank 0 does.
  status save_optimizer_states(const std::string& path, bool dump_optimizer = false) const override;
  status load_optimizer_states(const std::string& path) override;

  /// Waits for this worker's requests, tells the job it is done (on_finalize) and closes the
  /// links. Called by the destructor if not before; later calls are no-ops.
  status finalize();

  /// Fails every request under way and every later one with `why` (a lost peer).
  void fail(error why);
  /// fail() as a function that stays safe to call after the store is gone (for notifications
  /// arriving from other actors).
  std::function<void(error)> failure_reporter() const;

  struct pending; // a request's part waiting for a reply (defined in the .cpp)

private:
  explicit dist_kvstore(dist_kvstore_setup setup);

  bool sync_mode() const noexcept;
  /// Sends `request` to server `server`, registering `part` under its request id first.
  void send(std::uint32_t server, envelope request, std::shared_ptr<pending> part);
  std::uint64_t next_request_id() { return next_request_id_++; }
  /// Sends a keyless request (set_optimizer, command) to every server and waits for the acks.
  status to_every_server(
      const std::function<wire::message(std::uint64_t request_id, std::uint32_t server)>& make,
      const std::string& what) const;
  /// Adds push and pull work for one key group to `request`.
  void start_push(const key_group& group, std::span<const ndarray> values, bool then_pull,
                  std::span<ndarray> outputs, const kv_request& request);
  void start_pull(const key_group& group, std::span<ndarray> outputs, const kv_request& request);
  std::optional<error> sticky_failure() const;

  std::shared_ptr<void> owned_resources_; // first member: released last
  dist_kvstore_setup setup_;
  caf::actor_system* system_ = nullptr;
  caf::actor replies_;
  std::vector<caf::actor> links_;
  key_registry keys_;
  std::unique_ptr<comm> comm_;
  std::map<std::int64_t, std::uint64_t> rounds_; // pushes issued per key index
  mutable std::atomic<std::uint64_t> next_request_id_{1};
  bool finalized_ = false;

public:
  /// Shared with the reply actor: the parts waiting for replies, by request id.
  struct reply_table;

private:
  std::shared_ptr<reply_table> table_;
};

} // namespace troupe
