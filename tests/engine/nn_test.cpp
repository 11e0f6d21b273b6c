// Gluon-style blocks: naming and parameter collection, deferred initialisation, initializers,
// parameter files, and hybridization giving bit-identical outputs and gradients to imperative
// execution (MLP, LeNet, Dropout) without retracing.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/autograd.hpp"
#include "engine/nd.hpp"
#include "engine/nn/block.hpp"
#include "engine/nn/initializer.hpp"
#include "engine/op.hpp"
#include "engine_test_support.hpp"
#include "tests/temp_dir.hpp"

namespace troupe {
namespace {

using test::require_error;

std::vector<float> host(const ndarray& array) {
  return array.to_vector<float>();
}

/// The number in a generated prefix ("dense12_" -> 12).
int prefix_number(const std::string& prefix, const std::string& alias) {
  BOOST_TEST_REQUIRE(prefix.rfind(alias, 0) == 0u);
  return std::stoi(prefix.substr(alias.size()));
}

std::vector<std::string> names_of(const nn::parameter_list& params) {
  std::vector<std::string> names;
  for (auto& param : params)
    names.push_back(param->name());
  return names;
}

double mean_of(const std::vector<float>& values) {
  double sum = 0;
  for (float v : values)
    sum += v;
  return sum / static_cast<double>(values.size());
}

double stddev_of(const std::vector<float>& values) {
  double mean = mean_of(values), sum = 0;
  for (float v : values)
    sum += (v - mean) * (v - mean);
  return std::sqrt(sum / static_cast<double>(values.size()));
}

/// The values of every parameter, in collect_params() order.
std::vector<std::vector<float>> parameter_values(const nn::block& net) {
  std::vector<std::vector<float>> values;
  for (auto& param : net.collect_params())
    values.push_back(host(param->data()));
  return values;
}

std::shared_ptr<nn::sequential> make_mlp(double dropout_rate = 0.0) {
  auto net = std::make_shared<nn::sequential>();
  net->add(std::make_shared<nn::dense>(256, "relu"));
  if (dropout_rate > 0)
    net->add(std::make_shared<nn::dropout>(dropout_rate));
  net->add(std::make_shared<nn::dense>(10));
  return net;
}

std::shared_ptr<nn::sequential> make_lenet(double dropout_rate = 0.0) {
  auto net = std::make_shared<nn::sequential>();
  net->add(std::make_shared<nn::conv2d>(6, std::array<std::int64_t, 2>{5, 5}))
      .add(std::make_shared<nn::activation>("relu"))
      .add(std::make_shared<nn::max_pool2d>())
      .add(std::make_shared<nn::conv2d>(16, std::array<std::int64_t, 2>{5, 5}))
      .add(std::make_shared<nn::activation>("relu"))
      .add(std::make_shared<nn::max_pool2d>())
      .add(std::make_shared<nn::flatten>())
      .add(std::make_shared<nn::dense>(120, "relu"));
  if (dropout_rate > 0)
    net->add(std::make_shared<nn::dropout>(dropout_rate));
  net->add(std::make_shared<nn::dense>(10));
  return net;
}

/// Labels in [0, 10) as floats, deterministic.
ndarray make_labels(std::int64_t batch) {
  std::vector<float> labels;
  for (std::int64_t i = 0; i < batch; ++i)
    labels.push_back(static_cast<float>((i * 7 + 3) % 10));
  return ndarray::from_values(labels, {batch});
}

/// What one training step computes: the output, the loss and every parameter's gradient.
struct step_result {
  std::vector<float> output;
  double loss = 0;
  std::vector<std::vector<float>> grads;
};

step_result training_step(nn::block& net, const ndarray& x, const ndarray& labels,
                          std::uint64_t operator_seed = 11) {
  seed_operators(operator_seed);
  step_result result;
  {
    autograd::record_scope record;
    ndarray out = net(x);
    ndarray loss = nd::sum(nd::softmax_cross_entropy(out, labels));
    loss.backward();
    result.output = host(out);
    result.loss = loss.as_scalar();
  }
  for (auto& param : net.collect_params())
    result.grads.push_back(host(param->grad()));
  return result;
}

void require_identical(const step_result& expected, const step_result& actual,
                       const std::string& what) {
  BOOST_TEST_CONTEXT(what) {
    BOOST_TEST(actual.output == expected.output);
    BOOST_TEST(actual.loss == expected.loss);
    BOOST_TEST_REQUIRE(actual.grads.size() == expected.grads.size());
    for (std::size_t i = 0; i < expected.grads.size(); ++i)
      BOOST_TEST(actual.grads[i] == expected.grads[i], "gradient of parameter " << i);
  }
}

/// Imperative steps, then the same steps hybridized: the trace call, then two executor calls.
void check_hybridized_matches_imperative(nn::block& net, const ndarray& x, const ndarray& labels) {
  auto imperative = training_step(net, x, labels);
  auto imperative_inference = host(net(x));
  BOOST_TEST_REQUIRE(!imperative.grads.empty());
  // Every gradient takes part: a check that all parameters were reached.
  for (auto& grad : imperative.grads)
    BOOST_TEST(std::any_of(grad.begin(), grad.end(), [](float g) { return g != 0.0f; }));

  net.hybridize();
  require_identical(imperative, training_step(net, x, labels), "first hybridized call (trace)");
  BOOST_TEST(net.trace_count() == 1u);
  require_identical(imperative, training_step(net, x, labels), "second hybridized call");
  require_identical(imperative, training_step(net, x, labels), "third hybridized call");
  BOOST_TEST(net.trace_count() == 1u);
  BOOST_TEST(host(net(x)) == imperative_inference);
  BOOST_TEST(host(net(x)) == imperative_inference);
  BOOST_TEST(net.trace_count() == 2u); // predict mode is a graph of its own
}

} // namespace

BOOST_AUTO_TEST_SUITE(nn_blocks)

BOOST_AUTO_TEST_CASE(blocks_are_named_by_kind_with_a_counter_per_kind) {
  auto first = std::make_shared<nn::dense>(4);
  auto second = std::make_shared<nn::dense>(4);
  auto conv = std::make_shared<nn::conv2d>(2, std::array<std::int64_t, 2>{3, 3});
  auto relu = std::make_shared<nn::activation>("relu");
  BOOST_TEST(prefix_number(second->prefix(), "dense") ==
             prefix_number(first->prefix(), "dense") + 1);
  BOOST_TEST(conv->prefix().rfind("conv", 0) == 0u);
  BOOST_TEST(relu->prefix().rfind("relu", 0) == 0u);
  BOOST_TEST(first->prefix().back() == '_');
  BOOST_TEST(first->name() + "_" == first->prefix());
  BOOST_TEST(first->weight()->name() == first->prefix() + "weight");
  BOOST_TEST(first->bias()->name() == first->prefix() + "bias");

  auto named = std::make_shared<nn::dense>(4, "", true, 0, true, nullptr, "classifier_");
  BOOST_TEST(named->prefix() == "classifier_");
  BOOST_TEST(named->weight()->name() == "classifier_weight");
  BOOST_TEST(std::make_shared<nn::dense>(4, "", false)->bias() == nullptr);
}

BOOST_AUTO_TEST_CASE(collect_params_lists_own_parameters_then_children_in_registration_order) {
  auto net = std::make_shared<nn::sequential>("net_");
  auto inner = std::make_shared<nn::sequential>("inner_");
  inner->add(std::make_shared<nn::dense>(3, "", false, 0, true, nullptr, "b_"));
  net->add(std::make_shared<nn::conv2d>(
               2, std::array<std::int64_t, 2>{3, 3}, std::array<std::int64_t, 2>{1, 1},
               std::array<std::int64_t, 2>{0, 0}, "", true, 0, nullptr, "a_"))
      .add(std::make_shared<nn::max_pool2d>())
      .add(inner)
      .add(std::make_shared<nn::dense>(5, "", true, 0, true, nullptr, "c_"));
  BOOST_TEST(names_of(net->collect_params()) ==
                 (std::vector<std::string>{"a_weight", "a_bias", "b_weight", "c_weight", "c_bias"}),
             boost::test_tools::per_element());
  BOOST_TEST(net->params().empty());
  BOOST_TEST(net->size() == 4u);

  // A child registered twice is collected once; two parameters of one name are an error.
  auto shared = std::make_shared<nn::dense>(3, "", true, 0, true, nullptr, "s_");
  auto twice = std::make_shared<nn::sequential>();
  twice->add(shared).add(shared);
  BOOST_TEST(twice->collect_params().size() == 2u);
  auto clash = std::make_shared<nn::sequential>();
  clash->add(std::make_shared<nn::dense>(3, "", true, 0, true, nullptr, "x_"))
      .add(std::make_shared<nn::dense>(3, "", true, 0, true, nullptr, "x_"));
  require_error([&] { (void)clash->collect_params(); }, errc::invalid_argument, "x_weight");
  require_error([&] { (void)net->at(4); }, errc::invalid_argument, "child 4 of 4");
}

BOOST_AUTO_TEST_CASE(deferred_initialization_completes_shapes_at_the_first_forward) {
  auto fc = std::make_shared<nn::dense>(10);
  BOOST_TEST(fc->weight()->shape() == (shape_vector{10, 0}));
  fc->initialize();
  BOOST_TEST(!fc->weight()->is_initialized());
  BOOST_TEST(fc->bias()->is_initialized()); // its shape is known
  require_error([&] { (void)fc->weight()->data(); }, errc::invalid_argument, fc->weight()->name());
  auto y = (*fc)(ndarray::ones({4, 3, 5}));
  BOOST_TEST(fc->weight()->shape() == (shape_vector{10, 15}));
  BOOST_TEST(fc->weight()->is_initialized());
  BOOST_TEST(y.shape() == (shape_vector{4, 10}));

  auto last_axis = std::make_shared<nn::dense>(6, "", true, 0, false);
  last_axis->initialize();
  BOOST_TEST((*last_axis)(ndarray::ones({4, 7, 5})).shape() == (shape_vector{4, 7, 6}));
  BOOST_TEST(last_axis->weight()->shape() == (shape_vector{6, 5}));

  auto conv = std::make_shared<nn::conv2d>(6, std::array<std::int64_t, 2>{5, 5},
                                           std::array<std::int64_t, 2>{1, 1},
                                           std::array<std::int64_t, 2>{2, 2});
  conv->initialize();
  BOOST_TEST((*conv)(ndarray::ones({2, 3, 28, 28})).shape() == (shape_vector{2, 6, 28, 28}));
  BOOST_TEST(conv->weight()->shape() == (shape_vector{6, 3, 5, 5}));

  auto lenet = make_lenet();
  lenet->initialize(std::make_shared<nn::xavier>());
  BOOST_TEST((*lenet)(ndarray::ones({2, 1, 28, 28})).shape() == (shape_vector{2, 10}));
  std::vector<shape_vector> shapes;
  for (auto& param : lenet->collect_params())
    shapes.push_back(param->shape());
  BOOST_TEST(shapes ==
             (std::vector<shape_vector>{
                 {6, 1, 5, 5}, {6}, {16, 6, 5, 5}, {16}, {120, 256}, {120}, {10, 120}, {10}}));

  // A shape that contradicts the declared one is an error naming the parameter.
  require_error(
      [&] {
        fc->weight()->finish_shape({10, 16});
      },
      errc::shape_mismatch, fc->weight()->name());
  BOOST_CHECK_THROW((*fc)(ndarray::ones({4, 16})), exception);
}

BOOST_AUTO_TEST_CASE(initializing_twice_is_an_error_unless_forced_which_writes_in_place) {
  auto fc = std::make_shared<nn::dense>(3, "", true, 2);
  fc->initialize(std::make_shared<nn::constant>(0.5));
  BOOST_TEST(host(fc->weight()->data()) == std::vector<float>(6, 0.5f));
  require_error([&] { fc->initialize(); }, errc::already_initialized, fc->weight()->name());
  ndarray before = fc->weight()->data();
  fc->initialize(std::make_shared<nn::constant>(2.0), nn::default_contexts, 0, true);
  BOOST_TEST(fc->weight()->data().shares_storage_with(before));
  BOOST_TEST(host(before) == std::vector<float>(6, 2.0f));
}

BOOST_AUTO_TEST_CASE(every_context_holds_the_same_values_and_others_are_an_error) {
  auto fc = std::make_shared<nn::dense>(8, "", true, 5);
  std::vector<context> contexts{context::cpu(0), context::cpu(1)};
  fc->initialize(nullptr, contexts, 4);
  BOOST_TEST(host(fc->weight()->data(context::cpu(0))) ==
             host(fc->weight()->data(context::cpu(1))));
  BOOST_TEST(!fc->weight()
                  ->data(context::cpu(0))
                  .shares_storage_with(fc->weight()->data(context::cpu(1))));
  BOOST_TEST(fc->weight()->list_data().size() == 2u);
  BOOST_TEST(fc->weight()->list_grad().size() == 2u);
  require_error([&] { (void)fc->weight()->data(context::cpu(2)); }, errc::context_mismatch,
                "cpu(2)");
  BOOST_TEST((*fc)(ndarray::ones({2, 5}, context::cpu(1))).ctx() == context::cpu(1));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(nn_initializers)

BOOST_AUTO_TEST_CASE(uniform_fills_the_half_open_range_evenly) {
  auto values = ndarray::empty({100000});
  nn::uniform{0.07}.init_weight("w", values, 1);
  auto v = host(values);
  BOOST_TEST(std::all_of(v.begin(), v.end(), [](float x) { return x >= -0.07f && x < 0.07f; }));
  BOOST_TEST(*std::min_element(v.begin(), v.end()) < -0.0699f);
  BOOST_TEST(*std::max_element(v.begin(), v.end()) > 0.0699f);
  BOOST_TEST(std::abs(mean_of(v)) < 0.001);
  // The standard deviation of U(-s, s) is s/sqrt(3).
  BOOST_TEST(stddev_of(v) == 0.07 / std::sqrt(3.0), boost::test_tools::tolerance(0.01));
}

BOOST_AUTO_TEST_CASE(normal_has_the_requested_standard_deviation) {
  auto values = ndarray::empty({100000});
  nn::normal{0.01}.init_weight("w", values, 2);
  auto v = host(values);
  BOOST_TEST(std::abs(mean_of(v)) < 0.0002);
  BOOST_TEST(stddev_of(v) == 0.01, boost::test_tools::tolerance(0.02));
}

BOOST_AUTO_TEST_CASE(xavier_scales_by_mxnets_fans) {
  // Dense weight [256, 784]: magnitude 3, avg -> bound sqrt(3 * 2 / (784 + 256)).
  auto dense_weight = ndarray::empty({256, 784});
  nn::xavier{}.init_weight("fc_weight", dense_weight, 3);
  auto v = host(dense_weight);
  double bound = std::sqrt(3.0 * 2.0 / (784.0 + 256.0));
  BOOST_TEST(std::all_of(v.begin(), v.end(),
                         [&](float x) { return std::abs(x) <= static_cast<float>(bound); }));
  BOOST_TEST(*std::max_element(v.begin(), v.end()) > 0.999 * bound);
  BOOST_TEST(stddev_of(v) == bound / std::sqrt(3.0), boost::test_tools::tolerance(0.01));

  // Convolution weight [16, 6, 5, 5]: fan_in 6·25, fan_out 16·25.
  auto conv_weight = ndarray::empty({16, 6, 5, 5});
  nn::xavier{}.init_weight("conv_weight", conv_weight, 3);
  auto c = host(conv_weight);
  double conv_bound = std::sqrt(3.0 * 2.0 / (150.0 + 400.0));
  BOOST_TEST(*std::max_element(c.begin(), c.end()) <= static_cast<float>(conv_bound));
  BOOST_TEST(*std::max_element(c.begin(), c.end()) > 0.99 * conv_bound);

  // Gaussian with factor "in": standard deviation sqrt(magnitude / fan_in).
  auto gaussian = ndarray::empty({256, 784});
  nn::xavier{nn::xavier::rnd_type::gaussian, nn::xavier::factor_type::in, 2.0}.init_weight(
      "g_weight", gaussian, 3);
  BOOST_TEST(stddev_of(host(gaussian)) == std::sqrt(2.0 / 784.0),
             boost::test_tools::tolerance(0.02));
  auto out = ndarray::empty({256, 784});
  nn::xavier{nn::xavier::rnd_type::uniform, nn::xavier::factor_type::out}.init_weight("o_weight",
                                                                                      out, 3);
  auto o = host(out);
  BOOST_TEST(*std::max_element(o.begin(), o.end()) <= static_cast<float>(std::sqrt(3.0 / 256.0)));
  BOOST_TEST(*std::max_element(o.begin(), o.end()) > 0.99 * std::sqrt(3.0 / 256.0));

  auto vector = ndarray::empty({10});
  require_error([&] { nn::xavier{}.init_weight("fc_bias_like", vector, 0); },
                errc::invalid_argument, "fc_bias_like");
}

BOOST_AUTO_TEST_CASE(the_default_rule_dispatches_on_the_parameter_name_as_mxnet_does) {
  nn::uniform init{1.0};
  auto bias = ndarray::full({5}, 9.0);
  init.fill("dense0_bias", bias, 1);
  BOOST_TEST(host(bias) == std::vector<float>(5, 0.0f));
  auto gamma = ndarray::full({5}, 9.0);
  init.fill("bn0_gamma", gamma, 1);
  BOOST_TEST(host(gamma) == std::vector<float>(5, 1.0f));
  auto beta = ndarray::full({5}, 9.0);
  init.fill("bn0_beta", beta, 1);
  BOOST_TEST(host(beta) == std::vector<float>(5, 0.0f));
  auto weight = ndarray::full({5}, 9.0);
  nn::constant{0.25}.fill("dense0_weight", weight, 1);
  BOOST_TEST(host(weight) == std::vector<float>(5, 0.25f));

  // A network's biases start at zero whatever the default initializer.
  auto net = make_mlp();
  net->initialize(std::make_shared<nn::constant>(3.0));
  (*net)(ndarray::ones({2, 784}));
  for (auto& param : net->collect_params()) {
    auto v = host(param->data());
    bool is_bias = param->name().ends_with("bias");
    BOOST_TEST(std::all_of(v.begin(), v.end(), [&](float x) { return x == (is_bias ? 0 : 3); }),
               param->name());
  }
}

BOOST_AUTO_TEST_CASE(a_seed_reproduces_every_value_and_parameters_differ) {
  auto build = [](std::uint64_t seed) {
    auto net = std::make_shared<nn::sequential>("seeded_");
    net->add(std::make_shared<nn::dense>(16, "relu", true, 16, true, nullptr, "first_"))
        .add(std::make_shared<nn::dense>(16, "", true, 16, true, nullptr, "second_"));
    net->initialize(std::make_shared<nn::xavier>(), nn::default_contexts, seed);
    return parameter_values(*net);
  };
  auto seven = build(7);
  BOOST_TEST(build(7) == seven);
  BOOST_TEST(build(8)[0] != seven[0]);
  BOOST_TEST(seven[0] != seven[2]); // first_weight and second_weight: same shape, other values
  // Two kinds of random initializer with the same seed agree run to run too.
  auto normal_a = ndarray::empty({100});
  auto normal_b = ndarray::empty({100});
  nn::normal{}.init_weight("w", normal_a, 5);
  nn::normal{}.init_weight("w", normal_b, 5);
  BOOST_TEST(host(normal_a) == host(normal_b));
  BOOST_TEST(nn::initializer::seed_for("a", 1) != nn::initializer::seed_for("b", 1));
  BOOST_TEST(nn::initializer::seed_for("a", 1) != nn::initializer::seed_for("a", 2));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(nn_parameter_files)

namespace {

std::shared_ptr<nn::sequential> small_net(std::int64_t in_units, bool use_bias = true) {
  auto net = std::make_shared<nn::sequential>("file_");
  net->add(std::make_shared<nn::dense>(8, "relu", true, in_units, true, nullptr, "hidden_"))
      .add(std::make_shared<nn::dense>(3, "", use_bias, 0, true, nullptr, "out_"));
  return net;
}

/// Initialised and run once, so that every shape is complete.
std::shared_ptr<nn::sequential> ready_net(std::uint64_t seed, std::int64_t in_units = 5,
                                          bool use_bias = true) {
  auto net = small_net(in_units, use_bias);
  net->initialize(std::make_shared<nn::normal>(1.0), nn::default_contexts, seed);
  (*net)(ndarray::ones({1, in_units}));
  return net;
}

std::string read_bytes(const std::filesystem::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

} // namespace

BOOST_AUTO_TEST_CASE(save_then_load_restores_every_value_bit_for_bit) {
  testing::temp_dir dir;
  auto path = (dir / "net.params").string();
  auto saved = ready_net(1);
  saved->save_parameters(path).value();

  auto loaded = ready_net(2);
  BOOST_TEST(parameter_values(*loaded) != parameter_values(*saved));
  ndarray weight_before = loaded->collect_params()[0]->data();
  loaded->load_parameters(path).value();
  BOOST_TEST(parameter_values(*loaded) == parameter_values(*saved));
  // Into the existing arrays: whoever holds them (an executor, an optimizer) sees the values.
  BOOST_TEST(weight_before.shares_storage_with(loaded->collect_params()[0]->data()));

  // A network never run completes its deferred shapes from the file.
  auto fresh = small_net(0);
  fresh->load_parameters(path).value();
  BOOST_TEST(parameter_values(*fresh) == parameter_values(*saved));
  BOOST_TEST(host((*fresh)(ndarray::ones({2, 5}))) == host((*saved)(ndarray::ones({2, 5}))));

  // Onto other contexts.
  auto elsewhere = small_net(0);
  std::vector<context> two{context::cpu(1), context::cpu(2)};
  elsewhere->load_parameters(path, two).value();
  for (auto& param : elsewhere->collect_params())
    BOOST_TEST(param->list_ctx() == two);
  BOOST_TEST(host(elsewhere->collect_params()[2]->data(context::cpu(2))) ==
             parameter_values(*saved)[2]);
}

BOOST_AUTO_TEST_CASE(load_errors_name_the_parameter_and_the_file_and_change_nothing) {
  testing::temp_dir dir;
  auto path = (dir / "net.params").string();
  ready_net(1)->save_parameters(path).value();

  auto expect_failure = [&](nn::block& net, const std::string& file, errc code,
                            const std::string& fragment) {
    auto before = parameter_values(net);
    auto loaded = net.load_parameters(file);
    BOOST_TEST_REQUIRE(!loaded.has_value());
    BOOST_TEST(to_string(loaded.error().code()) == to_string(code));
    BOOST_TEST(loaded.error().message().find(fragment) != std::string::npos,
               loaded.error().message());
    BOOST_TEST(loaded.error().message().find(file) != std::string::npos, loaded.error().message());
    BOOST_TEST(parameter_values(net) == before);
  };

  auto wider = ready_net(3, 6);
  expect_failure(*wider, path, errc::shape_mismatch, "hidden_weight");

  auto no_bias = ready_net(3, 5, false);
  auto no_bias_path = (dir / "no_bias.params").string();
  no_bias->save_parameters(no_bias_path).value();
  auto with_bias = ready_net(4);
  expect_failure(*with_bias, no_bias_path, errc::invalid_argument, "out_bias");
  expect_failure(*no_bias, path, errc::invalid_argument, "out_bias");

  auto bytes = read_bytes(path);
  auto truncated = dir.write("truncated.params", bytes.substr(0, bytes.size() - 7)).string();
  expect_failure(*with_bias, truncated, errc::corrupt_data, "");
  auto garbage = dir.write("garbage.params", "not parameters at all").string();
  expect_failure(*with_bias, garbage, errc::corrupt_data, "");
  auto trailing = dir.write("trailing.params", bytes + "x").string();
  expect_failure(*with_bias, trailing, errc::corrupt_data, "after the last parameter");

  auto missing = with_bias->load_parameters((dir / "absent.params").string());
  BOOST_TEST_REQUIRE(!missing.has_value());
  BOOST_TEST(missing.error().message().find("absent.params") != std::string::npos);

  auto uninitialized = small_net(5);
  auto not_saved = uninitialized->save_parameters((dir / "x.params").string());
  BOOST_TEST_REQUIRE(!not_saved.has_value());
  BOOST_TEST(not_saved.error().message().find("hidden_weight") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(nn_hybridize)

BOOST_AUTO_TEST_CASE(a_hybridized_mlp_gives_the_imperative_outputs_and_gradients_bit_for_bit) {
  auto net = make_mlp();
  net->initialize(std::make_shared<nn::xavier>(), nn::default_contexts, 3);
  auto x = ndarray::random_normal(0, 1, {32, 784}, 21);
  check_hybridized_matches_imperative(*net, x, make_labels(32));
}

BOOST_AUTO_TEST_CASE(a_hybridized_lenet_gives_the_imperative_outputs_and_gradients_bit_for_bit) {
  auto net = make_lenet();
  net->initialize(std::make_shared<nn::xavier>(), nn::default_contexts, 4);
  auto x = ndarray::random_normal(0, 1, {8, 1, 28, 28}, 22);
  check_hybridized_matches_imperative(*net, x, make_labels(8));
}

BOOST_AUTO_TEST_CASE(dropout_masks_are_the_same_hybridized_under_the_same_operator_seed) {
  for (auto* make : {&make_mlp, &make_lenet}) {
    auto net = (*make)(0.5);
    net->initialize(std::make_shared<nn::xavier>(), nn::default_contexts, 5);
    bool lenet = make == &make_lenet;
    auto x = lenet ? ndarray::random_normal(0, 1, {8, 1, 28, 28}, 23)
                   : ndarray::random_normal(0, 1, {16, 784}, 23);
    auto labels = make_labels(x.shape()[0]);
    auto imperative = training_step(*net, x, labels, 99);
    // The mask depends on the seed: the check below is not vacuous.
    BOOST_TEST(training_step(*net, x, labels, 100).output != imperative.output);
    net->hybridize();
    require_identical(imperative, training_step(*net, x, labels, 99), "trace call");
    require_identical(imperative, training_step(*net, x, labels, 99), "executor call");
    BOOST_TEST(net->trace_count() == 1u);
  }
}

BOOST_AUTO_TEST_CASE(a_hybridized_block_traces_once_per_shape_and_mode) {
  auto net = make_mlp();
  net->initialize();
  net->hybridize();
  BOOST_TEST(net->trace_count() == 0u);
  for (int i = 0; i < 4; ++i)
    (*net)(ndarray::ones({4, 784}));
  BOOST_TEST(net->trace_count() == 1u);
  (*net)(ndarray::ones({6, 784})); // another batch size
  (*net)(ndarray::ones({6, 784}));
  BOOST_TEST(net->trace_count() == 2u);
  {
    autograd::training_scope train(true);
    (*net)(ndarray::ones({4, 784}));
    (*net)(ndarray::ones({4, 784}));
  }
  BOOST_TEST(net->trace_count() == 3u);
  // The children are part of the parent's graph: none of them traced.
  for (auto& child : net->children())
    BOOST_TEST(child->trace_count() == 0u);
  net->hybridize(); // drops the cache
  (*net)(ndarray::ones({4, 784}));
  BOOST_TEST(net->trace_count() == 4u);
  net->hybridize(false);
  (*net)(ndarray::ones({4, 784}));
  BOOST_TEST(net->trace_count() == 4u);
}

BOOST_AUTO_TEST_CASE(the_executor_computes_with_parameters_updated_in_place) {
  auto net = make_mlp();
  net->initialize(std::make_shared<nn::xavier>(), nn::default_contexts, 6);
  auto x = ndarray::random_normal(0, 1, {4, 784}, 24);
  net->hybridize();
  (*net)(x);
  (*net)(x);
  auto weight = net->collect_params()[2]; // the second layer's weight
  weight->set_data(ndarray::random_normal(0, 1, weight->shape(), 25));
  weight->data() *= 0.5; // as an optimizer writes: in place
  auto hybridized = host((*net)(x));
  net->hybridize(false);
  BOOST_TEST(hybridized == host((*net)(x)));
}

BOOST_AUTO_TEST_CASE(gradients_flow_through_a_hybridized_child_to_the_layers_before_it) {
  auto net = std::make_shared<nn::sequential>();
  auto tail = make_mlp();
  net->add(std::make_shared<nn::dense>(64, "tanh")).add(tail);
  net->initialize(std::make_shared<nn::xavier>(), nn::default_contexts, 7);
  auto x = ndarray::random_normal(0, 1, {8, 100}, 26);
  auto labels = make_labels(8);
  auto imperative = training_step(*net, x, labels);
  tail->hybridize(); // only the tail: its input carries history from the first layer
  require_identical(imperative, training_step(*net, x, labels), "trace call");
  require_identical(imperative, training_step(*net, x, labels), "executor call");
  BOOST_TEST(tail->trace_count() == 1u);
  BOOST_TEST(net->trace_count() == 0u);
}

BOOST_AUTO_TEST_CASE(two_recorded_calls_before_backward_keep_their_own_state) {
  auto net = make_mlp(0.3);
  net->initialize(std::make_shared<nn::xavier>(), nn::default_contexts, 8);
  auto x1 = ndarray::random_normal(0, 1, {8, 784}, 27);
  auto x2 = ndarray::random_normal(0, 1, {8, 784}, 28);
  auto labels = make_labels(8);
  auto step = [&] {
    seed_operators(5);
    step_result result;
    {
      autograd::record_scope record;
      auto out1 = (*net)(x1);
      auto out2 = (*net)(x2);
      auto loss = nd::add(nd::sum(nd::softmax_cross_entropy(out1, labels)),
                          nd::sum(nd::softmax_cross_entropy(out2, labels)));
      loss.backward();
      result.output = host(out2);
      result.loss = loss.as_scalar();
    }
    for (auto& param : net->collect_params())
      result.grads.push_back(host(param->grad()));
    return result;
  };
  auto imperative = step();
  net->hybridize();
  step(); // traces
  for (auto* what : {"executor calls", "executor calls again"}) {
    BOOST_TEST_CONTEXT(what) {
      auto hybridized = step();
      BOOST_TEST(hybridized.output == imperative.output);
      BOOST_TEST(hybridized.loss == imperative.loss);
      // Each parameter gets two contributions here. Imperatively the second is added by the
      // operator's backward in add mode, which accumulates a bias gradient row by row onto the
      // first (kernels/cpu/nn.cpp); a recorded executor step hands autograd its own sum, which is
      // then added: the same numbers in another order, equal to rounding.
      BOOST_TEST_REQUIRE(hybridized.grads.size() == imperative.grads.size());
      for (std::size_t p = 0; p < imperative.grads.size(); ++p) {
        BOOST_TEST_REQUIRE(hybridized.grads[p].size() == imperative.grads[p].size());
        for (std::size_t i = 0; i < imperative.grads[p].size(); ++i) {
          float expected = imperative.grads[p][i];
          BOOST_TEST(std::abs(hybridized.grads[p][i] - expected) <=
                         1e-5f * (1.0f + std::abs(expected)),
                     "parameter " << p << " element " << i);
        }
      }
    }
  }
  BOOST_TEST(net->trace_count() == 1u);
}

BOOST_AUTO_TEST_CASE(recording_in_predict_mode_still_differentiates) {
  auto net = make_mlp(0.5);
  net->initialize(std::make_shared<nn::xavier>(), nn::default_contexts, 9);
  auto x = ndarray::random_normal(0, 1, {4, 784}, 29);
  auto labels = make_labels(4);
  auto step = [&] {
    step_result result;
    autograd::record_scope record(false);
    auto out = (*net)(x);
    auto loss = nd::sum(nd::softmax_cross_entropy(out, labels));
    loss.backward();
    result.output = host(out);
    for (auto& param : net->collect_params())
      result.grads.push_back(host(param->grad()));
    return result;
  };
  auto imperative = step();
  net->hybridize();
  require_identical(imperative, step(), "first call");
  require_identical(imperative, step(), "second call");
}

BOOST_AUTO_TEST_SUITE_END()

} // namespace troupe
