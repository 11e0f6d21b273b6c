#pragma once
// Symbolic mode: MXNet's Symbol and Executor (python/mxnet/symbol, src/executor).
//
//   auto x = symbol::variable("data");
//   auto net = sym::fully_connected(x, symbol::variable("fc_weight"),
//                                   symbol::variable("fc_bias"), 10);
//   auto exec = net.simple_bind(context::cpu(), {{"data", {64, 784}}}, grad_req::write).value();
//   exec.arg("data") ...; exec.forward(true); exec.backward();  exec.grad("fc_weight")
//
// A symbol is a graph of operator nodes (engine/op.hpp) over named variables. Binding infers
// every shape, plans the memory of the whole graph (buffers whose values are no longer needed
// are reused for later ones), and gives an executor whose forward/backward run the same
// operators as the imperative API and so give identical results.

#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/error.hpp"
#include "engine/ndarray.hpp"
#include "engine/op.hpp"

namespace troupe {

struct symbol_node;

/// One output of a node.
struct symbol_output {
  std::shared_ptr<const symbol_node> node;
  std::size_t index = 0;
};

/// A graph node: a variable (op == nullptr) or an operator call.
struct symbol_node {
  const op_def* op = nullptr;
  std::string name; ///< the variable's name, or the call's name ("fullyconnected0")
  op_attrs attrs;
  std::vector<symbol_output> inputs;
  /// Creation number (symbol::variable and symbol::create count up from 1; 0 for a node made by
  /// hand). A node is made after its inputs, so this order is topological, and for a traced
  /// graph it is the order of the calls: the executor runs calls in it, which makes Dropout draw
  /// its seeds and backward add up gradients in the same order as the imperative run.
  std::uint64_t sequence = 0;
};

class executor;

class symbol {
public:
  /// A named input of the graph (data, a label or a parameter).
  static symbol variable(std::string name);
  /// A call of operator `op_name` on single-output symbols; `name` names the node (made unique
  /// as "<op in lower case><n>" when empty). Checks the number of inputs against the op.
  static symbol create(std::string_view op_name, std::span<const symbol> inputs, op_attrs attrs,
                       std::string name = {});
  /// Several symbols as one with all their outputs (mx.sym.Group).
  static symbol group(std::span<const symbol> symbols);

  symbol() = default;
  explicit symbol(std::vector<symbol_output> outputs) : outputs_(std::move(outputs)) {}

  const std::vector<symbol_output>& outputs() const noexcept { return outputs_; }
  /// Output `index` alone.
  symbol operator[](std::size_t index) const;

  /// Variable names in the order MXNet lists them (depth-first over inputs, first visit).
  std::vector<std::string> list_arguments() const;
  /// "<node name>_output" per output.
  std::vector<std::string> list_outputs() const;

  struct shapes {
    std::vector<shape_vector> arguments; ///< in list_arguments() order
    std::vector<shape_vector> outputs;
  };
  /// Every shape from the shapes of some variables (parameter shapes follow from the data's via
  /// op_def::fill_input_shapes). An error names the node and the shapes that conflict, or the
  /// variables whose shapes cannot be inferred.
  result<shapes> infer_shape(const std::map<std::string, shape_vector>& known) const;

  /// An executor over caller-provided arrays: `arguments` holds every variable's array,
  /// `gradients` the arrays that receive the gradients of variables whose req is not null
  /// (missing entries mean null). Shapes must match inference.
  result<executor> bind(context ctx, std::map<std::string, ndarray> arguments,
                        std::map<std::string, ndarray> gradients = {},
                        std::map<std::string, grad_req> reqs = {}) const;
  /// An executor that allocates every argument and gradient itself from the given shapes (the
  /// rest inferred); `req` applies to every variable except those named in `req_overrides`.
  result<executor> simple_bind(context ctx, const std::map<std::string, shape_vector>& shapes,
                               grad_req req = grad_req::write,
                               const std::map<std::string, grad_req>& req_overrides = {}) const;

  /// A readable listing of the graph: one line per node with its op, inputs and attributes.
  std::string to_string() const;

private:
  std::vector<symbol_output> outputs_;
};

/// Runs a bound graph. Movable, not copyable.
class executor {
public:
  executor(executor&&) noexcept;
  executor& operator=(executor&&) noexcept;
  ~executor();

  /// Computes the outputs from the current argument values.
  void forward(bool is_train = false);
  /// Gradients of the arguments from the outputs' gradients (ones when empty), written or added
  /// as each argument's req says. Needs forward(true) first.
  void backward(std::span<const ndarray> output_grads = {});

  const std::vector<ndarray>& outputs() const noexcept;
  /// The bound array of a variable; writing into it (copy_to) sets the next forward's input.
  ndarray& arg(std::string_view name);
  /// The gradient array of a variable (the none handle when its req is null).
  ndarray& grad(std::string_view name);
  const std::vector<std::string>& argument_names() const noexcept;

  /// Bytes of the intermediate buffers after planning, and what one buffer per value would
  /// take: the saving memory planning achieved.
  std::size_t planned_bytes() const noexcept;
  std::size_t unplanned_bytes() const noexcept;

  struct impl;

private:
  friend class symbol;
  explicit executor(std::unique_ptr<impl> state);
  std::unique_ptr<impl> impl_;
};

/// Symbolic forms of the operators of engine/nd.hpp, with the same arguments; `bias` may be a
/// default-constructed symbol for no bias.
namespace sym {
symbol fully_connected(const symbol& x, const symbol& weight, const symbol& bias,
                       std::int64_t num_hidden, bool flatten = true);
symbol convolution(const symbol& x, const symbol& weight, const symbol& bias,
                   std::array<std::int64_t, 2> kernel, std::int64_t num_filter,
                   std::array<std::int64_t, 2> stride = {1, 1},
                   std::array<std::int64_t, 2> pad = {0, 0});
symbol pooling(const symbol& x, std::array<std::int64_t, 2> kernel, std::string_view pool_type,
               std::array<std::int64_t, 2> stride = {1, 1},
               std::array<std::int64_t, 2> pad = {0, 0});
symbol activation(const symbol& x, std::string_view act_type);
symbol flatten(const symbol& x);
symbol dropout(const symbol& x, double p);
symbol softmax_cross_entropy(const symbol& logits, const symbol& label);
symbol add(const symbol& a, const symbol& b);
symbol multiply(const symbol& a, const symbol& b);
symbol sum(const symbol& a);
} // namespace sym

} // namespace troupe
