#include "engine/autograd.hpp"

#include <algorithm>
#include <array>
#include <atomic>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <utility>

#include "engine/autograd_state.hpp"

namespace troupe {

namespace {

thread_local bool recording = false;
thread_local bool training = false;
thread_local bool in_operator = false;
thread_local trace_scope* active_trace = nullptr;

std::atomic<std::uint64_t> next_sequence{0};

[[noreturn]] void fail(errc code, std::string message) {
  throw exception(code, "backward: " + std::move(message));
}

/// Where the gradient contributions to one value go: the first contribution is written, the
/// later ones added, in the order backward produces them (latest call first).
struct gradient_slot {
  ndarray buffer;
  bool written = false;
};

} // namespace

namespace detail {

bool carries_gradient(const ndarray& array) noexcept {
  const auto& state = array.autograd_state();
  return state != nullptr && (state->producer != nullptr || state->req != grad_req::null);
}

bool operators_observed() noexcept {
  return !in_operator && (recording || active_trace != nullptr);
}

trace_scope* current_trace() noexcept {
  return in_operator ? nullptr : active_trace;
}

void set_current_trace(trace_scope* trace) noexcept {
  active_trace = trace;
}

inside_operator::inside_operator() noexcept : previous_(in_operator) {
  in_operator = true;
}

inside_operator::~inside_operator() {
  in_operator = previous_;
}

void record_node(std::shared_ptr<autograd_node> node, std::span<ndarray> outputs) {
  node->sequence = next_sequence.fetch_add(1, std::memory_order_relaxed);
  node->outputs.reserve(outputs.size());
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    node->outputs.push_back(outputs[i].detach());
    auto state = std::make_shared<autograd_entry>();
    state->producer = node;
    state->output_index = i;
    outputs[i].set_autograd_state(std::move(state));
  }
}

} // namespace detail

