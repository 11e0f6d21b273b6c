// Optimizers and the updater: MXNet's names, defaults and errors, the update rules through the
// updater (the rules themselves are checked in tests/kernels), and state save/load.

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/optimizer.hpp"
#include "engine/row_sparse.hpp"

using namespace troupe;

BOOST_AUTO_TEST_SUITE(optimizers)

BOOST_AUTO_TEST_CASE(every_mxnet_optimizer_is_created_with_its_defaults) {
  struct expectation {
    std::string name;
    double learning_rate;
    std::size_t states;
  };
  for (auto& [name, learning_rate, states] : std::vector<expectation>{{"test", 0.01, 0},
                                                                      {"sgd", 0.01, 0},
                                                                      {"nag", 0.01, 0},
                                                                      {"adam", 0.001, 2},
                                                                      {"rmsprop", 0.001, 1},
                                                                      {"adagrad", 0.01, 1}}) {
    auto created = optimizer::create(name);
    BOOST_TEST_REQUIRE(created.has_value(), name);
    BOOST_TEST((*created)->name() == name);
    BOOST_TEST((*created)->learning_rate() == learning_rate);
    BOOST_TEST((*created)->rescale_grad() == 1.0);
    BOOST_TEST((*created)->state_count() == states, name);
  }
  BOOST_TEST(optimizer::create("sgd", {{"momentum", 0.9}}).value()->state_count() == 1u);
  BOOST_TEST(optimizer::create("rmsprop", {{"centered", 1}}).value()->state_count() == 3u);
}

BOOST_AUTO_TEST_CASE(an_unknown_optimizer_or_parameter_is_an_error_naming_it) {
  auto unknown = optimizer::create("sgdd");
  BOOST_TEST_REQUIRE(!unknown.has_value());
  BOOST_TEST(unknown.error().message().find("'sgdd'") != std::string::npos);
  auto bad_param = optimizer::create("sgd", {{"beta1", 0.9}});
  BOOST_TEST_REQUIRE(!bad_param.has_value());
  BOOST_TEST(bad_param.error().message().find("'beta1'") != std::string::npos);
  BOOST_TEST(bad_param.error().message().find("momentum") != std::string::npos);
  auto bad_value = optimizer::create("adam", {{"beta2", 1.5}});
  BOOST_TEST_REQUIRE(!bad_value.has_value());
  BOOST_TEST(bad_value.error().message().find("beta2") != std::string::npos);
  BOOST_TEST(!optimizer::create("adam", {{"epsilon", 0.0}}).has_value());
  BOOST_TEST(!optimizer::create("sgd", {{"learning_rate", NAN}}).has_value());
}

BOOST_AUTO_TEST_CASE(the_test_optimizer_adds_the_rescaled_gradient) {
  updater update{optimizer::create("test", {{"rescale_grad", 2.0}}).value()};
  auto weight = ndarray::ones({3});
  update(0, ndarray::full({3}, 5.0), weight);
  BOOST_TEST(weight.to_vector<float>() == std::vector<float>(3, 11.0f));
  BOOST_TEST(update.update_count(0) == 1);
  BOOST_TEST(update.update_count(1) == 0);
}

BOOST_AUTO_TEST_CASE(sgd_with_momentum_follows_mxnets_recurrence) {
  double lr = 0.1, momentum = 0.9, wd = 0.01;
  updater update{
      optimizer::create("sgd", {{"learning_rate", lr}, {"momentum", momentum}, {"wd", wd}})
          .value()};
  auto weight = ndarray::full({1}, 2.0);
  double w = 2.0, mom = 0.0;
  for (int step = 0; step < 5; ++step) {
    double g = 0.5 * (step + 1);
    update(3, ndarray::full({1}, g), weight);
    mom = momentum * mom - lr * (g + wd * w);
    w += mom;
    BOOST_TEST(weight.as_scalar() == w, boost::test_tools::tolerance(1e-5));
  }
}

