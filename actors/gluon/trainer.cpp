#include "actors/gluon/trainer.hpp"

#include <algorithm>
#include <cstdio>
#include <set>
#include <utility>

#include "actors/gluon/update_policy.hpp"
#include "engine/dispatch.hpp"
#include "engine/log.hpp"
#include "engine/serialize.hpp"

namespace troupe {

namespace {

/// MXNet's _create_kvstore: `local` keeps the optimizer on the workers when a parameter has more
/// than this many elements (the store's host-side update would be the bottleneck).
constexpr std::int64_t local_update_bound = 1024 * 1024 * 16;

bool shape_is_known(const shape_vector& shape) {
  return std::none_of(shape.begin(), shape.end(), [](std::int64_t extent) { return extent == 0; });
}

std::string context_list(const std::vector<context>& contexts) {
  std::string text = "[";
  for (std::size_t i = 0; i < contexts.size(); ++i)
    text += (i ? ", " : "") + contexts[i].to_string();
  return text + "]";
}

/// Pulled rows into a context's copy of a weight (the other rows left as they are).
status write_pulled_rows(const row_sparse_array& pulled, ndarray& copy) {
  if (copy.ctx().is_cpu())
    return pulled.write_rows_into(copy);
  return status_of([&]() -> status {
    ndarray whole = copy.copy_to(context::cpu());
    if (auto written = pulled.write_rows_into(whole); !written)
      return written;
    whole.copy_to(copy);
    return ok();
  });
}

error misuse(const std::string& call) {
  // MXNet's assertion text, so that users find the same advice.
  return {errc::invalid_argument,
          call + " when parameters are updated on kvstore is not supported. Try setting "
                 "`update_on_kvstore` to False when creating trainer."};
}

} // namespace

/// What the local updaters share, as MXNet's updaters share one Optimizer object: the scheduler
/// and num_update, the largest update count reached by any weight (Optimizer._update_count).
struct trainer::schedule {
  std::shared_ptr<lr_scheduler> scheduler;
  std::int64_t num_update = 0;

