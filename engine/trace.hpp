#pragma once
// Tracing: how hybridize() turns an imperative forward into a Symbol (engine/symbol.hpp).
//
//   trace_scope trace;
//   trace.mark_variable(x, "data");              // inputs and parameters become variables
//   trace.mark_variable(weight, "dense0_weight");
//   ndarray y = block_forward(x);                // runs as usual, and each nd:: call is noted
//   symbol graph = trace.to_symbol({&y, 1});
//
// While a trace_scope is alive on a thread, every operator call there (engine/nd.hpp) whose
// inputs are marked variables or outputs of traced calls is added to the graph. Using an array
// that is neither (a constant made inside forward) is an error at to_symbol() naming its shape,
// because the graph could not reproduce it.

#include <memory>
#include <span>
#include <string>

#include "engine/ndarray.hpp"
#include "engine/symbol.hpp"

namespace troupe {

class trace_scope;

namespace detail {
void note_traced_call(trace_scope& trace, const op_def& op, const op_attrs& attrs,
                      std::span<const ndarray> inputs, std::span<ndarray> outputs);
} // namespace detail

class trace_scope {
public:
  trace_scope();
  ~trace_scope();
  trace_scope(const trace_scope&) = delete;
  trace_scope& operator=(const trace_scope&) = delete;

  /// Makes `array` (and handles copied from it afterwards) the graph variable `name`.
  void mark_variable(ndarray& array, std::string name);
  /// The graph that computes `outputs` from the marked variables.
  symbol to_symbol(std::span<const ndarray> outputs) const;

  struct state;

private:
  friend void detail::note_traced_call(trace_scope& trace, const op_def& op, const op_attrs& attrs,
                                       std::span<const ndarray> inputs, std::span<ndarray> outputs);
  std::unique_ptr<state> state_;
  trace_scope* previous_;
};

} // namespace troupe
