// The executor: binding a symbol (shapes, order of the calls, memory plan) and running it.
//
// Order. Calls run in the order their nodes were created (symbol_node::sequence), which is the
// order of the calls of the traced forward, so Dropout draws the same seeds and backward adds up
// the same contributions in the same order as the imperative run with autograd.
//
// Memory plan. Binding lays the whole run out as steps: forward of call 0 .. N-1, a seed step
// (head gradients), then backward of the calls in reverse order. Each value that is neither an
// argument nor a graph output (and each intermediate gradient) is an item alive from the step
// that writes it to the last step that reads it; walking the steps, an item takes the smallest
// free buffer of at least its size (best fit by bytes) or a new one, and frees its buffer after
// its last reader has run, so a later item may take it. Items are views (slice + reshape) of
// flat float32 buffers. Forward values that a backward reads (op_def::backward_reads_inputs /
// outputs) stay alive to the end, so backward() may run again without a forward; when no
// gradient is asked for (every req null) nothing is kept and the plan is an inference plan.
// Arguments, their gradients and graph outputs have arrays of their own, never shared.
//
// Gradients. A value used by several calls gets the sum of their contributions, added in reverse
// order of the calls (within one call, in input order); a graph output's gradient (ones, or the
// one given to backward()) comes first. Each contribution is computed by the op with req write:
// the first one to a target it overwrites (an intermediate value's gradient buffer, or an
// argument's gradient array under grad_req write) straight into the target, every other one into
// a scratch buffer that is then added to the target with +=. Ops are never asked to add (req
// add): an op's add is not always the same rounding as a separate += (a GEMM with beta 1 adds
// block by block), and this rule gives the same bits as autograd and as a hybridized block, whose
// executor's gradients autograd adds with += too.

#include <algorithm>
#include <map>
#include <queue>
#include <unordered_map>
#include <utility>

#include "engine/autograd.hpp"
#include "engine/symbol.hpp"

namespace troupe {

namespace {

constexpr std::size_t none = static_cast<std::size_t>(-1);

[[noreturn]] void fail(errc code, std::string message) {
  throw exception(code, std::move(message));
}

/// Every op node reachable from `heads` in the order the executor runs them: creation order
/// (symbol_node::sequence), and among nodes made by hand (sequence 0) depth-first post-order.
/// Kahn's algorithm, so the order is topological whatever the sequences say.
std::vector<const symbol_node*> run_order(const std::vector<symbol_output>& heads) {
  // Depth-first post-order over everything, iterative (deep graphs).
  std::vector<const symbol_node*> post;
  std::unordered_map<const symbol_node*, std::size_t> position;
  {
    std::unordered_map<const symbol_node*, bool> seen;
    std::vector<std::pair<const symbol_node*, std::size_t>> stack;
    for (const symbol_output& head : heads) {
      if (!seen.emplace(head.node.get(), false).second)
        continue;
      stack.emplace_back(head.node.get(), 0);
      while (!stack.empty()) {
        auto& [node, next] = stack.back();
        if (next < node->inputs.size()) {
          const symbol_node* input = node->inputs[next++].node.get();
          if (seen.emplace(input, false).second)
            stack.emplace_back(input, 0);
          continue;
        }
        if (node->op != nullptr) {
          position.emplace(node, post.size());
          post.push_back(node);
        }
        stack.pop_back();
      }
    }
  }
  std::unordered_map<const symbol_node*, std::size_t> waiting; // op inputs not yet run
  std::unordered_map<const symbol_node*, std::vector<const symbol_node*>> consumers;
  for (const symbol_node* node : post) {
    std::size_t count = 0;
    for (const symbol_output& input : node->inputs) {
      if (input.node->op == nullptr)
        continue;
      auto& list = consumers[input.node.get()];
      if (std::find(list.begin(), list.end(), node) == list.end()) {
        list.push_back(node);
        ++count;
      }
    }
    waiting[node] = count;
  }
  using key = std::pair<std::uint64_t, std::size_t>;
  std::priority_queue<key, std::vector<key>, std::greater<>> ready;
  for (const symbol_node* node : post)
    if (waiting[node] == 0)
      ready.emplace(node->sequence, position[node]);
  std::vector<const symbol_node*> order;
  order.reserve(post.size());
  while (!ready.empty()) {
    const symbol_node* node = post[ready.top().second];
    ready.pop();
    order.push_back(node);
    for (const symbol_node* consumer : consumers[node])
      if (--waiting[consumer] == 0)
        ready.emplace(consumer->sequence, position[consumer]);
  }
  return order;
}

} // namespace

struct executor::impl {
  /// After a call's backward: input gradient `slot` (a scratch buffer) is copied or added into
  /// `target`, or into the gradient of argument `argument` when that is not none.
  struct delivery {
    std::size_t slot;
    std::size_t argument;
    ndarray target;
    bool add;
  };
  struct node_state {
    const symbol_node* node = nullptr;
    std::vector<ndarray> inputs;
    std::vector<ndarray> outputs;
    // The op's state, kept across calls so that it can reuse it; shared with the queued calls.
    std::shared_ptr<std::vector<ndarray>> saved = std::make_shared<std::vector<ndarray>>();
    bool runs_backward = false;
    std::vector<ndarray> output_grads;
    std::vector<ndarray> input_grads;
    std::vector<grad_req> reqs;
    std::vector<delivery> deliveries; // in input order
  };
  /// Entry `index` of one of node `node`'s vectors is refreshed from entry `source` of another
  /// vector on each call (the user may have replaced an argument's or gradient's handle).
  struct slot {
    std::size_t node;
    std::size_t index;
    std::size_t source;
  };
  /// A head gradient written (copied) or added into a gradient buffer or an argument's gradient.
  struct seed {
    std::size_t head;
    std::size_t argument; // none: into `buffer`
    ndarray buffer;
    bool add;
  };

