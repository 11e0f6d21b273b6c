#pragma once
// Operators: the one definition of each computation that the imperative API (engine/nd.hpp),
// autograd (engine/autograd.hpp) and the symbolic executor (engine/symbol.hpp) all run, so that
// the three give identical results.
//
// An op_def knows its inputs' names, how its output shapes follow from its input shapes, how to
// compute its outputs, and how to compute its inputs' gradients from its outputs' gradients.
// Names follow MXNet's operator names ("FullyConnected", "Convolution", "elemwise_add", ...).
//
// Operators compute on float32 arrays on cpu contexts; another dtype or a gpu context is a
// troupe::exception (errc::not_supported) that names the operator. Wrong shapes throw
// errc::shape_mismatch naming the operator, the input and both shapes.

#include <array>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/ndarray.hpp"
#include "engine/row_sparse.hpp"

namespace troupe {

/// Parameters of an operator call. One struct for all operators: each reads the fields it
/// documents and ignores the rest (MXNet passes the same as string attributes).
struct op_attrs {
  std::int64_t num_hidden = 0;              ///< FullyConnected: output units
  std::int64_t num_filter = 0;              ///< Convolution: output channels
  bool no_bias = false;                     ///< FullyConnected, Convolution: no bias input
  bool flatten = true;                      ///< FullyConnected: collapse all axes but the first
  std::array<std::int64_t, 2> kernel{1, 1}; ///< Convolution, Pooling: window (h, w)
  std::array<std::int64_t, 2> stride{1, 1}; ///< Convolution, Pooling
  std::array<std::int64_t, 2> pad{0, 0};    ///< Convolution, Pooling
  std::string act_type;                     ///< Activation: relu, sigmoid, tanh, softrelu
  std::string pool_type;                    ///< Pooling: max, avg
  double p = 0.5;                           ///< Dropout: probability of dropping, in [0, 1)
  double scalar = 0.0;                      ///< _plus_scalar, _mul_scalar, ...: the scalar
  shape_vector shape;                       ///< Reshape: target shape, -1 inferred once
  std::int64_t input_dim = 0;               ///< Embedding: rows of the weight (the vocabulary)
  std::int64_t output_dim = 0;              ///< Embedding: columns of the weight
  bool sparse_grad = false; ///< Embedding: autograd gives the weight a row_sparse gradient