BOOST_AUTO_TEST_CASE(adam_uses_the_per_weight_update_count_for_bias_correction) {
  double lr = 0.01, beta1 = 0.9, beta2 = 0.999, eps = 1e-8;
  updater update{optimizer::create("adam", {{"learning_rate", lr}}).value()};
  auto first = ndarray::full({1}, 1.0), second = ndarray::full({1}, 1.0);
  double w = 1.0, mean = 0, var = 0;
  for (int t = 1; t <= 4; ++t) {
    double g = 0.3 * t;
    update(0, ndarray::full({1}, g), first);
    mean = beta1 * mean + (1 - beta1) * g;
    var = beta2 * var + (1 - beta2) * g * g;
    double corrected = lr * std::sqrt(1 - std::pow(beta2, t)) / (1 - std::pow(beta1, t));
    w -= corrected * mean / (std::sqrt(var) + eps);
    BOOST_TEST(first.as_scalar() == w, boost::test_tools::tolerance(1e-5));
  }
  // A second weight starts its own count at 1.
  update(1, ndarray::full({1}, 0.3), second);
  BOOST_TEST(update.update_count(1) == 1);
  BOOST_TEST(second.as_scalar() == 1.0 - lr, boost::test_tools::tolerance(1e-5));
}

BOOST_AUTO_TEST_CASE(a_float16_weight_is_updated_in_float32_and_rounded_back) {
  updater update{optimizer::create("sgd", {{"learning_rate", 0.5}}).value()};
  auto weight = ndarray::full({4}, 3.0, context::cpu(), dtype::float16);
  update(0, ndarray::full({4}, 2.0, context::cpu(), dtype::float16), weight);
  BOOST_TEST(weight.dtype() == dtype::float16);
  BOOST_TEST(weight.to_vector<float>() == std::vector<float>(4, 2.0f));
}

BOOST_AUTO_TEST_CASE(multi_precision_is_a_flag_of_every_optimizer) {
  for (std::string name : {"test", "sgd", "nag", "adam", "rmsprop", "adagrad"}) {
    auto created = optimizer::create(name, {{"multi_precision", 1}});
    BOOST_TEST_REQUIRE(created.has_value(), name);
    BOOST_TEST((*created)->multi_precision(), name);
    BOOST_TEST(!optimizer::create(name).value()->multi_precision(), name); // MXNet's default
  }
  auto bad = optimizer::create("adam", {{"multi_precision", 0.5}});
  BOOST_TEST_REQUIRE(!bad.has_value());
  BOOST_TEST(bad.error().message().find("multi_precision") != std::string::npos,
             bad.error().message());
}

namespace {

/// Trains a float16 weight with optimizer `name` and multi_precision for `steps`, a float32
/// weight of the same start with the same optimizer on the same gradients widened, and the
/// float16 weight again without multi_precision; the values of the first, of the second rounded
/// to float16, and of the third.
struct trained {
  std::vector<float> mixed, reference_rounded, plain;
};
trained train_half_and_single(const std::string& name, optimizer_params params, int steps) {
  constexpr std::int64_t n = 64;
  auto with_master = params;
  with_master["multi_precision"] = 1;
  updater mixed{optimizer::create(name, with_master).value()};
  updater reference{optimizer::create(name, with_master).value()};
  updater plain{optimizer::create(name, params).value()};
  auto weight16 = ndarray::random_normal(0, 1, {n}, 99).as_type(dtype::float16);
  auto weight32 = weight16.as_type(dtype::float32);
  auto plain16 = weight16.copy();
  for (int step = 0; step < steps; ++step) {
    auto grad16 =
        ndarray::random_normal(0, 1, {n}, static_cast<std::uint64_t>(step)).as_type(dtype::float16);
    mixed(3, grad16, weight16);
    reference(3, grad16.as_type(dtype::float32), weight32);
    plain(3, grad16, plain16);
  }
  return {weight16.to_vector<float>(), weight32.as_type(dtype::float16).to_vector<float>(),
          plain16.to_vector<float>()};
}

} // namespace