  context ctx;
  symbol graph; // holds the nodes that node_state points to
  std::vector<std::string> names;
  std::vector<shape_vector> argument_shapes;
  std::vector<ndarray> arguments;
  std::vector<ndarray> gradients; // none handle where req is null
  std::vector<grad_req> argument_reqs;

  std::vector<node_state> nodes;        // in run order
  std::vector<slot> argument_inputs;    // nodes[n].inputs[i] = arguments[a]
  std::vector<slot> argument_gradients; // nodes[n].input_grads[i] = gradients[a]
  std::vector<slot> head_gradients;     // nodes[n].output_grads[i] = head gradient h
  std::vector<seed> seeds;              // in head order

  std::vector<ndarray> outputs;
  std::vector<std::size_t> output_arguments; // per output: the argument it is, or none
  std::vector<ndarray> ones;                 // per output whose gradient is used, else none
  std::vector<ndarray> head_grads;           // per output: this backward's head gradient

  std::vector<ndarray> buffers; // the planned pool
  std::size_t planned_bytes = 0;
  std::size_t unplanned_bytes = 0;
  bool trained = false; // the last forward was forward(true) and completed

  std::size_t argument_index(std::string_view name) const {
    for (std::size_t a = 0; a < names.size(); ++a)
      if (names[a] == name)
        return a;
    std::string known;
    for (const std::string& each : names)
      known += (known.empty() ? "" : ", ") + each;
    fail(errc::invalid_argument,
         "executor: no argument named '" + std::string(name) + "'; the arguments are " + known);
  }

  /// Throws unless every argument still has its bound shape and context.
  void check_arguments() const {
    for (std::size_t a = 0; a < arguments.size(); ++a) {
      const ndarray& array = arguments[a];
      if (array.is_none() || array.shape() != argument_shapes[a] || array.ctx() != ctx)
        fail(errc::shape_mismatch,
             "executor::forward: argument '" + names[a] + "' is " +
                 (array.is_none()
                      ? std::string("the none handle")
                      : shape_to_string(array.shape()) + " on " + array.ctx().to_string()) +
                 ", bound as " + shape_to_string(argument_shapes[a]) + " on " + ctx.to_string() +
                 " (write new values into the bound array with copy_to)");
    }
  }
};

namespace {

using impl = executor::impl;

/// A value of the graph: an argument (a variable, by index in list_arguments()) or output
/// `index` of op node `node` (by position in run order).
struct value_ref {
  bool is_argument = false;
  std::size_t index = 0; // argument index, or value id (first output id of the node + index)
};

/// One gradient contribution to a value or an argument.
struct contribution {
  std::size_t node;  // none: a head gradient
  std::size_t index; // input slot, or head index
};

/// How a contribution is stored (see the file comment).
enum class store { direct, scratch };

/// A planned array: a view of buffer `buffer` of the pool.
struct item {
  shape_vector shape;
  std::size_t bytes;
  std::size_t buffer = none;
};

/// plan()'s working state. Each phase reads what the earlier ones left in the fields and adds
/// its own; plan() runs them in the order they are declared.
struct planner {
  explicit planner(impl& planned)
      : state(planned), heads(planned.graph.outputs()), order(run_order(heads)),
        n_nodes(order.size()), n_steps(2 * n_nodes + 1) {}

