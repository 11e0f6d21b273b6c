// The operator table (engine/op.hpp), the operators' random source, and the checks the operator
// files share (register.hpp).

#include <algorithm>
#include <array>
#include <cstring>
#include <mutex>
#include <random>
#include <utility>

#include "engine/autograd_state.hpp"
#include "engine/dispatch.hpp"
#include "engine/op.hpp"
#include "engine/ops/register.hpp"
#include "kernels/cuda/elementwise.hpp"

namespace troupe {
namespace {

/// Built on first use, sorted by name (list_ops returns it in order, find_op bisects it).
const ops::op_table& table() {
  static const ops::op_table entries = [] {
    ops::op_table built;
    ops::register_nn_ops(built);
    ops::register_elementwise_ops(built);
    std::sort(built.begin(), built.end(),
              [](const auto& a, const auto& b) { return a.def.name < b.def.name; });
    const auto duplicate =
        std::adjacent_find(built.begin(), built.end(),
                           [](const auto& a, const auto& b) { return a.def.name == b.def.name; });
    if (duplicate != built.end())
      throw exception(errc::internal, "operator '" + duplicate->def.name + "' is registered twice");
    return built;
  }();
  return entries;
}

const ops::registered_op* lookup(std::string_view name) {
  const auto& entries = table();
  const auto it = std::lower_bound(
      entries.begin(), entries.end(), name,
      [](const ops::registered_op& entry, std::string_view key) { return entry.def.name < key; });
  if (it == entries.end() || it->def.name != name)
    return nullptr;
  return &*it;
}

/// The operators' seed source, as mx.random.seed's: one per process, shared by every thread
/// (Dropout in the imperative API and in executors draw from the same sequence).
struct seed_source {
  std::mutex mutex;
  std::mt19937_64 engine{0};
};

seed_source& operator_seeds() {
  static seed_source source;
  return source;
}

} // namespace

const op_def& find_op(std::string_view name) {
  if (const auto* entry = lookup(name))
    return entry->def;
  std::string message = "unknown operator '" + std::string{name} + "'; known operators: ";
  bool first = true;
  for (const auto& entry : table()) {
    if (!first)
      message += ", ";
    message += entry.def.name;
    first = false;
  }
  throw exception(errc::invalid_argument, std::move(message));
}

std::vector<std::string> list_ops() {
  std::vector<std::string> names;
  names.reserve(table().size());
  for (const auto& entry : table())
    names.push_back(entry.def.name);
  return names;
}

void seed_operators(std::uint64_t seed) {
  auto& source = operator_seeds();
  const std::lock_guard lock{source.mutex};
  source.engine.seed(seed);
}

std::uint64_t next_operator_seed() {
  auto& source = operator_seeds();
  const std::lock_guard lock{source.mutex};
  return source.engine();
}

std::uint64_t seed_for_call(const op_def& op, const op_attrs& attrs, bool is_train) {
  return op.draws_seed != nullptr && op.draws_seed(attrs, is_train) ? next_operator_seed() : 0;
}

void queue_forward(const op_def& op, const op_attrs& attrs, bool is_train, std::uint64_t seed,
                   std::span<const ndarray> inputs, std::span<ndarray> outputs,
                   std::shared_ptr<std::vector<ndarray>> saved) {
  if (!engine::has_backend()) { // the naive engine: no closure, no allocation
    detail::inside_operator inside;
    op.forward(op_forward_call{attrs, is_train, inputs, outputs, *saved, seed});
    return;
  }
  std::vector<const ndarray*> reads, writes;
  engine::add_addresses(reads, inputs);
  engine::add_addresses(writes, outputs);
  engine::push(op.name, outputs.empty() ? context::cpu() : outputs[0].ctx(), reads, writes,
               [&op, attrs, is_train, seed,
                inputs = std::vector<ndarray>(inputs.begin(), inputs.end()),
                outputs = std::vector<ndarray>(outputs.begin(), outputs.end()),
                saved = std::move(saved)]() mutable {
                 detail::inside_operator inside;
                 op.forward(op_forward_call{attrs, is_train, inputs, outputs, *saved, seed});
               });
}

void queue_backward(const op_def& op, const op_attrs& attrs, std::span<const ndarray> inputs,
                    std::span<const ndarray> outputs, std::shared_ptr<std::vector<ndarray>> saved,
                    std::span<const ndarray> output_grads, std::span<ndarray> input_grads,
                    std::span<const grad_req> reqs) {
  if (!engine::has_backend()) {
    detail::inside_operator inside;
    op.backward(op_backward_call{attrs, inputs, outputs, *saved, output_grads, input_grads, reqs});
    return;
  }
  std::vector<const ndarray*> reads, writes;
  engine::add_addresses(reads, inputs);
  engine::add_addresses(reads, outputs);
  engine::add_addresses(reads, output_grads);
  engine::add_addresses(writes, input_grads);
  const context ctx = !output_grads.empty() ? output_grads[0].ctx() : context::cpu();
  engine::push(std::string{op.name} + " backward", ctx, reads, writes,
               [&op, attrs, inputs = std::vector<ndarray>(inputs.begin(), inputs.end()),
                outputs = std::vector<ndarray>(outputs.begin(), outputs.end()),
                saved = std::move(saved),
                output_grads = std::vector<ndarray>(output_grads.begin(), output_grads.end()),
                input_grads = std::vector<ndarray>(input_grads.begin(), input_grads.end()),
                reqs = std::vector<grad_req>(reqs.begin(), reqs.end())]() mutable {
                 detail::inside_operator inside;
                 op.backward(op_backward_call{attrs, inputs, outputs, *saved, output_grads,
                                              input_grads, reqs});
               });
}

std::string op_attrs::describe(std::string_view op_name) const {
  // A message or a graph printout must not fail on an unknown name: it describes nothing.
  const auto* entry = lookup(op_name);
  if (entry == nullptr || entry->describe == nullptr)
    return {};
  return entry->describe(*this);
}

op_attrs fully_connected_attrs(std::int64_t num_hidden, bool flatten) {
  op_attrs attrs;
  attrs.num_hidden = num_hidden;
  attrs.flatten = flatten;
  return attrs;
}

namespace {

/// The sliding window Convolution and Pooling share.
op_attrs window_attrs(std::array<std::int64_t, 2> kernel, std::array<std::int64_t, 2> stride,
                      std::array<std::int64_t, 2> pad) {
  op_attrs attrs;
  attrs.kernel = kernel;
  attrs.stride = stride;
  attrs.pad = pad;
  return attrs;
}

} // namespace

op_attrs convolution_attrs(std::array<std::int64_t, 2> kernel, std::int64_t num_filter,
                           std::array<std::int64_t, 2> stride, std::array<std::int64_t, 2> pad) {
  op_attrs attrs = window_attrs(kernel, stride, pad);
  attrs.num_filter = num_filter;
  return attrs;
}

op_attrs pooling_attrs(std::array<std::int64_t, 2> kernel, std::string_view pool_type,
                       std::array<std::int64_t, 2> stride, std::array<std::int64_t, 2> pad) {
  op_attrs attrs = window_attrs(kernel, stride, pad);
  attrs.pool_type = pool_type;
  return attrs;
}

op_attrs activation_attrs(std::string_view act_type) {
  op_attrs attrs;
  attrs.act_type = act_type;
  return attrs;
}

op_attrs dropout_attrs(double p) {
  op_attrs attrs;
  attrs.p = p;
  return attrs;
}

op_attrs scalar_attrs(double scalar) {
  op_attrs attrs;
  attrs.scalar = scalar;
  return attrs;
}

op_attrs reshape_attrs(shape_vector shape) {
  op_attrs attrs;
  attrs.shape = std::move(shape);
  return attrs;
}

op_attrs embedding_attrs(std::int64_t input_dim, std::int64_t output_dim, bool sparse_grad) {
  op_attrs attrs;
  attrs.input_dim = input_dim;
  attrs.output_dim = output_dim;
  attrs.sparse_grad = sparse_grad;
  return attrs;
}

namespace ops {

// ---------------------------------------------------------------------------------------------
// Errors.

void fail(errc code, std::string_view op, const std::string& message) {
  std::string text{op};
  text += ": ";
  text += message;
  throw exception(code, std::move(text));
}

void fail_shape(std::string_view op, std::string_view input, const shape_vector& got,
                const shape_vector& expected) {
  fail(errc::shape_mismatch, op,
       "input '" + std::string{input} + "' has shape " + shape_to_string(got) + ", expected " +
           shape_to_string(expected));
}

namespace {

std::string joined(std::span<const std::string_view> names) {
  std::string text;
  for (std::size_t i = 0; i < names.size(); ++i) {
    if (i > 0)
      text += ", ";
    text += names[i];
  }
  return text;
}

/// The host is one device for operators (every cpu(i) reads host memory); each gpu(i) is its own.
bool same_device(context a, context b) noexcept {
  return a.is_cpu() ? b.is_cpu() : a == b;
}

/// `role` is "input 'data'", "output 0", "gradient of input 'weight'"...; `where` is the device
/// of the call.
void check_array(std::string_view op, const ndarray& array, const std::string& role,
                 context where) {
  if (array.is_none())
    fail(errc::invalid_argument, op, role + " is the none handle");
  if (array.dtype() != dtype::float32)
    fail(errc::not_supported, op,
         role + " is " + std::string{to_string(array.dtype())} + "; operators compute on float32");
  if (!same_device(array.ctx(), where))
    fail(errc::invalid_argument, op,
         role + " is on " + array.ctx().to_string() + " but the call computes on " +
             where.to_string() + "; an operator's arrays must be on one device");
}

std::string input_role(std::string_view name) {
  return "input '" + std::string{name} + "'";
}

std::string output_role(std::size_t index) {
  return "output " + std::to_string(index);
}

void check_count(std::string_view op, std::string_view what, std::size_t expected,
                 std::size_t given) {
  if (given != expected)
    fail(errc::invalid_argument, op,
         "expected " + std::to_string(expected) + " " + std::string{what} + ", got " +
             std::to_string(given));
}

} // namespace

// ---------------------------------------------------------------------------------------------
// Call checks. They run on every call, so each array is first tested with acceptable(), which
// builds no string; the message naming it is built only when it fails.

void check_input_count(std::string_view op, std::span<const std::string_view> names,
                       std::size_t given) {
  if (given != names.size())
    fail(errc::invalid_argument, op,
         "takes " + std::to_string(names.size()) + " inputs (" + joined(names) + "), got " +
             std::to_string(given));
}

namespace {

bool acceptable(const ndarray& array, context where) noexcept {
  return !array.is_none() && array.dtype() == dtype::float32 && same_device(array.ctx(), where);
}

/// The device of a call: that of its first array (or the host when there is none, or it is the
/// none handle, which the checks then report). Copies no ndarray: the checks allocate nothing.
context call_device(std::span<const ndarray> arrays) noexcept {
  return arrays.empty() || arrays[0].is_none() ? context::cpu() : arrays[0].ctx();
}

} // namespace

void check_forward(std::string_view op, std::span<const std::string_view> names,
                   const op_forward_call& call, std::size_t num_outputs) {
  check_input_count(op, names, call.inputs.size());
  check_count(op, "outputs", num_outputs, call.outputs.size());
  const context where = call_device(call.inputs);
  for (std::size_t i = 0; i < names.size(); ++i)
    if (!acceptable(call.inputs[i], where))
      check_array(op, call.inputs[i], input_role(names[i]), where);
  for (std::size_t i = 0; i < num_outputs; ++i)
    if (!acceptable(call.outputs[i], where))
      check_array(op, call.outputs[i], output_role(i), where);
}

void check_backward(std::string_view op, std::span<const std::string_view> names,
                    const op_backward_call& call, std::size_t num_outputs) {
  check_input_count(op, names, call.inputs.size());
  check_count(op, "outputs", num_outputs, call.outputs.size());
  check_count(op, "output gradients", num_outputs, call.output_grads.size());
  check_count(op, "input gradients", names.size(), call.input_grads.size());
  check_count(op, "gradient requests", names.size(), call.reqs.size());
  const context where = call_device(call.output_grads);
  for (std::size_t i = 0; i < num_outputs; ++i) {
    const ndarray& dy = call.output_grads[i];
    if (!acceptable(dy, where))
      check_array(op, dy, "gradient of " + output_role(i), where);
    // The outputs' buffers may be gone (backward_reads_outputs false) but their handles say
    // which shape the gradient must have.
    const ndarray& y = call.outputs[i];
    if (!y.is_none() && y.shape() != dy.shape())
      fail(errc::shape_mismatch, op,
           "gradient of " + output_role(i) + " has shape " + shape_to_string(dy.shape()) +
               ", expected " + shape_to_string(y.shape()));
  }
  for (std::size_t i = 0; i < names.size(); ++i) {
    const ndarray& dx = call.input_grads[i];
    if (dx.is_none() || call.reqs[i] == grad_req::null)
      continue;
    if (!acceptable(dx, where))
      check_array(op, dx, "gradient of " + input_role(names[i]), where);
    const ndarray& x = call.inputs[i];
    if (!x.is_none() && x.shape() != dx.shape())
      fail(errc::shape_mismatch, op,
           "gradient of " + input_role(names[i]) + " has shape " + shape_to_string(dx.shape()) +
               ", expected " + shape_to_string(x.shape()));
  }
}

void check_size(std::string_view op, std::string_view what, const ndarray& array,
                std::size_t expected) {
  if (to_size(array.size()) != expected)
    fail(errc::shape_mismatch, op,
         std::string{what} + " has shape " + shape_to_string(array.shape()) + " of " +
             std::to_string(array.size()) + " elements, expected " + std::to_string(expected));
}

// ---------------------------------------------------------------------------------------------
// Gradients and saved state.

grad_target gradient_of(const op_backward_call& call, std::size_t input) {
  ndarray& dx = call.input_grads[input];
  const grad_req req = call.reqs[input];
  if (dx.is_none() || req == grad_req::null)
    return {};
  return {floats(dx),
          req == grad_req::add ? kernels::cpu::write_mode::accumulate
                               : kernels::cpu::write_mode::overwrite,
          gpu_of(dx)};
}

void store_copy(const float* dy, grad_target dx, std::size_t n) {
  if (dx.gpu >= 0) {
    kernels::cuda::store_gradient(dx.gpu,
                                  {.formula = kernels::cuda::gradient_formula::copy, .dy = dy}, n,
                                  dx.data, dx.accumulates(), false);
  } else if (dx.mode == kernels::cpu::write_mode::accumulate) {
    for (std::size_t i = 0; i < n; ++i)
      dx.data[i] += dy[i];
  } else if (dx.data != dy && n > 0) {
    std::memcpy(dx.data, dy, n * sizeof(float));
  }
}

ndarray& reuse_saved(std::vector<ndarray>& saved, std::size_t index, const shape_vector& shape,
                     context ctx) {
  if (saved.size() <= index)
    saved.resize(index + 1);
  ndarray& slot = saved[index];
  const bool fits = !slot.is_none() && slot.shape() == shape && slot.dtype() == dtype::float32 &&
                    slot.ctx() == ctx && !slot.storage_is_shared();
  if (!fits)
    slot = ndarray(shape, ctx);
  return slot;
}

// ---------------------------------------------------------------------------------------------
// describe() pieces.

std::string describe_int(std::string_view name, std::int64_t value) {
  return std::string{name} + "=" + std::to_string(value);
}

std::string describe_bool(std::string_view name, bool value) {
  // MXNet writes booleans in attribute strings as 0 and 1.
  return std::string{name} + (value ? "=1" : "=0");
}

std::string describe_pair(std::string_view name, const std::array<std::int64_t, 2>& value) {
  return std::string{name} + "=" + shape_to_string({value[0], value[1]});
}

std::string describe_double(std::string_view name, double value) {
  return std::string{name} + "=" + number_text(value);
}

std::vector<std::string> to_strings(std::span<const std::string_view> names) {
  return {names.begin(), names.end()};
}

} // namespace ops
} // namespace troupe
