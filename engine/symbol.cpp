#include "engine/symbol.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <mutex>
#include <optional>
#include <unordered_map>
#include <utility>

namespace troupe {

namespace {

[[noreturn]] void fail(errc code, std::string message) {
  throw exception(code, std::move(message));
}

/// Creation numbers of nodes (symbol_node::sequence); 0 is left for nodes made by hand.
std::atomic<std::uint64_t> next_sequence{1};

/// "<op in lower case><n>", n counting per op name from 0 as MXNet's NameManager does. The
/// counters are shared by all threads (a graph may be built on any of them), hence the lock.
std::string auto_name(std::string_view op_name) {
  static std::mutex mutex;
  static std::unordered_map<std::string, std::size_t> counters;
  std::string hint(op_name);
  std::transform(hint.begin(), hint.end(), hint.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  std::size_t n = 0;
  {
    const std::lock_guard lock(mutex);
    n = counters[hint]++;
  }
  return hint + std::to_string(n);
}

/// Every node reachable from `heads`, each once, in depth-first post-order over the inputs
/// (inputs in order, heads in order): the order MXNet's DFSVisit gives, so variables come out
/// in the order list_arguments() documents. Iterative, so deep graphs do not exhaust the stack.
std::vector<const symbol_node*> post_order(const std::vector<symbol_output>& heads) {
  std::vector<const symbol_node*> order;
  std::unordered_map<const symbol_node*, bool> seen; // true once emitted
  struct frame {
    const symbol_node* node;
    std::size_t next_input;
  };
  std::vector<frame> stack;
  for (const symbol_output& head : heads) {
    if (!head.node || seen.contains(head.node.get()))
      continue;
    seen.emplace(head.node.get(), false);
    stack.push_back({head.node.get(), 0});
    while (!stack.empty()) {
      frame& top = stack.back();
      if (top.next_input < top.node->inputs.size()) {
        const symbol_node* input = top.node->inputs[top.next_input++].node.get();
        if (input && seen.emplace(input, false).second)
          stack.push_back({input, 0});
        continue;
      }
      seen[top.node] = true;
      order.push_back(top.node);
      stack.pop_back();
    }
  }
  return order;
}

/// Variable names in first-visit order; variables of the same name are one argument.
std::vector<std::string> argument_names(const std::vector<const symbol_node*>& order) {
  std::vector<std::string> names;
  for (const symbol_node* node : order) {
    if (node->op == nullptr && std::find(names.begin(), names.end(), node->name) == names.end())
      names.push_back(node->name);
  }
  return names;
}

std::string output_name(const symbol_node& node, std::size_t index) {
  if (node.op == nullptr)
    return node.name;
  if (node.op->num_outputs > 1)
    return node.name + "_output" + std::to_string(index);
  return node.name + "_output";
}

/// How an input is written in listings: the node's name, with the output index when the node
/// has several outputs.
std::string reference_name(const symbol_output& ref) {
  if (ref.node->op != nullptr && ref.node->op->num_outputs > 1)
    return ref.node->name + "[" + std::to_string(ref.index) + "]";
  return ref.node->name;
}

std::string join(const std::vector<std::string>& parts) {
  std::string text;
  for (const std::string& part : parts) {
    if (!text.empty())
      text += ", ";
    text += part;
  }
  return text;
}

std::string optional_shape_text(const std::optional<shape_vector>& shape) {
  return shape ? shape_to_string(*shape) : std::string("unknown");
}

using input_shapes = std::vector<std::optional<shape_vector>>;

bool all_known(const input_shapes& inputs) {
  return std::all_of(inputs.begin(), inputs.end(),
                     [](const auto& shape) { return shape.has_value(); });
}

/// "data=(2,3), fc_weight=unknown": the inputs of `node` with what is known of their shapes.
std::string describe_inputs(const symbol_node& node, const input_shapes& inputs) {
  std::string text;
  for (std::size_t i = 0; i < inputs.size(); ++i)
    text += (i == 0 ? "" : ", ") + reference_name(node.inputs[i]) + "=" +
            optional_shape_text(inputs[i]);
  return text;
}

/// symbol::infer_shape's state: every argument's shape (unknown until given or filled by a
/// consumer) and the output shapes of the op nodes inferred so far.
struct shape_inference {
  std::map<std::string, std::optional<shape_vector>, std::less<>> argument_shapes;
  std::unordered_map<const symbol_node*, std::vector<shape_vector>> node_shapes;

  /// Every argument unknown, then the `known` ones set; an error names a `known` entry that is
  /// not an argument.
  status seed(const std::vector<std::string>& arguments,
              const std::map<std::string, shape_vector>& known) {
    for (const std::string& name : arguments)
      argument_shapes.emplace(name, std::nullopt);
    for (const auto& [name, shape] : known) {
      auto found = argument_shapes.find(name);
      if (found == argument_shapes.end())
        return error(errc::invalid_argument, "infer_shape: '" + name +
                                                 "' is not an argument of the symbol; its "
                                                 "arguments are " +
                                                 join(arguments));
      found->second = shape;
    }
    return {};
  }

  std::optional<shape_vector> shape_of(const symbol_output& ref) const {
    if (ref.node->op == nullptr)
      return argument_shapes.find(ref.node->name)->second;
    auto found = node_shapes.find(ref.node.get());
    if (found == node_shapes.end())
      return std::nullopt;
    return found->second[ref.index];
  }

  /// One look at an op node whose outputs are not known yet: fills the unknown parameters its op
  /// can fill from its first input, then infers its outputs once every input is known. True when
  /// it learnt something (a parameter's shape or the node's outputs).
  result<bool> visit(const symbol_node& node) {
    input_shapes inputs;
    inputs.reserve(node.inputs.size());
    for (const symbol_output& ref : node.inputs)
      inputs.push_back(shape_of(ref));
    bool progress = false;
    if (!all_known(inputs) && node.op->fill_input_shapes != nullptr && !inputs.empty() &&
        inputs[0].has_value()) {
      auto filled = fill_parameters(node, inputs);
      if (!filled)
        return filled.error();
      progress = *filled;
    }
    if (!all_known(inputs))
      return progress;
    auto outputs = infer_outputs(node, inputs);
    if (!outputs)
      return outputs.error();
    node_shapes.emplace(&node, std::move(*outputs));
    return true;
  }

  /// Asks the op to fill its unknown inputs; the variables among them take the shapes it gives
  /// (an unknown op output is computed, not given). True when any did.
  result<bool> fill_parameters(const symbol_node& node, input_shapes& inputs) {
    // Parameters are never scalars, so an empty shape tells fill_input_shapes "unknown".
    std::vector<shape_vector> filled;
    filled.reserve(inputs.size());
    for (const auto& shape : inputs)
      filled.push_back(shape.value_or(shape_vector{}));
    try {
      node.op->fill_input_shapes(node.attrs, filled);
    } catch (const exception& thrown) {
      return error(thrown.error().code(),
                   "infer_shape: node '" + node.name + "' (" + node.op->name + ") with inputs " +
                       describe_inputs(node, inputs) + ": " + thrown.error().message());
    }
    bool progress = false;
    for (std::size_t i = 0; i < inputs.size(); ++i) {
      const symbol_output& ref = node.inputs[i];
      if (!inputs[i] && !filled[i].empty() && ref.node->op == nullptr) {
        argument_shapes.find(ref.node->name)->second = filled[i];
        inputs[i] = filled[i];
        progress = true;
      }
    }
    return progress;
  }

  /// The op's output shapes for inputs that are all known.
  static result<std::vector<shape_vector>> infer_outputs(const symbol_node& node,
                                                         const input_shapes& inputs) {
    const op_def& op = *node.op;
    std::vector<shape_vector> known_inputs;
    known_inputs.reserve(inputs.size());
    for (const auto& shape : inputs)
      known_inputs.push_back(*shape);
    std::vector<shape_vector> outputs;
    try {
      outputs = op.infer_shape(node.attrs, known_inputs);
    } catch (const exception& thrown) {
      return error(thrown.error().code(), "infer_shape: node '" + node.name + "' (" + op.name +
                                              ") rejects its input shapes " +
                                              describe_inputs(node, inputs) + ": " +
                                              thrown.error().message());
    }
    if (outputs.size() != op.num_outputs)
      return error(errc::internal,
                   "infer_shape: " + op.name + " gave " + std::to_string(outputs.size()) +
                       " output shapes, its op_def declares " + std::to_string(op.num_outputs));
    return outputs;
  }

  /// An error naming the arguments still unknown and the shapes that were given, if any.
  status check_complete(const std::vector<std::string>& arguments,
                        const std::map<std::string, shape_vector>& known) const {
    std::vector<std::string> unknown;
    for (const std::string& name : arguments)
      if (!argument_shapes.find(name)->second)
        unknown.push_back(name);
    if (unknown.empty())
      return {};
    std::vector<std::string> given;
    for (const auto& [name, shape] : known)
      given.push_back(name + "=" + shape_to_string(shape));
    return error(errc::invalid_argument, "infer_shape: cannot infer the shapes of " +
                                             join(unknown) + " from the shapes given (" +
                                             (known.empty() ? std::string("none") : join(given)) +
                                             "); give them too");
  }
};

} // namespace

// ---------------------------------------------------------------------------------------------
// Construction.

symbol symbol::variable(std::string name) {
  if (name.empty())
    fail(errc::invalid_argument, "symbol::variable: a variable needs a name");
  auto node = std::make_shared<symbol_node>();
  node->name = std::move(name);
  node->sequence = next_sequence.fetch_add(1, std::memory_order_relaxed);
  return symbol({symbol_output{std::move(node), 0}});
}

symbol symbol::create(std::string_view op_name, std::span<const symbol> inputs, op_attrs attrs,
                      std::string name) {
  const op_def& op = find_op(op_name);
  const std::vector<std::string> input_names = op.input_names(attrs);
  if (inputs.size() != input_names.size())
    fail(errc::invalid_argument,
         "symbol::create: " + op.name + " takes " + std::to_string(input_names.size()) +
             " inputs (" + join(input_names) + ") with attributes {" + attrs.describe(op.name) +
             "}, " + std::to_string(inputs.size()) + " given");
  auto node = std::make_shared<symbol_node>();
  node->op = &op;
  node->attrs = std::move(attrs);
  node->inputs.reserve(inputs.size());
  for (std::size_t i = 0; i < inputs.size(); ++i) {
    const std::size_t count = inputs[i].outputs().size();
    if (count != 1)
      fail(errc::invalid_argument, "symbol::create: input " + std::to_string(i) + " (" +
                                       input_names[i] + ") of " + op.name +
                                       (count == 0 ? std::string(" is an empty symbol")
                                                   : " has " + std::to_string(count) +
                                                         " outputs; pick one with operator[]"));
    node->inputs.push_back(inputs[i].outputs()[0]);
  }
  node->name = name.empty() ? auto_name(op.name) : std::move(name);
  node->sequence = next_sequence.fetch_add(1, std::memory_order_relaxed);
  return symbol({symbol_output{std::move(node), 0}});
}

symbol symbol::group(std::span<const symbol> symbols) {
  std::vector<symbol_output> outputs;
  for (const symbol& part : symbols)
    outputs.insert(outputs.end(), part.outputs().begin(), part.outputs().end());
  return symbol(std::move(outputs));
}

symbol symbol::operator[](std::size_t index) const {
  if (index >= outputs_.size())
    fail(errc::invalid_argument, "symbol[" + std::to_string(index) + "]: the symbol has " +
                                     std::to_string(outputs_.size()) + " outputs");
  return symbol({outputs_[index]});
}

// ---------------------------------------------------------------------------------------------
// Queries.

std::vector<std::string> symbol::list_arguments() const {
  return argument_names(post_order(outputs_));
}

std::vector<std::string> symbol::list_outputs() const {
  std::vector<std::string> names;
  names.reserve(outputs_.size());
  for (const symbol_output& out : outputs_)
    names.push_back(output_name(*out.node, out.index));
  return names;
}

result<symbol::shapes> symbol::infer_shape(const std::map<std::string, shape_vector>& known) const {
  const std::vector<const symbol_node*> order = post_order(outputs_);
  const std::vector<std::string> arguments = argument_names(order);
  shape_inference inference;
  if (auto seeded = inference.seed(arguments, known); !seeded)
    return seeded.error();

  // Output shapes of the op nodes, filled in topological order. One pass suffices for graphs
  // where each parameter's first consumer can fill it; more passes pick up a parameter that an
  // earlier consumer needed and only a later one could fill.
  for (bool progress = true; progress;) {
    progress = false;
    for (const symbol_node* node : order) {
      if (node->op == nullptr || inference.node_shapes.contains(node))
        continue;
      auto learnt = inference.visit(*node);
      if (!learnt)
        return learnt.error();
      progress = progress || *learnt;
    }
  }
  if (auto complete = inference.check_complete(arguments, known); !complete)
    return complete.error();

  shapes result;
  result.arguments.reserve(arguments.size());
  for (const std::string& name : arguments)
    result.arguments.push_back(*inference.argument_shapes.find(name)->second);
  result.outputs.reserve(outputs_.size());
  for (const symbol_output& out : outputs_) {
    std::optional<shape_vector> shape = inference.shape_of(out);
    if (!shape) // every input known means every node ran; a bug otherwise
      return error(errc::internal, "infer_shape: the shape of output " +
                                       output_name(*out.node, out.index) +
                                       " is unknown although every argument's is known");
    result.outputs.push_back(std::move(*shape));
  }
  return result;
}

std::string symbol::to_string() const {
  std::string text;
  for (const symbol_node* node : post_order(outputs_)) {
    if (node->op == nullptr) {
      text += "variable " + node->name + "\n";
      continue;
    }
    text += node->name + " = " + node->op->name + "(";
    for (std::size_t i = 0; i < node->inputs.size(); ++i)
      text += (i == 0 ? "" : ", ") + reference_name(node->inputs[i]);
    text += ")";
    const std::string attributes = node->attrs.describe(node->op->name);
    if (!attributes.empty())
      text += " {" + attributes + "}";
    text += "\n";
  }
  text += "outputs: " + join(list_outputs()) + "\n";
  return text;
}

// ---------------------------------------------------------------------------------------------
// The operators as symbols.

namespace sym {

namespace {

/// The inputs with `bias` appended unless it is the empty symbol, which sets no_bias instead.
symbol with_optional_bias(std::string_view op_name, std::vector<symbol> inputs, const symbol& bias,
                          op_attrs attrs) {
  attrs.no_bias = bias.outputs().empty();
  if (!attrs.no_bias)
    inputs.push_back(bias);
  return symbol::create(op_name, inputs, std::move(attrs));
}

symbol unary(std::string_view op_name, const symbol& x, op_attrs attrs = {}) {
  return symbol::create(op_name, std::span<const symbol>(&x, 1), std::move(attrs));
}

symbol binary(std::string_view op_name, const symbol& a, const symbol& b) {
  const std::array<symbol, 2> inputs{a, b};
  return symbol::create(op_name, inputs, {});
}

} // namespace

symbol fully_connected(const symbol& x, const symbol& weight, const symbol& bias,
                       std::int64_t num_hidden, bool flatten) {
  return with_optional_bias("FullyConnected", {x, weight}, bias,
                            fully_connected_attrs(num_hidden, flatten));
}

symbol convolution(const symbol& x, const symbol& weight, const symbol& bias,
                   std::array<std::int64_t, 2> kernel, std::int64_t num_filter,
                   std::array<std::int64_t, 2> stride, std::array<std::int64_t, 2> pad) {
  return with_optional_bias("Convolution", {x, weight}, bias,
                            convolution_attrs(kernel, num_filter, stride, pad));
}

symbol pooling(const symbol& x, std::array<std::int64_t, 2> kernel, std::string_view pool_type,
               std::array<std::int64_t, 2> stride, std::array<std::int64_t, 2> pad) {
  return unary("Pooling", x, pooling_attrs(kernel, pool_type, stride, pad));
}

symbol activation(const symbol& x, std::string_view act_type) {
  return unary("Activation", x, activation_attrs(act_type));
}

symbol flatten(const symbol& x) {
  return unary("Flatten", x);
}

symbol dropout(const symbol& x, double p) {
  return unary("Dropout", x, dropout_attrs(p));
}

symbol softmax_cross_entropy(const symbol& logits, const symbol& label) {
  return binary("SoftmaxCrossEntropy", logits, label);
}

symbol add(const symbol& a, const symbol& b) {
  return binary("elemwise_add", a, b);
}

symbol multiply(const symbol& a, const symbol& b) {
  return binary("elemwise_mul", a, b);
}

symbol sum(const symbol& a) {
  return unary("sum", a);
}

} // namespace sym

} // namespace troupe
