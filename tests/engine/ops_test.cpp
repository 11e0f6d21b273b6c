// The operator registry (engine/op.hpp), driven through op_def directly: infer_shape, forward,
// backward. Every backward is checked against central finite differences of the loss
// L = Σ dy·y for a random dy, in both grad_req write and add, and with gradients not wanted.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/op.hpp"
#include "engine_test_support.hpp"

using namespace troupe;
using troupe::test::require_error;

namespace {

std::size_t to_size_t(std::int64_t value) {
  return static_cast<std::size_t>(value);
}

ndarray values(std::vector<float> data, shape_vector shape) {
  return ndarray::from_values(std::span<const float>{data}, std::move(shape));
}

std::vector<float> host(const ndarray& array) {
  return array.to_vector<float>();
}

std::vector<shape_vector> shapes_of(std::span<const ndarray> arrays) {
  std::vector<shape_vector> shapes;
  for (const auto& array : arrays)
    shapes.push_back(array.shape());
  return shapes;
}

struct forward_result {
  std::vector<ndarray> outputs;
  std::vector<ndarray> saved;
};

/// infer_shape, outputs allocated and filled with NaN (so an output forward forgets shows), then
/// forward.
forward_result run_forward(const op_def& op, const op_attrs& attrs, std::span<const ndarray> inputs,
                           bool is_train = true) {
  forward_result result;
  for (auto& shape : op.infer_shape(attrs, shapes_of(inputs)))
    result.outputs.push_back(ndarray::full(shape, NAN));
  op.forward(
      {attrs, is_train, inputs, result.outputs, result.saved, seed_for_call(op, attrs, is_train)});
  return result;
}

forward_result run_forward(std::string_view name, const op_attrs& attrs,
                           std::vector<ndarray> inputs, bool is_train = true) {
  return run_forward(find_op(name), attrs, inputs, is_train);
}

/// Runs backward with `grads` as the input gradients (none handles where not wanted).
void run_backward(const op_def& op, const op_attrs& attrs, std::span<const ndarray> inputs,
                  const forward_result& forward, std::span<const ndarray> output_grads,
                  std::span<ndarray> grads, std::span<const grad_req> reqs) {
  op.backward({attrs, inputs, forward.outputs, forward.saved, output_grads, grads, reqs});
}

/// Σ dy·y over every output, in double.
double weighted_loss(const std::vector<ndarray>& outputs, const std::vector<ndarray>& dys) {
  double loss = 0.0;
  for (std::size_t o = 0; o < outputs.size(); ++o) {
    const auto y = host(outputs[o]);
    const auto dy = host(dys[o]);
    for (std::size_t k = 0; k < y.size(); ++k)
      loss += static_cast<double>(y[k]) * static_cast<double>(dy[k]);
  }
  return loss;
}

bool close(double got, double expected, double tolerance) {
  return std::abs(got - expected) <= tolerance * std::max(1.0, std::abs(expected));
}

struct gradient_case {
  // A constructor rather than an aggregate: -Wextra warns about aggregate initialisers that
  // leave trailing members to their defaults.
  gradient_case(std::string op_name, op_attrs op_attributes, std::vector<ndarray> op_inputs,
                std::vector<std::size_t> differentiate = {}, double finite_step = 1e-2,
                double relative_tolerance = 1e-2, std::optional<std::uint64_t> reseed_with = {})
      : op(std::move(op_name)), attrs(std::move(op_attributes)), inputs(std::move(op_inputs)),
        wrt(std::move(differentiate)), step(finite_step), tolerance(relative_tolerance),
        reseed(reseed_with) {}

