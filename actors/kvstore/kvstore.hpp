#pragma once
// The KVStore: the one interface host apps use for every mode, with Apache MXNet's semantics
// (python/mxnet/kvstore/kvstore.py, src/kvstore/kvstore_local.h).
//
//   auto kv = troupe::kvstore::create("local").value();
//   kv->init(3, ndarray::ones({2, 3}));
//   kv->push(3, {a, b, c, d});          // the list is summed, then replaces the value
//   kv->pull(3, out);                   // out == a + b + c + d
//
// Modes: `local` (values summed on the host) and `device` (summed on the pushing devices' side;
// see engine/comm.hpp), and the distributed `dist_sync`, `dist_async`, `dist_device_sync` and
// `dist_device_async` (actors/kvstore/dist_kvstore.hpp), whose values live on server processes.
//
// Keys are ints or strings, not both in one store. A push without an optimizer replaces the
// stored value with the sum of the pushed list; after set_optimizer (or set_updater) a push
// runs the update in the store instead.
//
// Every call checks all of its arguments before it changes anything: an unknown key, a shape or
// dtype that differs from init, mixed key types or an empty list return an error that names the
// key and the expected and actual values, and the stored values stay as they were.

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "actors/bridge.hpp"
#include "engine/error.hpp"
#include "engine/gradient_compression.hpp"
#include "engine/ndarray.hpp"
#include "engine/optimizer.hpp"
#include "engine/row_sparse.hpp"

namespace troupe {

struct config_overrides; // actors/config/config.hpp

/// A push, pull or pushpull under way: wait() blocks until it is done and says how it ended.
/// Copies share the same request. The outputs of a pull must not be read, and the inputs of a
/// push not written, before wait() returns. The store fails a request that is not answered
/// within its timeout of being sent; wait() itself gives up at the latest at `deadline` (a
/// backstop for a worker that no longer answers). When wait() gives up, or the last copy of an
/// unfinished request is dropped, the request is cancelled: a reply arriving later never writes
/// into its outputs.
class kv_request {
public:
  /// A request that is already complete with `outcome`.
  static kv_request done(status outcome = {});
  /// A request whose outcome `outcome` delivers; `what` names it in a timeout.
  kv_request(completion<status> outcome, std::string what,
             std::chrono::steady_clock::time_point deadline);

  kv_request() : kv_request(done()) {}
  status wait() const;
  bool ready() const;

private:
  struct caller;
  explicit kv_request(std::shared_ptr<caller> c) : caller_(std::move(c)) {}
  std::shared_ptr<caller> caller_;
};

/// An int or a string key, as MXNet accepts either.
using kv_key = std::variant<std::int64_t, std::string>;

/// "3" or "'weight'".
std::string to_string(const kv_key& key);

class kvstore {
public:
  /// A custom update run by the store on each push: (key, pushed sum, stored value to update).
  using updater_function =
      std::function<void(const kv_key& key, const ndarray& received, ndarray& stored)>;
  /// The same for a row_sparse key's pushes: (key, pushed rows summed, stored value).
  using row_updater_function =
      std::function<void(const kv_key& key, const row_sparse_array& received, ndarray& stored)>;

  /// A store of MXNet's type name; an unknown name is an error that lists the types. A `dist_*`
  /// type joins the job that the configuration ($TROUPE_CONFIG, the DMLC_* / TROUPE_*
  /// environment) names, as a worker. In a process whose configuration names the role server or
  /// scheduler it is an error naming DMLC_ROLE and serve_if_node_role: a program calls
  /// troupe::serve_if_node_role(argc, argv) first in main (actors/dist_job.hpp), which serves in
  /// those processes and returns their exit code, so that one program runs every role.
  static result<std::unique_ptr<kvstore>> create(std::string_view type = "local");
  /// The same, with the cluster flags a program parsed (add_config_flags: --quorum,
  /// --max-staleness, --timeout, --config...) over the file and the environment, so that a
  /// program configures its worker without touching its environment. The local types ignore them.
  static result<std::unique_ptr<kvstore>> create(std::string_view type,
                                                 const config_overrides& cluster_flags);

  virtual ~kvstore() = default;

  /// The name the store was created with.
  virtual const std::string& type() const noexcept = 0;
  virtual int rank() const noexcept = 0;
  virtual int num_workers() const noexcept = 0;

  // Every batch call takes parallel lists: keys[i] goes with values[i]. A key may repeat, and
  // then its values form one list (MXNet's grouping of key-value pairs). `priority` is MXNet's,
  // higher first: a distributed store sends requests of higher priority ahead of those queued
  // before them for the same server (actors/logic/worker_core.hpp, "The send queue").

