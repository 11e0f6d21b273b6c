#pragma once
// trainer: gluon's Trainer (python/mxnet/gluon/trainer.py, MXNet 1.x) — applies an optimizer to a
// list of parameters, reducing their gradients through a KVStore across contexts and workers.
//
//   auto trainer = trainer::create(net->collect_params(), "sgd", {{"learning_rate", 0.1}},
//                                  "dist_sync").value();
//   for (...) {
//     { autograd::record_scope record; loss = ...; loss.backward(); }
//     trainer->step(batch_size).value();   // rescale 1/batch_size, reduce, update
//   }
//
// Where the optimizer runs (update_on_kvstore) follows MXNet:
//  - model.py::_create_kvstore: a store type that is not `dist*` with one context per parameter
//    gets no store at all (each context updates locally; update_on_kvstore is false, whatever the
//    caller asked); `local` with a parameter of more than 16M elements defaults to false;
//  - then actors/gluon/update_policy.hpp's table: dist_*async forces true (a caller's false is an
//    error), a caller's value replaces the default, a store that cannot run the optimizer falls
//    back to false (a caller's true is an error).
//
// The store is set up lazily at the first step (or allreduce_grads/update/save_states/
// load_states), as MXNet does: key i is parameter i; kv.init(i, data on the first context), then,
// with update_on_kvstore, the optimizer goes to the store (its rescale_grad already
// scale/batch_size of that first step), then every context pulls key i, so every worker and
// context starts from rank 0's values. A parameter whose arrays are still deferred (shape unknown
// until a forward) is set up at the first step that finds it created.
//
// step(batch_size): rescale_grad = scale / batch_size (scale: the rescale_grad the caller gave,
// default 1). With a store and update_on_kvstore, each parameter's gradients are pushed and the
// updated weights pulled into every context (one pushpull); without it, the gradients are
// pushpulled in place — summed over contexts and workers, not averaged — and one updater per
// context updates that context's weights. Without a store, each context's updater uses that
// context's own gradient. Parameters with grad_req null are skipped.
//
// Overlap (MXNet's engine-driven push). The keys are started last parameter first, the order in
// which backward writes their gradients, with the non-blocking calls (priority -i, as MXNet); each
// waits for its own gradient alone, so with an engine backend (engine/dispatch.hpp: backward then
// runs on the contexts' lanes while the caller goes on) a gradient is on the wire while backward
// computes the ones before it. step() then returns without waiting: a task queued on each
// context's lane in forward order waits for its key's request, so the next forward's use of a
// parameter waits for that parameter's pull alone, and the next backward's write of a gradient
// for the push that reads it. Reading a parameter (to_vector, wait_to_read) or engine::waitall()
// waits for its pull; a failed request is left on the arrays it writes (thrown by a read) and
// returned by the next step, allreduce_grads, save_states or load_states. The values are the
// same bit for bit: only when each request waits changes. Without a backend (the naive engine),
// or when the store says lanes must not wait for it (kvstore::lanes_may_wait_for_requests: two
// distributed workers in one process), step() waits for every request before it returns.
//
// Where the store runs the optimizer, `dist*` stores receive a copy (set_optimizer) that lives on
// the servers; `local`/`device` stores get set_updater with the trainer's own updater, so that
// learning-rate changes, a scheduler and a changed batch size reach it (MXNet's local store shares
// the Python optimizer object in the same way). Hence on dist + update_on_kvstore:
// set_learning_rate and set_lr_scheduler are errc::not_supported, and a step whose batch size
// differs from the first step's cannot change the servers' rescale_grad: MXNet raises a
// UserWarning there; troupe reports a warning through the warning handler (by default one line on
// stderr) when the batch size changes to a value the servers were not given, and carries on.
//
// Row-sparse parameters (engine/nn/parameter.hpp: stype, grad_stype) follow the other two branches
// of MXNet's _init_kvstore and the sparse branch of _allreduce_grads; their keys are row_sparse
// keys, reduced in turn (row_sparse calls have no non-blocking form):
//  - a row_sparse weight (nn::sparse_embedding) always gets a store, even on one context, and is
//    updated there (update_on_kvstore false: MXNet's error); the key starts from the weight's
//    rows, each forward pulls the rows it uses (parameter::row_sparse_data calls back into the
//    trainer: one trainer per such parameter), a step pushes the gradients' rows and pulls
//    nothing. A row_sparse_data pull before the first step sets up the keys but not the
//    optimizer, which the store gets at that step with its rescale_grad;
//  - a dense weight with a row_sparse gradient (nn::embedding with sparse_grad) on a dist_* store
//    is updated on the servers (false: MXNet's error): the rows are pushed and the whole weight is
//    pulled back, since the rows the other workers pushed are not known here; on one machine
//    update_on_kvstore defaults to false: the contexts' rows are summed in the store (a key of
//    zeros), the union of their rows is pulled back into each context's gradient, and each
//    context updates its copy with update_rows (lazy_update); with true the store updates it
//    (set_row_updater) and the whole weight comes back. `local`'s 16M rule does not apply.
//
// Parameters with lr_mult or wd_mult other than 1 are refused (errc::not_supported): troupe's
// optimizers take no per-weight multipliers yet.
//
// Not thread-safe: one trainer per worker thread. Every failure is a status naming the parameter,
// key or file; nothing throws across this interface.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "actors/kvstore/kvstore.hpp"
#include "engine/error.hpp"
#include "engine/lr_scheduler.hpp"
#include "engine/nn/parameter.hpp"
#include "engine/optimizer.hpp"

