#include "engine/optimizer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <optional>
#include <utility>

#include "engine/dispatch.hpp"
#include "engine/serialize.hpp"
#include "kernels/cpu/optimizer_rules.hpp"

namespace troupe {
namespace {

namespace rules = kernels::cpu;
namespace gpu_rules = kernels::cuda;

/// MXNet 1.x's defaults per optimizer; a parameter not listed here is rejected by name.
/// clip_gradient and clip_weights use -1 for MXNet's None (disabled).
optimizer_params defaults_for(std::string_view name) {
  optimizer_params common{{"learning_rate", 0.01},
                          {"wd", 0.0},
                          {"rescale_grad", 1.0},
                          {"clip_gradient", -1.0},
                          {"multi_precision", 0.0}};
  auto with = [&](std::initializer_list<optimizer_params::value_type> extra) {
    auto params = common;
    for (auto& [key, value] : extra)
      params[key] = value;
    return params;
  };
  if (name == "test")
    return with({});
  // lazy_update (sgd and adam, MXNet's default true): a row_sparse gradient moves only the rows
  // it holds, weight and state (updater::update_rows).
  if (name == "sgd")
    return with({{"momentum", 0.0}, {"lazy_update", 1.0}});
  if (name == "nag")
    return with({{"momentum", 0.0}});
  if (name == "adam")
    return with({{"learning_rate", 0.001},
                 {"beta1", 0.9},
                 {"beta2", 0.999},
                 {"epsilon", 1e-8},
                 {"lazy_update", 1.0}});
  if (name == "rmsprop")
    return with({{"learning_rate", 0.001},
                 {"gamma1", 0.9},
                 {"gamma2", 0.9},
                 {"epsilon", 1e-8},
                 {"centered", 0.0},
                 {"clip_weights", -1.0}});
  if (name == "adagrad")
    return with({{"epsilon", 1e-7}});
  return {};
}

rules::gradient_settings settings_of(const optimizer& opt) {
  return {static_cast<float>(opt.param("rescale_grad")),
          static_cast<float>(opt.param("clip_gradient"))};
}

float f(const optimizer& opt, std::string_view key) {
  return static_cast<float>(opt.param(key));
}

/// MXNet 1.x `test`: weight += rescale_grad * grad.
class test_optimizer final : public optimizer {
public:
  using optimizer::optimizer;
  friend class troupe::optimizer; // create() is the only maker
  std::size_t state_count() const noexcept override { return 0; }
  void apply(float* weight, const float* grad, std::span<float* const>, std::size_t n,
             std::int64_t) const override {
    rules::test_update(weight, grad, n, f(*this, "rescale_grad"));
  }
  void apply_on_gpu(int device, gpu_rules::weight_and_grad w, std::span<float* const>,
                    std::size_t n, std::int64_t) const override {
    gpu_rules::test_update(device, w, n, f(*this, "rescale_grad"));
  }
};

/// Calls `update(weight row, grad row, state rows)` for every row of a lazy update.
template <class Update>
void for_each_row(float* weight, const float* grad, std::span<const std::int64_t> rows,
                  std::size_t row_elements, std::span<float* const> state, Update&& update) {
  std::vector<float*> at(state.size());
  for (std::size_t i = 0; i < rows.size(); ++i) {
    const auto offset = static_cast<std::size_t>(rows[i]) * row_elements;
    for (std::size_t s = 0; s < state.size(); ++s)
      at[s] = state[s] + offset;
    update(weight + offset, grad + i * row_elements, std::span<float* const>{at});
  }
}

class sgd_optimizer final : public optimizer {
public:
  using optimizer::optimizer;
  friend class troupe::optimizer; // create() is the only maker
  std::size_t state_count() const noexcept override { return param("momentum") != 0.0 ? 1 : 0; }
  void apply(float* weight, const float* grad, std::span<float* const> state, std::size_t n,
             std::int64_t) const override {
    rules::sgd_update(weight, grad, state.empty() ? nullptr : state[0], n,
                      f(*this, "learning_rate"), f(*this, "momentum"), f(*this, "wd"),
                      settings_of(*this));
  }
  void apply_rows(float* weight, const float* grad, std::span<const std::int64_t> rows,
                  std::size_t row_elements, std::span<float* const> state,
                  std::int64_t) const override {
    const float rate = f(*this, "learning_rate"), momentum = f(*this, "momentum"),
                decay = f(*this, "wd");
    const auto settings = settings_of(*this);
    for_each_row(weight, grad, rows, row_elements, state,
                 [&](float* w, const float* g, std::span<float* const> s) {
                   rules::sgd_update(w, g, s.empty() ? nullptr : s[0], row_elements, rate, momentum,
                                     decay, settings);
                 });
  }
  void apply_on_gpu(int device, gpu_rules::weight_and_grad w, std::span<float* const> state,
                    std::size_t n, std::int64_t) const override {
    gpu_rules::sgd_update(device, w, state.empty() ? nullptr : state[0], n,
                          f(*this, "learning_rate"), f(*this, "momentum"), f(*this, "wd"),
                          settings_of(*this));
  }
};

class nag_optimizer final : public optimizer {
public:
  using optimizer::optimizer;
  friend class troupe::optimizer; // create() is the only maker
  std::size_t state_count() const noexcept override { return param("momentum") != 0.0 ? 1 : 0; }
  void apply(float* weight, const float* grad, std::span<float* const> state, std::size_t n,
             std::int64_t) const override {
    if (state.empty()) {
      // MXNet's NAG without momentum is plain SGD.
      rules::sgd_update(weight, grad, nullptr, n, f(*this, "learning_rate"), 0.0f, f(*this, "wd"),
                        settings_of(*this));
      return;
    }
    rules::nag_update(weight, grad, state[0], n, f(*this, "learning_rate"), f(*this, "momentum"),
                      f(*this, "wd"), settings_of(*this));
  }
  void apply_on_gpu(int device, gpu_rules::weight_and_grad w, std::span<float* const> state,
                    std::size_t n, std::int64_t) const override {
    if (state.empty())
      gpu_rules::sgd_update(device, w, nullptr, n, f(*this, "learning_rate"), 0.0f, f(*this, "wd"),
                            settings_of(*this));
    else
      gpu_rules::nag_update(device, w, state[0], n, f(*this, "learning_rate"), f(*this, "momentum"),
                            f(*this, "wd"), settings_of(*this));
  }
};

class adam_optimizer final : public optimizer {
public:
  using optimizer::optimizer;
  friend class troupe::optimizer; // create() is the only maker
  std::size_t state_count() const noexcept override { return 2; }
  void apply(float* weight, const float* grad, std::span<float* const> state, std::size_t n,
             std::int64_t update_count) const override {
    rules::adam_update(weight, grad, state[0], state[1], n, corrected_rate(update_count),
                       f(*this, "beta1"), f(*this, "beta2"), f(*this, "epsilon"), f(*this, "wd"),
                       settings_of(*this));
  }
  void apply_rows(float* weight, const float* grad, std::span<const std::int64_t> rows,
                  std::size_t row_elements, std::span<float* const> state,
                  std::int64_t update_count) const override {
    const float rate = corrected_rate(update_count), beta1 = f(*this, "beta1"),
                beta2 = f(*this, "beta2"), epsilon = f(*this, "epsilon"), decay = f(*this, "wd");
    const auto settings = settings_of(*this);
    for_each_row(weight, grad, rows, row_elements, state,
                 [&](float* w, const float* g, std::span<float* const> s) {
                   rules::adam_update(w, g, s[0], s[1], row_elements, rate, beta1, beta2, epsilon,
                                      decay, settings);
                 });
  }
  void apply_on_gpu(int device, gpu_rules::weight_and_grad w, std::span<float* const> state,
                    std::size_t n, std::int64_t update_count) const override {
    gpu_rules::adam_update(device, w, state[0], state[1], n, corrected_rate(update_count),
                           f(*this, "beta1"), f(*this, "beta2"), f(*this, "epsilon"),
                           f(*this, "wd"), settings_of(*this));
  }

private:
  /// MXNet's Adam folds the bias correction into the rate it hands the kernel.
  float corrected_rate(std::int64_t update_count) const {
    const auto t = static_cast<double>(update_count);
    const double beta1 = param("beta1"), beta2 = param("beta2");
    return static_cast<float>(param("learning_rate") * std::sqrt(1.0 - std::pow(beta2, t)) /
                              (1.0 - std::pow(beta1, t)));
  }
};

class rmsprop_optimizer final : public optimizer {
public:
  using optimizer::optimizer;
  friend class troupe::optimizer; // create() is the only maker
  bool centered() const { return param("centered") != 0.0; }
  std::size_t state_count() const noexcept override { return centered() ? 3 : 1; }
  void apply(float* weight, const float* grad, std::span<float* const> state, std::size_t n,
             std::int64_t) const override {
    if (centered())
      rules::rmsprop_centered_update(weight, grad, state[0], state[1], state[2], n,
                                     f(*this, "learning_rate"), f(*this, "gamma1"),
                                     f(*this, "gamma2"), f(*this, "epsilon"), f(*this, "wd"),
                                     f(*this, "clip_weights"), settings_of(*this));
    else
      rules::rmsprop_update(weight, grad, state[0], n, f(*this, "learning_rate"),
                            f(*this, "gamma1"), f(*this, "epsilon"), f(*this, "wd"),
                            f(*this, "clip_weights"), settings_of(*this));
  }
  void apply_on_gpu(int device, gpu_rules::weight_and_grad w, std::span<float* const> state,
                    std::size_t n, std::int64_t) const override {
    if (centered())
      gpu_rules::rmsprop_centered_update(device, w, state[0], state[1], state[2], n,
                                         f(*this, "learning_rate"), f(*this, "gamma1"),
                                         f(*this, "gamma2"), f(*this, "epsilon"), f(*this, "wd"),
                                         f(*this, "clip_weights"), settings_of(*this));
    else
      gpu_rules::rmsprop_update(device, w, state[0], n, f(*this, "learning_rate"),
                                f(*this, "gamma1"), f(*this, "epsilon"), f(*this, "wd"),
                                f(*this, "clip_weights"), settings_of(*this));
  }
};

class adagrad_optimizer final : public optimizer {
public:
  using optimizer::optimizer;
  friend class troupe::optimizer; // create() is the only maker
  std::size_t state_count() const noexcept override { return 1; }
  void apply(float* weight, const float* grad, std::span<float* const> state, std::size_t n,
             std::int64_t) const override {
    rules::adagrad_update(weight, grad, state[0], n, f(*this, "learning_rate"), f(*this, "epsilon"),
                          f(*this, "wd"), settings_of(*this));
  }
  void apply_on_gpu(int device, gpu_rules::weight_and_grad w, std::span<float* const> state,
                    std::size_t n, std::int64_t) const override {
    gpu_rules::adagrad_update(device, w, state[0], n, f(*this, "learning_rate"),
                              f(*this, "epsilon"), f(*this, "wd"), settings_of(*this));
  }
};

std::string accepted_names(const optimizer_params& params) {
  std::string names;
  for (auto& [key, value] : params) {
    if (!names.empty())
      names += ", ";
    names += key;
  }
  return names;
}

constexpr std::string_view states_magic = "troupe-optimizer-states";
constexpr std::uint64_t states_version = 1;

} // namespace

result<std::unique_ptr<optimizer>> optimizer::create(std::string_view name,
                                                     const optimizer_params& params) {
  auto effective = defaults_for(name);
  if (effective.empty())
    return error{errc::invalid_argument, "unknown optimizer '" + std::string{name} +
                                             "' (known: test, sgd, nag, adam, rmsprop, adagrad)"};
  for (auto& [key, value] : params) {
    auto slot = effective.find(key);
    if (slot == effective.end())
      return error{errc::invalid_argument, "optimizer " + std::string{name} +
                                               " has no parameter '" + key +
                                               "' (it takes: " + accepted_names(effective) + ")"};
    if (!std::isfinite(value))
      return error{errc::invalid_argument, "optimizer " + std::string{name} + " parameter " + key +
                                               " must be finite, got " + std::to_string(value)};
    slot->second = value;
  }
  auto positive = [&](std::string_view key) -> status {
    auto slot = effective.find(key);
    if (slot != effective.end() && !(slot->second > 0.0))
      return error{errc::invalid_argument, "optimizer " + std::string{name} + " parameter " +
                                               std::string{key} + " must be > 0, got " +
                                               std::to_string(slot->second)};
    return ok();
  };
  auto in_unit_interval = [&](std::string_view key) -> status {
    auto slot = effective.find(key);
    if (slot != effective.end() && !(slot->second >= 0.0 && slot->second < 1.0))
      return error{errc::invalid_argument, "optimizer " + std::string{name} + " parameter " +
                                               std::string{key} + " must be in [0, 1), got " +
                                               std::to_string(slot->second)};
    return ok();
  };
  auto flag = [&](std::string_view key) -> status {
    auto slot = effective.find(key);
    if (slot != effective.end() && slot->second != 0.0 && slot->second != 1.0)
      return error{errc::invalid_argument, "optimizer " + std::string{name} + " parameter " +
                                               std::string{key} + " must be 0 or 1 (false or " +
                                               "true), got " + std::to_string(slot->second)};
    return ok();
  };
  for (auto check : {positive("epsilon"), in_unit_interval("momentum"), in_unit_interval("beta1"),
                     in_unit_interval("beta2"), in_unit_interval("gamma1"),
                     in_unit_interval("gamma2"), flag("multi_precision"), flag("lazy_update")})
    if (!check)
      return check.error();

  std::string owned_name{name};
  std::unique_ptr<optimizer> created;
  if (name == "test")
    created.reset(new test_optimizer(owned_name, effective));
  else if (name == "sgd")
    created.reset(new sgd_optimizer(owned_name, effective));
  else if (name == "nag")
    created.reset(new nag_optimizer(owned_name, effective));
  else if (name == "adam")
    created.reset(new adam_optimizer(owned_name, effective));
  else if (name == "rmsprop")
    created.reset(new rmsprop_optimizer(owned_name, effective));
  else
    created.reset(new adagrad_optimizer(owned_name, effective));
  return created;
}

double optimizer::param(std::string_view key) const {
  auto slot = params_.find(key);
  if (slot == params_.end())
    throw exception(errc::invalid_argument,
                    "optimizer " + name_ + " has no parameter '" + std::string{key} + "'");
  return slot->second;
}

std::unique_ptr<optimizer> optimizer::clone() const {
  return create(name_, params_).value();
}

namespace {

/// An update of a weight on a gpu, on that device: float32 and float16 weights in place (the
/// gradient brought to the weight's device and dtype first), any other dtype through a float32
/// copy on the device that is rounded back once.
void update_on_gpu(const optimizer& opt, const ndarray& grad, ndarray& weight,
                   std::vector<ndarray>& buffers, std::int64_t count, bool master) {
  const context ctx = weight.ctx();
  const bool direct = weight.dtype() == dtype::float32 || weight.dtype() == dtype::float16;
  ndarray target = direct ? weight : weight.as_type(dtype::float32);
  ndarray grad_here = grad.ctx() == ctx ? grad : grad.copy_to(ctx);
  if (grad_here.dtype() != target.dtype())
    grad_here = grad_here.as_type(target.dtype());
  std::vector<float*> state;
  for (std::size_t i = 0; i < opt.state_count(); ++i)
    state.push_back(static_cast<float*>(buffers[i].raw_data()));
  const kernels::cuda::weight_and_grad buffers_of{
      target.raw_data(), std::as_const(grad_here).raw_data(),
      target.dtype() == dtype::float16 ? kernels::cuda::element_type::float16
                                       : kernels::cuda::element_type::float32,
      master ? static_cast<float*>(buffers.back().raw_data()) : nullptr};
  opt.apply_on_gpu(ctx.id, buffers_of, state, static_cast<std::size_t>(weight.size()), count);
  if (!direct)
    target.copy_to(weight);
}

/// Whether `opt` keeps a float32 master copy of `weight` (MXNet's multi_precision): the last of
/// its state buffers, after the optimizer's own.
bool keeps_master(const optimizer& opt, const ndarray& weight) {
  return opt.multi_precision() && weight.dtype() == dtype::float16;
}

/// One update of `weight` from `grad` by `opt`, on the calling thread.
void apply_update(const optimizer& opt, const ndarray& grad, ndarray& weight,
                  std::vector<ndarray>& buffers, std::int64_t count) {
  const bool master = keeps_master(opt, weight);
  if (weight.ctx().is_gpu()) {
    update_on_gpu(opt, grad, weight, buffers, count, master);
    return;
  }
  // Updates run in float32; other dtypes are widened and rounded back once, or (multi_precision)
  // update the float32 master copy, which is then rounded into the weight. (Arrays are referred
  // to, not copied, when they need no conversion: a copy of an ndarray copies its shape.)
  const bool widen = weight.dtype() != dtype::float32;
  ndarray widened;
  ndarray& weight32 = master  ? buffers.back()
                      : widen ? (widened = weight.as_type(dtype::float32))
                              : weight;
  ndarray converted;
  const bool convert = grad.dtype() != dtype::float32 || !grad.ctx().is_cpu();
  if (convert)
    converted = grad.ctx().is_cpu() ? grad.as_type(dtype::float32)
                                    : grad.copy_to(context::cpu()).as_type(dtype::float32);
  const ndarray& grad32 = convert ? converted : grad;
  // Every optimizer has at most a few state buffers: their addresses stay on the stack.
  constexpr std::size_t inline_states = 4;
  std::array<float*, inline_states> few{};
  std::vector<float*> many;
  std::span<float* const> state;
  const auto states = opt.state_count();
  if (states <= inline_states) {
    for (std::size_t i = 0; i < states; ++i)
      few[i] = buffers[i].data<float>();
    state = std::span{few.data(), states};
  } else {
    for (std::size_t i = 0; i < states; ++i)
      many.push_back(buffers[i].data<float>());
    state = many;
  }
  opt.apply(weight32.data<float>(), grad32.data<float>(), state,
            static_cast<std::size_t>(weight.size()), count);
  if (widen)
    weight32.copy_to(weight);
}

} // namespace

updater::updater(std::unique_ptr<troupe::optimizer> opt) : optimizer_(std::move(opt)) {
  if (!optimizer_)
    throw exception(errc::invalid_argument, "updater needs an optimizer");
}

void updater::operator()(std::int64_t index, const ndarray& grad, ndarray& weight) {
  if (grad.shape() != weight.shape())
    throw exception(errc::shape_mismatch, "update of weight " + std::to_string(index) +
                                              ": gradient shape " + shape_to_string(grad.shape()) +
                                              " does not match weight shape " +
                                              shape_to_string(weight.shape()));
  auto& entry = states_[index];
  const bool master = keeps_master(*optimizer_, weight);
  if (entry.buffers.size() != optimizer_->state_count() + (master ? 1 : 0)) {
    entry.buffers.clear();
    for (std::size_t i = 0; i < optimizer_->state_count(); ++i)
      entry.buffers.push_back(ndarray::zeros(weight.shape(), weight.ctx(), dtype::float32));
    // MXNet's create_state_multi_precision: the master copy starts as the weight, widened.
    if (master)
      entry.buffers.push_back(weight.as_type(dtype::float32));
  }
  // Loaded states (load_states) were saved for some weight: one of another shape would be read
  // past its end, so it is refused before anything changes; one on another device moves here.
  for (const auto& buffer : entry.buffers)
    if (buffer.shape() != weight.shape())
      throw exception(errc::shape_mismatch,
                      "update of weight " + std::to_string(index) + ": its optimizer state has " +
                          "shape " + shape_to_string(buffer.shape()) + ", the weight " +
                          shape_to_string(weight.shape()) +
                          " (states loaded from a file saved for other weights?)");
  for (auto& buffer : entry.buffers)
    if (buffer.ctx() != weight.ctx())
      buffer = buffer.copy_to(weight.ctx());
  ++entry.update_count;

  // Nothing to queue (the naive engine, as on a server, or a lane's own thread): the update runs
  // here, with nothing built for a queue, so a shard's steady rounds allocate nothing.
  if (engine::runs_now()) {
    apply_update(*optimizer_, grad, weight, entry.buffers, entry.update_count);
    return;
  }
  std::vector<const ndarray*> writes{&weight};
  engine::add_addresses(writes, entry.buffers);
  const ndarray* reads[] = {&grad};
  // An optimizer that cannot be copied (a caller's own subclass, unknown to create()) updates at
  // once on this thread, where no queued update can see its parameters change.
  std::shared_ptr<const troupe::optimizer> opt = queued_view();
  std::optional<engine::inline_scope> at_once;
  if (!opt) {
    opt = std::shared_ptr<const troupe::optimizer>(optimizer_.get(), [](const auto*) {});
    at_once.emplace();
  }
  engine::push(
      "update of weight " + std::to_string(index), weight.ctx(), reads, writes,
      [opt = std::move(opt), grad, weight, buffers = entry.buffers,
       count = entry.update_count]() mutable { apply_update(*opt, grad, weight, buffers, count); });
}

void updater::update_rows(std::int64_t index, const row_sparse_array& grad, ndarray& weight) {
  if (grad.shape() != weight.shape())
    throw exception(errc::shape_mismatch,
                    "update of weight " + std::to_string(index) + ": row_sparse gradient shape " +
                        shape_to_string(grad.shape()) + " does not match weight shape " +
                        shape_to_string(weight.shape()));
  auto lazy = optimizer_->params().find("lazy_update");
  const bool rows_only = lazy != optimizer_->params().end() && lazy->second != 0.0 &&
                         weight.dtype() == dtype::float32 && weight.ctx().is_cpu() &&
                         grad.dtype() == dtype::float32;
  if (!rows_only) {
    // MXNet's dense rule: the absent rows' gradient is zero, and wd and momentum still move them.
    (*this)(index, grad.to_dense(), weight);
    return;
  }
  auto& entry = states_[index];
  if (entry.buffers.size() != optimizer_->state_count()) {
    entry.buffers.clear();
    for (std::size_t i = 0; i < optimizer_->state_count(); ++i)
      entry.buffers.push_back(ndarray::zeros(weight.shape(), weight.ctx(), dtype::float32));
  }
  for (const auto& buffer : entry.buffers)
    if (buffer.shape() != weight.shape())
      throw exception(errc::shape_mismatch, "update of weight " + std::to_string(index) +
                                                ": its optimizer state has " + "shape " +
                                                shape_to_string(buffer.shape()) + ", the weight " +
                                                shape_to_string(weight.shape()));
  ++entry.update_count;
  // The dense rule on each row the gradient holds: for sgd and adam the same operations MXNet's
  // lazy kernels run on those rows (update count, Adam's t, is the weight's).
  const auto row = static_cast<std::size_t>(grad.row_elements());
  if (grad.stored_rows() == 0 || row == 0)
    return;
  std::vector<float*> base;
  for (auto& buffer : entry.buffers)
    base.push_back(buffer.data<float>());
  optimizer_->apply_rows(weight.data<float>(), grad.data().data<float>(), grad.indices(), row, base,
                         entry.update_count);
}

void optimizer::apply_rows(float* weight, const float* grad, std::span<const std::int64_t> rows,
                           std::size_t row_elements, std::span<float* const> state,
                           std::int64_t update_count) const {
  for_each_row(weight, grad, rows, row_elements, state,
               [&](float* w, const float* g, std::span<float* const> s) {
                 apply(w, g, s, row_elements, update_count);
               });
}

void optimizer::apply_on_gpu(int device, kernels::cuda::weight_and_grad, std::span<float* const>,
                             std::size_t, std::int64_t) const {
  throw exception(errc::not_supported, "optimizer '" + name() + "' has no update on gpu(" +
                                           std::to_string(device) + ")");
}

std::shared_ptr<const troupe::optimizer> updater::queued_view() {
  if (!snapshot_ || snapshot_->params() != optimizer_->params() ||
      snapshot_->name() != optimizer_->name()) {
    auto copy = optimizer::create(optimizer_->name(), optimizer_->params());
    snapshot_ = copy ? std::shared_ptr<const troupe::optimizer>(std::move(*copy)) : nullptr;
  }
  return snapshot_;
}

std::int64_t updater::update_count(std::int64_t index) const {
  auto slot = states_.find(index);
  return slot == states_.end() ? 0 : slot->second.update_count;
}

std::vector<std::byte> updater::save_states(bool dump_optimizer,
                                            const std::function<bool(std::int64_t)>& only) const {
  byte_writer out;
  out.string(states_magic);
  out.u64(states_version);
  out.string(optimizer_->name());
  out.u8(dump_optimizer ? 1 : 0);
  if (dump_optimizer) {
    out.u64(optimizer_->params().size());
    for (auto& [key, value] : optimizer_->params()) {
      out.string(key);
      out.f64(value);
    }
  }
  const auto picked = [&](std::int64_t index) { return !only || only(index); };
  out.u64(static_cast<std::uint64_t>(
      std::count_if(states_.begin(), states_.end(), [&](auto& s) { return picked(s.first); })));
  for (auto& [index, entry] : states_) {
    if (!picked(index))
      continue;
    out.i64(index);
    out.i64(entry.update_count);
    out.u64(entry.buffers.size());
    for (auto& buffer : entry.buffers)
      out.array(buffer);
  }
  return out.take();
}

status
updater::load_states(std::span<const std::byte> bytes,
                     const std::function<std::optional<shape_vector>(std::int64_t index)>& shape_of,
                     bool merge) {
  byte_reader in{bytes};
  auto magic = in.string("optimizer states header");
  if (!magic)
    return magic.error();
  if (*magic != states_magic)
    return error{errc::corrupt_data,
                 "not a troupe optimizer states file (header '" + magic->substr(0, 40) + "')"};
  auto version = in.u64("format version");
  if (!version)
    return version.error();
  if (*version != states_version)
    return error{errc::corrupt_data, "optimizer states format version " + std::to_string(*version) +
                                         " is not supported (this is " +
                                         std::to_string(states_version) + ")"};
  auto name = in.string("optimizer name");
  if (!name)
    return name.error();
  auto has_optimizer = in.u8("optimizer flag");
  if (!has_optimizer)
    return has_optimizer.error();

  std::unique_ptr<troupe::optimizer> loaded_optimizer;
  if (*has_optimizer != 0) {
    auto count = in.u64("optimizer parameter count");
    if (!count)
      return count.error();
    optimizer_params params;
    for (std::uint64_t i = 0; i < *count; ++i) {
      auto key = in.string("optimizer parameter name");
      if (!key)
        return key.error();
      auto value = in.f64("optimizer parameter value");
      if (!value)
        return value.error();
      params[*key] = *value;
    }
    auto created = troupe::optimizer::create(*name, params);
    if (!created)
      return error{errc::corrupt_data, "optimizer in states file: " + created.error().message()};
    loaded_optimizer = std::move(*created);
  } else if (*name != optimizer_->name()) {
    return error{errc::invalid_argument, "optimizer states were saved by '" + *name +
                                             "', this updater runs '" + optimizer_->name() + "'"};
  }
  if (merge && loaded_optimizer &&
      (loaded_optimizer->name() != optimizer_->name() ||
       loaded_optimizer->params() != optimizer_->params()))
    return error{errc::invalid_argument,
                 "optimizer states to merge were saved by another optimizer ('" + *name +
                     "' with other parameters) than this updater's '" + optimizer_->name() + "'"};
  const auto& target = loaded_optimizer ? *loaded_optimizer : *optimizer_;

  auto count = in.u64("state count");
  if (!count)
    return count.error();
  std::map<std::int64_t, weight_state> loaded;
  for (std::uint64_t i = 0; i < *count; ++i) {
    auto index = in.i64("weight index");
    if (!index)
      return index.error();
    auto updates = in.i64("update count");
    if (!updates)
      return updates.error();
    auto buffers = in.u64("state buffer count");
    if (!buffers)
      return buffers.error();
    // With multi_precision, a float16 weight's master copy follows the optimizer's states.
    const bool with_master = target.multi_precision() && *buffers == target.state_count() + 1;
    if (*buffers != target.state_count() && !with_master)
      return error{errc::corrupt_data,
                   "weight " + std::to_string(*index) + " has " + std::to_string(*buffers) +
                       " state buffers, optimizer " + target.name() + " keeps " +
                       std::to_string(target.state_count()) +
                       (target.multi_precision() ? " (and a float16 weight's master copy)" : "")};
    weight_state entry;
    entry.update_count = *updates;
    for (std::uint64_t b = 0; b < *buffers; ++b) {
      auto buffer = in.array("state of weight " + std::to_string(*index));
      if (!buffer)
        return buffer.error();
      if (buffer->dtype() != dtype::float32)
        return error{errc::corrupt_data, "state of weight " + std::to_string(*index) + " is " +
                                             std::string{to_string(buffer->dtype())} +
                                             ", expected float32"};
      if (auto expected = shape_of ? shape_of(*index) : std::nullopt;
          expected && *expected != buffer->shape())
        return error{errc::shape_mismatch, "the state of weight " + std::to_string(*index) +
                                               " has shape " + shape_to_string(buffer->shape()) +
                                               ", the weight here " + shape_to_string(*expected) +
                                               " (saved for other weights?)"};
      entry.buffers.push_back(std::move(*buffer));
    }
    loaded[*index] = std::move(entry);
  }
  if (in.remaining() != 0)
    return error{errc::corrupt_data,
                 std::to_string(in.remaining()) + " unexpected bytes after the optimizer states"};
  // Only now, with everything read and checked, does the updater change.
  if (merge) {
    for (auto& [index, entry] : loaded)
      states_[index] = std::move(entry);
    return ok();
  }
  if (loaded_optimizer)
    optimizer_ = std::move(loaded_optimizer);
  states_ = std::move(loaded);
  return ok();
}

void updater::forget_states(const std::function<bool(std::int64_t index)>& which) {
  std::erase_if(states_, [&](const auto& state) { return which(state.first); });
}

} // namespace troupe