BOOST_AUTO_TEST_CASE(multi_precision_trains_a_float16_weight_as_float32_rounded_bit_for_bit) {
  const std::vector<std::pair<std::string, optimizer_params>> settings{
      {"test", {{"rescale_grad", 0.001}}},
      {"sgd", {{"learning_rate", 0.001}, {"momentum", 0.9}, {"wd", 0.001}}},
      {"nag", {{"learning_rate", 0.001}, {"momentum", 0.9}}},
      {"adam", {{"learning_rate", 0.0005}}},
      {"rmsprop", {{"learning_rate", 0.0005}, {"centered", 1}}},
      {"adagrad", {{"learning_rate", 0.002}}}};
  for (const auto& [name, params] : settings) {
    auto result = train_half_and_single(name, params, 40);
    // The float16 weight is the float32 master rounded, step after step: what a float32 weight
    // trained on the same gradients rounds to.
    BOOST_TEST((result.mixed == result.reference_rounded), name);
    // Without the master copy, updates below float16's resolution are lost each step.
    BOOST_TEST((result.plain != result.reference_rounded), name);
  }
}

BOOST_AUTO_TEST_CASE(a_master_copy_is_saved_and_loaded_with_the_states) {
  optimizer_params params{{"learning_rate", 0.001}, {"momentum", 0.9}, {"multi_precision", 1}};
  updater original{optimizer::create("sgd", params).value()};
  auto weight = ndarray::random_normal(0, 1, {32}, 7).as_type(dtype::float16);
  auto grad = [](int step) {
    return ndarray::random_normal(0, 1, {32}, 100 + static_cast<std::uint64_t>(step))
        .as_type(dtype::float16);
  };
  for (int step = 0; step < 5; ++step)
    original(1, grad(step), weight);
  updater restored{optimizer::create("sgd").value()};
  BOOST_TEST_REQUIRE(restored.load_states(original.save_states(true)).has_value());
  BOOST_TEST(restored.optimizer().multi_precision());
  auto again = weight.copy();
  for (int step = 5; step < 10; ++step) {
    original(1, grad(step), weight);
    restored(1, grad(step), again);
  }
  BOOST_TEST((again.to_vector<float>() == weight.to_vector<float>()));
  // A states file whose weight lacks the master copy its optimizer would keep is refused only if
  // the count fits neither: the optimizer's states alone stay loadable (a float32 weight).
  updater single{optimizer::create("sgd", params).value()};
  auto weight32 = ndarray::ones({4});
  single(0, ndarray::ones({4}), weight32);
  updater loads{optimizer::create("sgd", params).value()};
  BOOST_TEST(loads.load_states(single.save_states()).has_value());
}

BOOST_AUTO_TEST_CASE(an_update_with_a_gradient_of_another_shape_throws_naming_both) {
  updater update{optimizer::create("sgd").value()};
  auto weight = ndarray::ones({2, 2});
  try {
    update(5, ndarray::ones({4}), weight);
    BOOST_FAIL("expected a shape error");
  } catch (const exception& failure) {
    BOOST_TEST(failure.error().code() == errc::shape_mismatch);
    std::string message = failure.what();
    BOOST_TEST(message.find("(4,)") != std::string::npos, message);
    BOOST_TEST(message.find("(2,2)") != std::string::npos, message);
  }
  BOOST_TEST(weight.to_vector<float>() == std::vector<float>(4, 1.0f));
}

