#include "engine/nd.hpp"

#include <algorithm>
#include <array>
#include <string>
#include <utility>

#include "engine/autograd_state.hpp"

namespace troupe::nd {

namespace {

std::vector<ndarray> run(const op_def& op, std::span<const ndarray> inputs, const op_attrs& attrs) {
  const auto names = op.input_names(attrs);
  if (names.size() != inputs.size())
    throw exception(errc::invalid_argument, op.name + ": takes " + std::to_string(names.size()) +
                                                " inputs, got " + std::to_string(inputs.size()));
  std::vector<shape_vector> shapes;
  shapes.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    if (inputs[i].is_none())
      throw exception(errc::invalid_argument,
                      op.name + ": input '" + names[i] + "' is the none handle");
    shapes.push_back(inputs[i].shape());
  }
  const auto output_shapes = op.infer_shape(attrs, shapes);
  std::vector<ndarray> outputs;
  outputs.reserve(output_shapes.size());
  for (const auto& shape : output_shapes)
    outputs.emplace_back(shape, inputs[0].ctx(), inputs[0].dtype());

  const bool record = autograd::is_recording() && detail::operators_observed() &&
                      std::any_of(inputs.begin(), inputs.end(), detail::carries_gradient);
  auto* trace = detail::current_trace();
  std::shared_ptr<autograd_node> node;
  auto saved = record ? (node = std::make_shared<autograd_node>())->saved
                      : std::make_shared<std::vector<ndarray>>();
  const bool is_train = autograd::is_training();
  queue_forward(op, attrs, is_train, seed_for_call(op, attrs, is_train), inputs, outputs,
                std::move(saved));
  if (record) {
    node->op = &op;
    node->attrs = attrs;
    node->inputs.assign(inputs.begin(), inputs.end());
    detail::record_node(std::move(node), outputs);
  }
  if (trace != nullptr)
    detail::note_traced_call(*trace, op, attrs, inputs, outputs);
  return outputs;
}

ndarray run_one(std::string_view op_name, std::initializer_list<ndarray> inputs,
                const op_attrs& attrs) {
  return std::move(
      run(find_op(op_name), std::span<const ndarray>(inputs.begin(), inputs.size()), attrs)[0]);
}

/// The inputs of a call with an optional bias: {x, weight} or {x, weight, bias}.
ndarray run_with_bias(std::string_view op_name, const ndarray& x, const ndarray& weight,
                      const ndarray& bias, op_attrs attrs) {
  attrs.no_bias = bias.is_none();
  if (attrs.no_bias)
    return run_one(op_name, {x, weight}, attrs);
  return run_one(op_name, {x, weight, bias}, attrs);
}

} // namespace

std::vector<ndarray> invoke(std::string_view op_name, std::span<const ndarray> inputs,
                            const op_attrs& attrs) {
  return run(find_op(op_name), inputs, attrs);
}

ndarray fully_connected(const ndarray& x, const ndarray& weight, const ndarray& bias,
                        std::int64_t num_hidden, bool flatten) {
  return run_with_bias("FullyConnected", x, weight, bias,
                       fully_connected_attrs(num_hidden, flatten));
}

ndarray convolution(const ndarray& x, const ndarray& weight, const ndarray& bias,
                    std::array<std::int64_t, 2> kernel, std::int64_t num_filter,
                    std::array<std::int64_t, 2> stride, std::array<std::int64_t, 2> pad) {
  return run_with_bias("Convolution", x, weight, bias,
                       convolution_attrs(kernel, num_filter, stride, pad));
}

ndarray pooling(const ndarray& x, std::array<std::int64_t, 2> kernel, std::string_view pool_type,
                std::array<std::int64_t, 2> stride, std::array<std::int64_t, 2> pad) {
  return run_one("Pooling", {x}, pooling_attrs(kernel, pool_type, stride, pad));
}

ndarray activation(const ndarray& x, std::string_view act_type) {
  return run_one("Activation", {x}, activation_attrs(act_type));
}

ndarray relu(const ndarray& x) {
  return activation(x, "relu");
}
ndarray sigmoid(const ndarray& x) {
  return activation(x, "sigmoid");
}
ndarray tanh(const ndarray& x) {
  return activation(x, "tanh");
}

ndarray flatten(const ndarray& x) {
  return run_one("Flatten", {x}, {});
}

ndarray reshape(const ndarray& x, shape_vector shape) {
  return run_one("Reshape", {x}, reshape_attrs(std::move(shape)));
}

ndarray copy_to(const ndarray& x, context target) {
  std::array<ndarray, 1> out{x.copy_to(target)};
  autograd::record_custom(
      std::span<const ndarray>(&x, 1), out,
      [](std::span<const ndarray> output_grads, std::span<ndarray> input_grads) {
        if (!input_grads[0].is_none())
          output_grads[0].copy_to(input_grads[0]);
      });
  return std::move(out[0]);
}

ndarray dropout(const ndarray& x, double p) {
  return run_one("Dropout", {x}, dropout_attrs(p));
}

ndarray embedding(const ndarray& data, const ndarray& weight, std::int64_t input_dim,
                  std::int64_t output_dim, bool sparse_grad) {
  return run_one("Embedding", {data, weight}, embedding_attrs(input_dim, output_dim, sparse_grad));
}

ndarray softmax_cross_entropy(const ndarray& logits, const ndarray& label) {
  return run_one("SoftmaxCrossEntropy", {logits, label}, {});
}

ndarray add(const ndarray& a, const ndarray& b) {
  return run_one("elemwise_add", {a, b}, {});
}
ndarray subtract(const ndarray& a, const ndarray& b) {
  return run_one("elemwise_sub", {a, b}, {});
}
ndarray multiply(const ndarray& a, const ndarray& b) {
  return run_one("elemwise_mul", {a, b}, {});
}
ndarray divide(const ndarray& a, const ndarray& b) {
  return run_one("elemwise_div", {a, b}, {});
}

ndarray add_scalar(const ndarray& a, double scalar) {
  return run_one("_plus_scalar", {a}, scalar_attrs(scalar));
}
ndarray multiply_scalar(const ndarray& a, double scalar) {
  return run_one("_mul_scalar", {a}, scalar_attrs(scalar));
}
ndarray negative(const ndarray& a) {
  return run_one("negative", {a}, {});
}
ndarray square(const ndarray& a) {
  return run_one("square", {a}, {});
}
ndarray sum(const ndarray& a) {
  return run_one("sum", {a}, {});
}
ndarray mean(const ndarray& a) {
  return run_one("mean", {a}, {});
}

} // namespace troupe::nd
