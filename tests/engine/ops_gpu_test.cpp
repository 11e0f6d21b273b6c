// Every operator, and every optimizer's update, on gpu(0) against the same on cpu(0): the forward
// values and the gradients (or updated weights and states) must agree within float tolerance.
// Each case runs only where a GPU is present and is reported as skipped elsewhere; the no-GPU
// behaviour (a clear error naming the device) is checked by the cases at the end, which run
// everywhere.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/autograd.hpp"
#include "engine/nd.hpp"
#include "engine/ndarray.hpp"
#include "engine/op.hpp"
#include "engine/optimizer.hpp"
#include "engine_test_support.hpp"

namespace troupe {
namespace {

const context gpu = context::gpu(0);

/// Values in [-1, 1] from a fixed seed, so that a failure reproduces.
ndarray random_values(shape_vector shape, std::uint64_t seed) {
  return ndarray::random_uniform(-1.0, 1.0, std::move(shape), seed);
}

/// A model of some operators: its inputs (host arrays, each given a gradient) and the loss it
/// computes from them on their context.
struct graph {
  std::vector<ndarray> inputs;
  std::function<std::vector<ndarray>(const std::vector<ndarray>&)> outputs;
};

struct results {
  std::vector<std::vector<float>> outputs;
  std::vector<std::vector<float>> gradients;
};

/// Runs `g` on `ctx`: the inputs copied there, every output's sum backpropagated, and the outputs
/// and input gradients brought back to the host.
results run_on(const graph& g, context ctx, std::uint64_t operator_seed) {
  std::vector<ndarray> inputs;
  for (const auto& host : g.inputs) {
    inputs.push_back(host.copy_to(ctx));
    inputs.back().attach_grad();
  }
  seed_operators(operator_seed);
  std::vector<ndarray> outputs, heads;
  {
    autograd::record_scope record;
    outputs = g.outputs(inputs);
    for (const auto& out : outputs)
      heads.push_back(nd::sum(out));
  }
  autograd::backward(heads);
  results r;
  for (const auto& out : outputs)
    r.outputs.push_back(out.to_vector<float>());
  for (const auto& in : inputs)
    r.gradients.push_back(in.grad().to_vector<float>());
  return r;
}

void require_close(const std::vector<float>& gpu_values, const std::vector<float>& cpu_values,
                   const std::string& what, double tolerance = 1e-4) {
  BOOST_TEST_REQUIRE(gpu_values.size() == cpu_values.size(), what);
  for (std::size_t i = 0; i < cpu_values.size(); ++i) {
    const double expected = cpu_values[i];
    const double actual = gpu_values[i];
    if (std::abs(actual - expected) > tolerance * (1.0 + std::abs(expected))) {
      BOOST_ERROR(what << " element " << i << ": gpu " << actual << ", cpu " << expected);
      return;
    }
  }
}

void require_same_on_gpu(const graph& g, const std::string& name) {
  const results on_cpu = run_on(g, context::cpu(), 42);
  const results on_gpu = run_on(g, gpu, 42);
  for (std::size_t i = 0; i < on_cpu.outputs.size(); ++i)
    require_close(on_gpu.outputs[i], on_cpu.outputs[i], name + " output " + std::to_string(i));
  for (std::size_t i = 0; i < on_cpu.gradients.size(); ++i)
    require_close(on_gpu.gradients[i], on_cpu.gradients[i],
                  name + " gradient of input " + std::to_string(i));
}

} // namespace

BOOST_AUTO_TEST_SUITE(operators_on_a_gpu, *boost::unit_test::precondition(test::gpu_present))

BOOST_AUTO_TEST_CASE(fully_connected_with_and_without_bias_matches_the_cpu) {
  require_same_on_gpu(
      {{random_values({5, 7}, 1), random_values({3, 7}, 2), random_values({3}, 3)},
       [](const auto& in) { return std::vector{nd::fully_connected(in[0], in[1], in[2], 3)}; }},
      "FullyConnected");
  require_same_on_gpu(
      {{random_values({5, 2, 3}, 4), random_values({4, 6}, 5)},
       [](const auto& in) { return std::vector{nd::fully_connected(in[0], in[1], ndarray{}, 4)}; }},
      "FullyConnected without bias, flattened");
}

BOOST_AUTO_TEST_CASE(convolution_with_stride_and_padding_matches_the_cpu) {
  require_same_on_gpu(
      {{random_values({2, 3, 9, 8}, 6), random_values({4, 3, 3, 2}, 7), random_values({4}, 8)},
       [](const auto& in) {
         return std::vector{nd::convolution(in[0], in[1], in[2], {3, 2}, 4, {2, 1}, {1, 1})};
       }},
      "Convolution");
}

BOOST_AUTO_TEST_CASE(max_and_average_pooling_match_the_cpu) {
  for (const char* kind : {"max", "avg"})
    require_same_on_gpu({{random_values({2, 3, 7, 6}, 9)},
                         [kind](const auto& in) {
                           return std::vector{nd::pooling(in[0], {3, 2}, kind, {2, 2}, {1, 0})};
                         }},
                        std::string{"Pooling "} + kind);
}

BOOST_AUTO_TEST_CASE(every_activation_matches_the_cpu) {
  for (const char* kind : {"relu", "sigmoid", "tanh", "softrelu"})
    require_same_on_gpu(
        {{random_values({4, 33}, 10)},
         [kind](const auto& in) { return std::vector{nd::activation(in[0], kind)}; }},
        std::string{"Activation "} + kind);
}

BOOST_AUTO_TEST_CASE(dropout_draws_the_same_mask_as_the_cpu) {
  // The same operator seed gives the same mask on either device, so the values agree exactly.
  require_same_on_gpu({{random_values({8, 50}, 11)},
                       [](const auto& in) { return std::vector{nd::dropout(in[0], 0.3)}; }},
                      "Dropout");
}

BOOST_AUTO_TEST_CASE(softmax_cross_entropy_matches_the_cpu_and_checks_labels) {
  const auto labels = ndarray::from_values({0, 3, 1, 2, 4, 0}, {6});
  require_same_on_gpu({{random_values({6, 5}, 12)},
                       [labels](const auto& in) {
                         return std::vector{
                             nd::softmax_cross_entropy(in[0], labels.copy_to(in[0].ctx()))};
                       }},
                      "SoftmaxCrossEntropy");
  const auto bad = ndarray::from_values({0, 7}, {2}).copy_to(gpu);
  BOOST_CHECK_EXCEPTION(
      nd::softmax_cross_entropy(random_values({2, 5}, 13).copy_to(gpu), bad).to_vector<float>(),
      exception, [](const exception& e) {
        return std::string{e.what()}.find("label[1] = 7") != std::string::npos;
      });
}

BOOST_AUTO_TEST_CASE(flatten_reshape_and_elementwise_operators_match_the_cpu) {
  require_same_on_gpu(
      {{random_values({3, 2, 4}, 14), random_values({3, 8}, 15), random_values({1}, 16)},
       [](const auto& in) {
         const auto flat = nd::flatten(in[0]);
         const auto shifted = nd::add_scalar(nd::multiply_scalar(in[1], 0.5), 2.0);
         return std::vector{nd::reshape(nd::add(flat, in[1]), {4, 6}),
                            nd::subtract(flat, in[2]),
                            nd::multiply(in[2], flat),
                            nd::divide(flat, shifted),
                            nd::divide(in[2], shifted),
                            nd::negative(nd::square(flat)),
                            nd::mean(in[1]),
                            nd::sum(nd::divide(shifted, in[2]))};
       }},
      "element-wise");
}

BOOST_AUTO_TEST_CASE(every_optimizer_updates_a_gpu_weight_as_on_the_cpu) {
  const std::vector<std::pair<std::string, optimizer_params>> cases{
      {"test", {{"rescale_grad", 2.0}}},
      {"sgd", {{"learning_rate", 0.1}, {"wd", 0.01}}},
      {"sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}, {"clip_gradient", 0.5}}},
      {"nag", {{"learning_rate", 0.1}, {"momentum", 0.9}}},
      {"adam", {{"learning_rate", 0.01}, {"wd", 0.001}}},
      {"rmsprop", {{"learning_rate", 0.01}}},
      {"rmsprop", {{"learning_rate", 0.01}, {"centered", 1.0}, {"clip_weights", 0.8}}},
      {"adagrad", {{"learning_rate", 0.1}}},
  };
  for (const auto& [name, params] : cases) {
    BOOST_TEST_CONTEXT(name) {
      updater on_cpu{optimizer::create(name, params).value()};
      updater on_gpu{optimizer::create(name, params).value()};
      ndarray weight_cpu = random_values({1000}, 17);
      ndarray weight_gpu = weight_cpu.copy_to(gpu);
      for (std::uint64_t step = 0; step < 3; ++step) {
        const ndarray grad = random_values({1000}, 100 + step);
        on_cpu(0, grad, weight_cpu);
        on_gpu(0, grad.copy_to(gpu), weight_gpu);
      }
      require_close(weight_gpu.to_vector<float>(), weight_cpu.to_vector<float>(),
                    name + " weight after 3 updates", 1e-5);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_float16_weight_is_updated_on_the_gpu_as_on_the_cpu) {
  updater on_cpu{optimizer::create("sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}}).value()};
  updater on_gpu{optimizer::create("sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}}).value()};
  ndarray weight_cpu = random_values({513}, 18).as_type(dtype::float16);
  ndarray weight_gpu = weight_cpu.copy_to(gpu);
  for (std::uint64_t step = 0; step < 3; ++step) {
    const ndarray grad = random_values({513}, 200 + step).as_type(dtype::float16);
    on_cpu(0, grad, weight_cpu);
    on_gpu(0, grad.copy_to(gpu), weight_gpu);
  }
  // Both widen, update in float32 and round once: the float16 results agree to one half ulp.
  require_close(weight_gpu.to_vector<float>(), weight_cpu.to_vector<float>(), "float16 sgd weight",
                1e-3);
}

BOOST_AUTO_TEST_CASE(an_operator_given_arrays_on_two_devices_names_both) {
  const auto x = random_values({2, 3}, 20);
  test::require_error([&] { nd::add(x, x.copy_to(gpu)).to_vector<float>(); },
                      errc::invalid_argument, "is on gpu(0) but the call computes on cpu(0)");
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(operators_without_a_gpu)

BOOST_AUTO_TEST_CASE(host_contexts_are_one_device_and_a_missing_gpu_is_named) {
  // cpu(0) and cpu(1) are one device for operators (both host memory).
  const auto x = random_values({2, 3}, 19);
  BOOST_CHECK_NO_THROW(nd::add(x, x.copy_to(context::cpu(1))).to_vector<float>());
  if (num_gpus() == 0)
    test::require_error([&] { x.copy_to(gpu); }, errc::device_unavailable,
                        "gpu(0) is not available");
}

BOOST_AUTO_TEST_SUITE_END()

} // namespace troupe