  impl& state;
  const std::vector<symbol_output>& heads;
  const std::vector<const symbol_node*> order;
  const std::size_t n_nodes;
  // Planned items: steps 0..N-1 forward, N the head gradients, 2N - k the backward of call k.
  const std::size_t n_steps;
  const std::size_t element_bytes = size_of(dtype::float32); // operators compute in float32

  // lay_out
  std::unordered_map<std::string_view, std::size_t> argument_of;
  std::unordered_map<const symbol_node*, std::size_t> node_of;
  std::vector<std::size_t> first_value; // per node, and one past the last
  std::size_t n_values = 0;
  std::vector<std::size_t> producer; // per value
  std::vector<shape_vector> value_shapes;
  std::vector<std::vector<value_ref>> node_inputs;
  std::vector<value_ref> head_refs;
  std::vector<bool> is_head; // per value

  // trace_gradients
  std::vector<bool> needs_backward; // some input needs a gradient
  std::vector<bool> runs_backward;
  std::vector<std::vector<contribution>> value_contributions;
  std::vector<std::vector<contribution>> argument_contributions;

  // find_lifetimes
  std::vector<bool> kept;
  std::vector<std::size_t> last_reader;

  // choose_stores
  std::vector<std::vector<store>> value_stores;
  std::vector<std::vector<store>> argument_stores;

  // place_items
  std::vector<item> items;
  std::vector<std::vector<std::size_t>> allocate_at;
  std::vector<std::vector<std::size_t>> release_at;
  std::vector<std::size_t> value_item;
  std::vector<std::size_t> gradient_item;
  std::vector<bool> direct_head_gradient;
  // Scratch items by (value or argument, contribution index).
  std::vector<std::vector<std::size_t>> value_scratch;
  std::vector<std::vector<std::size_t>> argument_scratch;

  // make_values
  std::vector<ndarray> values;
  std::vector<ndarray> value_gradients;

  /// Numbers the values (outputs of the nodes in run order), resolves every input and head, and
  /// infers every value's shape from the arguments' (inference already checked them).
  void lay_out() {
    for (std::size_t a = 0; a < state.names.size(); ++a)
      argument_of.emplace(state.names[a], a);
    first_value.assign(n_nodes + 1, 0);
    for (std::size_t k = 0; k < n_nodes; ++k) {
      node_of.emplace(order[k], k);
      first_value[k + 1] = first_value[k] + order[k]->op->num_outputs;
    }
    n_values = first_value[n_nodes];
    producer.resize(n_values);
    for (std::size_t k = 0; k < n_nodes; ++k)
      for (std::size_t v = first_value[k]; v < first_value[k + 1]; ++v)
        producer[v] = k;

    value_shapes.resize(n_values);
    node_inputs.resize(n_nodes);
    for (std::size_t k = 0; k < n_nodes; ++k) {
      const symbol_node& node = *order[k];
      std::vector<shape_vector> input_shapes;
      for (const symbol_output& input : node.inputs) {
        const value_ref ref = resolve(input);
        node_inputs[k].push_back(ref);
        input_shapes.push_back(ref.is_argument ? state.argument_shapes[ref.index]
                                               : value_shapes[ref.index]);
      }
      std::vector<shape_vector> shapes = node.op->infer_shape(node.attrs, input_shapes);
      for (std::size_t j = 0; j < shapes.size() && j < node.op->num_outputs; ++j)
        value_shapes[first_value[k] + j] = std::move(shapes[j]);
    }
    is_head.assign(n_values, false);
    for (const symbol_output& head : heads) {
      head_refs.push_back(resolve(head));
      if (!head_refs.back().is_argument)
        is_head[head_refs.back().index] = true;
    }
  }

  value_ref resolve(const symbol_output& ref) const {
    if (ref.node->op == nullptr)
      return {true, argument_of.at(ref.node->name)};
    return {false, first_value[node_of.at(ref.node.get())] + ref.index};
  }

