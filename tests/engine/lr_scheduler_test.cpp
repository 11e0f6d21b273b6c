// Learning-rate schedulers against hand-written loops that mirror MXNet 1.x's
// python/mxnet/lr_scheduler.py line by line, over num_update 0..200; MXNet's argument errors;
// and apply() feeding an optimizer.

#include <cmath>
#include <cstdint>
#include <numbers>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/lr_scheduler.hpp"
#include "engine/optimizer.hpp"

using namespace troupe;

namespace {

constexpr std::int64_t last_update = 200;

/// MXNet's get_warmup_lr, with the base_lr given at construction as warmup_final_lr.
double reference_warmup(std::int64_t n, double final_lr, const warmup_options& w) {
  if (w.mode == "linear")
    return w.begin_lr +
           (final_lr - w.begin_lr) * static_cast<double>(n) / static_cast<double>(w.steps);
  return w.begin_lr;
}

/// FactorScheduler.__call__ for every num_update in 0..last_update, state carried along.
std::vector<double> reference_factor(std::int64_t step, double factor, double stop_factor_lr,
                                     double base_lr, const warmup_options& w) {
  std::vector<double> rates;
  const double warmup_final_lr = base_lr;
  std::int64_t count = 0;
  for (std::int64_t n = 0; n <= last_update; ++n) {
    if (n < w.steps) {
      rates.push_back(reference_warmup(n, warmup_final_lr, w));
      continue;
    }
    while (n > count + step) {
      count += step;
      base_lr *= factor;
      if (base_lr < stop_factor_lr)
        base_lr = stop_factor_lr;
    }
    rates.push_back(base_lr);
  }
  return rates;
}

std::vector<double> reference_multi_factor(const std::vector<std::int64_t>& step, double factor,
                                           double base_lr, const warmup_options& w) {
  std::vector<double> rates;
  const double warmup_final_lr = base_lr;
  std::size_t cur_step_ind = 0;
  for (std::int64_t n = 0; n <= last_update; ++n) {
    if (n < w.steps) {
      rates.push_back(reference_warmup(n, warmup_final_lr, w));
      continue;
    }
    while (cur_step_ind <= step.size() - 1 && n > step[cur_step_ind]) {
      ++cur_step_ind;
      base_lr *= factor;
    }
    rates.push_back(base_lr);
  }
  return rates;
}

std::vector<double> reference_cosine(std::int64_t max_update, double base_lr, double final_lr,
                                     const warmup_options& w) {
  std::vector<double> rates;
  const double base_lr_orig = base_lr;
  const double max_steps = static_cast<double>(max_update - w.steps);
  for (std::int64_t n = 0; n <= last_update; ++n) {
    if (n < w.steps) {
      rates.push_back(reference_warmup(n, base_lr_orig, w));
      continue;
    }
    if (n <= max_update)
      base_lr =
          final_lr +
          (base_lr_orig - final_lr) *
              (1 + std::cos(std::numbers::pi * static_cast<double>(n - w.steps) / max_steps)) / 2;
    rates.push_back(base_lr);
  }
  return rates;
}

std::vector<double> reference_poly(std::int64_t max_update, double base_lr, double pwr,
                                   double final_lr, const warmup_options& w) {
  std::vector<double> rates;
  const double base_lr_orig = base_lr;
  const double max_steps = static_cast<double>(max_update - w.steps);
  for (std::int64_t n = 0; n <= last_update; ++n) {
    if (n < w.steps) {
      rates.push_back(reference_warmup(n, base_lr_orig, w));
      continue;
    }
    if (n <= max_update)
      base_lr = final_lr + (base_lr_orig - final_lr) *
                               std::pow(1 - static_cast<double>(n - w.steps) / max_steps, pwr);
    rates.push_back(base_lr);
  }
  return rates;
}

std::vector<double> run(lr_scheduler& scheduler) {
  std::vector<double> rates;
  for (std::int64_t n = 0; n <= last_update; ++n)
    rates.push_back(scheduler(n));
  return rates;
}

const std::vector<warmup_options> warmups{
    {}, {10, 0.0, "linear"}, {25, 0.001, "linear"}, {7, 0.002, "constant"}};

std::string describe(const warmup_options& w) {
  return "warmup " + std::to_string(w.steps) + " from " + std::to_string(w.begin_lr) + " " + w.mode;
}

/// The error is invalid_argument and its message contains `needle` (the argument and its value).
template <class Result>
void check_rejected(const Result& made, const std::string& needle) {
  BOOST_TEST_REQUIRE(!made.has_value(), needle);
  BOOST_TEST(made.error().code() == errc::invalid_argument);
  BOOST_TEST(made.error().message().find(needle) != std::string::npos,
             made.error().message() << " should name " << needle);
}

} // namespace

BOOST_AUTO_TEST_SUITE(lr_schedulers)

