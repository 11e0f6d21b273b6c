#include "engine/lr_scheduler.hpp"

#include <cmath>
#include <numbers>
#include <sstream>
#include <utility>

#include "engine/optimizer.hpp"

namespace troupe {
namespace {

/// "step = 0": a value as the error messages print it.
template <class T>
std::string named(const char* name, const T& value) {
  std::ostringstream out;
  out.precision(17);
  out << name << " = " << value;
  return out.str();
}

error invalid(std::string message) {
  return error{errc::invalid_argument, std::move(message)};
}

/// MXNet's LRScheduler.__init__ checks.
status check_common(double base_lr, const warmup_options& warmup) {
  if (warmup.begin_lr > base_lr)
    return invalid("base lr has to be higher than warmup_begin_lr, got " +
                   named("warmup_begin_lr", warmup.begin_lr) + " and " + named("base_lr", base_lr));
  if (warmup.steps < 0)
    return invalid("warmup steps has to be positive or 0, got " +
                   named("warmup_steps", warmup.steps));
  if (warmup.mode != "linear" && warmup.mode != "constant")
    return invalid("supports only linear and constant modes of warmup, got warmup_mode = '" +
                   warmup.mode + "'");
  return ok();
}

status check_factor(double factor) {
  if (factor > 1.0)
    return invalid("factor must be no more than 1 to make lr reduce, got " +
                   named("factor", factor));
  return ok();
}

/// Poly and cosine: the common checks, then MXNet requires max_update >= 1; max_update <= warmup
/// steps would divide by a zero or negative max_steps, so it is rejected too.
status check_max_update(std::int64_t max_update, double base_lr, const warmup_options& warmup) {
  if (auto checked = check_common(base_lr, warmup); !checked)
    return checked;
  if (max_update < 1)
    return invalid("maximum number of updates must be strictly positive, got " +
                   named("max_update", max_update));
  if (warmup.steps >= max_update)
    return invalid("warmup steps must be fewer than max_update, got " +
                   named("warmup_steps", warmup.steps) + " and " + named("max_update", max_update));
  return ok();
}

class factor_scheduler final : public lr_scheduler {
public:
  factor_scheduler(std::int64_t step, double factor, double stop_factor_lr, double base_lr,
                   warmup_options warmup)
      : lr_scheduler(base_lr, std::move(warmup)), step_(step), factor_(factor),
        stop_factor_lr_(stop_factor_lr) {}

  double operator()(std::int64_t num_update) override {
    if (in_warmup(num_update))
      return warmup_lr(num_update);
    // `while`, not `if`: a job resumed at a later update catches up at once.
    while (num_update > count_ + step_) {
      count_ += step_;
      base_lr_ *= factor_;
      if (base_lr_ < stop_factor_lr_)
        base_lr_ = stop_factor_lr_;
    }
    return base_lr_;
  }

private:
  std::int64_t step_;
  double factor_;
  double stop_factor_lr_;
  std::int64_t count_ = 0;
};

class multi_factor_scheduler final : public lr_scheduler {
public:
  multi_factor_scheduler(std::vector<std::int64_t> steps, double factor, double base_lr,
                         warmup_options warmup)
      : lr_scheduler(base_lr, std::move(warmup)), steps_(std::move(steps)), factor_(factor) {}

  double operator()(std::int64_t num_update) override {
    if (in_warmup(num_update))
      return warmup_lr(num_update);
    while (cur_step_ind_ < steps_.size()) {
      if (num_update <= steps_[cur_step_ind_])
        return base_lr_;
      count_ = steps_[cur_step_ind_];
      ++cur_step_ind_;
      base_lr_ *= factor_;
    }
    return base_lr_;
  }

private:
  std::vector<std::int64_t> steps_;
  double factor_;
  std::size_t cur_step_ind_ = 0;
  std::int64_t count_ = 0; ///< MXNet's count: the last step passed (kept for parity, unread)
};

/// Poly and cosine share MXNet's shape: warmup, then a decay from the original base_lr to
/// final_lr over max_steps, then the last rate computed.
class decay_scheduler : public lr_scheduler {
protected:
  decay_scheduler(std::int64_t max_update, double base_lr, double final_lr, warmup_options warmup)
      : lr_scheduler(base_lr, std::move(warmup)), base_lr_orig_(base_lr), max_update_(max_update),
        final_lr_(final_lr), max_steps_(max_update - warmup_.steps) {}

  double base_lr_orig_;
  std::int64_t max_update_;
  double final_lr_;
  std::int64_t max_steps_;
};

class poly_scheduler final : public decay_scheduler {
public:
  poly_scheduler(std::int64_t max_update, double base_lr, double pwr, double final_lr,
                 warmup_options warmup)
      : decay_scheduler(max_update, base_lr, final_lr, std::move(warmup)), power_(pwr) {}

