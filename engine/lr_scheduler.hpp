#pragma once
// Learning-rate schedulers with MXNet 1.x's names, defaults, errors and exact arithmetic
// (python/mxnet/lr_scheduler.py): FactorScheduler, MultiFactorScheduler, PolyScheduler and
// CosineScheduler, each with an optional warmup.
//
// As in MXNet, a scheduler is stateful: factor and multi-factor schedulers lower base_lr as
// num_update passes their steps and never raise it again, and poly and cosine schedulers keep the
// last rate they computed, which is what they return past max_update. Call a scheduler with
// non-decreasing num_update, as a training loop does. Not thread-safe: one owner calls it.

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/error.hpp"

namespace troupe {

class optimizer;

/// MXNet's warmup arguments: for num_update < steps the rate is begin_lr (mode "constant") or
/// rises linearly from begin_lr to the scheduler's initial base_lr (mode "linear").
struct warmup_options {
  std::int64_t steps = 0;      ///< warmup_steps, >= 0
  double begin_lr = 0.0;       ///< warmup_begin_lr, <= base_lr
  std::string mode = "linear"; ///< warmup_mode: "linear" or "constant"
};

/// MXNet's LRScheduler: the rate for an update count, with the warmup shared by all schedulers.
class lr_scheduler {
public:
  virtual ~lr_scheduler() = default;

  /// The learning rate for update `num_update` (MXNet's __call__); may change the state.
  virtual double operator()(std::int64_t num_update) = 0;

  /// Sets `opt`'s learning_rate to (*this)(num_update).
  void apply(optimizer& opt, std::int64_t num_update);

  /// The current base rate (MXNet's base_lr attribute; lowered by factor schedulers).
  double base_lr() const noexcept { return base_lr_; }
  const warmup_options& warmup() const noexcept { return warmup_; }

protected:
  /// Precondition: the arguments passed MXNet's LRScheduler.__init__ checks (the factories do).
  lr_scheduler(double base_lr, warmup_options warmup)
      : base_lr_(base_lr), warmup_final_lr_(base_lr), warmup_(std::move(warmup)) {}

  bool in_warmup(std::int64_t num_update) const noexcept { return num_update < warmup_.steps; }
  /// MXNet's get_warmup_lr. Precondition: in_warmup(num_update).
  double warmup_lr(std::int64_t num_update) const;

  double base_lr_;
  double warmup_final_lr_; ///< base_lr as given: the rate a linear warmup ends at
  warmup_options warmup_;
};

/// MXNet's FactorScheduler: base_lr * factor^k after k * step updates, floored at stop_factor_lr.
/// step >= 1 and factor <= 1, or an invalid_argument error naming the value.
result<std::unique_ptr<lr_scheduler>> make_factor_scheduler(std::int64_t step, double factor = 1.0,
                                                            double stop_factor_lr = 1e-8,
                                                            double base_lr = 0.01,
                                                            warmup_options warmup = {});

/// MXNet's MultiFactorScheduler: base_lr is multiplied by factor once num_update passes each of
/// `steps`. steps non-empty, strictly increasing, each >= 1; factor <= 1.
result<std::unique_ptr<lr_scheduler>> make_multi_factor_scheduler(std::vector<std::int64_t> steps,
                                                                  double factor = 1.0,
                                                                  double base_lr = 0.01,
                                                                  warmup_options warmup = {});

/// MXNet's PolyScheduler: final_lr + (base_lr - final_lr) * (1 - t / T)^pwr, with
/// t = num_update - warmup steps and T = max_update - warmup steps. max_update >= 1 and greater
/// than the warmup steps.
result<std::unique_ptr<lr_scheduler>> make_poly_scheduler(std::int64_t max_update,
                                                          double base_lr = 0.01, double pwr = 2.0,
                                                          double final_lr = 0.0,
                                                          warmup_options warmup = {});

/// MXNet's CosineScheduler: final_lr + (base_lr - final_lr) * (1 + cos(pi * t / T)) / 2, with t
/// and T as for the poly scheduler. max_update >= 1 and greater than the warmup steps.
result<std::unique_ptr<lr_scheduler>> make_cosine_scheduler(std::int64_t max_update,
                                                            double base_lr = 0.01,
                                                            double final_lr = 0.0,
                                                            warmup_options warmup = {});

} // namespace troupe