  /// One update of `weight` by `grad` with the rate the scheduler gives for this update.
  void run(updater& update, std::int64_t index, const ndarray& grad, ndarray& weight) {
    advance(update, index);
    update(index, grad, weight);
  }
  /// The same for a row_sparse gradient (the optimizer's lazy_update rule).
  void run_rows(updater& update, std::int64_t index, const row_sparse_array& grad,
                ndarray& weight) {
    advance(update, index);
    update.update_rows(index, grad, weight);
  }

private:
  void advance(updater& update, std::int64_t index) {
    num_update = std::max(num_update, update.update_count(index) + 1);
    if (scheduler)
      scheduler->apply(update.optimizer(), num_update);
  }
};

trainer::~trainer() {
  if (owns_row_pullers_)
    for (auto& param : parameters_)
      if (param->stype() == storage_type::row_sparse)
        param->set_row_puller(nullptr);
}

result<std::unique_ptr<trainer>> trainer::create(nn::parameter_list parameters,
                                                 std::string_view optimizer_name,
                                                 const optimizer_params& hyper,
                                                 std::string_view kvstore_type,
                                                 std::optional<bool> update_on_kvstore) {
  return make(std::move(parameters), optimizer_name, hyper, nullptr, nullptr, true, kvstore_type,
              update_on_kvstore);
}

result<std::unique_ptr<trainer>> trainer::create(nn::parameter_list parameters,
                                                 std::string_view optimizer_name,
                                                 const optimizer_params& hyper,
                                                 std::shared_ptr<kvstore> store,
                                                 std::optional<bool> update_on_kvstore) {
  kvstore* raw = store.get();
  return make(std::move(parameters), optimizer_name, hyper, std::move(store), raw, false, {},
              update_on_kvstore);
}

result<std::unique_ptr<trainer>> trainer::create(nn::parameter_list parameters,
                                                 std::string_view optimizer_name,
                                                 const optimizer_params& hyper, kvstore* store,
                                                 std::optional<bool> update_on_kvstore) {
  return make(std::move(parameters), optimizer_name, hyper, nullptr, store, false, {},
              update_on_kvstore);
}

result<std::unique_ptr<trainer>>
trainer::make(nn::parameter_list parameters, std::string_view optimizer_name,
              const optimizer_params& hyper, std::shared_ptr<kvstore> owned, kvstore* store,
              bool store_from_type, std::string_view type, std::optional<bool> update_on_kvstore) {
  // Trainer.__init__ and _check_contexts: every parameter initialised, each on as many contexts
  // (updater c updates copy c of every parameter; one key per parameter). MXNet wants one set of
  // contexts for all; troupe lets the sets differ, so that the stages of a model-parallel
  // network (engine/nn/pipeline.hpp) keep their parameters on their own contexts.
  if (parameters.empty())
    return error{errc::empty_list, "trainer: no parameters to train"};
  std::set<const nn::parameter*> seen;
  const std::vector<context>* contexts = nullptr;
  for (std::size_t i = 0; i < parameters.size(); ++i) {
    const auto* param = parameters[i].get();
    if (!param)
      return error{errc::invalid_argument, "trainer: parameter " + std::to_string(i) + " is null"};
    if (!seen.insert(param).second)
      return error{errc::invalid_argument,
                   "trainer: parameter " + param->name() + " is listed twice"};
    if (param->list_ctx().empty())
      return error{errc::invalid_argument,
                   "trainer: parameter " + param->name() +
                       " has not been initialized; call initialize() before creating the trainer"};
    if (!contexts)
      contexts = &param->list_ctx();
    else if (param->list_ctx().size() != contexts->size())
      return error{errc::context_mismatch,
                   "trainer: all parameters must be initialized on as many contexts, but "
                   "parameter " +
                       param->name() + " is initialized on " + context_list(param->list_ctx()) +
                       " while previous parameters are initialized on " + context_list(*contexts)};
    if (param->lr_mult != 1.0 || param->wd_mult != 1.0)
      return error{errc::not_supported,
                   "trainer: parameter " + param->name() + " has lr_mult " +
                       std::to_string(param->lr_mult) + " and wd_mult " +
                       std::to_string(param->wd_mult) +
                       "; per-parameter multipliers are not applied by troupe's optimizers yet"};
  }

  auto opt = optimizer::create(optimizer_name, hyper);
  if (!opt)
    return opt.error();

  std::unique_ptr<trainer> made{new trainer};
  made->parameters_ = std::move(parameters);
  made->user_update_on_kvstore_ = update_on_kvstore;
  made->scale_ = (*opt)->rescale_grad();
  made->last_rescale_ = made->scale_;
  made->schedule_ = std::make_shared<schedule>();
  made->in_store_.assign(made->parameters_.size(), false);
  made->warn_ = [log = logger{"trainer", 0}](const std::string& warning) { log.warning(warning); };
  for (std::size_t c = 0; c < contexts->size(); ++c)
    made->updaters_.push_back(std::make_unique<updater>((*opt)->clone()));

  // trainer.py::__init__: which branch of _init_kvstore applies.
  const nn::parameter* sparse_weight = nullptr;
  const nn::parameter* sparse_grad = nullptr;
  for (const auto& param : made->parameters_) {
    if (!sparse_weight && param->stype() == storage_type::row_sparse)
      sparse_weight = param.get();
    if (!sparse_grad && param->grad_stype() == storage_type::row_sparse)
      sparse_grad = param.get();
  }
  if (sparse_weight && sparse_weight->has_row_puller())
    return error{errc::invalid_argument,
                 "trainer: parameter " + sparse_weight->name() +
                     " has a row_sparse weight and already belongs to another trainer; more "
                     "than one trainer for a row_sparse parameter is not supported"};

  // model.py::_create_kvstore (and _create_sparse_kvstore, which always makes the store).
  std::optional<bool> choice = update_on_kvstore;
  if (store_from_type) {
    const bool dist = type.find("dist") != std::string_view::npos;
    if (!type.empty() && type != "none") {
      auto created = kvstore::create(type);
      if (!created)
        return created.error();
      // One context on one machine: nothing to reduce, so no store (made to check the name).
      if (dist || contexts->size() > 1 || sparse_weight)
        owned = std::move(*created);
    }
    store = owned.get();
    if (store && type == "local" && !choice && !sparse_grad) {
      bool all_known = true;
      std::int64_t largest = 0;
      for (const auto& param : made->parameters_) {
        all_known = all_known && shape_is_known(param->shape());
        largest = std::max(largest, element_count(param->shape()));
      }
      if (largest > local_update_bound)
        choice = false;
      else if (!all_known)
        made->size_rule_pending_ = true; // decided when the store is set up (MXNet's moment)
    }
  }
  made->owned_store_ = std::move(owned);
  made->store_ = store;
  if (sparse_weight) {
    // _init_kvstore's first branch: the weight lives in the store, which updates it.
    if (!store)
      return error{errc::invalid_argument,
                   "trainer: parameter " + sparse_weight->name() +
                       " has a row_sparse weight, which lives in a kvstore; create the trainer "
                       "with a kvstore type or store"};
    if (choice == false)
      return error{errc::invalid_argument,
                   "trainer: Cannot set update_on_kvstore=False when sparse weights are present "
                   "(parameter " +
                       sparse_weight->name() + ")."};
    if (!store->is_capable("optimizer"))
      return error{errc::invalid_argument,
                   "trainer: parameter " + sparse_weight->name() +
                       " has a row_sparse weight, updated on the kvstore, and kvstore '" +
                       store->type() + "' cannot run the optimizer"};
    made->update_on_kvstore_ = true;
  } else if (sparse_grad && store) {
    // The second branch: a dense weight with a row_sparse gradient. Across workers the rows
    // pushed by the others are unknown, so the store updates and the whole weight is pulled;
    // on one machine the gradients are reduced and each context updates its own weight.
    const bool dist = store->type().find("dist") != std::string::npos;
    if (choice == false && dist)
      return error{errc::invalid_argument,
                   "trainer: Cannot set update_on_kvstore=False on dist kvstore when sparse "
                   "gradients are present (parameter " +
                       sparse_grad->name() + ")."};
    made->update_on_kvstore_ = choice.value_or(dist);
    if (made->update_on_kvstore_ && !store->is_capable("optimizer"))
      return error{errc::invalid_argument,
                   "Please set update_on_kvstore=False when training with kvstore '" +
                       store->type() + "', which is not capable of running the optimizer."};
  } else if (store) {
    auto resolved =
        resolve_update_on_kvstore(store->type(), store->is_capable("optimizer"), choice);
    if (!resolved)
      return resolved.error();
    made->update_on_kvstore_ = *resolved;
  }
  // Parameter.row_sparse_data pulls through this trainer (gluon's param._set_trainer).
  for (auto& param : made->parameters_)
    if (param->stype() == storage_type::row_sparse)
      param->set_row_puller(
          [owner = made.get()](nn::parameter& target, std::size_t copy, const ndarray& ids) {
            return owner->pull_rows(target, copy, ids);
          });
  made->owns_row_pullers_ = true;
  return made;
}

bool trainer::distributed() const noexcept {
  return store_ && store_->type().find("dist") != std::string::npos;
}

const troupe::optimizer& trainer::optimizer() const noexcept {
  return store_updater_ ? store_updater_->optimizer() : updaters_.front()->optimizer();
}

std::vector<troupe::optimizer*> trainer::local_optimizers() {
  std::vector<troupe::optimizer*> all;
  for (auto& update : updaters_)
    all.push_back(&update->optimizer());
  if (store_updater_)
    all.push_back(&store_updater_->optimizer());
  return all;
}

void trainer::warn(const std::string& message) const {
  if (warn_)
    warn_(message);
}

void trainer::set_rescale(double rescale) {
  // MXNet's _check_and_rescale_grad: the servers keep the rescale_grad of the first step. MXNet
  // raises a UserWarning at every step that differs; troupe warns when the batch size changes to
  // one the servers were not given, so that a run of such steps gives one warning, not one each.
  if (update_on_kvstore_ && distributed() && store_ready_ && store_rescale_ &&
      rescale != *store_rescale_ && rescale != last_rescale_)
    warn("possible change in the batch_size from the previous step detected (rescale_grad " +
         std::to_string(rescale) + ", the servers' " + std::to_string(*store_rescale_) +
         "). The optimizer's gradient normalizing factor will not change with the new "
         "batch_size when update_on_kvstore=True and a distributed kvstore is used.");
  last_rescale_ = rescale;
  for (auto* opt : local_optimizers())
    opt->set_rescale_grad(rescale);
}

void trainer::resolve_size_rule() {
  if (!size_rule_pending_ || store_ready_)
    return;
  bool all_known = true;
  std::int64_t largest = 0;
  for (const auto& param : parameters_) {
    all_known = all_known && shape_is_known(param->shape());
    largest = std::max(largest, element_count(param->shape()));
  }
  if (largest > local_update_bound) {
    update_on_kvstore_ = false;
    size_rule_pending_ = false;
  } else if (all_known) {
    size_rule_pending_ = false;
  }
}

bool trainer::store_holds_weight(const nn::parameter& param) const noexcept {
  return param.stype() == storage_type::row_sparse || update_on_kvstore_;
}

status trainer::pull_whole_weight(std::size_t index) {
  auto& param = *parameters_[index];
  row_sparse_array pulled;
  if (auto done =
          store_->row_sparse_pull(kv_key{static_cast<std::int64_t>(index)}, pulled,
                                  all_row_ids(param.shape().front()), -static_cast<int>(index));
      !done)
    return done;
  for (auto& copy : param.list_data())
    if (auto written = write_pulled_rows(pulled, copy); !written)
      return written;
  return ok();
}

status trainer::reduce_rows(std::size_t index) {
  // trainer.py::_allreduce_grads, its branch for sparse gradients: push, then pull separately.
  auto& param = *parameters_[index];
  const kv_key key{static_cast<std::int64_t>(index)};
  const int priority = -static_cast<int>(index);
  auto grads = param.list_row_sparse_grad();
  std::vector<kv_key> keys(grads.size(), key);
  if (auto pushed = store_->push(keys, grads, priority); !pushed)
    return pushed;
  // A row_sparse weight is not pulled: the next forward pulls the rows it uses.
  if (param.stype() == storage_type::row_sparse)
    return ok();
  // The store updated a dense weight: the rows other workers pushed are unknown here, so the
  // whole weight comes back (MXNet's pull of it).
  if (update_on_kvstore_)
    return pull_whole_weight(index);
  // One machine, the gradients summed: the union of the contexts' rows comes back to each.
  std::vector<std::int64_t> rows;
  for (const auto& grad : grads)
    rows.insert(rows.end(), grad.indices().begin(), grad.indices().end());
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  ndarray ids({static_cast<std::int64_t>(rows.size())}, context::cpu(), dtype::int64);
  std::copy(rows.begin(), rows.end(), static_cast<std::int64_t*>(ids.raw_data()));
  row_sparse_array summed;
  if (auto pulled = store_->row_sparse_pull(key, summed, ids, priority); !pulled)
    return pulled;
  for (const auto& ctx : param.list_ctx())
    param.set_row_sparse_grad(ctx, summed);
  return ok();
}

status trainer::pull_rows(nn::parameter& param, std::size_t copy, const ndarray& row_ids) {
  // trainer.py::_row_sparse_pull: the store is set up first if it is not yet.
  if (auto ready = prepare_store(false); !ready)
    return ready;
  const auto found = std::find_if(parameters_.begin(), parameters_.end(),
                                  [&](const auto& listed) { return listed.get() == &param; });
  if (found == parameters_.end())
    return error{errc::invalid_argument,
                 "trainer: parameter " + param.name() + " is not one of this trainer's"};
  const auto index = static_cast<std::size_t>(found - parameters_.begin());
  row_sparse_array pulled;
  if (auto done = store_->row_sparse_pull(kv_key{static_cast<std::int64_t>(index)}, pulled, row_ids,
                                          -static_cast<int>(index));
      !done)
    return done;
  return write_pulled_rows(pulled, param.list_data().at(copy));
}

status trainer::prepare_store(bool with_optimizer) {
  resolve_size_rule();
  if (!store_) {
    store_ready_ = true;
    return ok();
  }
  return status_of([&]() -> status {
    // _init_params: parameters whose arrays exist now; deferred ones wait for a later step.
    // A parameter with a row_sparse gradient is a row_sparse key (its pushes are rows): it holds
    // the weight when the store updates it, else the sum of a step's gradients.
    std::vector<kv_key> keys;
    std::vector<ndarray> values;
    std::vector<kv_key> row_keys;
    std::vector<row_sparse_array> row_values;
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      auto& param = *parameters_[i];
      if (in_store_[i] || !param.is_initialized())
        continue;
      const kv_key key{static_cast<std::int64_t>(i)};
      if (param.grad_stype() != storage_type::row_sparse) {
        keys.push_back(key);
        values.push_back(param.list_data().front());
        continue;
      }
      row_keys.push_back(key);
      if (!store_holds_weight(param)) {
        row_values.push_back(row_sparse_array::zeros(param.shape()));
        continue;
      }
      const auto all = all_row_ids(param.shape().front());
      auto whole = row_sparse_array::from_dense_rows(
          param.list_data().front(), std::span{static_cast<const std::int64_t*>(all.raw_data()),
                                               static_cast<std::size_t>(all.size())});
      if (!whole)
        return whole.error();
      row_values.push_back(std::move(*whole));
    }
    if (!keys.empty())
      if (auto initialised = store_->init(keys, values); !initialised)
        return error{initialised.error().code(),
                     "trainer: kvstore init: " + initialised.error().message()};
    if (!row_keys.empty())
      if (auto initialised = store_->init(row_keys, row_values); !initialised)
        return error{initialised.error().code(),
                     "trainer: kvstore init: " + initialised.error().message()};

    // A row_sparse_data pull before the first step sets up the keys only: the optimizer goes to
    // the store at that step, with its rescale_grad.
    if (!store_ready_ && with_optimizer) {
      // The decision is final from here: the store now runs (or does not run) the optimizer.
      size_rule_pending_ = false;
      if (update_on_kvstore_) {
        if (distributed()) {
          // The servers get a copy; its rescale_grad is this (first) step's.
          auto copy = updaters_.front()->optimizer().clone();
          store_rescale_ = copy->rescale_grad();
          if (auto sent = store_->set_optimizer(std::move(copy)); !sent)
            return error{sent.error().code(),
                         "trainer: kvstore set_optimizer: " + sent.error().message()};
        } else {
          // The store runs the trainer's own updater, so that rate, scheduler and rescale
          // changes reach it. The function owns what it uses: the store may outlive the trainer.
          store_updater_ = std::make_shared<updater>(updaters_.front()->optimizer().clone());
          auto update = [update = store_updater_, plan = schedule_](
                            const kv_key& key, const ndarray& received, ndarray& stored) {
            plan->run(*update, std::get<std::int64_t>(key), received, stored);
          };
          if (auto set = store_->set_updater(std::move(update)); !set)
            return error{set.error().code(),
                         "trainer: kvstore set_updater: " + set.error().message()};
          const bool rows =
              std::any_of(parameters_.begin(), parameters_.end(), [](const auto& param) {
                return param->grad_stype() == storage_type::row_sparse;
              });
          if (rows) {
            auto update_rows = [update = store_updater_, plan = schedule_](
                                   const kv_key& key, const row_sparse_array& received,
                                   ndarray& stored) {
              plan->run_rows(*update, std::get<std::int64_t>(key), received, stored);
            };
            if (auto set = store_->set_row_updater(std::move(update_rows)); !set)
              return error{set.error().code(),
                           "trainer: kvstore set_row_updater: " + set.error().message()};
          }
        }
      }
      store_ready_ = true;
    }

    // Every context of every worker starts from the store's value (rank 0's on dist stores).
    std::vector<kv_request> pulls;
    for (const auto& key : keys) {
      const auto i = std::get<std::int64_t>(key);
      auto& data = parameters_[static_cast<std::size_t>(i)]->list_data();
      std::vector<kv_key> repeated(data.size(), key);
      pulls.push_back(store_->pull_async(repeated, data, -static_cast<int>(i)));
    }
    status outcome;
    for (auto& pull : pulls)
      if (auto done = pull.wait(); !done && outcome)
        outcome = done;
    if (!outcome)
      return outcome;
    // A dense weight the store updates starts from the store's value too; a row_sparse weight
    // is pulled by rows when a forward reads them.
    for (const auto& key : row_keys) {
      const auto i = static_cast<std::size_t>(std::get<std::int64_t>(key));
      if (parameters_[i]->stype() == storage_type::dense && update_on_kvstore_)
        if (auto pulled = pull_whole_weight(i); !pulled)
          return pulled;
    }
    for (const auto& key : keys)
      in_store_[static_cast<std::size_t>(std::get<std::int64_t>(key))] = true;
    for (const auto& key : row_keys)
      in_store_[static_cast<std::size_t>(std::get<std::int64_t>(key))] = true;
    return ok();
  });
}