  double operator()(std::int64_t num_update) override {
    if (in_warmup(num_update))
      return warmup_lr(num_update);
    if (num_update <= max_update_)
      base_lr_ = final_lr_ + (base_lr_orig_ - final_lr_) *
                                 std::pow(1.0 - static_cast<double>(num_update - warmup_.steps) /
                                                    static_cast<double>(max_steps_),
                                          power_);
    return base_lr_;
  }

private:
  double power_;
};

class cosine_scheduler final : public decay_scheduler {
public:
  cosine_scheduler(std::int64_t max_update, double base_lr, double final_lr, warmup_options warmup)
      : decay_scheduler(max_update, base_lr, final_lr, std::move(warmup)) {}

  double operator()(std::int64_t num_update) override {
    if (in_warmup(num_update))
      return warmup_lr(num_update);
    // Python evaluates pi * t / T left to right; so does this.
    if (num_update <= max_update_)
      base_lr_ = final_lr_ + (base_lr_orig_ - final_lr_) *
                                 (1.0 + std::cos(std::numbers::pi *
                                                 static_cast<double>(num_update - warmup_.steps) /
                                                 static_cast<double>(max_steps_))) /
                                 2.0;
    return base_lr_;
  }
};

} // namespace

void lr_scheduler::apply(optimizer& opt, std::int64_t num_update) {
  opt.set_learning_rate((*this)(num_update));
}

double lr_scheduler::warmup_lr(std::int64_t num_update) const {
  if (warmup_.mode == "constant")
    return warmup_.begin_lr;
  double increase = (warmup_final_lr_ - warmup_.begin_lr) * static_cast<double>(num_update) /
                    static_cast<double>(warmup_.steps);
  return warmup_.begin_lr + increase;
}

result<std::unique_ptr<lr_scheduler>> make_factor_scheduler(std::int64_t step, double factor,
                                                            double stop_factor_lr, double base_lr,
                                                            warmup_options warmup) {
  if (auto checked = check_common(base_lr, warmup); !checked)
    return checked.error();
  if (step < 1)
    return invalid("schedule step must be greater or equal than 1 round, got " +
                   named("step", step));
  if (auto checked = check_factor(factor); !checked)
    return checked.error();
  return std::unique_ptr<lr_scheduler>{
      new factor_scheduler(step, factor, stop_factor_lr, base_lr, std::move(warmup))};
}

result<std::unique_ptr<lr_scheduler>> make_multi_factor_scheduler(std::vector<std::int64_t> steps,
                                                                  double factor, double base_lr,
                                                                  warmup_options warmup) {
  if (auto checked = check_common(base_lr, warmup); !checked)
    return checked.error();
  if (steps.empty())
    return invalid("schedule steps must not be empty");
  for (std::size_t i = 0; i < steps.size(); ++i) {
    if (i != 0 && steps[i] <= steps[i - 1])
      return invalid("schedule step must be an increasing integer list, got step[" +
                     std::to_string(i) + "] = " + std::to_string(steps[i]) + " after step[" +
                     std::to_string(i - 1) + "] = " + std::to_string(steps[i - 1]));
    if (steps[i] < 1)
      return invalid("schedule step must be greater or equal than 1 round, got step[" +
                     std::to_string(i) + "] = " + std::to_string(steps[i]));
  }
  if (auto checked = check_factor(factor); !checked)
    return checked.error();
  return std::unique_ptr<lr_scheduler>{
      new multi_factor_scheduler(std::move(steps), factor, base_lr, std::move(warmup))};
}

result<std::unique_ptr<lr_scheduler>> make_poly_scheduler(std::int64_t max_update, double base_lr,
                                                          double pwr, double final_lr,
                                                          warmup_options warmup) {
  if (auto checked = check_max_update(max_update, base_lr, warmup); !checked)
    return checked.error();
  return std::unique_ptr<lr_scheduler>{
      new poly_scheduler(max_update, base_lr, pwr, final_lr, std::move(warmup))};
}

result<std::unique_ptr<lr_scheduler>> make_cosine_scheduler(std::int64_t max_update, double base_lr,
                                                            double final_lr,
                                                            warmup_options warmup) {
  if (auto checked = check_max_update(max_update, base_lr, warmup); !checked)
    return checked.error();
  return std::unique_ptr<lr_scheduler>{
      new cosine_scheduler(max_update, base_lr, final_lr, std::move(warmup))};
}

} // namespace troupe
