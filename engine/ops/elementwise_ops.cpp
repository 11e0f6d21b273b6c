// The element-wise operators: elemwise_add/sub/mul/div, _plus_scalar, _mul_scalar, negative,
// square, and the whole-array reductions sum and mean.
//
// The binary operators take equal shapes, or one side of exactly one element that stands for
// every element of the other (ndarray's arithmetic takes the same). The gradient of such a
// broadcast side is the sum of its contributions to every output element.

#include <array>
#include <string>

#include "engine/op.hpp"
#include "engine/ops/register.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/reduce.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/elementwise.hpp"

namespace troupe::ops {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

constexpr std::array<std::string_view, 1> unary_names{"data"};
constexpr std::array<std::string_view, 2> binary_names{"lhs", "rhs"};

std::vector<std::string> unary_input_names(const op_attrs&) {
  return to_strings(unary_names);
}

std::vector<std::string> binary_input_names(const op_attrs&) {
  return to_strings(binary_names);
}

/// dx (=|+=) g(k) for every element k; or, for a broadcast input (one element standing for n),
/// dx[0] (=|+=) Σ_k g(k), accumulated in double.
template <class G>
void store_gradient(grad_target dx, bool broadcast, std::size_t n, G g) {
  const bool accumulate = dx.mode == cpu::write_mode::accumulate;
  if (broadcast) {
    double total = 0.0;
    for (std::size_t k = 0; k < n; ++k)
      total += static_cast<double>(g(k));
    const auto value = static_cast<float>(total);
    dx.data[0] = accumulate ? dx.data[0] + value : value;
  } else if (accumulate) {
    for (std::size_t k = 0; k < n; ++k)
      dx.data[k] += g(k);
  } else {
    for (std::size_t k = 0; k < n; ++k)
      dx.data[k] = g(k);
  }
}

// ---------------------------------------------------------------------------------------------
// Binary operators

enum class binary_kind { add, sub, mul, div };

/// Which side, if any, is one element standing for the other's every element. The same rule as
/// ndarray's arithmetic: equal shapes first, then a one-element right side, then the left.
struct binary_layout {
  bool lhs_one = false;
  bool rhs_one = false;
};

binary_layout binary_geometry(std::string_view op, const shape_vector& lhs,
                              const shape_vector& rhs) {
  if (lhs == rhs)
    return {};
  if (element_count(rhs) == 1)
    return {false, true};
  if (element_count(lhs) == 1)
    return {true, false};
  fail(errc::shape_mismatch, op,
       "input 'rhs' has shape " + shape_to_string(rhs) + " and input 'lhs' shape " +
           shape_to_string(lhs) + ": expected equal shapes, or one side of one element");
}

template <binary_kind kind>
constexpr float binary_apply(float a, float b) noexcept {
  if constexpr (kind == binary_kind::add)
    return a + b;
  else if constexpr (kind == binary_kind::sub)
    return a - b;
  else if constexpr (kind == binary_kind::mul)
    return a * b;
  else
    return a / b;
}

template <binary_kind kind>
constexpr cuda::binary_kind cuda_kind() noexcept {
  if constexpr (kind == binary_kind::add)
    return cuda::binary_kind::add;
  else if constexpr (kind == binary_kind::sub)
    return cuda::binary_kind::sub;
  else if constexpr (kind == binary_kind::mul)
    return cuda::binary_kind::mul;
  else
    return cuda::binary_kind::div;
}

template <binary_kind kind>
constexpr std::string_view binary_op_name() noexcept {
  if constexpr (kind == binary_kind::add)
    return "elemwise_add";
  else if constexpr (kind == binary_kind::sub)
    return "elemwise_sub";
  else if constexpr (kind == binary_kind::mul)
    return "elemwise_mul";
  else
    return "elemwise_div";
}

template <binary_kind kind>
std::vector<shape_vector> binary_infer_shape(const op_attrs&,
                                             std::span<const shape_vector> inputs) {
  constexpr std::string_view op = binary_op_name<kind>();
  check_input_count(op, binary_names, inputs.size());
  const binary_layout layout = binary_geometry(op, inputs[0], inputs[1]);
  return {layout.lhs_one ? inputs[1] : inputs[0]};
}

template <binary_kind kind>
void binary_forward(const op_forward_call& call) {
  constexpr std::string_view op = binary_op_name<kind>();
  check_forward(op, binary_names, call);
  const ndarray& lhs = call.inputs[0];
  const ndarray& rhs = call.inputs[1];
  const binary_layout layout = binary_geometry(op, lhs.shape(), rhs.shape());
  ndarray& y = call.outputs[0];
  const std::size_t n = to_size(layout.lhs_one ? rhs.size() : lhs.size());
  check_size(op, "output 0", y, n);
  const float* a = floats(lhs);
  const float* b = floats(rhs);
  float* out = floats(y);
  if (const int gpu = gpu_of(y); gpu >= 0) {
    cuda::binary(gpu, cuda_kind<kind>(), a, layout.lhs_one, b, layout.rhs_one, out, n);
  } else if (layout.rhs_one) {
    const float bv = b[0];
    for (std::size_t k = 0; k < n; ++k)
      out[k] = binary_apply<kind>(a[k], bv);
  } else if (layout.lhs_one) {
    const float av = a[0];
    for (std::size_t k = 0; k < n; ++k)
      out[k] = binary_apply<kind>(av, b[k]);
  } else if constexpr (kind == binary_kind::add) {
    cpu::add(a, b, out, n); // the kernels are built at -O3, which vectorises them
  } else if constexpr (kind == binary_kind::sub) {
    cpu::sub(a, b, out, n);
  } else if constexpr (kind == binary_kind::mul) {
    cpu::mul(a, b, out, n);
  } else {
    cpu::div(a, b, out, n);
  }
}

/// binary_backward's gradients, computed on `gpu` with the same formulas.
template <binary_kind kind>
void binary_backward_on_gpu(int gpu, const op_backward_call& call, const binary_layout& layout,
                            std::size_t n, grad_target da, grad_target db) {
  using cuda::gradient_formula;
  const float* dy = floats(call.output_grads[0]);
  cuda::gradient_terms for_a{.dy = dy};
  cuda::gradient_terms for_b{.dy = dy};
  if constexpr (kind == binary_kind::sub) {
    for_b.formula = gradient_formula::scaled;
    for_b.scalar = -1.0f;
  } else if constexpr (kind == binary_kind::mul || kind == binary_kind::div) {
    const float* a = floats(call.inputs[0]);
    const float* b = floats(call.inputs[1]);
    for_a.formula = kind == binary_kind::mul ? gradient_formula::times_u : gradient_formula::over_u;
    for_a.u = b;
    for_a.u_one = layout.rhs_one;
    for_b.formula =
        kind == binary_kind::mul ? gradient_formula::times_u : gradient_formula::quotient_rhs;
    for_b.u = a;
    for_b.u_one = layout.lhs_one;
    for_b.v = b;
    for_b.v_one = layout.rhs_one;
  }
  if (da)
    cuda::store_gradient(gpu, for_a, n, da.data, da.accumulates(), layout.lhs_one);
  if (db)
    cuda::store_gradient(gpu, for_b, n, db.data, db.accumulates(), layout.rhs_one);
}

template <binary_kind kind>
void binary_backward(const op_backward_call& call) {
  constexpr std::string_view op = binary_op_name<kind>();
  check_backward(op, binary_names, call);
  // Only the shapes of the inputs are needed for add and sub (backward_reads_inputs is false for
  // them); mul and div read the values.
  const binary_layout layout = binary_geometry(op, call.inputs[0].shape(), call.inputs[1].shape());
  const ndarray& dy_array = call.output_grads[0];
  const std::size_t n = to_size(layout.lhs_one ? call.inputs[1].size() : call.inputs[0].size());
  check_size(op, "gradient of output 0", dy_array, n);
  const float* dy = floats(dy_array);

  const grad_target da = gradient_of(call, 0);
  const grad_target db = gradient_of(call, 1);
  if (!da && !db)
    return;
  if (const int gpu = gpu_of(dy_array); gpu >= 0) {
    binary_backward_on_gpu<kind>(gpu, call, layout, n, da, db);
    return;
  }
  if constexpr (kind == binary_kind::add || kind == binary_kind::sub) {
    if (da)
      store_gradient(da, layout.lhs_one, n, [dy](std::size_t k) { return dy[k]; });
    if (db) {
      if constexpr (kind == binary_kind::add)
        store_gradient(db, layout.rhs_one, n, [dy](std::size_t k) { return dy[k]; });
      else
        store_gradient(db, layout.rhs_one, n, [dy](std::size_t k) { return -dy[k]; });
    }
  } else {
    const float* a = floats(call.inputs[0]);
    const float* b = floats(call.inputs[1]);
    // a[ai(k)] and b[bi(k)]: the element of each side that output k used.
    const std::size_t a_step = layout.lhs_one ? 0 : 1;
    const std::size_t b_step = layout.rhs_one ? 0 : 1;
    if constexpr (kind == binary_kind::mul) {
      if (da)
        store_gradient(da, layout.lhs_one, n, [=](std::size_t k) { return dy[k] * b[k * b_step]; });
      if (db)
        store_gradient(db, layout.rhs_one, n, [=](std::size_t k) { return dy[k] * a[k * a_step]; });
    } else {
      if (da)
        store_gradient(da, layout.lhs_one, n, [=](std::size_t k) { return dy[k] / b[k * b_step]; });
      if (db)
        store_gradient(db, layout.rhs_one, n, [=](std::size_t k) {
          const float bk = b[k * b_step];
          return -dy[k] * a[k * a_step] / (bk * bk);
        });
    }
  }
}

template <binary_kind kind>
registered_op binary_entry() {
  constexpr bool reads_inputs = kind == binary_kind::mul || kind == binary_kind::div;
  return {{.name = std::string{binary_op_name<kind>()},
           .input_names = binary_input_names,
           .infer_shape = binary_infer_shape<kind>,
           .forward = binary_forward<kind>,
           .backward = binary_backward<kind>,
           .backward_reads_inputs = reads_inputs,
           .backward_reads_outputs = false},
          nullptr};
}

// ---------------------------------------------------------------------------------------------
// Unary operators: the output has the input's shape.

enum class unary_kind { plus_scalar, mul_scalar, negative, square };

template <unary_kind kind>
constexpr std::string_view unary_op_name() noexcept {
  if constexpr (kind == unary_kind::plus_scalar)
    return "_plus_scalar";
  else if constexpr (kind == unary_kind::mul_scalar)
    return "_mul_scalar";
  else if constexpr (kind == unary_kind::negative)
    return "negative";
  else
    return "square";
}

template <unary_kind kind>
std::vector<shape_vector> unary_infer_shape(const op_attrs&, std::span<const shape_vector> inputs) {
  check_input_count(unary_op_name<kind>(), unary_names, inputs.size());
  return {inputs[0]};
}

template <unary_kind kind>
void unary_forward(const op_forward_call& call) {
  constexpr std::string_view op = unary_op_name<kind>();
  check_forward(op, unary_names, call);
  const ndarray& x_array = call.inputs[0];
  const std::size_t n = to_size(x_array.size());
  check_size(op, "output 0", call.outputs[0], n);
  const float* x = floats(x_array);
  float* y = floats(call.outputs[0]);
  // The scalar is converted to float32 once, as MXNet's scalar operators convert it to the dtype.
  const auto scalar = static_cast<float>(call.attrs.scalar);
  if (const int gpu = gpu_of(call.outputs[0]); gpu >= 0) {
    if constexpr (kind == unary_kind::plus_scalar)
      cuda::add_scalar(gpu, x, scalar, y, n);
    else if constexpr (kind == unary_kind::mul_scalar)
      cuda::scale(gpu, x, scalar, y, n);
    else if constexpr (kind == unary_kind::negative)
      cuda::scale(gpu, x, -1.0f, y, n);
    else
      cuda::mul(gpu, x, x, y, n);
  } else if constexpr (kind == unary_kind::plus_scalar)
    cpu::add_scalar(x, scalar, y, n);
  else if constexpr (kind == unary_kind::mul_scalar)
    cpu::scale(x, scalar, y, n);
  else if constexpr (kind == unary_kind::negative)
    cpu::scale(x, -1.0f, y, n);
  else
    cpu::mul(x, x, y, n);
}

template <unary_kind kind>
void unary_backward(const op_backward_call& call) {
  constexpr std::string_view op = unary_op_name<kind>();
  check_backward(op, unary_names, call);
  const grad_target dx = gradient_of(call, 0);
  if (!dx)
    return;
  const ndarray& dy_array = call.output_grads[0];
  const std::size_t n = to_size(call.input_grads[0].size());
  check_size(op, "gradient of output 0", dy_array, n);
  const float* dy = floats(dy_array);
  if (dx.gpu >= 0) {
    cuda::gradient_terms terms{.dy = dy};
    if constexpr (kind == unary_kind::mul_scalar || kind == unary_kind::negative) {
      terms.formula = cuda::gradient_formula::scaled;
      terms.scalar = kind == unary_kind::negative ? -1.0f : static_cast<float>(call.attrs.scalar);
    } else if constexpr (kind == unary_kind::square) {
      check_size(op, "input 'data'", call.inputs[0], n);
      terms.formula = cuda::gradient_formula::square;
      terms.u = floats(call.inputs[0]);
    }
    cuda::store_gradient(dx.gpu, terms, n, dx.data, dx.accumulates(), false);
  } else if constexpr (kind == unary_kind::plus_scalar) {
    store_copy(dy, dx, n);
  } else if constexpr (kind == unary_kind::mul_scalar) {
    const auto scalar = static_cast<float>(call.attrs.scalar);
    store_gradient(dx, false, n, [=](std::size_t k) { return dy[k] * scalar; });
  } else if constexpr (kind == unary_kind::negative) {
    store_gradient(dx, false, n, [=](std::size_t k) { return -dy[k]; });
  } else {
    const ndarray& x_array = call.inputs[0];
    check_size(op, "input 'data'", x_array, n);
    const float* x = floats(x_array);
    store_gradient(dx, false, n, [=](std::size_t k) { return 2.0f * x[k] * dy[k]; });
  }
}

std::string scalar_describe(const op_attrs& attrs) {
  return describe_double("scalar", attrs.scalar);
}

template <unary_kind kind>
registered_op unary_entry() {
  constexpr bool has_scalar = kind == unary_kind::plus_scalar || kind == unary_kind::mul_scalar;
  return {{.name = std::string{unary_op_name<kind>()},
           .input_names = unary_input_names,
           .infer_shape = unary_infer_shape<kind>,
           .forward = unary_forward<kind>,
           .backward = unary_backward<kind>,
           .backward_reads_inputs = kind == unary_kind::square,
           .backward_reads_outputs = false},
          has_scalar ? scalar_describe : nullptr};
}

// ---------------------------------------------------------------------------------------------
// Reductions over all elements, to shape [1] (MXNet's sum/mean without an axis).

enum class reduce_kind { sum, mean };

template <reduce_kind kind>
constexpr std::string_view reduce_op_name() noexcept {
  return kind == reduce_kind::sum ? "sum" : "mean";
}

template <reduce_kind kind>
std::vector<shape_vector> reduce_infer_shape(const op_attrs&,
                                             std::span<const shape_vector> inputs) {
  check_input_count(reduce_op_name<kind>(), unary_names, inputs.size());
  return {{1}};
}

template <reduce_kind kind>
void reduce_forward(const op_forward_call& call) {
  constexpr std::string_view op = reduce_op_name<kind>();
  check_forward(op, unary_names, call);
  const ndarray& x = call.inputs[0];
  check_size(op, "output 0", call.outputs[0], 1);
  const auto n = to_size(x.size());
  if (const int gpu = gpu_of(x); gpu >= 0) {
    const double factor = kind == reduce_kind::mean ? 1.0 / static_cast<double>(n) : 1.0;
    cuda::sum(gpu, floats(x), n, factor, floats(call.outputs[0]));
    return;
  }
  double total = cpu::sum(floats(x), n);
  if constexpr (kind == reduce_kind::mean)
    total /= static_cast<double>(n); // NaN for an empty array, as numpy's mean
  floats(call.outputs[0])[0] = static_cast<float>(total);
}

template <reduce_kind kind>
void reduce_backward(const op_backward_call& call) {
  constexpr std::string_view op = reduce_op_name<kind>();
  check_backward(op, unary_names, call);
  const grad_target dx = gradient_of(call, 0);
  if (!dx)
    return;
  check_size(op, "gradient of output 0", call.output_grads[0], 1);
  const std::size_t n = to_size(call.input_grads[0].size());
  if (dx.gpu >= 0) {
    const double factor = kind == reduce_kind::mean ? 1.0 / static_cast<double>(n) : 1.0;
    cuda::gradient_terms terms{.formula = cuda::gradient_formula::scaled,
                               .dy = floats(call.output_grads[0]),
                               .dy_one = true,
                               .scalar = static_cast<float>(factor)};
    cuda::store_gradient(dx.gpu, terms, n, dx.data, dx.accumulates(), false);
    return;
  }
  float value = floats(call.output_grads[0])[0];
  if constexpr (kind == reduce_kind::mean)
    value = static_cast<float>(static_cast<double>(value) / static_cast<double>(n));
  store_gradient(dx, false, n, [=](std::size_t) { return value; });
}

template <reduce_kind kind>
registered_op reduce_entry() {
  return {{.name = std::string{reduce_op_name<kind>()},
           .input_names = unary_input_names,
           .infer_shape = reduce_infer_shape<kind>,
           .forward = reduce_forward<kind>,
           .backward = reduce_backward<kind>,
           .backward_reads_inputs = false,
           .backward_reads_outputs = false},
          nullptr};
}

} // namespace

void register_elementwise_ops(op_table& table) {
  table.push_back(binary_entry<binary_kind::add>());
  table.push_back(binary_entry<binary_kind::sub>());
  table.push_back(binary_entry<binary_kind::mul>());
  table.push_back(binary_entry<binary_kind::div>());
  table.push_back(unary_entry<unary_kind::plus_scalar>());
  table.push_back(unary_entry<unary_kind::mul_scalar>());
  table.push_back(unary_entry<unary_kind::negative>());
  table.push_back(unary_entry<unary_kind::square>());
  table.push_back(reduce_entry<reduce_kind::sum>());
  table.push_back(reduce_entry<reduce_kind::mean>());
}

} // namespace troupe::ops
