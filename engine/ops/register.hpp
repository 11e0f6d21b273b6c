#pragma once
// Internal to the operator registry (engine/op.hpp): how the operator files hand their op_defs to
// the table, and the checks and helpers every operator shares.
//
// There is no static-initialiser registration: troupe_engine is a static library, and the linker
// drops an object file that nothing references, taking its registrar with it. find_op's table is
// built on first use by calling each register_* function explicitly (registry.cpp).

#include <cstddef>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/error.hpp"
#include "engine/ndarray.hpp"
#include "engine/op.hpp"
#include "kernels/cpu/nn.hpp"

namespace troupe::ops {

/// One entry of the table: the op_def that find_op returns, and the op_attrs::describe of its
/// attributes (null when the operator reads none).
struct registered_op {
  op_def def;
  std::string (*describe)(const op_attrs& attrs) = nullptr;
};

using op_table = std::vector<registered_op>;

void register_nn_ops(op_table& table);
void register_elementwise_ops(op_table& table);

// ---------------------------------------------------------------------------------------------
// Errors. Every message starts with the operator's name, as ndarray's start with the operation.

[[noreturn]] void fail(errc code, std::string_view op, const std::string& message);

/// "FullyConnected: input 'weight' has shape (3,4), expected (5,4)".
[[noreturn]] void fail_shape(std::string_view op, std::string_view input, const shape_vector& got,
                             const shape_vector& expected);

// ---------------------------------------------------------------------------------------------
// Call checks. They allocate nothing: they run on every forward and backward call.

/// Throws invalid_argument unless `given` equals names.size(), listing the names.
void check_input_count(std::string_view op, std::span<const std::string_view> names,
                       std::size_t given);

/// Every input and output of a forward call present, float32 and on one device: the host (any
/// cpu(i)) or one gpu(i), that of the first input; the counts as `names` and `num_outputs` say.
void check_forward(std::string_view op, std::span<const std::string_view> names,
                   const op_forward_call& call, std::size_t num_outputs = 1);

/// The same for a backward call: the counts of inputs, outputs, output gradients, input
/// gradients and requests; every output gradient present, float32, on one device (that of the
/// first output gradient) and of its output's shape; every wanted input gradient float32, on that
/// device and of its input's shape.
void check_backward(std::string_view op, std::span<const std::string_view> names,
                    const op_backward_call& call, std::size_t num_outputs = 1);

/// Throws shape_mismatch unless array.size() == expected (a forward output or a gradient whose
/// element count the raw kernels rely on).
void check_size(std::string_view op, std::string_view what, const ndarray& array,
                std::size_t expected);

// ---------------------------------------------------------------------------------------------
// Gradients.

/// Where input i's gradient goes: null data when it is not wanted (none handle or req null).
struct grad_target {
  float* data = nullptr;
  kernels::cpu::write_mode mode = kernels::cpu::write_mode::overwrite;
  int gpu = -1; ///< the CUDA device that holds `data`, or -1 for host memory
  explicit operator bool() const noexcept { return data != nullptr; }
  bool accumulates() const noexcept { return mode == kernels::cpu::write_mode::accumulate; }
};

grad_target gradient_of(const op_backward_call& call, std::size_t input);

/// dx (=|+=) dy over n elements, on the device that holds dx (and dy); dx may equal dy.
void store_copy(const float* dy, grad_target dx, std::size_t n);

/// The float32 elements of an operator's array: host memory, or device memory on a gpu (the
/// checks above have made sure of the dtype and the device).
inline const float* floats(const ndarray& array) {
  return static_cast<const float*>(array.raw_data());
}
inline float* floats(ndarray& array) {
  return static_cast<float*>(array.raw_data());
}

/// The CUDA device an array's memory is on, or -1 for host memory. An operator call computes
/// where its arrays are (the checks above keep them on one device).
inline int gpu_of(const ndarray& array) noexcept {
  return array.ctx().is_gpu() ? array.ctx().id : -1;
}

// ---------------------------------------------------------------------------------------------
// State for backward.

/// saved[index] as an array of `shape` (float32, on `ctx`): the one the caller passed back when its
/// shape fits and nobody else holds its storage (a retained graph may still read it), else a new
/// one. Grows `saved` as needed.
ndarray& reuse_saved(std::vector<ndarray>& saved, std::size_t index, const shape_vector& shape,
                     context ctx);

// ---------------------------------------------------------------------------------------------
// describe() pieces.

std::string describe_int(std::string_view name, std::int64_t value);
std::string describe_bool(std::string_view name, bool value);
std::string describe_pair(std::string_view name, const std::array<std::int64_t, 2>& value);
std::string describe_double(std::string_view name, double value);

/// The input names as op_def::input_names returns them.
std::vector<std::string> to_strings(std::span<const std::string_view> names);

inline std::size_t to_size(std::int64_t value) noexcept {
  return static_cast<std::size_t>(value);
}

} // namespace troupe::ops