status trainer::reduce(bool pull_weights) {
  // Backward writes the last layers' gradients first: walking the parameters backwards, each key
  // starts as soon as its own gradient is written (the store waits for that gradient alone,
  // kvstore::push_async), while backward is still computing the earlier ones on its lane. The
  // priority stays -i, as MXNet's: the first layers, which the next forward needs first, go
  // first wherever requests queue.
  std::vector<std::pair<std::size_t, kv_request>> started;
  status outcome = status_of([&]() -> status {
    for (std::size_t i = parameters_.size(); i-- > 0;) {
      auto& param = *parameters_[i];
      if (param.req() == grad_req::null)
        continue;
      if (param.grad_stype() == storage_type::row_sparse) {
        // Row-sparse keys have no non-blocking calls: they are reduced here, in turn.
        if (auto reduced = reduce_rows(i); !reduced)
          return reduced;
        continue;
      }
      auto& grads = param.list_grad();
      std::vector<kv_key> keys(grads.size(), kv_key{static_cast<std::int64_t>(i)});
      const int priority = -static_cast<int>(i);
      auto& outputs = pull_weights ? param.list_data() : grads;
      started.emplace_back(i, store_->pushpull_async(keys, grads, outputs, priority));
    }
    return ok();
  });
  if (!engine::has_backend() || !store_->lanes_may_wait_for_requests()) {
    // Nothing runs ahead of the caller, or the lanes must not wait for the store: every request
    // is waited for here. Even after a failure, the requests under way are waited for: they
    // write the parameters.
    for (auto& [i, request] : started)
      if (auto done = request.wait(); !done && outcome)
        outcome = done;
    return outcome;
  }
  // The caller goes on at once. Each output gets a task on its context's lane, queued in
  // forward order, that waits for its key's request: the next forward's use of a parameter
  // waits for that parameter's pull alone, and the next backward's write of a gradient for the
  // push that reads it. A failure is left on the outputs by the engine and reported by the next
  // step (settle).
  for (auto it = started.rbegin(); it != started.rend(); ++it) {
    auto& [i, request] = *it;
    if (request.ready()) {
      if (auto done = request.wait(); !done && outcome)
        outcome = done;
      continue;
    }
    in_flight_.push_back(request);
    auto& param = *parameters_[i];
    auto& grads = param.list_grad();
    auto& outputs = pull_weights ? param.list_data() : grads;
    for (std::size_t c = 0; c < outputs.size(); ++c) {
      const ndarray* read = pull_weights && c < grads.size() ? &grads[c] : nullptr;
      const ndarray* written = &outputs[c];
      engine::push("kvstore pushpull of parameter " + param.name(), outputs[c].ctx(),
                   std::span{&read, read ? 1u : 0u}, std::span{&written, 1}, [request = request] {
                     if (auto done = request.wait(); !done)
                       throw exception(done.error());
                   });
    }
  }
  return outcome;
}