  /// Which calls run backward, and the contributions each gradient receives, in the order they
  /// are made: head gradients first, then the calls in reverse order (inputs in order).
  void trace_gradients() {
    needs_backward.assign(n_nodes, false);
    for (std::size_t k = 0; k < n_nodes; ++k)
      needs_backward[k] = std::any_of(node_inputs[k].begin(), node_inputs[k].end(),
                                      [this](const value_ref& ref) { return needs_gradient(ref); });
    value_contributions.resize(n_values);
    argument_contributions.resize(state.names.size());
    for (std::size_t h = 0; h < head_refs.size(); ++h)
      if (needs_gradient(head_refs[h]))
        contributions_of(head_refs[h]).push_back({none, h});
    runs_backward.assign(n_nodes, false);
    for (std::size_t k = n_nodes; k-- > 0;) {
      bool reached = false;
      for (std::size_t v = first_value[k]; v < first_value[k + 1]; ++v)
        reached = reached || !value_contributions[v].empty();
      runs_backward[k] = needs_backward[k] && reached;
      if (!runs_backward[k])
        continue;
      for (std::size_t i = 0; i < node_inputs[k].size(); ++i)
        if (needs_gradient(node_inputs[k][i]))
          contributions_of(node_inputs[k][i]).push_back({k, i});
    }
  }

  bool needs_gradient(const value_ref& ref) const {
    return ref.is_argument ? state.argument_reqs[ref.index] != grad_req::null
                           : needs_backward[producer[ref.index]];
  }

  std::vector<contribution>& contributions_of(const value_ref& ref) {
    return ref.is_argument ? argument_contributions[ref.index] : value_contributions[ref.index];
  }

  /// The last call that reads each value; forward values a backward reads stay alive to the end.
  void find_lifetimes() {
    kept.assign(n_values, false);
    last_reader.resize(n_values);
    for (std::size_t v = 0; v < n_values; ++v) {
      last_reader[v] = producer[v];
      kept[v] = runs_backward[producer[v]] && order[producer[v]]->op->backward_reads_outputs;
    }
    for (std::size_t k = 0; k < n_nodes; ++k)
      for (const value_ref& ref : node_inputs[k]) {
        if (ref.is_argument)
          continue;
        last_reader[ref.index] = std::max(last_reader[ref.index], k);
        if (runs_backward[k] && order[k]->op->backward_reads_inputs)
          kept[ref.index] = true;
      }
  }

  /// How each contribution is stored (see the file comment): the first contribution to a target
  /// that it overwrites (an intermediate gradient, an argument's under grad_req write) is written
  /// there by the op; every other one is written to scratch by the op and then added with +=.
  void choose_stores() {
    value_stores.resize(n_values);
    argument_stores.resize(state.names.size());
    for (std::size_t v = 0; v < n_values; ++v)
      for (std::size_t c = 0; c < value_contributions[v].size(); ++c)
        value_stores[v].push_back(c == 0 ? store::direct : store::scratch);
    for (std::size_t a = 0; a < state.names.size(); ++a)
      for (std::size_t c = 0; c < argument_contributions[a].size(); ++c)
        argument_stores[a].push_back(
            c == 0 && state.argument_reqs[a] == grad_req::write ? store::direct : store::scratch);
  }

  /// The planned items (intermediate values, gradients, scratch) with the steps at which each
  /// is taken and freed.
  void place_items() {
    allocate_at.resize(n_steps);
    release_at.resize(n_steps);
    value_item.assign(n_values, none);
    for (std::size_t v = 0; v < n_values; ++v)
      if (!is_head[v])
        value_item[v] = add_item(value_shapes[v], producer[v], kept[v] ? none : last_reader[v]);
    gradient_item.assign(n_values, none);
    direct_head_gradient.assign(n_values, false);
    value_scratch.resize(n_values);
    argument_scratch.resize(state.names.size());
    for (std::size_t v = 0; v < n_values; ++v) {
      const auto& list = value_contributions[v];
      if (list.empty())
        continue;
      if (list.size() == 1 && list[0].node == none) {
        direct_head_gradient[v] = true; // the head gradient itself, no buffer
        continue;
      }
      gradient_item[v] = add_item(value_shapes[v], step_of(list[0]), backward_step(producer[v]));
      value_scratch[v].assign(list.size(), none);
      for (std::size_t c = 0; c < list.size(); ++c)
        if (list[c].node != none && value_stores[v][c] == store::scratch)
          value_scratch[v][c] = add_item(value_shapes[v], step_of(list[c]), step_of(list[c]));
    }
    for (std::size_t a = 0; a < state.names.size(); ++a) {
      const auto& list = argument_contributions[a];
      argument_scratch[a].assign(list.size(), none);
      for (std::size_t c = 0; c < list.size(); ++c)
        if (list[c].node != none && argument_stores[a][c] == store::scratch)
          argument_scratch[a][c] =
              add_item(state.argument_shapes[a], step_of(list[c]), step_of(list[c]));
    }
  }