  /// Declares keys and their initial values; a key can be initialised once.
  virtual status init(std::span<const kv_key> keys, std::span<const ndarray> values) = 0;
  /// Pushes values; the values of one key are summed.
  virtual status push(std::span<const kv_key> keys, std::span<const ndarray> values,
                      int priority = 0) = 0;
  /// Copies each key's stored value into its outputs.
  virtual status pull(std::span<const kv_key> keys, std::span<ndarray> outputs,
                      int priority = 0) = 0;
  /// Non-blocking forms: they check the arguments, start the work and return at once; errors
  /// found later are reported by the request's wait(). The local modes finish before returning.
  /// Pushes and pulls of one key from one worker take effect in the order they were issued.
  virtual kv_request push_async(std::span<const kv_key> keys, std::span<const ndarray> values,
                                int priority = 0);
  virtual kv_request pull_async(std::span<const kv_key> keys, std::span<ndarray> outputs,
                                int priority = 0);
  virtual kv_request pushpull_async(std::span<const kv_key> keys, std::span<const ndarray> values,
                                    std::span<ndarray> outputs, int priority = 0);

  /// push then pull, with the same keys.
  virtual status pushpull(std::span<const kv_key> keys, std::span<const ndarray> values,
                          std::span<ndarray> outputs, int priority = 0);
  /// init then pull.
  virtual status broadcast(std::span<const kv_key> keys, std::span<const ndarray> values,
                           std::span<ndarray> outputs, int priority = 0);

  status init(const kv_key& key, const ndarray& value);
  status push(const kv_key& key, const ndarray& value, int priority = 0);
  status push(const kv_key& key, std::span<const ndarray> values, int priority = 0);
  status push(const kv_key& key, std::initializer_list<ndarray> values, int priority = 0);
  status pull(const kv_key& key, ndarray& output, int priority = 0);
  status pull(const kv_key& key, std::span<ndarray> outputs, int priority = 0);
  status pushpull(const kv_key& key, const ndarray& value, ndarray& output, int priority = 0);
  status pushpull(const kv_key& key, std::span<const ndarray> values, std::span<ndarray> outputs,
                  int priority = 0);
  status broadcast(const kv_key& key, const ndarray& value, ndarray& output, int priority = 0);
  status broadcast(const kv_key& key, const ndarray& value, std::span<ndarray> outputs,
                   int priority = 0);

  // row_sparse keys (MXNet's RowSparseNDArray values; engine/row_sparse.hpp). A key initialised
  // with a row_sparse value takes row_sparse pushes (only their rows are summed and, with an
  // optimizer, updated: lazy_update) and is read with row_sparse_pull; a dense push or pull of it
  // is an error naming row_sparse_pull. Every store type has them.

  /// Declares row_sparse keys with their initial values (every row a value does not hold is 0).
  virtual status init(std::span<const kv_key> keys, std::span<const row_sparse_array> values);
  /// Pushes row_sparse values; the values of one key are summed (the union of their rows).
  virtual status push(std::span<const kv_key> keys, std::span<const row_sparse_array> values,
                      int priority = 0);
  /// Fills outputs[i] with the rows row_ids[i] names of key keys[i]: ids of any shape and integer
  /// (or integer-valued float) type, sorted and de-duplicated as MXNet does; outputs[i] then
  /// holds exactly those rows, every other row zero. An empty row_ids gives no rows.
  virtual status row_sparse_pull(std::span<const kv_key> keys, std::span<row_sparse_array> outputs,
                                 std::span<const ndarray> row_ids, int priority = 0);
  status init(const kv_key& key, const row_sparse_array& value);
  status push(const kv_key& key, const row_sparse_array& value, int priority = 0);
  status row_sparse_pull(const kv_key& key, row_sparse_array& output, const ndarray& row_ids,
                         int priority = 0);