  std::string op;
  op_attrs attrs;
  std::vector<ndarray> inputs;
  /// Inputs to differentiate; the others get no gradient (none handle). Empty: all of them.
  std::vector<std::size_t> wrt;
  double step;
  double tolerance;
  /// Dropout: reseed the operators' source before every forward so the mask stays the same.
  std::optional<std::uint64_t> reseed;
};

/// The backward of `c.op` against central differences, then add mode against write mode, then
/// each input's gradient alone, then grad_req null leaving a buffer untouched.
void check_gradients(gradient_case c) {
  const op_def& op = find_op(c.op);
  const std::string label = c.op + "(" + c.attrs.describe(c.op) + ")";
  BOOST_TEST_CONTEXT(label) {
    if (c.wrt.empty()) {
      c.wrt.resize(c.inputs.size());
      std::iota(c.wrt.begin(), c.wrt.end(), std::size_t{0});
    }
    const auto forward = [&](const std::vector<ndarray>& inputs) {
      if (c.reseed)
        seed_operators(*c.reseed);
      return run_forward(op, c.attrs, inputs);
    };
    const forward_result base = forward(c.inputs);
    std::vector<ndarray> dys;
    for (std::size_t o = 0; o < base.outputs.size(); ++o)
      dys.push_back(ndarray::random_normal(0.0, 1.0, base.outputs[o].shape(), 100 + o));

    // Analytic, grad_req write into NaN-filled buffers: every element must be written.
    const std::size_t n_inputs = c.inputs.size();
    std::vector<ndarray> written(n_inputs);
    std::vector<grad_req> reqs(n_inputs, grad_req::null);
    for (const std::size_t i : c.wrt) {
      written[i] = ndarray::full(c.inputs[i].shape(), NAN);
      reqs[i] = grad_req::write;
    }
    run_backward(op, c.attrs, c.inputs, base, dys, written, reqs);

    // Numeric: central differences, the step measured in the float actually stored.
    for (const std::size_t i : c.wrt) {
      const auto analytic = host(written[i]);
      const auto original = host(c.inputs[i]);
      for (std::size_t j = 0; j < original.size(); ++j) {
        auto perturbed = c.inputs;
        auto plus = original;
        auto minus = original;
        plus[j] = static_cast<float>(original[j] + c.step);
        minus[j] = static_cast<float>(original[j] - c.step);
        perturbed[i] = values(plus, c.inputs[i].shape());
        const double loss_plus = weighted_loss(forward(perturbed).outputs, dys);
        perturbed[i] = values(minus, c.inputs[i].shape());
        const double loss_minus = weighted_loss(forward(perturbed).outputs, dys);
        const double numeric = (loss_plus - loss_minus) /
                               (static_cast<double>(plus[j]) - static_cast<double>(minus[j]));
        BOOST_TEST(close(analytic[j], numeric, c.tolerance),
                   "input " << i << " element " << j << ": backward " << analytic[j]
                            << ", central difference " << numeric);
      }
    }

    // grad_req add: the same gradient added to what is there.
    std::vector<ndarray> added(n_inputs);
    std::vector<std::vector<float>> before(n_inputs);
    for (const std::size_t i : c.wrt) {
      added[i] = ndarray::random_uniform(-1.0, 1.0, c.inputs[i].shape(), 200 + i);
      before[i] = host(added[i]);
      reqs[i] = grad_req::add;
    }
    run_backward(op, c.attrs, c.inputs, base, dys, added, reqs);
    for (const std::size_t i : c.wrt) {
      const auto sum = host(added[i]);
      const auto alone = host(written[i]);
      for (std::size_t j = 0; j < sum.size(); ++j)
        BOOST_TEST(close(sum[j], before[i][j] + alone[j], 1e-5),
                   "add mode, input " << i << " element " << j << ": " << sum[j]
                                      << " != " << before[i][j] << " + " << alone[j]);
    }

    // Each input's gradient alone (the others none handles), and grad_req null with a buffer:
    // the buffer stays as it was.
    for (const std::size_t i : c.wrt) {
      std::vector<ndarray> grads(n_inputs);
      std::vector<grad_req> only(n_inputs, grad_req::null);
      grads[i] = ndarray::full(c.inputs[i].shape(), NAN);
      only[i] = grad_req::write;
      for (const std::size_t other : c.wrt)
        if (other != i)
          grads[other] = ndarray::full(c.inputs[other].shape(), 42.0); // req null: untouched
      run_backward(op, c.attrs, c.inputs, base, dys, grads, only);
      BOOST_TEST(host(grads[i]) == host(written[i]), boost::test_tools::per_element());
      for (const std::size_t other : c.wrt)
        if (other != i)
          BOOST_TEST(host(grads[other]) ==
                         std::vector<float>(to_size_t(c.inputs[other].size()), 42.0f),
                     boost::test_tools::per_element());
    }
  }
}

/// (k - n/2)·gap + offset for k < n, in a seeded random order: no two within a finite-difference
/// step of each other (max pooling's ties) and, with offset gap/2, none near zero (relu's kink).
ndarray distinct(shape_vector shape, std::uint64_t seed, float gap = 0.1f, float offset = 0.05f) {
  const auto n = to_size_t(element_count(shape));
  std::vector<float> data(n);
  for (std::size_t k = 0; k < n; ++k)
    data[k] = (static_cast<float>(k) - static_cast<float>(n / 2)) * gap + offset;
  std::mt19937_64 engine{seed};
  std::shuffle(data.begin(), data.end(), engine);
  return values(data, std::move(shape));
}

ndarray uniform(shape_vector shape, std::uint64_t seed, double low = -1.0, double high = 1.0) {
  return ndarray::random_uniform(low, high, std::move(shape), seed);
}

/// The library's builders with no_bias, which a direct op_def call sets itself.
op_attrs fc_attrs(std::int64_t num_hidden, bool no_bias = false, bool flatten = true) {
  op_attrs attrs = fully_connected_attrs(num_hidden, flatten);
  attrs.no_bias = no_bias;
  return attrs;
}

op_attrs conv_attrs(std::int64_t num_filter, std::array<std::int64_t, 2> kernel,
                    std::array<std::int64_t, 2> stride = {1, 1},
                    std::array<std::int64_t, 2> pad = {0, 0}, bool no_bias = false) {
  op_attrs attrs = convolution_attrs(kernel, num_filter, stride, pad);
  attrs.no_bias = no_bias;
  return attrs;
}

std::vector<shape_vector> infer(std::string_view name, const op_attrs& attrs,
                                std::vector<shape_vector> inputs) {
  return find_op(name).infer_shape(attrs, inputs);
}

} // namespace

BOOST_AUTO_TEST_SUITE(ops)

// --- the registry ----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(every_operator_of_the_imperative_api_is_registered_in_sorted_order) {
  const std::vector<std::string> expected{"Activation",   "Convolution",  "Dropout",
                                          "Embedding",    "Flatten",      "FullyConnected",
                                          "Pooling",      "Reshape",      "SoftmaxCrossEntropy",
                                          "_mul_scalar",  "_plus_scalar", "elemwise_add",
                                          "elemwise_div", "elemwise_mul", "elemwise_sub",
                                          "mean",         "negative",     "square",
                                          "sum"};
  BOOST_TEST(list_ops() == expected, boost::test_tools::per_element());
  for (const auto& name : expected) {
    const op_def& op = find_op(name);
    BOOST_TEST(op.name == name);
    BOOST_TEST(op.num_outputs == 1u);
    BOOST_TEST((op.input_names != nullptr && op.infer_shape != nullptr && op.forward != nullptr &&
                op.backward != nullptr),
               name);
  }
}

BOOST_AUTO_TEST_CASE(an_unknown_operator_is_an_error_naming_it_and_listing_the_known_ones) {
  require_error([] { find_op("FullyConected"); }, errc::invalid_argument,
                "unknown operator 'FullyConected'");
  require_error([] { find_op("relu"); }, errc::invalid_argument,
                "known operators: Activation, Convolution, Dropout");
  require_error([] { find_op(""); }, errc::invalid_argument, "elemwise_add");
}