  /// The item's id, or none when the value gets an array of its own (empty arrays).
  std::size_t add_item(const shape_vector& shape, std::size_t first, std::size_t last) {
    const auto bytes = static_cast<std::size_t>(element_count(shape)) * element_bytes;
    if (bytes == 0)
      return none;
    items.push_back({shape, bytes});
    allocate_at[first].push_back(items.size() - 1);
    if (last != none)
      release_at[last].push_back(items.size() - 1);
    return items.size() - 1;
  }

  std::size_t backward_step(std::size_t node) const { return 2 * n_nodes - node; }
  std::size_t step_of(const contribution& c) const {
    return c.node == none ? n_nodes : backward_step(c.node);
  }

  /// Best fit, walking the steps. A step takes its buffers before it frees any, so no call's
  /// outputs (or input gradients) share a buffer with its inputs (or output gradients).
  void assign_buffers() {
    std::vector<std::size_t> buffer_bytes;
    std::multimap<std::size_t, std::size_t> free_buffers; // bytes -> buffer
    for (std::size_t t = 0; t < n_steps; ++t) {
      for (std::size_t id : allocate_at[t]) {
        auto fit = free_buffers.lower_bound(items[id].bytes);
        if (fit != free_buffers.end()) {
          items[id].buffer = fit->second;
          free_buffers.erase(fit);
        } else {
          items[id].buffer = buffer_bytes.size();
          buffer_bytes.push_back(items[id].bytes);
        }
      }
      for (std::size_t id : release_at[t])
        free_buffers.emplace(buffer_bytes[items[id].buffer], items[id].buffer);
    }
    for (std::size_t bytes : buffer_bytes) {
      state.buffers.push_back(ndarray::empty({static_cast<std::int64_t>(bytes / element_bytes)},
                                             state.ctx, dtype::float32));
      state.planned_bytes += bytes;
    }
    for (const item& each : items)
      state.unplanned_bytes += each.bytes;
  }

  /// Item `id`'s view of the pool, or an array of its own for none.
  ndarray array_of(std::size_t id, const shape_vector& shape) const {
    if (id == none)
      return ndarray::empty(shape, state.ctx, dtype::float32);
    return state.buffers[items[id].buffer].slice(0, element_count(shape)).reshape(shape);
  }

  /// Arrays of the values and of their gradients.
  void make_values() {
    values.resize(n_values);
    for (std::size_t v = 0; v < n_values; ++v)
      values[v] = array_of(value_item[v], value_shapes[v]);
    value_gradients.resize(n_values);
    for (std::size_t v = 0; v < n_values; ++v)
      if (!value_contributions[v].empty() && !direct_head_gradient[v])
        value_gradients[v] = array_of(gradient_item[v], value_shapes[v]);
  }

  /// The calls: their inputs, outputs and output gradients.
  void build_nodes() {
    state.nodes.resize(n_nodes);
    for (std::size_t k = 0; k < n_nodes; ++k) {
      impl::node_state& node = state.nodes[k];
      node.node = order[k];
      for (std::size_t i = 0; i < node_inputs[k].size(); ++i) {
        const value_ref& ref = node_inputs[k][i];
        if (ref.is_argument) {
          node.inputs.push_back(state.arguments[ref.index]);
          state.argument_inputs.push_back({k, i, ref.index});
        } else {
          node.inputs.push_back(values[ref.index]);
        }
      }
      for (std::size_t v = first_value[k]; v < first_value[k + 1]; ++v)
        node.outputs.push_back(values[v]);
      node.runs_backward = runs_backward[k];
      if (!node.runs_backward)
        continue;
      for (std::size_t v = first_value[k]; v < first_value[k + 1]; ++v) {
        if (value_contributions[v].empty()) // another output is used, this one is not: zeros
          node.output_grads.push_back(ndarray::zeros(value_shapes[v], state.ctx));
        else
          node.output_grads.push_back(value_gradients[v]); // none when direct: set per call
        if (direct_head_gradient[v])
          state.head_gradients.push_back({k, v - first_value[k], value_contributions[v][0].index});
      }
      node.input_grads.resize(node_inputs[k].size());
      node.reqs.assign(node_inputs[k].size(), grad_req::null);
    }
  }