namespace troupe {

class trainer {
public:
  /// Receives each warning (one line, no newline).
  using warning_handler = std::function<void(const std::string& warning)>;

  /// A trainer whose store is made from MXNet's type name: "local", "device", "dist_sync",
  /// "dist_async", ... ("" or "none": no store; a non-dist type with one context per parameter:
  /// no store either, see the file comment). `update_on_kvstore`: nullopt is MXNet's None.
  /// Errors: no parameters, a null or repeated parameter, a parameter that was never
  /// initialize()d or lives on another number of contexts than the first one (the contexts may
  /// differ: a model-parallel network's stages, engine/nn/pipeline.hpp), lr_mult/wd_mult other
  /// than 1;
  /// the optimizer's (unknown name or parameter); the store's (unknown type, cannot connect); the
  /// update_on_kvstore table's.
  static result<std::unique_ptr<trainer>>
  create(nn::parameter_list parameters, std::string_view optimizer_name,
         const optimizer_params& hyper = {}, std::string_view kvstore_type = "device",
         std::optional<bool> update_on_kvstore = std::nullopt);
  /// A trainer on an existing store, which it shares (null: no store). The store is used even
  /// with a single context, as MXNet does with a KVStore object.
  static result<std::unique_ptr<trainer>> create(nn::parameter_list parameters,
                                                 std::string_view optimizer_name,
                                                 const optimizer_params& hyper,
                                                 std::shared_ptr<kvstore> store,
                                                 std::optional<bool> update_on_kvstore);
  /// As above with a store the caller owns (null: no store); it must outlive the trainer.
  static result<std::unique_ptr<trainer>> create(nn::parameter_list parameters,
                                                 std::string_view optimizer_name,
                                                 const optimizer_params& hyper, kvstore* store,
                                                 std::optional<bool> update_on_kvstore);

  trainer(const trainer&) = delete;
  trainer& operator=(const trainer&) = delete;
  ~trainer();

  /// One optimization step: rescale_grad = scale / batch_size, allreduce_grads, update. Errors:
  /// batch_size <= 0; the store's (naming the key); a parameter not created yet (deferred).
  /// `ignore_stale_grad` is taken for MXNet's signature: troupe's arrays do not record whether
  /// backward wrote them since the last step, so stale gradients are not detected and every
  /// parameter with a gradient is updated.
  status step(std::int64_t batch_size, bool ignore_stale_grad = false);
  /// Reduces the gradients only (pushpull in place over contexts and workers), for a caller that
  /// then calls update(); without a store there is nothing to reduce. With update_on_kvstore an
  /// error (errc::invalid_argument, MXNet's message): the store updates the weights.
  status allreduce_grads();
  /// Updates each context's weights from its gradients, rescaled by scale / batch_size, without
  /// reducing them first. With update_on_kvstore an error, as allreduce_grads.
  status update(std::int64_t batch_size, bool ignore_stale_grad = false);

  /// The current rate: the scheduler's for the current update count when one is set (MXNet's
  /// learning_rate property; calling it may advance a stateful scheduler as MXNet's does).
  double learning_rate() const;
  /// Sets the rate of every optimizer this trainer holds. Errors: dist + update_on_kvstore
  /// (errc::not_supported: the servers hold the optimizer); a scheduler is set
  /// (errc::invalid_argument, as MXNet's UserWarning).
  status set_learning_rate(double learning_rate);
  /// Before each local update of parameter i the rate becomes scheduler(num_update), num_update
  /// being the largest update count so far, this update included (MXNet's Optimizer._get_lr).
  /// Null removes it. dist + update_on_kvstore: errc::not_supported.
  status set_lr_scheduler(std::shared_ptr<lr_scheduler> scheduler);