BOOST_AUTO_TEST_CASE(input_names_follow_mxnet_and_drop_the_bias_when_no_bias) {
  using names = std::vector<std::string>;
  BOOST_TEST(find_op("FullyConnected").input_names(fc_attrs(4)) ==
             (names{"data", "weight", "bias"}));
  BOOST_TEST(find_op("FullyConnected").input_names(fc_attrs(4, true)) == (names{"data", "weight"}));
  BOOST_TEST(find_op("Convolution").input_names(conv_attrs(2, {3, 3}, {1, 1}, {0, 0}, true)) ==
             (names{"data", "weight"}));
  BOOST_TEST(find_op("SoftmaxCrossEntropy").input_names({}) == (names{"data", "label"}));
  BOOST_TEST(find_op("elemwise_mul").input_names({}) == (names{"lhs", "rhs"}));
  BOOST_TEST(find_op("sum").input_names({}) == (names{"data"}));
}

BOOST_AUTO_TEST_CASE(describe_lists_the_attributes_the_operator_reads) {
  BOOST_TEST(fc_attrs(256).describe("FullyConnected") == "num_hidden=256, no_bias=0, flatten=1");
  BOOST_TEST(conv_attrs(8, {5, 5}, {1, 1}, {2, 2}, true).describe("Convolution") ==
             "kernel=(5,5), stride=(1,1), pad=(2,2), num_filter=8, no_bias=1");
  BOOST_TEST(pooling_attrs({2, 2}, "max", {2, 2}).describe("Pooling") ==
             "kernel=(2,2), pool_type=max, stride=(2,2), pad=(0,0)");
  BOOST_TEST(activation_attrs("relu").describe("Activation") == "act_type=relu");
  BOOST_TEST(dropout_attrs(0.5).describe("Dropout") == "p=0.5");
  BOOST_TEST(scalar_attrs(2.5).describe("_mul_scalar") == "scalar=2.5");
  BOOST_TEST(reshape_attrs({2, -1}).describe("Reshape") == "shape=(2,-1)");
  BOOST_TEST(op_attrs{}.describe("elemwise_add") == "");
  BOOST_TEST(op_attrs{}.describe("no such operator") == "");
}

BOOST_AUTO_TEST_CASE(the_operator_seed_source_is_a_seeded_mt19937_64) {
  seed_operators(7);
  const std::uint64_t first = next_operator_seed();
  const std::uint64_t second = next_operator_seed();
  std::mt19937_64 reference{7};
  BOOST_TEST(first == reference());
  BOOST_TEST(second == reference());
  seed_operators(7);
  BOOST_TEST(next_operator_seed() == first);
  seed_operators(8);
  BOOST_TEST(next_operator_seed() != first);
}

// --- checks every operator shares --------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_dtype_other_than_float32_is_not_supported_and_names_the_operator) {
  const auto x = ndarray::ones({2, 3}, context::cpu(), dtype::float64);
  require_error([&] { run_forward("Activation", activation_attrs("relu"), {x}); },
                errc::not_supported, "Activation: input 'data' is float64");
  const auto w = ndarray::ones({4, 3}, context::cpu(), dtype::int32);
  require_error(
      [&] {
        run_forward("FullyConnected", fc_attrs(4), {ndarray::ones({2, 3}), w, ndarray::ones({4})});
      },
      errc::not_supported, "FullyConnected: input 'weight' is int32");
}

BOOST_AUTO_TEST_CASE(a_wrong_number_of_inputs_is_an_invalid_argument_listing_the_names) {
  require_error(
      [] {
        infer("FullyConnected", fc_attrs(4), {{2, 3}, {4, 3}});
      },
      errc::invalid_argument, "takes 3 inputs (data, weight, bias), got 2");
  require_error([] { run_forward("elemwise_add", {}, {ndarray::ones({2})}); },
                errc::invalid_argument, "elemwise_add: takes 2 inputs (lhs, rhs), got 1");
  require_error(
      [] {
        run_forward("FullyConnected", fc_attrs(4, true), {ndarray::ones({2, 3})});
      },
      errc::invalid_argument, "takes 2 inputs (data, weight)");
}

BOOST_AUTO_TEST_CASE(a_none_input_is_an_invalid_argument_naming_it) {
  const op_def& op = find_op("negative");
  std::vector<ndarray> inputs{ndarray{}};
  std::vector<ndarray> outputs{ndarray::zeros({1})};
  std::vector<ndarray> saved;
  require_error(
      [&] {
        op.forward({{}, true, inputs, outputs, saved});
      },
      errc::invalid_argument, "negative: input 'data' is the none handle");
}

BOOST_AUTO_TEST_CASE(a_gradient_of_the_wrong_shape_is_a_shape_mismatch_naming_the_input) {
  const op_def& op = find_op("elemwise_mul");
  std::vector<ndarray> inputs{ndarray::ones({2, 3}), ndarray::ones({2, 3})};
  const auto forward = run_forward(op, {}, inputs);
  std::vector<ndarray> dys{ndarray::ones({2, 3})};
  std::vector<ndarray> grads{ndarray::zeros({2, 3}), ndarray::zeros({3, 2})};
  std::vector<grad_req> reqs{grad_req::write, grad_req::write};
  require_error([&] { run_backward(op, {}, inputs, forward, dys, grads, reqs); },
                errc::shape_mismatch, "gradient of input 'rhs' has shape (3,2), expected (2,3)");
  std::vector<ndarray> bad_dys{ndarray::ones({6})};
  grads[1] = ndarray::zeros({2, 3});
  require_error([&] { run_backward(op, {}, inputs, forward, bad_dys, grads, reqs); },
                errc::shape_mismatch, "gradient of output 0 has shape (6,), expected (2,3)");
}