  /// Where each contribution goes, and whether it is written or added.
  void route_gradients() {
    std::vector<impl::seed> seeds;
    route_value_gradients(seeds);
    route_argument_gradients(seeds);
    // Deliveries run after the call's backward in input order, as autograd delivers them.
    for (impl::node_state& node : state.nodes)
      std::stable_sort(
          node.deliveries.begin(), node.deliveries.end(),
          [](const impl::delivery& x, const impl::delivery& y) { return x.slot < y.slot; });
    // Per target the seeds are in head order already; a stable sort keeps that.
    std::stable_sort(seeds.begin(), seeds.end(),
                     [](const impl::seed& x, const impl::seed& y) { return x.head < y.head; });
    state.seeds = std::move(seeds);
  }

  void route_value_gradients(std::vector<impl::seed>& seeds) {
    for (std::size_t v = 0; v < n_values; ++v) {
      if (direct_head_gradient[v])
        continue;
      const auto& list = value_contributions[v];
      for (std::size_t c = 0; c < list.size(); ++c) {
        const bool add = c > 0;
        if (list[c].node == none) {
          seeds.push_back({list[c].index, none, value_gradients[v], add});
          continue;
        }
        impl::node_state& node = state.nodes[list[c].node];
        const std::size_t slot = list[c].index;
        node.reqs[slot] = grad_req::write;
        if (value_stores[v][c] == store::direct) {
          node.input_grads[slot] = value_gradients[v];
        } else {
          node.input_grads[slot] = array_of(value_scratch[v][c], value_shapes[v]);
          node.deliveries.push_back({slot, none, value_gradients[v], add});
        }
      }
    }
  }

  void route_argument_gradients(std::vector<impl::seed>& seeds) {
    for (std::size_t a = 0; a < state.names.size(); ++a) {
      const grad_req req = state.argument_reqs[a];
      if (req == grad_req::null)
        continue;
      // Every argument reaches a head, so every one with a req gets contributions.
      const auto& list = argument_contributions[a];
      for (std::size_t c = 0; c < list.size(); ++c) {
        const bool add = req == grad_req::add || c > 0;
        if (list[c].node == none) {
          seeds.push_back({list[c].index, a, {}, add});
          continue;
        }
        impl::node_state& node = state.nodes[list[c].node];
        const std::size_t slot = list[c].index;
        if (argument_stores[a][c] == store::direct) {
          node.input_grads[slot] = state.gradients[a];
          node.reqs[slot] = grad_req::write;
          state.argument_gradients.push_back({list[c].node, slot, a});
        } else {
          node.input_grads[slot] = array_of(argument_scratch[a][c], state.argument_shapes[a]);
          node.reqs[slot] = grad_req::write;
          node.deliveries.push_back({slot, a, {}, add});
        }
      }
    }
  }