status trainer::settle() {
  status outcome;
  for (auto& request : in_flight_)
    if (auto done = request.wait(); !done && outcome)
      outcome = error{done.error().code(),
                      "the previous step's reduction failed: " + done.error().message()};
  in_flight_.clear();
  return outcome;
}

status trainer::update_locally() {
  return status_of([&]() -> status {
    for (std::size_t i = 0; i < parameters_.size(); ++i) {
      auto& param = *parameters_[i];
      if (param.req() == grad_req::null)
        continue;
      auto& data = param.list_data();
      if (data.size() != updaters_.size())
        return error{errc::context_mismatch, "trainer: parameter " + param.name() +
                                                 " now lives on " + context_list(param.list_ctx()) +
                                                 " but the trainer was created for " +
                                                 std::to_string(updaters_.size()) + " contexts"};
      if (param.grad_stype() == storage_type::row_sparse) {
        auto grads = param.list_row_sparse_grad();
        for (std::size_t c = 0; c < data.size(); ++c)
          schedule_->run_rows(*updaters_[c], static_cast<std::int64_t>(i), grads[c], data[c]);
        continue;
      }
      auto& grads = param.list_grad();
      for (std::size_t c = 0; c < data.size(); ++c)
        schedule_->run(*updaters_[c], static_cast<std::int64_t>(i), grads[c], data[c]);
    }
    return ok();
  });
}