  /// Blocks until every worker of the job has called barrier() (a no-op in the local modes).
  /// Workers that left the job are not waited for.
  virtual status barrier() { return {}; }
  /// This worker leaves the job while the others go on (a dist store; closing or destroying the
  /// store does the same): it waits until every request it made is answered, then tells the
  /// scheduler. From the round after this worker's last push of a key on, that key's dist_sync
  /// rounds close with the workers still in, and barriers stop waiting for it, so a worker that
  /// ran out of data early never stalls the others. Afterwards every call on the store fails,
  /// naming the leave. An error says what did not go through (a request unanswered in time, a
  /// scheduler gone); the store has left all the same. The local stores have no job to leave:
  /// ok(), and they stay usable.
  virtual status leave() { return {}; }
  /// Most numbers gather_at_barrier shares per worker.
  static constexpr std::size_t max_gathered_values = 64;
  /// barrier() that also shares `mine` (at most max_gathered_values numbers: a worker's
  /// throughput, its loss) with every worker: entry r of the answer is worker r's values, empty
  /// for a worker lost within the quorum or one that shared none. troupe's own call (MXNet has
  /// none): it rides on the barrier's messages, so it costs no extra round trip. In the local
  /// modes: {mine}.
  virtual result<std::vector<std::vector<double>>> gather_at_barrier(std::span<const double> mine);
  /// The ranks of the workers the job counts now (alive, not left), ascending, as the latest
  /// membership table says; after a barrier every worker holds the same list, unless a worker
  /// was lost or left meanwhile. What a program that re-cuts its data per epoch divides by. In
  /// the local modes: {0}.
  virtual std::vector<int> worker_ranks() const { return {0}; }
  /// A worker that joined the running job at the workers' barrier (job.join_at_barrier): what
  /// the others shared at that barrier, as gather_at_barrier answers (entry r: worker r's
  /// values). nullopt for every other worker and store.
  virtual std::optional<std::vector<std::vector<double>>> gathered_at_join() const {
    return std::nullopt;
  }

  /// Pushes run this optimizer in the store from now on (MXNet's update_on_kvstore).
  virtual status set_optimizer(std::unique_ptr<optimizer> opt) = 0;
  status set_optimizer(std::string_view name, const optimizer_params& params = {});
  /// Pushes are compressed from now on (MXNet's set_gradient_compression): each pushed value
  /// of a float32 or float16 key is added to a residual the store keeps per key (and, in
  /// `device`, per position in the pushed list), and what crosses is 2 bits (2bit: +t, -t or 0)
  /// or 1 bit (1bit: +1 or -1) per element, the residual keeping the rest
  /// (engine/gradient_compression.hpp). A distributed store compresses each worker's summed push
  /// (and pushpull's push half, which MXNet refuses) and its servers sum what the pushes stand
  /// for; `device` compresses each pushed value and sums what they stand for. init, pulls and
  /// keys of other dtypes stay dense; "none" turns it off. `local` refuses it, as MXNet does:
  /// its values never cross a link. With rule.pulls (troupe's extension, `dist_*` stores only;
  /// `device` refuses it) the replies of pulls and pushpulls come back packed too where they
  /// hold a dist_sync round's sum that no optimizer on the servers updates: each server keeps
  /// per worker and key what its packed replies have not carried, so that the values a worker
  /// receives, summed over rounds, follow the true sums (docs/protocol.md, "Compressed pulls").
  virtual status set_gradient_compression(const gradient_compression& rule);
  /// The same from MXNet's parameters {"type": "2bit", "threshold": 0.5}, and troupe's "pulls".
  status set_gradient_compression(std::string_view type,
                                  std::optional<double> threshold = std::nullopt,
                                  bool pulls = false);
  /// Pushes run `update` in the store from now on (MXNet's _set_updater).
  virtual status set_updater(updater_function update) = 0;
  /// Pushes of row_sparse keys run `update` with their rows (an optimizer's lazy update) from
  /// now on, where set_updater's function would get their dense sum (MXNet's updater takes
  /// either kind of gradient). Stores that run no custom updater: errc::not_supported.
  virtual status set_row_updater(row_updater_function update);
  /// "optimizer": whether set_optimizer runs the optimizer in the store.
  virtual bool is_capable(std::string_view capability) const noexcept = 0;
  /// Whether the engine's lanes may run tasks that wait for this store's requests (the
  /// trainer's overlap, actors/gluon/trainer.hpp). A lane runs its tasks in order, so a task
  /// waiting there for a pull also holds every task queued behind it; that is safe only when
  /// nothing the pull needs can be among them. False for a distributed store while another
  /// distributed worker lives in the same process (an in-process job): the workers share the
  /// lanes, and one worker's pull could wait for a push of the other held behind it.
  virtual bool lanes_may_wait_for_requests() const noexcept { return true; }

  /// Writes the optimizer's per-key state (and, with dump_optimizer, the optimizer itself) to
  /// `path`; load restores it bit for bit. Both need set_optimizer first.
  virtual status save_optimizer_states(const std::string& path,
                                       bool dump_optimizer = false) const = 0;
  virtual status load_optimizer_states(const std::string& path) = 0;
};

} // namespace troupe