// --- FullyConnected ----------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(fully_connected_infers_its_output_with_and_without_flatten) {
  BOOST_TEST(infer("FullyConnected", fc_attrs(5), {{2, 3, 4}, {5, 12}, {5}}) ==
             (std::vector<shape_vector>{{2, 5}}));
  BOOST_TEST(infer("FullyConnected", fc_attrs(5, false, false), {{2, 3, 4}, {5, 4}, {5}}) ==
             (std::vector<shape_vector>{{2, 3, 5}}));
  BOOST_TEST(infer("FullyConnected", fc_attrs(5, true), {{7}, {5, 1}}) ==
             (std::vector<shape_vector>{{7, 5}}));
}

BOOST_AUTO_TEST_CASE(fully_connected_shape_errors_name_the_input_and_both_shapes) {
  require_error(
      [] {
        infer("FullyConnected", fc_attrs(5), {{2, 4}, {5, 3}, {5}});
      },
      errc::shape_mismatch, "FullyConnected: input 'weight' has shape (5,3), expected (5,4)");
  require_error(
      [] {
        infer("FullyConnected", fc_attrs(5), {{2, 4}, {5, 4}, {4}});
      },
      errc::shape_mismatch, "input 'bias' has shape (4,), expected (5,)");
  require_error(
      [] {
        infer("FullyConnected", fc_attrs(0), {{2, 4}, {0, 4}, {0}});
      },
      errc::invalid_argument, "num_hidden must be > 0, got 0");
  require_error(
      [] {
        infer("FullyConnected", fc_attrs(3), {{}, {3, 1}, {3}});
      },
      errc::shape_mismatch, "input 'data' has shape ()");
  // forward checks too: a caller that skipped infer_shape must not read past the weight.
  require_error(
      [] {
        std::vector<ndarray> inputs{ndarray::ones({1, 4}), ndarray::ones({2, 3})};
        std::vector<ndarray> outputs{ndarray::zeros({1, 2})};
        std::vector<ndarray> saved;
        const op_attrs attrs = fc_attrs(2, true);
        find_op("FullyConnected").forward({attrs, true, inputs, outputs, saved});
      },
      errc::shape_mismatch, "input 'weight' has shape (2,3), expected (2,4)");
}

BOOST_AUTO_TEST_CASE(fully_connected_fills_unknown_weight_and_bias_shapes) {
  const op_def& op = find_op("FullyConnected");
  std::vector<shape_vector> shapes{{2, 3, 4}, {}, {}};
  op.fill_input_shapes(fc_attrs(5), shapes);
  BOOST_TEST((shapes[1] == shape_vector{5, 12}));
  BOOST_TEST((shapes[2] == shape_vector{5}));

  std::vector<shape_vector> last_axis{{2, 3, 4}, {}, {}};
  op.fill_input_shapes(fc_attrs(5, false, false), last_axis);
  BOOST_TEST((last_axis[1] == shape_vector{5, 4}));

  std::vector<shape_vector> no_bias{{8, 6}, {}};
  op.fill_input_shapes(fc_attrs(3, true), no_bias);
  BOOST_TEST((no_bias[1] == shape_vector{3, 6}));

  std::vector<shape_vector> known{{8, 6}, {3, 7}, {}};
  op.fill_input_shapes(fc_attrs(3), known);
  BOOST_TEST((known[1] == shape_vector{3, 7})); // left alone; infer_shape names it
  BOOST_TEST((known[2] == shape_vector{3}));
}

