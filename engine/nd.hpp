#pragma once
// The imperative operators (MXNet's mx.nd.*): each runs one op_def (engine/op.hpp) on arrays and
// returns new arrays. Inside an autograd::record_scope the calls are recorded for backward, and
// inside a trace_scope (engine/trace.hpp) they are also written down as a Symbol graph.
//
// All compute on float32 cpu arrays; errors are troupe::exception naming the operator and the
// input that is wrong.

#include <array>
#include <cstdint>
#include <span>
#include <string_view>
#include <vector>

#include "engine/ndarray.hpp"
#include "engine/op.hpp"

namespace troupe::nd {

/// Runs operator `op_name` on `inputs` (in the order op_def::input_names gives): infers the
/// output shapes, allocates the outputs on inputs[0]'s context, computes them, and records the
/// call (autograd) and/or writes it down (trace) when a scope asks for it.
std::vector<ndarray> invoke(std::string_view op_name, std::span<const ndarray> inputs,
                            const op_attrs& attrs = {});

/// FullyConnected: y = x·weightᵀ + bias. weight is [num_hidden, in]; bias [num_hidden] or the
/// none handle (no bias). With flatten, x of shape [n, ...] is used as [n, rest].
ndarray fully_connected(const ndarray& x, const ndarray& weight, const ndarray& bias,
                        std::int64_t num_hidden, bool flatten = true);
/// Convolution over NCHW data: weight [num_filter, C, kh, kw], bias [num_filter] or none.
ndarray convolution(const ndarray& x, const ndarray& weight, const ndarray& bias,
                    std::array<std::int64_t, 2> kernel, std::int64_t num_filter,
                    std::array<std::int64_t, 2> stride = {1, 1},
                    std::array<std::int64_t, 2> pad = {0, 0});
/// Pooling over NCHW data; pool_type "max" or "avg".
ndarray pooling(const ndarray& x, std::array<std::int64_t, 2> kernel, std::string_view pool_type,
                std::array<std::int64_t, 2> stride = {1, 1},
                std::array<std::int64_t, 2> pad = {0, 0});
/// Activation: act_type relu, sigmoid, tanh or softrelu.
ndarray activation(const ndarray& x, std::string_view act_type);
ndarray relu(const ndarray& x);
ndarray sigmoid(const ndarray& x);
ndarray tanh(const ndarray& x);
/// [n, d1, d2, ...] -> [n, d1·d2·...].
ndarray flatten(const ndarray& x);
/// A reshape that autograd and tracing see (-1 inferred once).
ndarray reshape(const ndarray& x, shape_vector shape);
/// `x`'s values on `target` (MXNet's as_in_context / copyto under autograd): when recorded, the
/// gradient flows back to x's context the same way. Model parallelism moves activations between
/// stages with it.
ndarray copy_to(const ndarray& x, context target);
/// Inverted dropout with probability p in training mode; the identity otherwise.
ndarray dropout(const ndarray& x, double p);
/// Embedding: out[..., :] = weight[data[...], :]. `data` holds row indices as float32 (MXNet's
/// default), of any shape; weight is [input_dim, output_dim]; the output has data's shape plus
/// output_dim. An index that is not an integer in [0, input_dim) is an error naming its position
/// (MXNet clips it). With sparse_grad, backward gives a weight that has a row_sparse gradient
/// (autograd::attach_row_sparse_grad) only the rows the call used; otherwise the dense gradient.
/// On the host only.
ndarray embedding(const ndarray& data, const ndarray& weight, std::int64_t input_dim,
                  std::int64_t output_dim, bool sparse_grad = false);
/// Per-sample -log softmax(logits)[label]: logits [n, classes], label [n] float class indices;
/// returns [n] (gluon.loss.SoftmaxCrossEntropyLoss with its defaults). A label outside
/// [0, classes) is an error naming the row and the label.
ndarray softmax_cross_entropy(const ndarray& logits, const ndarray& label);

ndarray add(const ndarray& a, const ndarray& b);
ndarray subtract(const ndarray& a, const ndarray& b);
ndarray multiply(const ndarray& a, const ndarray& b);
ndarray divide(const ndarray& a, const ndarray& b);
ndarray add_scalar(const ndarray& a, double scalar);
ndarray multiply_scalar(const ndarray& a, double scalar);
ndarray negative(const ndarray& a);
ndarray square(const ndarray& a);
/// Sum / mean of all elements, shape [1].
ndarray sum(const ndarray& a);
ndarray mean(const ndarray& a);

} // namespace troupe::nd