status trainer::step(std::int64_t batch_size, bool /*ignore_stale_grad: see the header*/) {
  if (batch_size <= 0)
    return error{errc::invalid_argument,
                 "trainer: step with batch_size " + std::to_string(batch_size) + " (must be > 0)"};
  if (auto settled = settle(); !settled)
    return settled;
  set_rescale(scale_ / static_cast<double>(batch_size));
  if (auto ready = prepare_store(); !ready)
    return ready;
  if (store_)
    if (auto reduced = reduce(update_on_kvstore_); !reduced)
      return reduced;
  if (update_on_kvstore_)
    return ok();
  return update_locally();
}

status trainer::allreduce_grads() {
  resolve_size_rule();
  if (update_on_kvstore_)
    return misuse("allreduce_grads()");
  if (auto settled = settle(); !settled)
    return settled;
  if (auto ready = prepare_store(); !ready)
    return ready;
  return store_ ? reduce(false) : ok();
}

status trainer::update(std::int64_t batch_size, bool /*ignore_stale_grad*/) {
  if (batch_size <= 0)
    return error{errc::invalid_argument, "trainer: update with batch_size " +
                                             std::to_string(batch_size) + " (must be > 0)"};
  resolve_size_rule();
  if (update_on_kvstore_)
    return misuse("update()");
  if (auto ready = prepare_store(); !ready)
    return ready;
  set_rescale(scale_ / static_cast<double>(batch_size));
  return update_locally();
}

