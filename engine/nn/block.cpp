#include "engine/nn/block.hpp"

#include <algorithm>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <utility>

#include "engine/autograd.hpp"
#include "engine/autograd_state.hpp"
#include "engine/nd.hpp"
#include "engine/nn/initializer.hpp"
#include "engine/serialize.hpp"
#include "engine/symbol.hpp"
#include "engine/trace.hpp"

namespace troupe::nn {

namespace {

/// gluon's NameManager: one counter per kind, shared by every thread.
std::string next_prefix(std::string_view alias) {
  static std::mutex mutex;
  static std::map<std::string, std::size_t, std::less<>> counters;
  std::lock_guard lock{mutex};
  auto slot = counters.find(alias);
  if (slot == counters.end())
    slot = counters.emplace(std::string{alias}, 0).first;
  return std::string{alias} + std::to_string(slot->second++) + "_";
}

/// The trace in progress on this thread, if any. While it runs, blocks compute imperatively
/// (a hybridized child inside a hybridized parent is part of the parent's graph) and parameters
/// read through block::param_data become variables.
struct active_trace {
  trace_scope* scope;
  std::vector<const parameter*> marked;
};
thread_local active_trace* current_trace = nullptr;

class trace_guard {
public:
  explicit trace_guard(active_trace& trace) { current_trace = &trace; }
  ~trace_guard() { current_trace = nullptr; }
  trace_guard(const trace_guard&) = delete;
  trace_guard& operator=(const trace_guard&) = delete;
};

constexpr std::string_view parameters_magic = "troupe-parameters";
constexpr std::uint64_t parameters_version = 1;
constexpr std::string_view data_name = "data";

void require_window(std::string_view what, const std::string& prefix,
                    std::array<std::int64_t, 2> values, std::int64_t minimum) {
  if (values[0] < minimum || values[1] < minimum)
    throw exception(errc::invalid_argument,
                    prefix + ": " + std::string{what} + " (" + std::to_string(values[0]) + ", " +
                        std::to_string(values[1]) + ") must be >= " + std::to_string(minimum));
}

void require_activation(const std::string& act_type, const std::string& prefix) {
  if (act_type != "relu" && act_type != "sigmoid" && act_type != "tanh" && act_type != "softrelu")
    throw exception(errc::invalid_argument, prefix + ": unknown activation '" + act_type +
                                                "' (known: relu, sigmoid, tanh, softrelu)");
}

} // namespace

// ---------------------------------------------------------------------------------------------
// The cache of a hybridized block.

/// One bound executor. An executor keeps the state of its last forward for backward, so a slot
/// whose recorded forward may still be differentiated (its backward closure is alive) is busy
/// and a new call binds another slot: recording two calls of one block before backward stays
/// correct.
struct block::executor_slot {
  executor exec;
  bool data_grad;             // whether the executor computes the input's gradient
  ndarray own_data_grad;      // the executor's own array for it, when autograd hands none over
  std::vector<ndarray> grads; // per graph parameter: its gradient array, none when req null
  std::weak_ptr<void> busy;
};

/// The graph traced for one input shape, context and training mode.
struct block::cached_graph {
  shape_vector shape;
  context ctx;
  bool training;
  symbol graph;
  /// The graph's parameter variables, in list_arguments() order.
  std::vector<std::shared_ptr<parameter>> params;
  std::vector<std::shared_ptr<executor_slot>> slots;

