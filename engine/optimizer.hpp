#pragma once
// Optimizers with MXNet's names, parameters and exact update rules (kernels/cpu/optimizer_rules
// holds the arithmetic), and the updater that owns per-key state, as MXNet's
// python/mxnet/optimizer/optimizer.py (Optimizer, Updater) does.
//
// Weights and gradients of any dtype are updated in float32: a float16 weight is widened, updated
// and rounded back, as MXNet does without multi_precision. With multi_precision (every
// optimizer's parameter, 0 by default as in MXNet), the updater keeps a float32 master copy of
// each float16 weight among its states (made from the weight at its first update, saved and
// loaded with the others): the rule updates the master copy and the weight is the master rounded
// to float16 (MXNet's create_state_multi_precision / update_multi_precision). A weight on a gpu(i)
// is updated there by the CUDA rules (kernels/cuda/optimizer.hpp), float16 in place and any other
// non-float32 dtype through a float32 copy on the device.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/error.hpp"
#include "engine/ndarray.hpp"
#include "engine/row_sparse.hpp"
#include "kernels/cuda/optimizer.hpp"

namespace troupe {

/// Hyper-parameters by MXNet's names: learning_rate, wd, rescale_grad, clip_gradient,
/// multi_precision, momentum, beta1, beta2, epsilon, gamma1, gamma2, centered, clip_weights.
using optimizer_params = std::map<std::string, double, std::less<>>;

class optimizer {
public:
  /// Creates an optimizer by MXNet's name: test, sgd, nag, adam, rmsprop, adagrad. An unknown
  /// name, an unknown parameter or a value out of range is an error naming it and what is
  /// accepted. Parameters left out take MXNet 1.x's defaults.
  static result<std::unique_ptr<optimizer>> create(std::string_view name,
                                                   const optimizer_params& params = {});
  virtual ~optimizer() = default;

  const std::string& name() const noexcept { return name_; }
  /// Every parameter of this optimizer, defaults filled in.
  const optimizer_params& params() const noexcept { return params_; }
  double param(std::string_view key) const;

  double learning_rate() const { return param("learning_rate"); }
  void set_learning_rate(double learning_rate) { params_["learning_rate"] = learning_rate; }
  double rescale_grad() const { return param("rescale_grad"); }
  void set_rescale_grad(double rescale_grad) { params_["rescale_grad"] = rescale_grad; }
  /// float16 weights are updated through a float32 master copy (see the top of this file). An
  /// optimizer of the caller's own, without the parameter, has none.
  bool multi_precision() const {
    auto slot = params_.find("multi_precision");
    return slot != params_.end() && slot->second != 0.0;
  }

  /// Number of float32 state buffers a weight needs (momentum, Adam's mean and variance...); a
  /// float16 weight under multi_precision has its master copy besides.
  virtual std::size_t state_count() const noexcept = 0;
  /// One update of `weight` by `grad` (float32 buffers of n elements, on the host) with its
  /// state buffers; `update_count` is how many updates this weight has had, this one included
  /// (Adam's t).
  virtual void apply(float* weight, const float* grad, std::span<float* const> state, std::size_t n,
                     std::int64_t update_count) const = 0;
  /// apply on rows `rows` of `weight` and of each state buffer (row r: elements [r * row_elements,
  /// (r + 1) * row_elements)), row i of `grad` (row_elements each) for rows[i]: the lazy update of
  /// a row_sparse gradient (updater::update_rows). By default apply, row by row; sgd and adam
  /// read their parameters once for all rows.
  virtual void apply_rows(float* weight, const float* grad, std::span<const std::int64_t> rows,
                          std::size_t row_elements, std::span<float* const> state,
                          std::int64_t update_count) const;
  /// The same update on CUDA device `device`: weight and grad (float32 or float16) and the
  /// float32 state are device memory. The built-in optimizers have it; by default it throws
  /// not_supported naming the optimizer.
  virtual void apply_on_gpu(int device, kernels::cuda::weight_and_grad weight,
                            std::span<float* const> state, std::size_t n,
                            std::int64_t update_count) const;

  /// A fresh optimizer with the same name and parameters.
  std::unique_ptr<optimizer> clone() const;

protected:
  optimizer(std::string name, optimizer_params params)
      : name_(std::move(name)), params_(std::move(params)) {}

private:
  std::string name_;
  optimizer_params params_;
};

/// Applies an optimizer to weights identified by an index, keeping each weight's state and update
/// count (MXNet's Updater). Not thread-safe: one owner calls it.
class updater {
public:
  explicit updater(std::unique_ptr<troupe::optimizer> opt);

  /// weight <- update(weight, grad), queued on the weight's context (engine/dispatch.hpp). Shapes
  /// must match; the state is created on first use. Throws troupe::exception for a shape
  /// mismatch or a gpu context.
  void operator()(std::int64_t index, const ndarray& grad, ndarray& weight);
  /// The same with a row_sparse gradient. With the optimizer's lazy_update (sgd and adam, true by
  /// default as in MXNet) a float32 weight on the host moves only in the rows the gradient holds,
  /// and so do its states: the dense rule runs on each such row. Otherwise (lazy_update false,
  /// another optimizer, another dtype or context) the gradient is made dense and the dense rule
  /// runs on every row. Runs on the calling thread (the lazy rule): the caller waits for the
  /// weight as for a read.
  void update_rows(std::int64_t index, const row_sparse_array& grad, ndarray& weight);

  troupe::optimizer& optimizer() noexcept { return *optimizer_; }
  const troupe::optimizer& optimizer() const noexcept { return *optimizer_; }
  /// Updates applied to `index` so far.
  std::int64_t update_count(std::int64_t index) const;

  /// Every weight's state and update count as bytes (with the optimizer's name and parameters
  /// when dump_optimizer), in a versioned little-endian format; load_states restores them bit for
  /// bit. load_states rejects data that is truncated, of another version, or of another optimizer
  /// (unless it carries one, which then replaces this updater's) and leaves the updater as it was.
  /// `shape_of`, when given, says the shape of the weight of an index (nullopt: not known here);
  /// a state of another shape is refused (shape_mismatch, naming the weight and both shapes), as
  /// an update would refuse it later.
  /// `only`, when given, picks the weights whose states are saved (a server's key ranges that
  /// move to another server, with their states).
  std::vector<std::byte>
  save_states(bool dump_optimizer = false,
              const std::function<bool(std::int64_t index)>& only = {}) const;
  /// `merge`: the loaded states join those held (replacing a weight's own), instead of replacing
  /// all of them; a carried optimizer must then equal this updater's (name and parameters), since
  /// the states held were made by it.
  status
  load_states(std::span<const std::byte> bytes,
              const std::function<std::optional<shape_vector>(std::int64_t index)>& shape_of = {},
              bool merge = false);
  /// Drops the states of the weights `which` picks (their keys left for another server).
  void forget_states(const std::function<bool(std::int64_t index)>& which);

private:
  struct weight_state {
    std::int64_t update_count = 0;
    std::vector<ndarray> buffers;
  };
  /// The optimizer as the queued updates see it: a copy made when its parameters last changed,
  /// so that a rate set after an update was queued does not reach that update. Null when
  /// optimizer::create does not know the optimizer's name.
  std::shared_ptr<const troupe::optimizer> queued_view();

  std::unique_ptr<troupe::optimizer> optimizer_;
  std::shared_ptr<const troupe::optimizer> snapshot_;
  std::map<std::int64_t, weight_state> states_;
};

} // namespace troupe