  /// The graph outputs and the head gradients backward() uses by default (ones).
  void bind_outputs() {
    state.outputs.resize(heads.size());
    state.output_arguments.assign(heads.size(), none);
    state.ones.resize(heads.size());
    state.head_grads.resize(heads.size());
    for (std::size_t h = 0; h < heads.size(); ++h) {
      const value_ref& ref = head_refs[h];
      if (ref.is_argument) {
        state.output_arguments[h] = ref.index;
        state.outputs[h] = state.arguments[ref.index];
      } else {
        state.outputs[h] = values[ref.index]; // an array of its own: heads are not planned
      }
      if (needs_gradient(ref)) {
        state.ones[h] = ndarray::ones(state.outputs[h].shape(), state.ctx);
        state.head_grads[h] = state.ones[h];
      }
    }
  }
};

/// Builds nodes, arrays and the memory plan of `state` (arguments, gradients and reqs are set).
void plan(impl& state) {
  planner p{state};
  p.lay_out();
  p.trace_gradients();
  p.find_lifetimes();
  p.choose_stores();
  p.place_items();
  p.assign_buffers();
  p.make_values();
  p.build_nodes();
  p.route_gradients();
  p.bind_outputs();
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Binding.

result<executor> symbol::bind(context ctx, std::map<std::string, ndarray> arguments,
                              std::map<std::string, ndarray> gradients,
                              std::map<std::string, grad_req> reqs) const {
  try {
    auto state = std::make_unique<executor::impl>();
    state->ctx = ctx;
    state->graph = *this;
    state->names = list_arguments();
    auto require_known = [&](const auto& entries, const char* what) -> status {
      for (const auto& [name, entry] : entries)
        if (std::find(state->names.begin(), state->names.end(), name) == state->names.end())
          return error(
              errc::invalid_argument, std::string("bind: ") + what + " '" + name +
                                          "' is not an argument of the symbol; its arguments are " +
                                          [&] {
                                            std::string known;
                                            for (const std::string& each : state->names)
                                              known += (known.empty() ? "" : ", ") + each;
                                            return known;
                                          }());
      return ok();
    };
    if (status known = require_known(arguments, "argument"); !known)
      return known.error();
    if (status known = require_known(gradients, "gradient"); !known)
      return known.error();
    if (status known = require_known(reqs, "grad_req of"); !known)
      return known.error();

    std::map<std::string, shape_vector> given;
    for (const std::string& name : state->names) {
      auto found = arguments.find(name);
      if (found == arguments.end() || found->second.is_none())
        return error(errc::invalid_argument, "bind: no array for argument '" + name + "'");
      if (found->second.ctx() != ctx)
        return error(errc::context_mismatch, "bind: argument '" + name + "' is on " +
                                                 found->second.ctx().to_string() +
                                                 ", the executor on " + ctx.to_string());
      given.emplace(name, found->second.shape());
    }
    // Inference checks every call against the arrays given; an error names the node and the
    // variables with their shapes.
    auto inferred = infer_shape(given);
    if (!inferred)
      return error(inferred.error().code(), "bind: " + inferred.error().message());

    for (std::size_t a = 0; a < state->names.size(); ++a) {
      const std::string& name = state->names[a];
      state->arguments.push_back(arguments.at(name));
      state->argument_shapes.push_back(inferred->arguments[a]);
      auto req_entry = reqs.find(name);
      auto gradient = gradients.find(name);
      const grad_req req = req_entry != reqs.end()       ? req_entry->second
                           : gradient != gradients.end() ? grad_req::write
                                                         : grad_req::null;
      state->argument_reqs.push_back(req);
      if (req == grad_req::null) {
        state->gradients.emplace_back();
        continue;
      }
      if (gradient == gradients.end() || gradient->second.is_none())
        return error(errc::invalid_argument,
                     "bind: argument '" + name + "' has a non-null grad_req and no gradient array");
      if (gradient->second.shape() != inferred->arguments[a] || gradient->second.ctx() != ctx)
        return error(errc::shape_mismatch,
                     "bind: the gradient of '" + name + "' is " +
                         shape_to_string(gradient->second.shape()) + " on " +
                         gradient->second.ctx().to_string() + ", the argument " +
                         shape_to_string(inferred->arguments[a]) + " on " + ctx.to_string());
      state->gradients.push_back(gradient->second);
    }
    plan(*state);
    return executor(std::move(state));
  } catch (const exception& thrown) {
    return thrown.error();
  }
}

result<executor> symbol::simple_bind(context ctx, const std::map<std::string, shape_vector>& shapes,
                                     grad_req req,
                                     const std::map<std::string, grad_req>& req_overrides) const {
  auto inferred = infer_shape(shapes);
  if (!inferred)
    return error(inferred.error().code(), "simple_bind: " + inferred.error().message());
  const std::vector<std::string> names = list_arguments();
  for (const auto& [name, override_req] : req_overrides)
    if (std::find(names.begin(), names.end(), name) == names.end())
      return error(errc::invalid_argument,
                   "simple_bind: req_overrides names '" + name + "', not an argument");
  try {
    std::map<std::string, ndarray> arguments;
    std::map<std::string, ndarray> gradients;
    std::map<std::string, grad_req> reqs;
    for (std::size_t a = 0; a < names.size(); ++a) {
      const shape_vector& shape = inferred->arguments[a];
      arguments.emplace(names[a], ndarray::zeros(shape, ctx));
      auto found = req_overrides.find(names[a]);
      const grad_req own = found != req_overrides.end() ? found->second : req;
      reqs.emplace(names[a], own);
      if (own != grad_req::null)
        gradients.emplace(names[a], ndarray::zeros(shape, ctx));
    }
    return bind(ctx, std::move(arguments), std::move(gradients), std::move(reqs));
  } catch (const exception& thrown) {
    return thrown.error();
  }
}

// ---------------------------------------------------------------------------------------------
// Running.

executor::executor(std::unique_ptr<impl> state) : impl_(std::move(state)) {}
executor::executor(executor&&) noexcept = default;
executor& executor::operator=(executor&&) noexcept = default;
executor::~executor() = default;

void executor::forward(bool is_train) {
  impl& state = *impl_;
  state.trained = false;
  state.check_arguments();
  // The ops are called directly and record nothing; the scope also gives them the training flag
  // that autograd::is_training() reports during the call.
  const autograd::pause_scope pause(is_train);
  for (const impl::slot& entry : state.argument_inputs)
    state.nodes[entry.node].inputs[entry.index] = state.arguments[entry.source];
  for (impl::node_state& node : state.nodes) {
    const auto& op = *node.node->op;
    queue_forward(op, node.node->attrs, is_train, seed_for_call(op, node.node->attrs, is_train),
                  node.inputs, node.outputs, node.saved);
  }
  for (std::size_t h = 0; h < state.outputs.size(); ++h)
    if (state.output_arguments[h] != none)
      state.outputs[h] = state.arguments[state.output_arguments[h]];
  state.trained = is_train;
}

void executor::backward(std::span<const ndarray> output_grads) {
  impl& state = *impl_;
  const autograd::pause_scope pause(autograd::is_training());
  if (!state.trained)
    fail(errc::invalid_argument, "executor::backward: needs a completed forward(true) first");
  if (!output_grads.empty() && output_grads.size() != state.outputs.size())
    fail(errc::invalid_argument, "executor::backward: " + std::to_string(output_grads.size()) +
                                     " output gradients for " +
                                     std::to_string(state.outputs.size()) + " outputs");
  for (std::size_t h = 0; h < state.outputs.size(); ++h) {
    if (state.ones[h].is_none())
      continue; // nothing reads this output's gradient
    if (output_grads.empty() || output_grads[h].is_none()) {
      state.head_grads[h] = state.ones[h];
      continue;
    }
    const ndarray& given = output_grads[h];
    if (given.shape() != state.outputs[h].shape() || given.ctx() != state.ctx)
      fail(errc::shape_mismatch,
           "executor::backward: the gradient of output " + std::to_string(h) + " is " +
               shape_to_string(given.shape()) + " on " + given.ctx().to_string() + ", the output " +
               shape_to_string(state.outputs[h].shape()) + " on " + state.ctx.to_string());
    state.head_grads[h] = given;
  }
  for (std::size_t a = 0; a < state.gradients.size(); ++a) {
    if (state.argument_reqs[a] == grad_req::null)
      continue;
    const ndarray& gradient = state.gradients[a];
    if (gradient.is_none() || gradient.shape() != state.argument_shapes[a] ||
        gradient.ctx() != state.ctx)
      fail(errc::shape_mismatch, "executor::backward: the gradient array of '" + state.names[a] +
                                     "' no longer has the bound shape " +
                                     shape_to_string(state.argument_shapes[a]) + " on " +
                                     state.ctx.to_string());
  }
  for (const impl::slot& entry : state.argument_gradients)
    state.nodes[entry.node].input_grads[entry.index] = state.gradients[entry.source];
  for (impl::seed& entry : state.seeds) {
    ndarray& target = entry.argument == none ? entry.buffer : state.gradients[entry.argument];
    if (entry.add)
      target += state.head_grads[entry.head];
    else
      state.head_grads[entry.head].copy_to(target);
  }
  for (const impl::slot& entry : state.head_gradients)
    state.nodes[entry.node].output_grads[entry.index] = state.head_grads[entry.source];
  for (std::size_t k = state.nodes.size(); k-- > 0;) {
    impl::node_state& node = state.nodes[k];
    if (!node.runs_backward)
      continue;
    queue_backward(*node.node->op, node.node->attrs, node.inputs, node.outputs, node.saved,
                   node.output_grads, node.input_grads, node.reqs);
    for (impl::delivery& entry : node.deliveries) {
      ndarray& target = entry.argument == none ? entry.target : state.gradients[entry.argument];
      if (entry.add)
        target += node.input_grads[entry.slot];
      else
        node.input_grads[entry.slot].copy_to(target);
    }
  }
}

const std::vector<ndarray>& executor::outputs() const noexcept {
  return impl_->outputs;
}

ndarray& executor::arg(std::string_view name) {
  return impl_->arguments[impl_->argument_index(name)];
}

ndarray& executor::grad(std::string_view name) {
  return impl_->gradients[impl_->argument_index(name)];
}

const std::vector<std::string>& executor::argument_names() const noexcept {
  return impl_->names;
}

std::size_t executor::planned_bytes() const noexcept {
  return impl_->planned_bytes;
}

std::size_t executor::unplanned_bytes() const noexcept {
  return impl_->unplanned_bytes;
}

} // namespace troupe