  /// "num_hidden=256, no_bias=0": the fields the operator `op_name` reads, for messages and
  /// graph printing.
  std::string describe(std::string_view op_name) const;
};

// The attributes of one call of each operator, from the arguments of its engine/nd.hpp form, so
// that the imperative API, the symbolic API and the nn blocks fill the same fields the same way.
// no_bias is left false: the caller sets it from whether it passes a bias.
op_attrs fully_connected_attrs(std::int64_t num_hidden, bool flatten = true);
op_attrs convolution_attrs(std::array<std::int64_t, 2> kernel, std::int64_t num_filter,
                           std::array<std::int64_t, 2> stride = {1, 1},
                           std::array<std::int64_t, 2> pad = {0, 0});
op_attrs pooling_attrs(std::array<std::int64_t, 2> kernel, std::string_view pool_type,
                       std::array<std::int64_t, 2> stride = {1, 1},
                       std::array<std::int64_t, 2> pad = {0, 0});
op_attrs activation_attrs(std::string_view act_type);
op_attrs dropout_attrs(double p);
/// _plus_scalar, _mul_scalar, ...
op_attrs scalar_attrs(double scalar);
op_attrs reshape_attrs(shape_vector shape);
op_attrs embedding_attrs(std::int64_t input_dim, std::int64_t output_dim, bool sparse_grad = false);

struct op_def;

/// What a forward call sees. `outputs` are allocated by the caller with the shapes infer_shape
/// gave. `saved` is the op's private state for backward (softmax probabilities, a dropout mask):
/// the op fills it; when the caller passes it back non-empty (an executor running the same node
/// again) the op may reuse its arrays when their shapes fit.
struct op_forward_call {
  const op_attrs& attrs;
  bool is_train; ///< training mode (Dropout drops only when true)
  std::span<const ndarray> inputs;
  std::span<ndarray> outputs;
  std::vector<ndarray>& saved;
  /// The seed of a random operator (Dropout) for this call, drawn when the call was queued (see
  /// op_def::draws_seed), so that queued work on several contexts draws in call order.
  std::uint64_t seed = 0;
};

/// What a backward call sees: the forward's inputs, outputs and saved state, the gradients of
/// the outputs, and where the inputs' gradients go. input_grads[i] is the none handle when input
/// i needs no gradient (req null); otherwise it has input i's shape and is written or added to
/// as reqs[i] says.
struct op_backward_call {
  const op_attrs& attrs;
  std::span<const ndarray> inputs;
  std::span<const ndarray> outputs;
  std::span<const ndarray> saved;
  std::span<const ndarray> output_grads;
  std::span<ndarray> input_grads;
  std::span<const grad_req> reqs;
};

struct op_def {
  std::string name;
  /// The inputs' names for these attributes: {"data", "weight", "bias"}, or without "bias" when
  /// no_bias. Their count is the number of inputs a call must pass.
  std::vector<std::string> (*input_names)(const op_attrs& attrs);
  /// Number of outputs (1 for every operator so far).
  std::size_t num_outputs = 1;
  /// Output shapes from the inputs' shapes (all known: run fill_input_shapes first where some
  /// are not). Throws troupe::exception (errc::shape_mismatch or invalid_argument) naming the op,
  /// the input and the shapes.
  std::vector<shape_vector> (*infer_shape)(const op_attrs& attrs,
                                           std::span<const shape_vector> inputs);
  /// Fills the shapes of parameter inputs (weight, bias) that are unknown (an empty vector:
  /// parameters are never scalars) from the data's shape and the attributes (FullyConnected:
  /// weight [num_hidden, in]); leaves known shapes alone.
  /// Used by deferred initialisation and simple_bind. Null for ops without parameters.
  void (*fill_input_shapes)(const op_attrs& attrs, std::span<shape_vector> inputs) = nullptr;
  void (*forward)(const op_forward_call& call);
  /// Whether a call with these attributes draws a seed from the operators' source (null: never).
  bool (*draws_seed)(const op_attrs& attrs, bool is_train) = nullptr;
  void (*backward)(const op_backward_call& call);
  /// Whether backward reads the forward inputs / outputs (memory planning may free or reuse
  /// those buffers after forward when it does not).
  bool backward_reads_inputs = true;
  bool backward_reads_outputs = true;
  /// For an op whose gradient with respect to input `rows_input` may be row_sparse (Embedding's
  /// weight: a batch touches a few rows of a large table): that gradient from the forward's
  /// inputs and the outputs' gradients, on the host. Autograd calls it, instead of computing that
  /// input's dense gradient with `backward`, when the call's attrs.sparse_grad is set (the
  /// symbolic executor always computes the dense one). Null for every other op.
  row_sparse_array (*backward_rows)(const op_attrs& attrs, std::span<const ndarray> inputs,
                                    std::span<const ndarray> output_grads) = nullptr;
  std::size_t rows_input = 0;
};

/// Queues one forward call of `op` on the outputs' context (engine/dispatch.hpp): the inputs are
/// read, the outputs written, `saved` filled (it stays shared with the backward that reads it).
/// The caller allocates the outputs with the shapes infer_shape gave and draws the seed
/// (seed_for_call). Without a device backend the call runs at once and throws what it throws.
void queue_forward(const op_def& op, const op_attrs& attrs, bool is_train, std::uint64_t seed,
                   std::span<const ndarray> inputs, std::span<ndarray> outputs,
                   std::shared_ptr<std::vector<ndarray>> saved);
/// Queues one backward call in the same way: the input gradients are written (or added to, as
/// reqs say), everything else read.
void queue_backward(const op_def& op, const op_attrs& attrs, std::span<const ndarray> inputs,
                    std::span<const ndarray> outputs, std::shared_ptr<std::vector<ndarray>> saved,
                    std::span<const ndarray> output_grads, std::span<ndarray> input_grads,
                    std::span<const grad_req> reqs);

/// The operator of that name; throws troupe::exception (errc::invalid_argument) naming it and
/// listing the known names.
const op_def& find_op(std::string_view name);
/// Names of every registered operator, sorted.
std::vector<std::string> list_ops();

/// Seeds the random source of operators (Dropout), as mx.random.seed does for them. Each
/// training-mode Dropout call draws its mask seed from this source, so a seed reproduces a run,
/// imperative or hybridized.
void seed_operators(std::uint64_t seed);
/// The next 64-bit seed from that source (thread-safe).
std::uint64_t next_operator_seed();
/// The seed of one call of `op`: next_operator_seed() when the op draws one, else 0. Callers
/// draw it when they queue the call.
std::uint64_t seed_for_call(const op_def& op, const op_attrs& attrs, bool is_train);

} // namespace troupe