namespace autograd {

record_scope::record_scope(bool train_mode)
    : previous_recording_(recording), previous_training_(training) {
  recording = true;
  training = train_mode;
}
record_scope::~record_scope() {
  recording = previous_recording_;
  training = previous_training_;
}

pause_scope::pause_scope(bool train_mode)
    : previous_recording_(recording), previous_training_(training) {
  recording = false;
  training = train_mode;
}
pause_scope::~pause_scope() {
  recording = previous_recording_;
  training = previous_training_;
}

training_scope::training_scope(bool is_training) : previous_training_(training) {
  training = is_training;
}
training_scope::~training_scope() {
  training = previous_training_;
}

bool is_recording() noexcept {
  return recording;
}
bool is_training() noexcept {
  return training;
}

void attach_row_sparse_grad(ndarray& array, grad_req req) {
  if (array.is_none() || array.shape().empty())
    throw exception(errc::invalid_argument,
                    "attach_row_sparse_grad: a row_sparse gradient needs an array with rows, got " +
                        (array.is_none() ? std::string{"the none handle"}
                                         : "shape " + shape_to_string(array.shape())));
  auto state = std::make_shared<autograd_entry>();
  state->req = req;
  state->row_sparse = true;
  state->rows = row_sparse_array::zeros(array.shape(), array.dtype());
  array.set_autograd_state(std::move(state));
}

bool has_row_sparse_grad(const ndarray& array) noexcept {
  const auto& state = array.autograd_state();
  return state != nullptr && state->row_sparse;
}

namespace {

autograd_entry& row_sparse_entry(const ndarray& array, std::string_view call) {
  if (!has_row_sparse_grad(array))
    throw exception(
        errc::invalid_argument,
        std::string{call} + ": the array" +
            (array.is_none() ? std::string{} : " of shape " + shape_to_string(array.shape())) +
            " has no row_sparse gradient (attach_row_sparse_grad)");
  return *array.autograd_state();
}

} // namespace

row_sparse_array row_sparse_grad(const ndarray& array) {
  return row_sparse_entry(array, "row_sparse_grad").rows;
}

void set_row_sparse_grad(const ndarray& array, row_sparse_array value) {
  auto& state = row_sparse_entry(array, "set_row_sparse_grad");
  if (value.shape() != array.shape())
    throw exception(errc::shape_mismatch,
                    "set_row_sparse_grad: a value of shape " + shape_to_string(value.shape()) +
                        " for a gradient of shape " + shape_to_string(array.shape()));
  state.rows = std::move(value);
}

void record_custom(std::span<const ndarray> inputs, std::span<ndarray> outputs,
                   custom_backward backward) {
  if (!recording || in_operator ||
      std::none_of(inputs.begin(), inputs.end(), detail::carries_gradient))
    return;
  auto node = std::make_shared<autograd_node>();
  node->custom = std::move(backward);
  node->inputs.assign(inputs.begin(), inputs.end());
  detail::record_node(std::move(node), outputs);
}

namespace {

/// Every recorded call that the heads depend on, latest first. Shared ownership keeps each
/// node alive while the pass releases the ones downstream of it.
std::vector<std::shared_ptr<autograd_node>> nodes_latest_first(std::span<const ndarray> heads) {
  std::vector<std::shared_ptr<autograd_node>> found;
  std::unordered_set<autograd_node*> seen;
  std::vector<std::shared_ptr<autograd_node>> pending;
  for (const auto& head : heads)
    if (const auto& node = head.autograd_state()->producer; seen.insert(node.get()).second)
      pending.push_back(node);
  while (!pending.empty()) {
    auto node = std::move(pending.back());
    pending.pop_back();
    if (node->released)
      fail(errc::invalid_argument,
           "the graph was already released by an earlier backward(); pass retain_graph=true "
           "to the first call to run backward through it again");
    for (const auto& input : node->inputs)
      if (const auto& state = input.autograd_state(); state && state->producer)
        if (seen.insert(state->producer.get()).second)
          pending.push_back(state->producer);
    found.push_back(std::move(node));
  }
  std::sort(found.begin(), found.end(),
            [](const auto& a, const auto& b) { return a->sequence > b->sequence; });
  return found;
}

/// Adds `contribution` to a slot: the first one becomes the slot's buffer.
void add_to_slot(gradient_slot& slot, ndarray contribution) {
  if (!slot.written) {
    slot.buffer = std::move(contribution);
    slot.written = true;
  } else {
    slot.buffer += contribution;
  }
}

struct leaf_state {
  bool written = false; // the first contribution of this backward has been stored
};

class backward_pass {
public:
  void run(std::span<const ndarray> heads, std::span<const ndarray> head_grads, bool retain_graph) {
    for (std::size_t i = 0; i < heads.size(); ++i) {
      const auto& head = heads[i];
      if (head.is_none())
        fail(errc::invalid_argument, "head " + std::to_string(i) + " is the none handle");
      const auto& state = head.autograd_state();
      if (!state || !state->producer)
        fail(errc::invalid_argument,
             "head " + std::to_string(i) + " of shape " + shape_to_string(head.shape()) +
                 " has no recorded history (was it computed inside an autograd::record_scope "
                 "from arrays with attach_grad()?)");
      if (state->producer->released)
        fail(errc::invalid_argument,
             "the graph of head " + std::to_string(i) +
                 " was already released by an earlier backward(); pass retain_graph=true to "
                 "the first call to run backward through it again");
      ndarray head_grad = i < head_grads.size() ? head_grads[i] : ndarray{};
      if (head_grad.is_none()) {
        head_grad = ndarray::ones(head.shape(), head.ctx(), head.dtype());
      } else if (head_grad.shape() != head.shape()) {
        fail(errc::shape_mismatch, "head gradient " + std::to_string(i) + " has shape " +
                                       shape_to_string(head_grad.shape()) + ", the head " +
                                       shape_to_string(head.shape()));
      } else {
        head_grad = head_grad.detach();
      }
      add_to_slot(slot_of(*state->producer, state->output_index), head_grad.copy());
    }

    const auto nodes = nodes_latest_first(heads);
    for (const auto& node : nodes)
      run_node(*node);
    if (!retain_graph)
      for (const auto& node : nodes)
        release(*node);
  }

private:
  gradient_slot& slot_of(autograd_node& node, std::size_t output) {
    auto& slots = slots_[&node];
    if (slots.empty())
      slots.resize(node.outputs.size());
    return slots[output];
  }