  std::shared_ptr<executor_slot> bind_slot(bool data_grad) {
    std::map<std::string, ndarray> arguments;
    std::map<std::string, ndarray> gradients;
    std::map<std::string, grad_req> reqs;
    arguments.emplace(std::string{data_name}, ndarray::empty(shape, ctx));
    ndarray own_data_grad;
    if (data_grad) {
      own_data_grad = ndarray::zeros(shape, ctx);
      gradients.emplace(std::string{data_name}, own_data_grad);
      reqs.emplace(std::string{data_name}, grad_req::write);
    }
    std::vector<ndarray> grads;
    for (auto& param : params) {
      // The parameter's own array: updates made in place are what the executor computes with.
      arguments.emplace(param->name(), param->data(ctx));
      if (param->req() == grad_req::null) {
        grads.emplace_back();
        continue;
      }
      // The executor always overwrites its gradient arrays: at each backward autograd hands it
      // the array to write (the parameter's gradient, or a buffer it then adds); this one
      // serves when autograd hands over none.
      ndarray grad = ndarray::zeros(param->shape(), ctx);
      gradients.emplace(param->name(), grad);
      reqs.emplace(param->name(), grad_req::write);
      grads.push_back(std::move(grad));
    }
    auto bound = graph.bind(ctx, std::move(arguments), std::move(gradients), std::move(reqs));
    if (!bound)
      throw exception(bound.error());
    auto slot = std::make_shared<executor_slot>(executor_slot{
        std::move(bound).value(), data_grad, std::move(own_data_grad), std::move(grads), {}});
    slots.push_back(slot);
    return slot;
  }
};

// ---------------------------------------------------------------------------------------------
// block.

block::block(std::string_view alias, std::string prefix)
    : prefix_(prefix.empty() ? next_prefix(alias) : std::move(prefix)) {}

block::~block() = default;

std::string block::name() const {
  if (!prefix_.empty() && prefix_.back() == '_')
    return prefix_.substr(0, prefix_.size() - 1);
  return prefix_;
}

std::shared_ptr<block> block::register_child(std::shared_ptr<block> child) {
  if (!child)
    throw exception(errc::invalid_argument, prefix_ + ": register_child of a null block");
  if (child.get() == this)
    throw exception(errc::invalid_argument, prefix_ + ": a block cannot be its own child");
  children_.push_back(child);
  drop_cached_graphs();
  return child;
}

std::shared_ptr<parameter> block::register_param(const std::string& name, shape_vector shape,
                                                 grad_req req,
                                                 std::shared_ptr<const initializer> init,
                                                 storage_type stype, storage_type grad_stype) {
  auto param = std::make_shared<parameter>(prefix_ + name, std::move(shape), req, std::move(init),
                                           stype, grad_stype);
  params_.push_back(param);
  return param;
}

parameter_list block::collect_params() const {
  parameter_list collected;
  std::map<std::string, const parameter*, std::less<>> by_name;
  std::set<const block*> visited;
  std::function<void(const block&)> visit = [&](const block& current) {
    if (!visited.insert(&current).second)
      return;
    for (auto& param : current.params_) {
      auto [slot, inserted] = by_name.emplace(param->name(), param.get());
      if (inserted)
        collected.push_back(param);
      else if (slot->second != param.get())
        throw exception(errc::invalid_argument, prefix_ + ": two different parameters are named " +
                                                    param->name() +
                                                    " (give the blocks distinct prefixes)");
    }
    for (auto& child : current.children_)
      visit(*child);
  };
  visit(*this);
  return collected;
}

void block::initialize(std::shared_ptr<const initializer> init, std::span<const context> contexts,
                       std::uint64_t seed, bool force_reinit) {
  auto params = collect_params();
  if (!force_reinit)
    for (auto& param : params)
      if (!param->list_ctx().empty())
        throw exception(errc::already_initialized,
                        "parameter " + param->name() + " of block " + prefix_ +
                            " is already initialized (pass force_reinit to initialize again)");
  if (!init)
    init = std::make_shared<uniform>();
  for (auto& param : params)
    param->initialize(init, contexts, seed, force_reinit);
  drop_cached_graphs();
}

void block::hybridize(bool active) {
  const auto params = collect_params();
  const bool rows = std::any_of(params.begin(), params.end(), [](const auto& param) {
    return param->grad_stype() == storage_type::row_sparse;
  });
  active_ = active && !rows;
  cache_.clear();
  for (auto& child : children_)
    child->hybridize(active);
}

void block::drop_cached_graphs() {
  cache_.clear();
  for (auto& child : children_)
    child->drop_cached_graphs();
}

ndarray& block::param_data(parameter& param, context ctx) {
  ndarray& array = param.data(ctx);
  if (current_trace != nullptr &&
      std::find(current_trace->marked.begin(), current_trace->marked.end(), &param) ==
          current_trace->marked.end()) {
    current_trace->scope->mark_variable(array, param.name());
    current_trace->marked.push_back(&param);
  }
  return array;
}

void block::finish_shapes(std::string_view op_name, const op_attrs& attrs, const ndarray& x,
                          std::span<parameter* const> params) {
  bool complete = std::all_of(params.begin(), params.end(), [](const parameter* param) {
    return std::find(param->shape().begin(), param->shape().end(), 0) == param->shape().end();
  });
  if (complete)
    return;
  const op_def& op = find_op(op_name);
  if (op.fill_input_shapes == nullptr)
    throw exception(errc::internal, "operator " + op.name + " cannot infer its parameters' shapes");
  std::vector<shape_vector> shapes;
  shapes.push_back(x.shape());
  for (auto* param : params) {
    bool known = std::find(param->shape().begin(), param->shape().end(), 0) == param->shape().end();
    shapes.push_back(known ? param->shape() : shape_vector{});
  }
  op.fill_input_shapes(attrs, shapes);
  for (std::size_t i = 0; i < params.size(); ++i)
    params[i]->finish_shape(shapes[i + 1]);
}

ndarray block::forward(const ndarray& x) {
  if (!active_ || current_trace != nullptr)
    return hybrid_forward(x);
  return cached_forward(x);
}

ndarray block::trace(const ndarray& x, bool training) {
  trace_scope scope;
  active_trace state{&scope, {}};
  trace_guard guard{state};

  ndarray input = x;
  scope.mark_variable(input, std::string{data_name});
  // Parameters already created are variables from the start, so that a block reading them
  // without param_data is traced too; deferred ones become variables when first read.
  for (auto& param : collect_params()) {
    auto& contexts = param->list_ctx();
    if (param->is_initialized() &&
        std::find(contexts.begin(), contexts.end(), x.ctx()) != contexts.end())
      param_data(*param, x.ctx());
  }
  ndarray output = hybrid_forward(input);
  symbol graph = scope.to_symbol({&output, 1});

  auto cached = std::make_shared<cached_graph>();
  cached->shape = x.shape();
  cached->ctx = x.ctx();
  cached->training = training;
  std::map<std::string, std::shared_ptr<parameter>, std::less<>> by_name;
  for (auto& param : collect_params())
    by_name.emplace(param->name(), param);
  for (auto& argument : graph.list_arguments()) {
    if (argument == data_name)
      continue;
    auto param = by_name.find(argument);
    if (param == by_name.end())
      throw exception(errc::internal, prefix_ + ": the traced graph has a variable " + argument +
                                          " that is not a parameter of the block");
    cached->params.push_back(param->second);
  }
  cached->graph = std::move(graph);
  cache_.push_back(std::move(cached));
  ++trace_count_;
  return output;
}

ndarray block::cached_forward(const ndarray& x) {
  bool training = autograd::is_training();
  bool recording = autograd::is_recording();
  // An executor differentiates only a forward(is_train = true), which would also make Dropout
  // drop: recording in predict mode (record_scope(false)) runs imperatively instead.
  if (recording && !training)
    return hybrid_forward(x);
  auto found = std::find_if(cache_.begin(), cache_.end(), [&](const auto& cached) {
    return cached->shape == x.shape() && cached->ctx == x.ctx() && cached->training == training;
  });
  // The first call for a shape is the imperative run that traces: its result is the imperative
  // one, recorded by autograd op by op, and Dropout drew its seeds exactly once.
  if (found == cache_.end())
    return trace(x, training);
  auto cached = *found;

  // The input's gradient is computed only when something upstream may want it.
  bool data_grad = recording && detail::carries_gradient(x);
  std::shared_ptr<executor_slot> slot;
  for (auto& candidate : cached->slots)
    if (candidate->data_grad == data_grad && candidate->busy.expired()) {
      slot = candidate;
      break;
    }
  if (!slot)
    slot = cached->bind_slot(data_grad);

  // The executor reads the caller's array itself (a handle of the bound shape): no copy in.
  slot->exec.arg(data_name) = x.detach();
  slot->exec.forward(training);
  ndarray output = slot->exec.outputs().front().copy();
  if (!recording)
    return output;

  std::vector<ndarray> inputs;
  inputs.reserve(cached->params.size() + 1);
  inputs.push_back(x);
  for (auto& param : cached->params)
    inputs.push_back(param->data(cached->ctx));
  // The token lives in the backward closure: the slot stays busy while the recorded graph that
  // may call it is alive.
  auto token = std::make_shared<char>(0);
  slot->busy = token;
  autograd::record_custom(
      inputs, {&output, 1},
      [slot, token, cached](std::span<const ndarray> output_grads, std::span<ndarray> grads) {
        // The executor writes straight into the arrays autograd hands over (a parameter's
        // attached gradient for its first contribution): no gradient is copied afterwards.
        if (slot->data_grad)
          slot->exec.grad(data_name) = grads[0].is_none() ? slot->own_data_grad : grads[0];
        for (std::size_t i = 0; i < slot->grads.size(); ++i)
          if (!slot->grads[i].is_none())
            slot->exec.grad(cached->params[i]->name()) =
                grads[i + 1].is_none() ? slot->grads[i] : grads[i + 1];
        slot->exec.backward(output_grads);
      });
  return output;
}

// ---------------------------------------------------------------------------------------------
// Parameter files.

status block::save_parameters(const std::string& path) const {
  auto params = collect_params();
  byte_writer out;
  out.string(parameters_magic);
  out.u64(parameters_version);
  out.u64(params.size());
  for (auto& param : params) {
    if (!param->is_initialized())
      return error{errc::invalid_argument, "cannot save parameters of " + prefix_ + " to " + path +
                                               ": parameter " + param->name() +
                                               " is not initialized"};
    if (param->stype() == storage_type::row_sparse && param->has_row_puller()) {
      // The worker's copy of a row_sparse weight is current only in the rows pulled last; the
      // file gets the store's value (MXNet's Parameter._reduce pulls every row too).
      auto pulled = status_of([&]() -> status {
        param->row_sparse_data(all_row_ids(param->shape().front()), param->list_ctx().front());
        return ok();
      });
      if (!pulled)
        return error{pulled.error().code(), "cannot save parameters of " + prefix_ + " to " + path +
                                                ": " + pulled.error().message()};
    }
    out.string(param->name());
    out.array(param->list_data().front().as_type(dtype::float32));
  }
  return write_file(path, out.bytes());
}

status block::load_parameters(const std::string& path, std::span<const context> contexts) {
  auto fail = [&](errc code, const std::string& message) {
    return error{code, "parameter file " + path + ": " + message};
  };
  auto bytes = read_file(path);
  if (!bytes)
    return bytes.error();
  byte_reader in{*bytes};
  auto magic = in.string("header");
  if (!magic)
    return fail(magic.error().code(), magic.error().message());
  if (*magic != parameters_magic)
    return fail(errc::corrupt_data,
                "not a troupe parameter file (header '" + magic->substr(0, 40) + "')");
  auto version = in.u64("format version");
  if (!version)
    return fail(version.error().code(), version.error().message());
  if (*version != parameters_version)
    return fail(errc::corrupt_data, "format version " + std::to_string(*version) +
                                        " is not supported (this is " +
                                        std::to_string(parameters_version) + ")");
  auto count = in.u64("parameter count");
  if (!count)
    return fail(count.error().code(), count.error().message());
  std::map<std::string, ndarray, std::less<>> values;
  for (std::uint64_t i = 0; i < *count; ++i) {
    auto name = in.string("parameter name");
    if (!name)
      return fail(name.error().code(), name.error().message());
    auto value = in.array("values of parameter " + *name);
    if (!value)
      return fail(value.error().code(), value.error().message());
    if (value->dtype() != dtype::float32)
      return fail(errc::corrupt_data, "parameter " + *name + " is stored as " +
                                          std::string{to_string(value->dtype())} + ", not float32");
    if (!values.emplace(*name, std::move(*value)).second)
      return fail(errc::corrupt_data, "parameter " + *name + " is stored twice");
  }
  if (in.remaining() != 0)
    return fail(errc::corrupt_data,
                std::to_string(in.remaining()) + " bytes after the last parameter");

  // Everything is checked before anything is changed.
  auto params = collect_params();
  std::set<std::string, std::less<>> expected;
  for (auto& param : params) {
    expected.insert(param->name());
    auto value = values.find(param->name());
    if (value == values.end())
      return fail(errc::invalid_argument, "parameter " + param->name() + " of block " + prefix_ +
                                              " is missing from the file");
    const auto& declared = param->shape();
    const auto& stored = value->second.shape();
    bool fits = declared.size() == stored.size();
    for (std::size_t axis = 0; fits && axis < stored.size(); ++axis)
      fits = stored[axis] > 0 && (declared[axis] == 0 || declared[axis] == stored[axis]);
    if (!fits)
      return fail(errc::shape_mismatch, "parameter " + param->name() + " has shape " +
                                            shape_to_string(stored) + " in the file, but " +
                                            prefix_ + " declares " + shape_to_string(declared));
  }
  for (auto& param : params)
    if (param->stype() == storage_type::row_sparse && param->has_row_puller())
      return fail(errc::invalid_argument,
                  "parameter " + param->name() +
                      " is a row_sparse weight whose values live in its trainer's kvstore; load "
                      "the parameters before creating the trainer");
  for (auto& [name, value] : values)
    if (!expected.contains(name))
      return fail(errc::invalid_argument, "the file holds parameter " + name + ", which block " +
                                              prefix_ + " does not have");
  for (std::size_t i = 0; i < contexts.size(); ++i) {
    if (contexts[i].is_gpu() && contexts[i].id >= num_gpus())
      return fail(errc::device_unavailable, "cannot load parameters onto " +
                                                contexts[i].to_string() + ": " +
                                                std::to_string(num_gpus()) + " GPU(s) present");
    for (std::size_t j = 0; j < i; ++j)
      if (contexts[i] == contexts[j])
        return fail(errc::invalid_argument, contexts[i].to_string() + " is listed twice");
  }

  auto placeholder = std::make_shared<zero>();
  for (auto& param : params) {
    const ndarray& value = values.find(param->name())->second;
    std::vector<context> target(contexts.begin(), contexts.end());
    if (target.empty())
      target = param->list_ctx().empty() ? std::vector<context>{context::cpu()} : param->list_ctx();
    if (param->list_ctx() != target)
      param->initialize(placeholder, target, 0, true);
    param->finish_shape(value.shape());
    param->set_data(value);
  }
  drop_cached_graphs();
  return ok();
}

// ---------------------------------------------------------------------------------------------
// Layers.

dense::dense(std::int64_t units, std::string activation, bool use_bias, std::int64_t in_units,
             bool flatten, std::shared_ptr<const initializer> weight_init, std::string prefix)
    : block("dense", std::move(prefix)), units_(units), activation_(std::move(activation)),
      flatten_(flatten) {
  if (units <= 0 || in_units < 0)
    throw exception(errc::invalid_argument,
                    this->prefix() + ": units must be > 0 and in_units >= 0, got units " +
                        std::to_string(units) + ", in_units " + std::to_string(in_units));
  if (!activation_.empty())
    require_activation(activation_, this->prefix());
  weight_ = register_param("weight", {units, in_units}, grad_req::write, std::move(weight_init));
  if (use_bias)
    bias_ = register_param("bias", {units}, grad_req::write, std::make_shared<zero>());
}

ndarray dense::hybrid_forward(const ndarray& x) {
  op_attrs attrs = fully_connected_attrs(units_, flatten_);
  attrs.no_bias = bias_ == nullptr;
  std::vector<parameter*> params{weight_.get()};
  if (bias_)
    params.push_back(bias_.get());
  finish_shapes("FullyConnected", attrs, x, params);
  auto ctx = x.ctx();
  ndarray y = nd::fully_connected(x, param_data(*weight_, ctx),
                                  bias_ ? param_data(*bias_, ctx) : ndarray{}, units_, flatten_);
  return activation_.empty() ? y : nd::activation(y, activation_);
}

embedding::embedding(std::int64_t input_dim, std::int64_t output_dim, bool sparse_grad,
                     std::shared_ptr<const initializer> weight_init, std::string prefix)
    : embedding("embedding", input_dim, output_dim, storage_type::dense,
                sparse_grad ? storage_type::row_sparse : storage_type::dense,
                std::move(weight_init), std::move(prefix)) {}

embedding::embedding(std::string_view alias, std::int64_t input_dim, std::int64_t output_dim,
                     storage_type stype, storage_type grad_stype,
                     std::shared_ptr<const initializer> weight_init, std::string prefix)
    : block(alias, std::move(prefix)), input_dim_(input_dim), output_dim_(output_dim) {
  if (input_dim <= 0 || output_dim <= 0)
    throw exception(errc::invalid_argument,
                    this->prefix() + ": input_dim and output_dim must be > 0, got " +
                        std::to_string(input_dim) + " and " + std::to_string(output_dim));
  weight_ = register_param("weight", {input_dim, output_dim}, grad_req::write,
                           std::move(weight_init), stype, grad_stype);
}

ndarray embedding::hybrid_forward(const ndarray& x) {
  auto ctx = x.ctx();
  const bool sparse_grad = weight_->grad_stype() == storage_type::row_sparse;
  // A row_sparse weight's copy holds the rows this batch uses once they are pulled.
  ndarray& weight = weight_->stype() == storage_type::row_sparse ? weight_->row_sparse_data(x, ctx)
                                                                 : param_data(*weight_, ctx);
  return nd::embedding(x, weight, input_dim_, output_dim_, sparse_grad);
}

sparse_embedding::sparse_embedding(std::int64_t input_dim, std::int64_t output_dim,
                                   std::shared_ptr<const initializer> weight_init,
                                   std::string prefix)
    : embedding("sparseembedding", input_dim, output_dim, storage_type::row_sparse,
                storage_type::row_sparse, std::move(weight_init), std::move(prefix)) {}

activation::activation(std::string act_type, std::string prefix)
    : block(act_type, std::move(prefix)), act_type_(std::move(act_type)) {
  require_activation(act_type_, this->prefix());
}

ndarray activation::hybrid_forward(const ndarray& x) {
  return nd::activation(x, act_type_);
}

conv2d::conv2d(std::int64_t channels, std::array<std::int64_t, 2> kernel_size,
               std::array<std::int64_t, 2> strides, std::array<std::int64_t, 2> padding,
               std::string activation, bool use_bias, std::int64_t in_channels,
               std::shared_ptr<const initializer> weight_init, std::string prefix)
    : block("conv", std::move(prefix)),
      attrs_(convolution_attrs(kernel_size, channels, strides, padding)),
      activation_(std::move(activation)) {
  if (channels <= 0 || in_channels < 0)
    throw exception(errc::invalid_argument,
                    this->prefix() + ": channels must be > 0 and in_channels >= 0, got channels " +
                        std::to_string(channels) + ", in_channels " + std::to_string(in_channels));
  require_window("kernel_size", this->prefix(), kernel_size, 1);
  require_window("strides", this->prefix(), strides, 1);
  require_window("padding", this->prefix(), padding, 0);
  if (!activation_.empty())
    require_activation(activation_, this->prefix());
  attrs_.no_bias = !use_bias;
  weight_ = register_param("weight", {channels, in_channels, kernel_size[0], kernel_size[1]},
                           grad_req::write, std::move(weight_init));
  if (use_bias)
    bias_ = register_param("bias", {channels}, grad_req::write, std::make_shared<zero>());
}

ndarray conv2d::hybrid_forward(const ndarray& x) {
  std::vector<parameter*> params{weight_.get()};
  if (bias_)
    params.push_back(bias_.get());
  finish_shapes("Convolution", attrs_, x, params);
  auto ctx = x.ctx();
  ndarray y =
      nd::convolution(x, param_data(*weight_, ctx), bias_ ? param_data(*bias_, ctx) : ndarray{},
                      attrs_.kernel, attrs_.num_filter, attrs_.stride, attrs_.pad);
  return activation_.empty() ? y : nd::activation(y, activation_);
}

pool2d::pool2d(std::string_view pool_type, std::array<std::int64_t, 2> pool_size,
               std::optional<std::array<std::int64_t, 2>> strides,
               std::array<std::int64_t, 2> padding, std::string prefix)
    : block("pool", std::move(prefix)),
      attrs_(pooling_attrs(pool_size, pool_type, strides.value_or(pool_size), padding)) {
  require_window("pool_size", this->prefix(), attrs_.kernel, 1);
  require_window("strides", this->prefix(), attrs_.stride, 1);
  require_window("padding", this->prefix(), attrs_.pad, 0);
}

ndarray pool2d::hybrid_forward(const ndarray& x) {
  return nd::pooling(x, attrs_.kernel, attrs_.pool_type, attrs_.stride, attrs_.pad);
}

max_pool2d::max_pool2d(std::array<std::int64_t, 2> pool_size,
                       std::optional<std::array<std::int64_t, 2>> strides,
                       std::array<std::int64_t, 2> padding, std::string prefix)
    : pool2d("max", pool_size, strides, padding, std::move(prefix)) {}

avg_pool2d::avg_pool2d(std::array<std::int64_t, 2> pool_size,
                       std::optional<std::array<std::int64_t, 2>> strides,
                       std::array<std::int64_t, 2> padding, std::string prefix)
    : pool2d("avg", pool_size, strides, padding, std::move(prefix)) {}

flatten::flatten(std::string prefix) : block("flatten", std::move(prefix)) {}

ndarray flatten::hybrid_forward(const ndarray& x) {
  return nd::flatten(x);
}

dropout::dropout(double rate, std::string prefix)
    : block("dropout", std::move(prefix)), rate_(rate) {
  if (!(rate >= 0.0 && rate < 1.0))
    throw exception(errc::invalid_argument, this->prefix() +
                                                ": dropout rate must be in [0, 1), got " +
                                                std::to_string(rate));
}

ndarray dropout::hybrid_forward(const ndarray& x) {
  return nd::dropout(x, rate_);
}

sequential::sequential(std::string prefix) : block("sequential", std::move(prefix)) {}

sequential& sequential::add(std::shared_ptr<block> child) {
  register_child(std::move(child));
  return *this;
}

const std::shared_ptr<block>& sequential::at(std::size_t index) const {
  if (index >= children().size())
    throw exception(errc::invalid_argument, prefix() + ": child " + std::to_string(index) + " of " +
                                                std::to_string(children().size()));
  return children()[index];
}

ndarray sequential::hybrid_forward(const ndarray& x) {
  ndarray y = x;
  for (auto& child : children())
    y = child->forward(y);
  return y;
}

} // namespace troupe::nn
