#pragma once
// Engine internals shared by autograd.cpp, nd.cpp, trace.cpp and ndarray.cpp: what an ndarray's
// autograd state holds, and the per-thread switches. Not for code outside engine/.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/autograd.hpp"
#include "engine/ndarray.hpp"
#include "engine/op.hpp"
#include "engine/row_sparse.hpp"

namespace troupe {

class trace_scope;

/// One recorded call: an operator, or a custom step (op == nullptr) with its own backward.
struct autograd_node {
  const op_def* op = nullptr;
  op_attrs attrs;
  autograd::custom_backward custom;
  /// The inputs with their autograd state: they keep the graph upstream alive.
  std::vector<ndarray> inputs;
  /// The outputs' values without autograd state (a node must not own its outputs' state, which
  /// owns the node).
  std::vector<ndarray> outputs;
  /// The op's state for backward. Shared: the forward that fills it and the backward that reads
  /// it may still be queued on the context's lane when the node is released.
  std::shared_ptr<std::vector<ndarray>> saved = std::make_shared<std::vector<ndarray>>();
  /// Recording order: backward visits nodes from the latest.
  std::uint64_t sequence = 0;
  bool released = false;
};

struct autograd_entry {
  /// The gradient attached by attach_grad, and how backward stores into it.
  ndarray grad;
  grad_req req = grad_req::null;
  /// attach_row_sparse_grad: the gradient is `rows` (row_sparse) and `grad` is the none handle.
  bool row_sparse = false;
  row_sparse_array rows;
  /// The call that computed this array, when it was recorded.
  std::shared_ptr<autograd_node> producer;
  std::size_t output_index = 0;
};

namespace detail {

/// True when `array` takes part in differentiation: it has recorded history or a gradient.
bool carries_gradient(const ndarray& array) noexcept;
/// True when operator calls on this thread must go through nd:: (recording or tracing, and not
/// inside an operator's own computation).
bool operators_observed() noexcept;
/// The innermost live trace_scope of this thread, or nullptr.
trace_scope* current_trace() noexcept;
void set_current_trace(trace_scope* trace) noexcept;
/// Marks that an operator's forward/backward runs on this thread, so that ndarray arithmetic
/// inside it is neither recorded nor traced.
class inside_operator {
public:
  inside_operator() noexcept;
  ~inside_operator();
  inside_operator(const inside_operator&) = delete;
  inside_operator& operator=(const inside_operator&) = delete;

private:
  bool previous_;
};
/// Writes an operator call down in `trace`'s graph; outputs get autograd state if they have
/// none, so that later calls can find them (trace.cpp).
void note_traced_call(trace_scope& trace, const op_def& op, const op_attrs& attrs,
                      std::span<const ndarray> inputs, std::span<ndarray> outputs);
/// Records `node` as the producer of `outputs` (whose autograd state is replaced).
void record_node(std::shared_ptr<autograd_node> node, std::span<ndarray> outputs);

} // namespace detail

} // namespace troupe