BOOST_AUTO_TEST_CASE(a_factor_scheduler_matches_mxnets_loop_exactly) {
  struct setting {
    std::int64_t step;
    double factor;
    double stop_factor_lr;
    double base_lr;
  };
  for (auto [step, factor, stop, base_lr] : std::vector<setting>{{1, 0.9, 1e-8, 0.1},
                                                                 {10, 0.5, 1e-8, 0.01},
                                                                 {25, 0.1, 1e-8, 1.0},
                                                                 {7, 1.0, 1e-8, 0.05},
                                                                 {3, 0.3, 1e-8, 0.2}})
    for (auto& w : warmups) {
      auto scheduler = make_factor_scheduler(step, factor, stop, base_lr, w);
      BOOST_TEST_REQUIRE(scheduler.has_value());
      auto expected = reference_factor(step, factor, stop, base_lr, w);
      auto got = run(**scheduler);
      for (std::size_t n = 0; n < got.size(); ++n)
        BOOST_TEST(got[n] == expected[n], "step " << step << " factor " << factor << " "
                                                  << describe(w) << " update " << n);
    }
}

BOOST_AUTO_TEST_CASE(a_factor_scheduler_never_goes_below_stop_factor_lr) {
  auto scheduler = make_factor_scheduler(2, 0.1, 1e-4, 0.1).value();
  BOOST_TEST((*scheduler)(2) == 0.1);
  BOOST_TEST((*scheduler)(3) == 0.1 * 0.1);
  for (std::int64_t n = 4; n <= last_update; ++n)
    BOOST_TEST((*scheduler)(n) >= 1e-4);
  BOOST_TEST((*scheduler)(last_update) == 1e-4);
  BOOST_TEST(scheduler->base_lr() == 1e-4);
}

BOOST_AUTO_TEST_CASE(a_factor_scheduler_resumed_at_a_later_update_catches_up_at_once) {
  auto scheduler = make_factor_scheduler(10, 0.5, 1e-8, 1.0).value();
  BOOST_TEST((*scheduler)(35) == 0.125); // 35 > 10, 20, 30: three halvings
}

BOOST_AUTO_TEST_CASE(a_multi_factor_scheduler_matches_mxnets_loop_exactly) {
  struct setting {
    std::vector<std::int64_t> steps;
    double factor;
    double base_lr;
  };
  for (auto& [steps, factor, base_lr] : std::vector<setting>{{{1}, 0.5, 0.1},
                                                             {{10, 20, 30}, 0.5, 0.01},
                                                             {{15, 60, 120, 180}, 0.1, 1.0},
                                                             {{50, 51, 52, 300}, 0.9, 0.05},
                                                             {{5, 100}, 1.0, 0.3}})
    for (auto& w : warmups) {
      auto scheduler = make_multi_factor_scheduler(steps, factor, base_lr, w);
      BOOST_TEST_REQUIRE(scheduler.has_value());
      auto expected = reference_multi_factor(steps, factor, base_lr, w);
      auto got = run(**scheduler);
      for (std::size_t n = 0; n < got.size(); ++n)
        BOOST_TEST(got[n] == expected[n], "steps starting " << steps.front() << " factor " << factor
                                                            << " " << describe(w) << " update "
                                                            << n);
    }
}

BOOST_AUTO_TEST_CASE(a_multi_factor_scheduler_lowers_the_rate_just_after_each_step) {
  auto scheduler = make_multi_factor_scheduler({10, 20}, 0.5, 1.0).value();
  BOOST_TEST((*scheduler)(10) == 1.0);
  BOOST_TEST((*scheduler)(11) == 0.5);
  BOOST_TEST((*scheduler)(20) == 0.5);
  BOOST_TEST((*scheduler)(21) == 0.25);
  BOOST_TEST((*scheduler)(1000) == 0.25);
}

BOOST_AUTO_TEST_CASE(a_cosine_scheduler_matches_mxnets_formula) {
  struct setting {
    std::int64_t max_update;
    double base_lr;
    double final_lr;
  };
  for (auto [max_update, base_lr, final_lr] :
       std::vector<setting>{{100, 0.1, 0.0}, {200, 0.01, 0.001}, {150, 1.0, 0.1}, {30, 0.5, 0.0}})
    for (auto& w : warmups) {
      auto scheduler = make_cosine_scheduler(max_update, base_lr, final_lr, w);
      BOOST_TEST_REQUIRE(scheduler.has_value());
      auto expected = reference_cosine(max_update, base_lr, final_lr, w);
      auto got = run(**scheduler);
      for (std::size_t n = 0; n < got.size(); ++n)
        BOOST_TEST(std::abs(got[n] - expected[n]) <= 1e-12,
                   "max_update " << max_update << " " << describe(w) << " update " << n << ": "
                                 << got[n] << " vs " << expected[n]);
    }
}