double trainer::learning_rate() const {
  if (schedule_->scheduler)
    return (*schedule_->scheduler)(schedule_->num_update);
  return optimizer().learning_rate();
}

status trainer::set_learning_rate(double learning_rate) {
  if (update_on_kvstore_ && distributed())
    return error{
        errc::not_supported,
        "trainer: set_learning_rate on kvstore '" + store_->type() +
            "' with update_on_kvstore: the servers hold the optimizer and keep the rate "
            "they were given; create the trainer with update_on_kvstore=false to change it"};
  if (schedule_->scheduler)
    return error{errc::invalid_argument,
                 "trainer: set_learning_rate with an lr_scheduler set; the rate can be changed "
                 "only when no scheduler is defined (remove it with set_lr_scheduler(nullptr))"};
  for (auto* opt : local_optimizers())
    opt->set_learning_rate(learning_rate);
  return ok();
}

status trainer::set_lr_scheduler(std::shared_ptr<lr_scheduler> scheduler) {
  if (update_on_kvstore_ && distributed())
    return error{errc::not_supported,
                 "trainer: set_lr_scheduler on kvstore '" + store_->type() +
                     "' with update_on_kvstore: the servers hold the optimizer and cannot run a "
                     "scheduler; create the trainer with update_on_kvstore=false to use one"};
  schedule_->scheduler = std::move(scheduler);
  return ok();
}