  void run_node(autograd_node& node) {
    auto found = slots_.find(&node);
    if (found == slots_.end())
      return;
    std::vector<ndarray> output_grads(node.outputs.size());
    for (std::size_t i = 0; i < output_grads.size(); ++i)
      output_grads[i] = found->second[i].written
                            ? found->second[i].buffer
                            : ndarray::zeros(node.outputs[i].shape(), node.outputs[i].ctx(),
                                             node.outputs[i].dtype());
    slots_.erase(found);

    // Each input that needs a gradient gets a buffer. The first contribution to a leaf with
    // grad_req write is written straight into its attached gradient; everything else gets a fresh
    // buffer that is delivered (written or added) afterwards.
    const std::size_t count = node.inputs.size();
    // An op that can make a row_sparse gradient (Embedding with sparse_grad) makes it for its
    // input `rows_input` here, after the dense backward has made the others.
    const bool rows_wanted = node.op != nullptr && node.op->backward_rows != nullptr &&
                             node.attrs.sparse_grad && node.op->rows_input < count &&
                             detail::carries_gradient(node.inputs[node.op->rows_input]);
    std::vector<ndarray> input_grads(count);
    std::vector<grad_req> reqs(count, grad_req::null);
    std::vector<bool> direct(count, false);
    for (std::size_t i = 0; i < count; ++i) {
      const auto& input = node.inputs[i];
      if (!detail::carries_gradient(input) || (rows_wanted && i == node.op->rows_input))
        continue;
      const auto& state = input.autograd_state();
      const bool repeated =
          std::any_of(node.inputs.begin(), node.inputs.end(), [&](const ndarray& other) {
            return &other != &input && other.autograd_state() == state;
          });
      // An op's own add mode rounds differently from adding its result afterwards (a GEMM
      // with beta 1 adds block by block); the executor adds afterwards, so autograd does too,
      // and imperative, hybridized and symbolic runs agree to the bit.
      if (!state->producer && !repeated && state->req == grad_req::write && !state->row_sparse &&
          !leaves_[state.get()].written) {
        leaves_[state.get()].written = true;
        input_grads[i] = state->grad;
        reqs[i] = grad_req::write;
        direct[i] = true;
      } else {
        input_grads[i] = ndarray(input.shape(), input.ctx(), input.dtype());
        reqs[i] = grad_req::write;
      }
    }
    {
      detail::inside_operator inside;
      if (node.custom)
        node.custom(output_grads, input_grads);
      else
        queue_backward(*node.op, node.attrs, node.inputs, node.outputs, node.saved, output_grads,
                       input_grads, reqs);
    }
    for (std::size_t i = 0; i < count; ++i)
      if (reqs[i] != grad_req::null && !direct[i])
        deliver(node.inputs[i], std::move(input_grads[i]));
    if (rows_wanted) {
      // Made on this thread from values the lanes may still be computing.
      for (const auto& grad : output_grads)
        grad.wait_to_read();
      for (std::size_t i = 0; i < count; ++i)
        if (i != node.op->rows_input)
          node.inputs[i].wait_to_read();
      row_sparse_array rows;
      {
        detail::inside_operator inside;
        rows = node.op->backward_rows(node.attrs, node.inputs, output_grads);
      }
      deliver_rows(node.inputs[node.op->rows_input], std::move(rows));
    }
  }

  /// Passes a row_sparse gradient contribution to the value it belongs to: a row_sparse leaf
  /// keeps it as rows, anything else gets it dense.
  void deliver_rows(const ndarray& input, row_sparse_array contribution) {
    const auto& state = input.autograd_state();
    if (!state || (!state->producer && state->req == grad_req::null))
      return;
    if (state->producer || !state->row_sparse) {
      deliver(input, contribution.to_dense().copy_to(input.ctx()));
      return;
    }
    store_rows(*state, std::move(contribution));
  }

  /// Writes (the first contribution of this backward to a grad_req write leaf) or adds rows.
  void store_rows(autograd_entry& state, row_sparse_array contribution) {
    auto& leaf = leaves_[&state];
    if (!leaf.written && state.req == grad_req::write) {
      state.rows = std::move(contribution);
    } else {
      const std::array<const row_sparse_array*, 2> both{&state.rows, &contribution};
      state.rows = sum_rows(both);
    }
    leaf.written = true;
  }

  /// Passes a gradient contribution to the value it belongs to.
  void deliver(const ndarray& input, ndarray contribution) {
    const auto& state = input.autograd_state();
    if (!state)
      return;
    if (state->producer) {
      add_to_slot(slot_of(*state->producer, state->output_index), std::move(contribution));
      return;
    }
    if (state->req == grad_req::null)
      return;
    if (state->row_sparse) {
      // A dense contribution (the weight used by another operator too) keeps its non-zero rows.
      auto rows = row_sparse_array::from_dense(contribution);
      if (!rows)
        throw exception(rows.error());
      store_rows(*state, std::move(*rows));
      return;
    }
    auto& leaf = leaves_[state.get()];
    if (!leaf.written && state->req == grad_req::write)
      contribution.copy_to(state->grad);
    else
      state->grad += contribution;
    leaf.written = true;
  }

  static void release(autograd_node& node) {
    node.released = true;
    node.inputs.clear();
    node.outputs.clear();
    node.saved.reset();
    node.custom = nullptr;
  }

  std::unordered_map<autograd_node*, std::vector<gradient_slot>> slots_;
  std::unordered_map<const autograd_entry*, leaf_state> leaves_;
};

} // namespace

void backward(std::span<const ndarray> heads, std::span<const ndarray> head_grads,
              bool retain_graph) {
  if (!head_grads.empty() && head_grads.size() != heads.size())
    fail(errc::invalid_argument, std::to_string(heads.size()) + " heads but " +
                                     std::to_string(head_grads.size()) + " head gradients");
  pause_scope pause(training);
  backward_pass{}.run(heads, head_grads, retain_graph);
}

void backward(const ndarray& head, const ndarray& head_grad, bool retain_graph) {
  backward(std::span<const ndarray>(&head, 1), std::span<const ndarray>(&head_grad, 1),
           retain_graph);
}

} // namespace autograd

} // namespace troupe