BOOST_AUTO_TEST_CASE(a_cosine_scheduler_starts_at_base_lr_and_ends_at_final_lr) {
  auto scheduler = make_cosine_scheduler(100, 0.1, 0.01).value();
  BOOST_TEST((*scheduler)(0) == 0.1);
  BOOST_TEST(std::abs((*scheduler)(50) - 0.055) <= 1e-12);
  BOOST_TEST(std::abs((*scheduler)(100) - 0.01) <= 1e-12);
  BOOST_TEST(std::abs((*scheduler)(150) - 0.01) <= 1e-12);
}

BOOST_AUTO_TEST_CASE(a_poly_scheduler_matches_mxnets_formula) {
  for (double pwr : {1.0, 2.0, 0.5})
    for (auto& w : warmups) {
      auto scheduler = make_poly_scheduler(120, 0.1, pwr, 0.001, w);
      BOOST_TEST_REQUIRE(scheduler.has_value());
      auto expected = reference_poly(120, 0.1, pwr, 0.001, w);
      auto got = run(**scheduler);
      for (std::size_t n = 0; n < got.size(); ++n)
        BOOST_TEST(std::abs(got[n] - expected[n]) <= 1e-12,
                   "pwr " << pwr << " " << describe(w) << " update " << n);
    }
}

BOOST_AUTO_TEST_CASE(a_linear_warmup_rises_from_warmup_begin_lr_to_base_lr) {
  auto scheduler = make_factor_scheduler(1000, 1.0, 1e-8, 0.1, {10, 0.0, "linear"}).value();
  BOOST_TEST((*scheduler)(0) == 0.0);
  BOOST_TEST(std::abs((*scheduler)(5) - 0.05) <= 1e-15);
  BOOST_TEST((*scheduler)(10) == 0.1);
  auto constant = make_factor_scheduler(1000, 1.0, 1e-8, 0.1, {10, 0.02, "constant"}).value();
  BOOST_TEST((*constant)(9) == 0.02);
  BOOST_TEST((*constant)(10) == 0.1);
}

BOOST_AUTO_TEST_CASE(each_invalid_argument_is_rejected_with_its_value_named) {
  check_rejected(make_factor_scheduler(0), "step = 0");
  check_rejected(make_factor_scheduler(-3), "step = -3");
  check_rejected(make_factor_scheduler(10, 1.5), "factor = 1.5");
  check_rejected(make_factor_scheduler(10, 0.5, 1e-8, 0.01, {-1, 0.0, "linear"}),
                 "warmup_steps = -1");
  check_rejected(make_factor_scheduler(10, 0.5, 1e-8, 0.01, {5, 0.0, "cubic"}),
                 "warmup_mode = 'cubic'");
  check_rejected(make_factor_scheduler(10, 0.5, 1e-8, 0.01, {5, 0.5, "linear"}),
                 "warmup_begin_lr = 0.5");

  check_rejected(make_multi_factor_scheduler({}), "empty");
  check_rejected(make_multi_factor_scheduler({10, 10}), "step[1] = 10");
  check_rejected(make_multi_factor_scheduler({10, 5}), "step[1] = 5");
  check_rejected(make_multi_factor_scheduler({0, 5}), "step[0] = 0");
  check_rejected(make_multi_factor_scheduler({5, 10}, 2.0), "factor = 2");
  check_rejected(make_multi_factor_scheduler({5}, 0.5, 0.01, {3, 0.0, "step"}),
                 "warmup_mode = 'step'");

  check_rejected(make_cosine_scheduler(0), "max_update = 0");
  check_rejected(make_cosine_scheduler(10, 0.01, 0.0, {10, 0.0, "linear"}), "warmup_steps = 10");
  check_rejected(make_cosine_scheduler(10, 0.01, 0.0, {20, 0.0, "linear"}), "warmup_steps = 20");
  check_rejected(make_cosine_scheduler(10, 0.01, 0.0, {-2, 0.0, "linear"}), "warmup_steps = -2");
  check_rejected(make_poly_scheduler(-1), "max_update = -1");
  check_rejected(make_poly_scheduler(10, 0.01, 2.0, 0.0, {10, 0.0, "linear"}), "warmup_steps = 10");
}

BOOST_AUTO_TEST_CASE(apply_sets_the_optimizers_learning_rate) {
  auto opt = optimizer::create("sgd", {{"learning_rate", 0.5}}).value();
  auto scheduler = make_factor_scheduler(10, 0.5, 1e-8, 0.2).value();
  scheduler->apply(*opt, 0);
  BOOST_TEST(opt->learning_rate() == 0.2);
  scheduler->apply(*opt, 11);
  BOOST_TEST(opt->learning_rate() == 0.1);
  auto cosine = make_cosine_scheduler(100, 0.1).value();
  cosine->apply(*opt, 100);
  BOOST_TEST(std::abs(opt->learning_rate()) <= 1e-15);
}

BOOST_AUTO_TEST_SUITE_END()