status trainer::save_states(const std::string& path) {
  if (auto settled = settle(); !settled)
    return settled;
  if (auto ready = prepare_store(); !ready)
    return ready;
  if (update_on_kvstore_ && distributed()) {
    if (auto saved = store_->save_optimizer_states(path, true); !saved)
      return error{saved.error().code(),
                   "trainer: save_states to " + path + ": " + saved.error().message()};
    return ok();
  }
  const updater& source = store_updater_ ? *store_updater_ : *updaters_.front();
  return write_file(path, source.save_states(true));
}

status trainer::load_states(const std::string& path) {
  if (auto settled = settle(); !settled)
    return settled;
  if (auto ready = prepare_store(); !ready)
    return ready;
  if (update_on_kvstore_ && distributed()) {
    // Worker rank 0's call loads the servers, the only rank that may send them commands; on the
    // others there is nothing to load.
    if (store_->rank() == 0)
      if (auto loaded = store_->load_optimizer_states(path); !loaded)
        return error{loaded.error().code(),
                     "trainer: load_states from " + path + ": " + loaded.error().message()};
    // The servers now hold the saved optimizer, whose rescale_grad this trainer does not know.
    store_rescale_.reset();
    return ok();
  }
  auto bytes = read_file(path);
  if (!bytes)
    return bytes.error();
  // Every updater gets the same state (MXNet: for updater in self._updaters: set_states); a
  // rejected file leaves the first one as it was, and so all of them.
  std::vector<updater*> targets;
  for (auto& update : updaters_)
    targets.push_back(update.get());
  if (store_updater_)
    targets.push_back(store_updater_.get());
  for (auto* target : targets)
    if (auto loaded = target->load_states(*bytes); !loaded)
      return error{loaded.error().code(),
                   "trainer: load_states from " + path + ": " + loaded.error().message()};
  // num_update comes back with the counts (MXNet unpickles it with the optimizer).
  const updater& counted = store_updater_ ? *store_updater_ : *updaters_.front();
  schedule_->num_update = 0;
  for (std::size_t i = 0; i < parameters_.size(); ++i)
    schedule_->num_update =
        std::max(schedule_->num_update, counted.update_count(static_cast<std::int64_t>(i)));
  return ok();
}

} // namespace troupe