BOOST_AUTO_TEST_CASE(fully_connected_computes_x_times_weight_transposed_plus_bias) {
  const auto x = values({1, 2, 3, 4, 5, 6}, {2, 3});
  const auto w = values({1, 0, -1, 2, 1, 0}, {2, 3});
  const auto b = values({10, 20}, {2});
  const auto y = run_forward("FullyConnected", fc_attrs(2), {x, w, b}).outputs[0];
  BOOST_TEST((y.shape() == shape_vector{2, 2}));
  BOOST_TEST(host(y) == (std::vector<float>{8, 24, 8, 33}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(fully_connected_gradients_match_central_differences) {
  check_gradients({"FullyConnected",
                   fc_attrs(4),
                   {uniform({3, 2, 3}, 1), uniform({4, 6}, 2), uniform({4}, 3)}});
  check_gradients({"FullyConnected", fc_attrs(3, true), {uniform({2, 5}, 4), uniform({3, 5}, 5)}});
  check_gradients({"FullyConnected",
                   fc_attrs(3, false, false),
                   {uniform({2, 2, 4}, 6), uniform({3, 4}, 7), uniform({3}, 8)}});
}

// --- Convolution -------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(convolution_infers_its_output_from_kernel_stride_and_pad) {
  BOOST_TEST(infer("Convolution", conv_attrs(4, {3, 3}, {2, 2}, {1, 1}),
                   {{2, 3, 7, 7}, {4, 3, 3, 3}, {4}}) == (std::vector<shape_vector>{{2, 4, 4, 4}}));
  BOOST_TEST(infer("Convolution", conv_attrs(6, {5, 5}, {1, 1}, {0, 0}, true),
                   {{1, 1, 28, 28}, {6, 1, 5, 5}}) == (std::vector<shape_vector>{{1, 6, 24, 24}}));
}

BOOST_AUTO_TEST_CASE(convolution_fills_unknown_weight_and_bias_shapes) {
  const op_def& op = find_op("Convolution");
  std::vector<shape_vector> shapes{{2, 3, 7, 7}, {}, {}};
  op.fill_input_shapes(conv_attrs(4, {3, 2}), shapes);
  BOOST_TEST((shapes[1] == shape_vector{4, 3, 3, 2}));
  BOOST_TEST((shapes[2] == shape_vector{4}));
  std::vector<shape_vector> no_bias{{1, 1, 5, 5}, {}};
  op.fill_input_shapes(conv_attrs(2, {3, 3}, {1, 1}, {0, 0}, true), no_bias);
  BOOST_TEST((no_bias[1] == shape_vector{2, 1, 3, 3}));
  std::vector<shape_vector> unknown_data{{}, {}, {}};
  op.fill_input_shapes(conv_attrs(2, {3, 3}), unknown_data);
  BOOST_TEST(unknown_data[1].empty());
}

BOOST_AUTO_TEST_CASE(convolution_shape_errors_name_the_input_and_shapes) {
  require_error(
      [] {
        infer("Convolution", conv_attrs(1, {3, 3}), {{1, 1, 2, 2}, {1, 1, 3, 3}, {1}});
      },
      errc::shape_mismatch,
      "(1,1,2,2), whose image padded by (0,0) is smaller than the kernel (3,3)");
  require_error(
      [] {
        infer("Convolution", conv_attrs(2, {3, 3}), {{1, 3, 5, 5}, {2, 1, 3, 3}, {2}});
      },
      errc::shape_mismatch, "Convolution: input 'weight' has shape (2,1,3,3), expected (2,3,3,3)");
  require_error(
      [] {
        infer("Convolution", conv_attrs(2, {3, 3}), {{3, 5, 5}, {2, 3, 3, 3}, {2}});
      },
      errc::shape_mismatch, "input 'data' has shape (3,5,5), expected 4 axes");
  require_error(
      [] {
        infer("Convolution", conv_attrs(2, {3, 3}, {0, 1}), {{1, 1, 5, 5}, {2, 1, 3, 3}, {2}});
      },
      errc::invalid_argument, "stride (0,1)");
  require_error(
      [] {
        infer("Convolution", conv_attrs(0, {3, 3}), {{1, 1, 5, 5}, {0, 1, 3, 3}, {0}});
      },
      errc::invalid_argument, "num_filter must be > 0");
}

BOOST_AUTO_TEST_CASE(convolution_sums_each_window_times_the_kernel) {
  const auto x = values({1, 2, 3, 4, 5, 6, 7, 8, 9}, {1, 1, 3, 3});
  const auto w = values({1, 1, 1, 1}, {1, 1, 2, 2});
  const auto b = values({0.5f}, {1});
  const auto y = run_forward("Convolution", conv_attrs(1, {2, 2}), {x, w, b}).outputs[0];
  BOOST_TEST((y.shape() == shape_vector{1, 1, 2, 2}));
  BOOST_TEST(host(y) == (std::vector<float>{12.5f, 16.5f, 24.5f, 28.5f}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(convolution_gradients_match_central_differences) {
  check_gradients({"Convolution",
                   conv_attrs(3, {3, 3}, {2, 2}, {1, 1}),
                   {uniform({2, 2, 5, 5}, 11), uniform({3, 2, 3, 3}, 12), uniform({3}, 13)}});
  check_gradients({"Convolution",
                   conv_attrs(2, {2, 3}, {1, 2}, {0, 1}, true),
                   {uniform({1, 3, 4, 5}, 14), uniform({2, 3, 2, 3}, 15)}});
}

// --- Pooling -----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(pooling_takes_the_max_or_average_of_each_window) {
  std::vector<float> ramp(16);
  std::iota(ramp.begin(), ramp.end(), 0.0f);
  const auto x = values(ramp, {1, 1, 4, 4});
  const auto max = run_forward("Pooling", pooling_attrs({2, 2}, "max", {2, 2}), {x}).outputs[0];
  BOOST_TEST((max.shape() == shape_vector{1, 1, 2, 2}));
  BOOST_TEST(host(max) == (std::vector<float>{5, 7, 13, 15}), boost::test_tools::per_element());
  const auto avg = run_forward("Pooling", pooling_attrs({2, 2}, "avg", {2, 2}), {x}).outputs[0];
  BOOST_TEST(host(avg) == (std::vector<float>{2.5f, 4.5f, 10.5f, 12.5f}),
             boost::test_tools::per_element());
  BOOST_TEST(infer("Pooling", pooling_attrs({3, 3}, "max", {2, 2}, {1, 1}), {{2, 4, 7, 7}}) ==
             (std::vector<shape_vector>{{2, 4, 4, 4}}));
}

BOOST_AUTO_TEST_CASE(an_unknown_pool_type_is_an_error_naming_it) {
  require_error(
      [] {
        infer("Pooling", pooling_attrs({2, 2}, "sum"), {{1, 1, 4, 4}});
      },
      errc::invalid_argument, "Pooling: unknown pool_type 'sum'");
  require_error(
      [] {
        infer("Pooling", pooling_attrs({5, 5}, "max"), {{1, 1, 4, 4}});
      },
      errc::shape_mismatch, "smaller than the kernel (5,5)");
}

BOOST_AUTO_TEST_CASE(pooling_gradients_match_central_differences) {
  // Distinct values 0.1 apart: no window has a tie within the step.
  check_gradients(
      {"Pooling", pooling_attrs({2, 2}, "max", {2, 2}), {distinct({2, 2, 4, 4}, 21)}, {}, 1e-3});
  check_gradients({"Pooling",
                   pooling_attrs({3, 3}, "max", {2, 2}, {1, 1}),
                   {distinct({1, 2, 5, 5}, 22)},
                   {},
                   1e-3});
  check_gradients(
      {"Pooling", pooling_attrs({3, 2}, "avg", {1, 2}, {1, 0}), {uniform({2, 1, 4, 4}, 23)}});
}

// --- Activation --------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(activation_applies_its_function_element_wise) {
  const auto x = values({-2.0f, -0.5f, 0.0f, 1.5f}, {2, 2});
  const auto expect = [&](const std::string& type, double (*f)(double)) {
    const auto y = run_forward("Activation", activation_attrs(type), {x}).outputs[0];
    BOOST_TEST((y.shape() == shape_vector{2, 2}));
    const auto got = host(y);
    const auto in = host(x);
    for (std::size_t k = 0; k < got.size(); ++k)
      BOOST_TEST(std::abs(got[k] - f(in[k])) <= 1e-5, type << "(" << in[k] << ") = " << got[k]);
  };
  expect("relu", [](double v) { return std::max(v, 0.0); });
  expect("sigmoid", [](double v) { return 1.0 / (1.0 + std::exp(-v)); });
  expect("tanh", [](double v) { return std::tanh(v); });
  expect("softrelu", [](double v) { return std::log1p(std::exp(v)); });
}

BOOST_AUTO_TEST_CASE(an_unknown_act_type_is_an_error_naming_it) {
  require_error([] { infer("Activation", activation_attrs("gelu"), {{2}}); },
                errc::invalid_argument, "Activation: unknown act_type 'gelu'");
  require_error([] { run_forward("Activation", activation_attrs(""), {ndarray::ones({2})}); },
                errc::invalid_argument, "unknown act_type ''");
}

BOOST_AUTO_TEST_CASE(embedding_weight_gradient_matches_central_differences) {
  // Row 4 used twice, rows 1 and 3 not at all; the indices themselves take no gradient.
  check_gradients({"Embedding",
                   embedding_attrs(5, 3),
                   {values({4, 0, 4, 2}, {2, 2}), uniform({5, 3}, 61)},
                   {1}});
}

BOOST_AUTO_TEST_CASE(activation_gradients_match_central_differences) {
  // relu: values at least 0.05 from its kink at 0.
  check_gradients({"Activation", activation_attrs("relu"), {distinct({3, 5}, 31)}});
  for (const char* type : {"sigmoid", "tanh", "softrelu"})
    check_gradients({"Activation", activation_attrs(type), {uniform({3, 5}, 32, -2.0, 2.0)}});
}

// --- Dropout -----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(training_dropout_zeroes_a_seeded_fraction_and_scales_the_rest) {
  const auto x = ndarray::ones({1000});
  seed_operators(42);
  const auto first = run_forward("Dropout", dropout_attrs(0.25), {x}, true);
  const auto y = host(first.outputs[0]);
  const auto dropped = std::count(y.begin(), y.end(), 0.0f);
  const auto kept = std::count(y.begin(), y.end(), static_cast<float>(1.0 / 0.75));
  BOOST_TEST(dropped + kept == 1000);
  BOOST_TEST(dropped > 180);
  BOOST_TEST(dropped < 320);
  BOOST_TEST(first.saved.size() == 1u);

  // The same seed gives the same mask; the next draw another.
  seed_operators(42);
  BOOST_TEST(host(run_forward("Dropout", dropout_attrs(0.25), {x}, true).outputs[0]) == y,
             boost::test_tools::per_element());
  BOOST_TEST((host(run_forward("Dropout", dropout_attrs(0.25), {x}, true).outputs[0]) != y));
}

BOOST_AUTO_TEST_CASE(inference_dropout_is_the_identity_and_passes_the_gradient_through) {
  const op_def& op = find_op("Dropout");
  const auto x = uniform({4, 5}, 41);
  std::vector<ndarray> inputs{x};
  for (const bool is_train : {false, true}) {
    const op_attrs attrs = dropout_attrs(is_train ? 0.0 : 0.5); // p = 0 in training: identity
    const auto forward = run_forward(op, attrs, inputs, is_train);
    BOOST_TEST(host(forward.outputs[0]) == host(x), boost::test_tools::per_element());
    BOOST_TEST(forward.saved.empty());
    std::vector<ndarray> dys{uniform({4, 5}, 42)};
    std::vector<ndarray> grads{ndarray::full({4, 5}, NAN)};
    std::vector<grad_req> reqs{grad_req::write};
    run_backward(op, attrs, inputs, forward, dys, grads, reqs);
    BOOST_TEST(host(grads[0]) == host(dys[0]), boost::test_tools::per_element());
    grads[0].fill(1.0);
    reqs[0] = grad_req::add;
    run_backward(op, attrs, inputs, forward, dys, grads, reqs);
    const auto summed = host(grads[0]);
    const auto dy = host(dys[0]);
    for (std::size_t k = 0; k < dy.size(); ++k)
      BOOST_TEST(summed[k] == 1.0f + dy[k]);
  }
}

BOOST_AUTO_TEST_CASE(a_dropout_probability_outside_0_to_1_is_an_invalid_argument) {
  require_error([] { infer("Dropout", dropout_attrs(1.0), {{3}}); }, errc::invalid_argument,
                "Dropout: p must be in [0, 1), got 1");
  require_error([] { run_forward("Dropout", dropout_attrs(-0.1), {ndarray::ones({3})}, false); },
                errc::invalid_argument, "got -0.1");
  require_error([] { infer("Dropout", dropout_attrs(NAN), {{3}}); }, errc::invalid_argument,
                "p must be in [0, 1)");
}

BOOST_AUTO_TEST_CASE(dropout_gradients_match_central_differences_under_one_seed) {
  check_gradients({"Dropout", dropout_attrs(0.4), {uniform({4, 6}, 43)}, {}, 1e-2, 1e-2, 99});
}

// --- SoftmaxCrossEntropy -----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(softmax_cross_entropy_is_the_negative_log_probability_of_the_label) {
  const auto logits = values({1, 2, 3, 0, 0, 0}, {2, 3});
  const auto label = values({2, 0}, {2});
  const auto result = run_forward("SoftmaxCrossEntropy", {}, {logits, label});
  const auto loss = result.outputs[0];
  BOOST_TEST((loss.shape() == shape_vector{2}));
  const auto got = host(loss);
  BOOST_TEST(got[0] == std::log(1.0 + std::exp(-1.0) + std::exp(-2.0)),
             boost::test_tools::tolerance(1e-5));
  BOOST_TEST(got[1] == std::log(3.0), boost::test_tools::tolerance(1e-5));
  BOOST_TEST_REQUIRE(result.saved.size() == 1u);
  BOOST_TEST((result.saved[0].shape() == shape_vector{2, 3}));
}

BOOST_AUTO_TEST_CASE(a_label_that_is_not_a_class_index_is_an_error_naming_row_and_value) {
  const auto logits = ndarray::zeros({3, 4});
  require_error(
      [&] {
        run_forward("SoftmaxCrossEntropy", {}, {logits, values({0, 1, 4}, {3})});
      },
      errc::invalid_argument, "SoftmaxCrossEntropy: label[2] = 4 is not a class index in [0, 4)");
  require_error(
      [&] {
        run_forward("SoftmaxCrossEntropy", {}, {logits, values({-1, 1, 2}, {3})});
      },
      errc::invalid_argument, "label[0] = -1");
  require_error(
      [&] {
        run_forward("SoftmaxCrossEntropy", {}, {logits, values({0, 1.5f, 2}, {3})});
      },
      errc::invalid_argument, "label[1] = 1.5");
  require_error(
      [&] {
        run_forward("SoftmaxCrossEntropy", {}, {logits, values({0, NAN, 2}, {3})});
      },
      errc::invalid_argument, "label[1] = nan");
  require_error(
      [] {
        infer("SoftmaxCrossEntropy", {}, {{3, 4}, {2}});
      },
      errc::shape_mismatch, "input 'label' has shape (2,), expected (3,)");
  require_error(
      [] {
        infer("SoftmaxCrossEntropy", {}, {{3, 4, 1}, {3}});
      },
      errc::shape_mismatch, "input 'data' has shape (3,4,1)");
}

BOOST_AUTO_TEST_CASE(softmax_cross_entropy_gradients_match_central_differences) {
  check_gradients({"SoftmaxCrossEntropy",
                   {},
                   {uniform({4, 5}, 51, -2.0, 2.0), values({0, 4, 2, 2}, {4})},
                   {0}});
}

BOOST_AUTO_TEST_CASE(the_label_gradient_is_zero_when_written_and_untouched_when_added) {
  const op_def& op = find_op("SoftmaxCrossEntropy");
  std::vector<ndarray> inputs{uniform({2, 3}, 52), values({1, 2}, {2})};
  const auto forward = run_forward(op, {}, inputs);
  std::vector<ndarray> dys{ndarray::ones({2})};
  std::vector<ndarray> grads{ndarray::full({2, 3}, NAN), ndarray::full({2}, NAN)};
  std::vector<grad_req> reqs{grad_req::write, grad_req::write};
  run_backward(op, {}, inputs, forward, dys, grads, reqs);
  BOOST_TEST(host(grads[1]) == (std::vector<float>{0, 0}), boost::test_tools::per_element());
  // Each row of the logits' gradient is softmax - onehot: it sums to zero.
  const auto dlogits = host(grads[0]);
  BOOST_TEST(std::abs(dlogits[0] + dlogits[1] + dlogits[2]) < 1e-6);
  grads[1] = ndarray::full({2}, 3.0);
  reqs[1] = grad_req::add;
  run_backward(op, {}, inputs, forward, dys, grads, reqs);
  BOOST_TEST(host(grads[1]) == (std::vector<float>{3, 3}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_forward_reuses_saved_state_that_fits_and_nobody_else_holds) {
  const op_def& op = find_op("SoftmaxCrossEntropy");
  std::vector<ndarray> inputs{uniform({8, 10}, 53), values({0, 1, 2, 3, 4, 5, 6, 7}, {8})};
  std::vector<ndarray> outputs{ndarray::zeros({8})};
  std::vector<ndarray> saved;
  op.forward({{}, true, inputs, outputs, saved});
  BOOST_TEST_REQUIRE(saved.size() == 1u);
  const void* first = saved[0].raw_data();
  op.forward({{}, true, inputs, outputs, saved});
  BOOST_TEST(saved[0].raw_data() == first);

  // A graph that kept the probabilities keeps them: the op allocates anew.
  const ndarray kept = saved[0];
  const auto kept_values = host(kept);
  std::vector<ndarray> other{uniform({8, 10}, 54), inputs[1]};
  op.forward({{}, true, other, outputs, saved});
  BOOST_TEST(!saved[0].shares_storage_with(kept));
  BOOST_TEST(host(kept) == kept_values, boost::test_tools::per_element());
}

// --- Flatten and Reshape -----------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(flatten_and_reshape_infer_their_shapes) {
  BOOST_TEST(infer("Flatten", {}, {{2, 3, 4}}) == (std::vector<shape_vector>{{2, 12}}));
  BOOST_TEST(infer("Flatten", {}, {{5}}) == (std::vector<shape_vector>{{5, 1}}));
  BOOST_TEST(infer("Reshape", reshape_attrs({4, -1}), {{2, 3, 4}}) ==
             (std::vector<shape_vector>{{4, 6}}));
  BOOST_TEST(infer("Reshape", reshape_attrs({}), {{1, 1}}) == (std::vector<shape_vector>{{}}));
  require_error([] { infer("Flatten", {}, {{}}); }, errc::shape_mismatch,
                "Flatten: input 'data' has shape ()");
  require_error(
      [] {
        infer("Reshape", reshape_attrs({5, -1}), {{2, 3, 4}});
      },
      errc::shape_mismatch,
      "cannot infer the -1 of shape (5,-1) from input 'data' of shape (2,3,4)");
  require_error(
      [] {
        infer("Reshape", reshape_attrs({5, 5}), {{2, 3, 4}});
      },
      errc::shape_mismatch,
      "Reshape: cannot reshape input 'data' of shape (2,3,4) (24 elements) into (5,5)");
  require_error(
      [] {
        infer("Reshape", reshape_attrs({-1, -1}), {{2, 3}});
      },
      errc::invalid_argument, "more than one -1");
}

BOOST_AUTO_TEST_CASE(flatten_and_reshape_keep_the_values_in_order) {
  const auto x = uniform({2, 3, 2}, 61);
  const auto flat = run_forward("Flatten", {}, {x}).outputs[0];
  BOOST_TEST((flat.shape() == shape_vector{2, 6}));
  BOOST_TEST(host(flat) == host(x), boost::test_tools::per_element());
  const auto reshaped = run_forward("Reshape", reshape_attrs({-1, 4}), {x}).outputs[0];
  BOOST_TEST((reshaped.shape() == shape_vector{3, 4}));
  BOOST_TEST(host(reshaped) == host(x), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(flatten_and_reshape_gradients_match_central_differences) {
  check_gradients({"Flatten", {}, {uniform({2, 3, 2}, 62)}});
  check_gradients({"Reshape", reshape_attrs({3, -1}), {uniform({2, 3, 2}, 63)}});
}

// --- element-wise ------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(binary_operators_compute_element_wise_and_broadcast_one_element) {
  const auto a = values({1, 2, 3, 4}, {2, 2});
  const auto b = values({4, 3, 2, 1}, {2, 2});
  const auto one = values({2}, {1});
  const auto run = [](const char* name, const ndarray& lhs, const ndarray& rhs) {
    return run_forward(name, {}, {lhs, rhs}).outputs[0];
  };
  BOOST_TEST(host(run("elemwise_add", a, b)) == (std::vector<float>{5, 5, 5, 5}),
             boost::test_tools::per_element());
  BOOST_TEST(host(run("elemwise_sub", a, b)) == (std::vector<float>{-3, -1, 1, 3}),
             boost::test_tools::per_element());
  BOOST_TEST(host(run("elemwise_mul", a, b)) == (std::vector<float>{4, 6, 6, 4}),
             boost::test_tools::per_element());
  BOOST_TEST(host(run("elemwise_div", a, b)) == (std::vector<float>{0.25f, 2.0f / 3.0f, 1.5f, 4}),
             boost::test_tools::per_element());
  const auto left = run("elemwise_sub", one, a);
  BOOST_TEST((left.shape() == shape_vector{2, 2}));
  BOOST_TEST(host(left) == (std::vector<float>{1, 0, -1, -2}), boost::test_tools::per_element());
  BOOST_TEST(host(run("elemwise_div", a, one)) == (std::vector<float>{0.5f, 1, 1.5f, 2}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(binary_operators_with_other_shapes_are_a_shape_mismatch_naming_both) {
  require_error(
      [] {
        infer("elemwise_add", {}, {{2, 3}, {3}});
      },
      errc::shape_mismatch, "elemwise_add: input 'rhs' has shape (3,) and input 'lhs' shape (2,3)");
  require_error(
      [] {
        infer("elemwise_div", {}, {{2, 3}, {3, 2}});
      },
      errc::shape_mismatch, "elemwise_div");
}

BOOST_AUTO_TEST_CASE(binary_gradients_match_central_differences_and_sum_over_a_broadcast) {
  for (const char* name : {"elemwise_add", "elemwise_sub", "elemwise_mul", "elemwise_div"}) {
    // Divisors kept away from zero.
    check_gradients({name, {}, {uniform({2, 3}, 71), uniform({2, 3}, 72, 0.5, 2.0)}});
    check_gradients({name, {}, {uniform({2, 3}, 73), uniform({1}, 74, 0.5, 2.0)}});
    check_gradients({name, {}, {uniform({}, 75, 0.5, 2.0), uniform({3, 2}, 76, 0.5, 2.0)}});
  }
}

BOOST_AUTO_TEST_CASE(scalar_and_unary_operators_compute_element_wise) {
  const auto x = values({-1, 0.5f, 2}, {3});
  BOOST_TEST(host(run_forward("_plus_scalar", scalar_attrs(1.5), {x}).outputs[0]) ==
                 (std::vector<float>{0.5f, 2, 3.5f}),
             boost::test_tools::per_element());
  BOOST_TEST(host(run_forward("_mul_scalar", scalar_attrs(-2), {x}).outputs[0]) ==
                 (std::vector<float>{2, -1, -4}),
             boost::test_tools::per_element());
  BOOST_TEST(host(run_forward("negative", {}, {x}).outputs[0]) ==
                 (std::vector<float>{1, -0.5f, -2}),
             boost::test_tools::per_element());
  BOOST_TEST(host(run_forward("square", {}, {x}).outputs[0]) == (std::vector<float>{1, 0.25f, 4}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(scalar_and_unary_gradients_match_central_differences) {
  check_gradients({"_plus_scalar", scalar_attrs(3.0), {uniform({2, 3}, 81)}});
  check_gradients({"_mul_scalar", scalar_attrs(-1.5), {uniform({2, 3}, 82)}});
  check_gradients({"negative", {}, {uniform({4}, 83)}});
  check_gradients({"square", {}, {uniform({2, 2}, 84)}});
}

BOOST_AUTO_TEST_CASE(sum_and_mean_reduce_everything_to_one_element) {
  const auto x = values({1, 2, 3, 4, 5, 6}, {2, 3});
  const auto total = run_forward("sum", {}, {x}).outputs[0];
  BOOST_TEST((total.shape() == shape_vector{1}));
  BOOST_TEST(total.as_scalar() == 21.0);
  BOOST_TEST(run_forward("mean", {}, {x}).outputs[0].as_scalar() == 3.5);
  check_gradients({"sum", {}, {uniform({2, 3}, 91)}});
  check_gradients({"mean", {}, {uniform({3, 4}, 92)}});
}

BOOST_AUTO_TEST_SUITE_END()
