#include "engine/trace.hpp"

#include <unordered_map>
#include <utility>

#include "engine/autograd_state.hpp"

namespace troupe {

struct trace_scope::state {
  /// The graph value each traced array stands for, by its autograd state.
  std::unordered_map<const autograd_entry*, symbol> values;
  /// Arrays used by traced calls that were neither marked nor traced outputs: constants the
  /// graph cannot reproduce, by the variable that stands for them.
  std::unordered_map<const symbol_node*, shape_vector> constants;
  /// Keeps the autograd states alive so that their addresses stay unique while tracing.
  std::vector<std::shared_ptr<autograd_entry>> keepalive;
  std::size_t constant_count = 0;
};

trace_scope::trace_scope() : state_(std::make_unique<state>()), previous_(detail::current_trace()) {
  detail::set_current_trace(this);
}

trace_scope::~trace_scope() {
  detail::set_current_trace(previous_);
}

namespace {

/// The autograd state of `array`, created when it has none.
const std::shared_ptr<autograd_entry>& state_of(ndarray& array) {
  if (!array.autograd_state())
    array.set_autograd_state(std::make_shared<autograd_entry>());
  return array.autograd_state();
}

} // namespace

void trace_scope::mark_variable(ndarray& array, std::string name) {
  if (array.is_none())
    throw exception(errc::invalid_argument, "trace: variable '" + name + "' is the none handle");
  const auto& entry = state_of(array);
  state_->keepalive.push_back(entry);
  state_->values[entry.get()] = symbol::variable(std::move(name));
}

namespace detail {

void note_traced_call(trace_scope& trace, const op_def& op, const op_attrs& attrs,
                      std::span<const ndarray> inputs, std::span<ndarray> outputs) {
  auto& st = *trace.state_;
  std::vector<symbol> input_symbols;
  input_symbols.reserve(inputs.size());
  for (const auto& input : inputs) {
    const auto* entry = input.autograd_state().get();
    auto found = entry ? st.values.find(entry) : st.values.end();
    if (found != st.values.end()) {
      input_symbols.push_back(found->second);
      continue;
    }
    auto constant = symbol::variable("__constant" + std::to_string(st.constant_count++));
    st.constants.emplace(constant.outputs()[0].node.get(), input.shape());
    input_symbols.push_back(std::move(constant));
  }
  const auto call = symbol::create(op.name, input_symbols, attrs);
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto& entry = state_of(outputs[i]);
    st.keepalive.push_back(entry);
    st.values[entry.get()] = call[i];
  }
}

} // namespace detail

symbol trace_scope::to_symbol(std::span<const ndarray> outputs) const {
  std::vector<symbol> parts;
  parts.reserve(outputs.size());
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const auto* entry = outputs[i].autograd_state().get();
    auto found = entry ? state_->values.find(entry) : state_->values.end();
    if (found == state_->values.end())
      throw exception(errc::invalid_argument,
                      "trace: output " + std::to_string(i) + " of shape " +
                          shape_to_string(outputs[i].shape()) +
                          " was not computed by traced operators from the marked variables");
    parts.push_back(found->second);
  }
  auto graph = parts.size() == 1 ? parts[0] : symbol::group(parts);
  // A constant is an error only when the outputs depend on it.
  std::vector<const symbol_node*> pending;
  std::unordered_map<const symbol_node*, bool> seen;
  for (const auto& out : graph.outputs())
    pending.push_back(out.node.get());
  while (!pending.empty()) {
    const auto* node = pending.back();
    pending.pop_back();
    if (!seen.emplace(node, true).second)
      continue;
    if (auto constant = state_->constants.find(node); constant != state_->constants.end())
      throw exception(errc::invalid_argument,
                      "trace: an array of shape " + shape_to_string(constant->second) +
                          " used in the traced forward is neither a marked variable (an input "
                          "or a parameter) nor computed from one; the graph cannot reproduce it");
    for (const auto& input : node->inputs)
      pending.push_back(input.node.get());
  }
  return graph;
}

} // namespace troupe