BOOST_AUTO_TEST_CASE(states_round_trip_and_a_rejected_load_changes_nothing) {
  updater update{optimizer::create("rmsprop", {{"centered", 1}}).value()};
  auto weight = ndarray::ones({16});
  for (int step = 0; step < 3; ++step)
    update(2, ndarray::random_normal(0, 1, {16}, step), weight);
  auto saved = update.save_states(true);

  updater restored{optimizer::create("rmsprop", {{"centered", 1}}).value()};
  BOOST_TEST_REQUIRE(restored.load_states(saved).has_value());
  BOOST_TEST(restored.update_count(2) == 3);
  BOOST_TEST((restored.save_states(true) == saved));

  // Every truncation is rejected and leaves the updater as it was.
  for (std::size_t cut = 0; cut < saved.size(); cut += 7) {
    auto status = restored.load_states(std::span{saved}.first(cut));
    BOOST_TEST_REQUIRE(!status.has_value());
    BOOST_TEST(status.error().code() == errc::corrupt_data);
  }
  BOOST_TEST((restored.save_states(true) == saved));

  // States dumped with their optimizer replace a different one.
  updater other{optimizer::create("sgd").value()};
  BOOST_TEST_REQUIRE(other.load_states(saved).has_value());
  BOOST_TEST(other.optimizer().name() == "rmsprop");
}

BOOST_AUTO_TEST_CASE(
    states_loaded_for_another_shape_are_refused_at_the_update_and_nothing_changes) {
  // Saved for a (2,3) weight, loaded where weight 2 has 12 elements: the update would read past
  // the state's 6 floats.
  updater saver{optimizer::create("sgd", {{"momentum", 0.9}}).value()};
  auto small = ndarray::ones({2, 3});
  saver(2, ndarray::ones({2, 3}), small);
  updater update{optimizer::create("sgd", {{"momentum", 0.9}}).value()};
  BOOST_TEST_REQUIRE(update.load_states(saver.save_states()).has_value());
  auto weight = ndarray::ones({12});
  try {
    update(2, ndarray::ones({12}), weight);
    BOOST_FAIL("expected a shape error");
  } catch (const exception& failure) {
    BOOST_TEST(failure.error().code() == errc::shape_mismatch);
    const std::string message = failure.what();
    BOOST_TEST(message.find("optimizer state has shape (2,3), the weight (12,)") !=
                   std::string::npos,
               message);
  }
  BOOST_TEST(weight.to_vector<float>() == std::vector<float>(12, 1.0f));
  BOOST_TEST(update.update_count(2) == 1); // the loaded count, not advanced
}

BOOST_AUTO_TEST_SUITE_END()

// --- row_sparse gradients: lazy_update ---------------------------------------------------------

namespace {

/// A (6, 3) weight with distinct values.
ndarray sparse_test_weight() {
  std::vector<float> values(18);
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = 0.25f * static_cast<float>(i) - 1.5f;
  return ndarray::from_values(values, {6, 3});
}

/// A row_sparse (6, 3) gradient holding `rows`, row r's values (r + 1) * 0.5 + column * 0.1 + step.
row_sparse_array sparse_test_gradient(const std::vector<std::int64_t>& rows, int step) {
  std::vector<float> values;
  for (auto r : rows)
    for (int c = 0; c < 3; ++c)
      values.push_back(static_cast<float>(r + 1) * 0.5f + 0.1f * static_cast<float>(c) +
                       static_cast<float>(step));
  return row_sparse_array::from_rows(
             ndarray::from_values(values, {static_cast<std::int64_t>(rows.size()), 3}), rows,
             {6, 3})
      .value();
}

} // namespace

BOOST_AUTO_TEST_SUITE(lazy_update_of_row_sparse_gradients)