  /// Writes the optimizer state (with the optimizer itself) to `path`: through the store's
  /// save_optimizer_states on dist + update_on_kvstore (`path` is then a name inside the servers'
  /// checkpoint directory, where they write their shards' files `path`.server<r>.shard<k> on
  /// their own file systems; worker rank 0 calls it, as only it may command the servers, and
  /// the others wait at a barrier), otherwise the trainer's updater (MXNet's
  /// updaters[0].get_states(dump_optimizer=True)). Before the first step it sets the store up
  /// first, as MXNet does, which on a dist store every worker must join. Errors name the file.
  status save_states(const std::string& path);
  /// Reads what save_states wrote; the loaded state (and optimizer) goes to every context's
  /// updater (on dist + update_on_kvstore: to the servers, from worker rank 0's call; every
  /// worker may call it, and on the others it loads nothing), so training continues bit for bit
  /// as if it had not stopped. Errors name the file.
  status load_states(const std::string& path);

  bool update_on_kvstore() const noexcept { return update_on_kvstore_; }
  /// The store, or null when there is none.
  kvstore* store() const noexcept { return store_; }
  const nn::parameter_list& parameters() const noexcept { return parameters_; }
  /// The optimizer of the first context (for dist + update_on_kvstore: the template sent to the
  /// servers).
  const troupe::optimizer& optimizer() const noexcept;
  /// Replaces the stderr default; null silences warnings.
  void set_warning_handler(warning_handler handler) { warn_ = std::move(handler); }

private:
  struct schedule; // the scheduler and update count the local updaters share (in the .cpp)

  trainer() = default;
  static result<std::unique_ptr<trainer>>
  make(nn::parameter_list parameters, std::string_view optimizer_name,
       const optimizer_params& hyper, std::shared_ptr<kvstore> owned, kvstore* store,
       bool store_from_type, std::string_view type, std::optional<bool> update_on_kvstore);

  /// MXNet's _check_and_rescale_grad.
  void set_rescale(double rescale);
  /// The `local` 16M rule, once every shape is known.
  void resolve_size_rule();
  /// Lazy store setup (MXNet's _init_kvstore and _init_params); without `with_optimizer` (a
  /// row_sparse_data pull before the first step) the keys only.
  status prepare_store(bool with_optimizer = true);
  /// The store keeps this parameter's weight (rather than only its gradients' sum).
  bool store_holds_weight(const nn::parameter& param) const noexcept;
  /// Pushes parameter `index`'s row_sparse gradients and pulls what MXNet pulls after them.
  status reduce_rows(std::size_t index);
  /// Every row of a dense weight the store updates, into each context's copy.
  status pull_whole_weight(std::size_t index);
  /// row_sparse_data of a row_sparse weight: rows `row_ids` into its copy `copy`.
  status pull_rows(nn::parameter& param, std::size_t copy, const ndarray& row_ids);
  status reduce(bool pull_weights);
  /// Waits for the requests the last reduce left under way and says how the first that failed
  /// ended; ok() when none did.
  status settle();
  status update_locally();
  /// Every optimizer the trainer holds (per-context and, for local stores, the store's).
  std::vector<troupe::optimizer*> local_optimizers();
  void warn(const std::string& message) const;
  bool distributed() const noexcept;

  nn::parameter_list parameters_;
  std::shared_ptr<kvstore> owned_store_;
  kvstore* store_ = nullptr;
  bool update_on_kvstore_ = false;
  std::optional<bool> user_update_on_kvstore_;
  bool size_rule_pending_ = false; ///< `local` by name, no user choice, shapes not all known
  double scale_ = 1.0;
  double last_rescale_ = 0.0;
  std::optional<double> store_rescale_; ///< rescale_grad the servers were given, when known
  std::vector<std::unique_ptr<updater>> updaters_; ///< one per context
  std::shared_ptr<updater> store_updater_;         ///< local store + update_on_kvstore
  std::shared_ptr<schedule> schedule_;
  bool store_ready_ = false;
  std::vector<bool> in_store_; ///< parameter i's key is initialised and pulled
  /// The last reduce's requests still writing parameters (with an engine backend only).
  std::vector<kv_request> in_flight_;
  warning_handler warn_;
  bool owns_row_pullers_ = false; ///< the row_sparse weights pull through this trainer
};

} // namespace troupe