BOOST_AUTO_TEST_CASE(sgd_moves_only_the_rows_a_gradient_holds_weight_and_momentum) {
  // The reference: each row its own weight with its own updater state, updated when its row is in
  // the gradient: what MXNet's lazy sgd does (rows absent keep weight and momentum).
  const optimizer_params params{{"learning_rate", 0.1}, {"momentum", 0.9}, {"wd", 0.01}};
  updater lazy{optimizer::create("sgd", params).value()};
  updater per_row{optimizer::create("sgd", params).value()};
  auto weight = sparse_test_weight();
  std::vector<ndarray> rows;
  for (std::int64_t r = 0; r < 6; ++r)
    rows.push_back(weight.slice(r, r + 1).reshape({3}).copy());
  const std::vector<std::vector<std::int64_t>> steps{{1, 4}, {1, 2}, {}, {4, 5}};
  for (std::size_t step = 0; step < steps.size(); ++step) {
    const auto grad = sparse_test_gradient(steps[step], static_cast<int>(step));
    lazy.update_rows(7, grad, weight);
    const auto dense = grad.to_dense();
    for (auto r : steps[step])
      per_row(r, dense.slice(r, r + 1).reshape({3}).copy(), rows[static_cast<std::size_t>(r)]);
    std::vector<float> expected;
    for (const auto& row : rows)
      for (float v : row.to_vector<float>())
        expected.push_back(v);
    BOOST_TEST(weight.to_vector<float>() == expected, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(adam_moves_only_the_rows_a_gradient_holds) {
  const optimizer_params params{{"learning_rate", 0.01}};
  updater lazy{optimizer::create("adam", params).value()};
  updater per_row{optimizer::create("adam", params).value()};
  auto weight = sparse_test_weight();
  const auto before = weight.to_vector<float>();
  std::vector<ndarray> rows;
  for (std::int64_t r = 0; r < 6; ++r)
    rows.push_back(weight.slice(r, r + 1).reshape({3}).copy());
  // The same rows every step, so that Adam's t (the weight's update count) is each row's too.
  for (int step = 0; step < 3; ++step) {
    const auto grad = sparse_test_gradient({0, 3}, step);
    lazy.update_rows(2, grad, weight);
    const auto dense = grad.to_dense();
    for (std::int64_t r : {0, 3})
      per_row(r, dense.slice(r, r + 1).reshape({3}).copy(), rows[static_cast<std::size_t>(r)]);
  }
  const auto after = weight.to_vector<float>();
  for (std::size_t r = 0; r < 6; ++r)
    for (std::size_t c = 0; c < 3; ++c) {
      const float want = (r == 0 || r == 3) ? rows[r].to_vector<float>()[c] : before[r * 3 + c];
      BOOST_TEST(after[r * 3 + c] == want, "row " << r << " column " << c);
    }
}

BOOST_AUTO_TEST_CASE(without_lazy_update_the_dense_rule_moves_every_row) {
  // lazy_update false (and an optimizer without it) is the dense update of the gradient made
  // dense: wd and momentum move the absent rows too.
  for (const auto& [name, params] : std::vector<std::pair<std::string, optimizer_params>>{
           {"sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}, {"wd", 0.01}, {"lazy_update", 0}}},
           {"rmsprop", {{"learning_rate", 0.01}}}}) {
    updater sparse{optimizer::create(name, params).value()};
    updater dense{optimizer::create(name, params).value()};
    auto a = sparse_test_weight();
    auto b = sparse_test_weight();
    for (int step = 0; step < 3; ++step) {
      const auto grad = sparse_test_gradient({static_cast<std::int64_t>(step), 5}, step);
      sparse.update_rows(1, grad, a);
      dense(1, grad.to_dense(), b);
    }
    BOOST_TEST(a.to_vector<float>() == b.to_vector<float>(), boost::test_tools::per_element());
    if (name == "sgd") // wd moves row 3, which no gradient held
      BOOST_TEST(a.to_vector<float>()[9] != sparse_test_weight().to_vector<float>()[9]);
  }
  BOOST_TEST(!optimizer::create("sgd", {{"lazy_update", 2}}).has_value());
  BOOST_TEST(!optimizer::create("rmsprop", {{"lazy_update", 1}}).has_value());
}

BOOST_AUTO_TEST_SUITE_END()
