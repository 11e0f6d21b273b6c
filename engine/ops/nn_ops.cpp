// The neural-network operators: FullyConnected, Convolution, Pooling, Activation, Dropout,
// SoftmaxCrossEntropy, Flatten and Reshape, with MXNet's semantics, on the raw float kernels of
// kernels/cpu/nn.hpp, or of kernels/cuda/nn.hpp when the arrays are on a gpu.
//
// Each operator validates its shapes in one geometry function that infer_shape and forward both
// call, so that a forward handed arrays of the wrong shapes (an executor bug, a caller that
// skipped infer_shape) throws instead of reading past a buffer. The checks allocate nothing: the
// MLP and LeNet training loops call forward and backward thousands of times a second.

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <initializer_list>
#include <string>
#include <vector>

#include "engine/op.hpp"
#include "engine/ops/register.hpp"
#include "kernels/cpu/nn.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/nn.hpp"

namespace troupe::ops {
namespace {

namespace cpu = kernels::cpu;
namespace cuda = kernels::cuda;

using names_t = std::span<const std::string_view>;

std::int64_t product(const shape_vector& shape, std::size_t begin, std::size_t end) noexcept {
  std::int64_t count = 1;
  for (std::size_t i = begin; i < end; ++i)
    count *= shape[i];
  return count;
}

/// shape == {values...}, without building a vector.
bool shape_is(const shape_vector& shape, std::initializer_list<std::int64_t> values) noexcept {
  return std::equal(shape.begin(), shape.end(), values.begin(), values.end());
}

void require_shape(std::string_view op, std::string_view input, const shape_vector& shape,
                   std::initializer_list<std::int64_t> expected) {
  if (!shape_is(shape, expected))
    fail_shape(op, input, shape, shape_vector(expected));
}

void require_positive(std::string_view op, std::string_view attribute, std::int64_t value) {
  if (value <= 0)
    fail(errc::invalid_argument, op,
         std::string{attribute} + " must be > 0, got " + std::to_string(value));
}

/// Copies the single output of a pure data movement (Flatten, Reshape, inference Dropout).
void copy_forward(std::string_view op, const ndarray& x, ndarray& y) {
  check_size(op, "output 0", y, to_size(x.size()));
  const std::size_t bytes = to_size(x.size()) * sizeof(float);
  if (bytes == 0)
    return;
  if (const int gpu = gpu_of(y); gpu >= 0)
    cuda::copy_device_to_device(gpu, floats(y), gpu, floats(x), bytes);
  else
    std::memcpy(floats(y), floats(x), bytes);
}

/// dx (=|+=) dy for the operators whose gradient is the output gradient reshaped.
void copy_backward(std::string_view op, const op_backward_call& call) {
  const ndarray& dy = call.output_grads[0];
  const grad_target dx = gradient_of(call, 0);
  if (!dx)
    return;
  check_size(op, "gradient of input 'data'", call.input_grads[0], to_size(dy.size()));
  store_copy(floats(dy), dx, to_size(dy.size()));
}

constexpr std::array<std::string_view, 1> data_only{"data"};

std::vector<std::string> data_only_names(const op_attrs&) {
  return to_strings(data_only);
}

// ---------------------------------------------------------------------------------------------
// FullyConnected

constexpr std::string_view fc_op = "FullyConnected";
constexpr std::array<std::string_view, 3> fc_all_names{"data", "weight", "bias"};

names_t fc_names(const op_attrs& attrs) noexcept {
  return names_t{fc_all_names}.first(attrs.no_bias ? 2 : 3);
}

struct fc_dims {
  std::int64_t batch = 0, in = 0, out = 0;
};

/// data's [batch, in] view: all axes but the first collapsed (flatten), or all but the last.
fc_dims fc_data_dims(const op_attrs& attrs, const shape_vector& data) {
  require_positive(fc_op, "num_hidden", attrs.num_hidden);
  if (data.empty())
    fail(errc::shape_mismatch, fc_op, "input 'data' has shape (), expected at least one axis");
  if (attrs.flatten)
    return {data[0], product(data, 1, data.size()), attrs.num_hidden};
  return {product(data, 0, data.size() - 1), data.back(), attrs.num_hidden};
}

fc_dims fc_geometry(const op_attrs& attrs, const shape_vector& data, const shape_vector& weight,
                    const shape_vector* bias) {
  const fc_dims dims = fc_data_dims(attrs, data);
  require_shape(fc_op, "weight", weight, {dims.out, dims.in});
  if (bias != nullptr)
    require_shape(fc_op, "bias", *bias, {dims.out});
  return dims;
}

std::vector<std::string> fc_input_names(const op_attrs& attrs) {
  return to_strings(fc_names(attrs));
}

std::vector<shape_vector> fc_infer_shape(const op_attrs& attrs,
                                         std::span<const shape_vector> inputs) {
  check_input_count(fc_op, fc_names(attrs), inputs.size());
  const shape_vector& data = inputs[0];
  const fc_dims dims = fc_geometry(attrs, data, inputs[1], attrs.no_bias ? nullptr : &inputs[2]);
  if (attrs.flatten)
    return {{dims.batch, dims.out}};
  shape_vector out = data;
  out.back() = dims.out;
  return {out};
}

void fc_fill_input_shapes(const op_attrs& attrs, std::span<shape_vector> inputs) {
  check_input_count(fc_op, fc_names(attrs), inputs.size());
  if (inputs[0].empty())
    return; // data unknown too: nothing to derive from
  const fc_dims dims = fc_data_dims(attrs, inputs[0]);
  if (inputs[1].empty())
    inputs[1] = {dims.out, dims.in};
  if (!attrs.no_bias && inputs[2].empty())
    inputs[2] = {dims.out};
}

fc_dims fc_call_geometry(const op_attrs& attrs, std::span<const ndarray> inputs) {
  return fc_geometry(attrs, inputs[0].shape(), inputs[1].shape(),
                     attrs.no_bias ? nullptr : &inputs[2].shape());
}

void fc_forward(const op_forward_call& call) {
  check_forward(fc_op, fc_names(call.attrs), call);
  const fc_dims dims = fc_call_geometry(call.attrs, call.inputs);
  ndarray& y = call.outputs[0];
  check_size(fc_op, "output 0", y, to_size(dims.batch * dims.out));
  const float* bias = call.attrs.no_bias ? nullptr : floats(call.inputs[2]);
  if (const int gpu = gpu_of(y); gpu >= 0)
    cuda::fully_connected_forward(gpu, floats(call.inputs[0]), floats(call.inputs[1]), bias,
                                  floats(y), to_size(dims.batch), to_size(dims.in),
                                  to_size(dims.out));
  else
    cpu::fully_connected_forward(floats(call.inputs[0]), floats(call.inputs[1]), bias, floats(y),
                                 to_size(dims.batch), to_size(dims.in), to_size(dims.out));
}

void fc_backward(const op_backward_call& call) {
  check_backward(fc_op, fc_names(call.attrs), call);
  const fc_dims dims = fc_call_geometry(call.attrs, call.inputs);
  const ndarray& dy = call.output_grads[0];
  check_size(fc_op, "gradient of output 0", dy, to_size(dims.batch * dims.out));
  const grad_target dx = gradient_of(call, 0);
  const grad_target dw = gradient_of(call, 1);
  const grad_target db = call.attrs.no_bias ? grad_target{} : gradient_of(call, 2);
  if (const int gpu = gpu_of(dy); gpu >= 0)
    cuda::fully_connected_backward(gpu, floats(call.inputs[0]), floats(call.inputs[1]), floats(dy),
                                   dx.data, dx.mode, dw.data, dw.mode, db.data, db.mode,
                                   to_size(dims.batch), to_size(dims.in), to_size(dims.out));
  else
    cpu::fully_connected_backward(floats(call.inputs[0]), floats(call.inputs[1]), floats(dy),
                                  dx.data, dx.mode, dw.data, dw.mode, db.data, db.mode,
                                  to_size(dims.batch), to_size(dims.in), to_size(dims.out));
}

std::string fc_describe(const op_attrs& attrs) {
  return describe_int("num_hidden", attrs.num_hidden) + ", " +
         describe_bool("no_bias", attrs.no_bias) + ", " + describe_bool("flatten", attrs.flatten);
}

// ---------------------------------------------------------------------------------------------
// Window geometry shared by Convolution and Pooling.

struct window_dims {
  cpu::image_shape in;
  cpu::window_2d window;
  std::int64_t out_h = 0, out_w = 0;
};

window_dims window_geometry(std::string_view op, const op_attrs& attrs, const shape_vector& data) {
  for (std::size_t axis = 0; axis < 2; ++axis) {
    if (attrs.kernel[axis] <= 0 || attrs.stride[axis] <= 0 || attrs.pad[axis] < 0)
      fail(errc::invalid_argument, op,
           "kernel " + shape_to_string({attrs.kernel[0], attrs.kernel[1]}) + " and stride " +
               shape_to_string({attrs.stride[0], attrs.stride[1]}) + " must be positive and pad " +
               shape_to_string({attrs.pad[0], attrs.pad[1]}) + " not negative");
  }
  if (data.size() != 4)
    fail(errc::shape_mismatch, op,
         "input 'data' has shape " + shape_to_string(data) + ", expected 4 axes (NCHW)");
  window_dims dims;
  dims.in = {to_size(data[0]), to_size(data[1]), to_size(data[2]), to_size(data[3])};
  dims.window = {to_size(attrs.kernel[0]), to_size(attrs.kernel[1]), to_size(attrs.stride[0]),
                 to_size(attrs.stride[1]), to_size(attrs.pad[0]),    to_size(attrs.pad[1])};
  dims.out_h = static_cast<std::int64_t>(cpu::window_output_extent(
      dims.in.height, dims.window.kernel_h, dims.window.stride_h, dims.window.pad_h));
  dims.out_w = static_cast<std::int64_t>(cpu::window_output_extent(
      dims.in.width, dims.window.kernel_w, dims.window.stride_w, dims.window.pad_w));
  if (dims.out_h == 0 || dims.out_w == 0)
    fail(errc::shape_mismatch, op,
         "input 'data' has shape " + shape_to_string(data) + ", whose image padded by " +
             shape_to_string({attrs.pad[0], attrs.pad[1]}) + " is smaller than the kernel " +
             shape_to_string({attrs.kernel[0], attrs.kernel[1]}));
  return dims;
}

std::string window_describe(const op_attrs& attrs) {
  return describe_pair("kernel", attrs.kernel) + ", " + describe_pair("stride", attrs.stride) +
         ", " + describe_pair("pad", attrs.pad);
}

// ---------------------------------------------------------------------------------------------
// Convolution

constexpr std::string_view conv_op = "Convolution";

names_t conv_names(const op_attrs& attrs) noexcept {
  return names_t{fc_all_names}.first(attrs.no_bias ? 2 : 3);
}

window_dims conv_geometry(const op_attrs& attrs, const shape_vector& data,
                          const shape_vector& weight, const shape_vector* bias) {
  require_positive(conv_op, "num_filter", attrs.num_filter);
  const window_dims dims = window_geometry(conv_op, attrs, data);
  require_shape(conv_op, "weight", weight,
                {attrs.num_filter, data[1], attrs.kernel[0], attrs.kernel[1]});
  if (bias != nullptr)
    require_shape(conv_op, "bias", *bias, {attrs.num_filter});
  return dims;
}

std::vector<std::string> conv_input_names(const op_attrs& attrs) {
  return to_strings(conv_names(attrs));
}

std::vector<shape_vector> conv_infer_shape(const op_attrs& attrs,
                                           std::span<const shape_vector> inputs) {
  check_input_count(conv_op, conv_names(attrs), inputs.size());
  const window_dims dims =
      conv_geometry(attrs, inputs[0], inputs[1], attrs.no_bias ? nullptr : &inputs[2]);
  return {{inputs[0][0], attrs.num_filter, dims.out_h, dims.out_w}};
}

void conv_fill_input_shapes(const op_attrs& attrs, std::span<shape_vector> inputs) {
  check_input_count(conv_op, conv_names(attrs), inputs.size());
  const shape_vector& data = inputs[0];
  if (data.empty())
    return;
  require_positive(conv_op, "num_filter", attrs.num_filter);
  window_geometry(conv_op, attrs, data); // names a data shape that cannot be convolved
  if (inputs[1].empty())
    inputs[1] = {attrs.num_filter, data[1], attrs.kernel[0], attrs.kernel[1]};
  if (!attrs.no_bias && inputs[2].empty())
    inputs[2] = {attrs.num_filter};
}

window_dims conv_call_geometry(const op_attrs& attrs, std::span<const ndarray> inputs) {
  return conv_geometry(attrs, inputs[0].shape(), inputs[1].shape(),
                       attrs.no_bias ? nullptr : &inputs[2].shape());
}

std::size_t conv_output_size(const op_attrs& attrs, const window_dims& dims) {
  return dims.in.batch * to_size(attrs.num_filter) * to_size(dims.out_h) * to_size(dims.out_w);
}

void conv_forward(const op_forward_call& call) {
  check_forward(conv_op, conv_names(call.attrs), call);
  const window_dims dims = conv_call_geometry(call.attrs, call.inputs);
  ndarray& y = call.outputs[0];
  check_size(conv_op, "output 0", y, conv_output_size(call.attrs, dims));
  const float* bias = call.attrs.no_bias ? nullptr : floats(call.inputs[2]);
  if (const int gpu = gpu_of(y); gpu >= 0)
    cuda::convolution_forward(gpu, floats(call.inputs[0]), floats(call.inputs[1]), bias, floats(y),
                              dims.in, to_size(call.attrs.num_filter), dims.window);
  else
    cpu::convolution_forward(floats(call.inputs[0]), floats(call.inputs[1]), bias, floats(y),
                             dims.in, to_size(call.attrs.num_filter), dims.window);
}

void conv_backward(const op_backward_call& call) {
  check_backward(conv_op, conv_names(call.attrs), call);
  const window_dims dims = conv_call_geometry(call.attrs, call.inputs);
  const ndarray& dy = call.output_grads[0];
  check_size(conv_op, "gradient of output 0", dy, conv_output_size(call.attrs, dims));
  const grad_target dx = gradient_of(call, 0);
  const grad_target dw = gradient_of(call, 1);
  const grad_target db = call.attrs.no_bias ? grad_target{} : gradient_of(call, 2);
  if (const int gpu = gpu_of(dy); gpu >= 0)
    cuda::convolution_backward(gpu, floats(call.inputs[0]), floats(call.inputs[1]), floats(dy),
                               dx.data, dx.mode, dw.data, dw.mode, db.data, db.mode, dims.in,
                               to_size(call.attrs.num_filter), dims.window);
  else
    cpu::convolution_backward(floats(call.inputs[0]), floats(call.inputs[1]), floats(dy), dx.data,
                              dx.mode, dw.data, dw.mode, db.data, db.mode, dims.in,
                              to_size(call.attrs.num_filter), dims.window);
}

std::string conv_describe(const op_attrs& attrs) {
  return window_describe(attrs) + ", " + describe_int("num_filter", attrs.num_filter) + ", " +
         describe_bool("no_bias", attrs.no_bias);
}

// ---------------------------------------------------------------------------------------------
// Pooling

constexpr std::string_view pool_op = "Pooling";

cpu::pool_kind pool_kind_of(const op_attrs& attrs) {
  if (attrs.pool_type == "max")
    return cpu::pool_kind::max;
  if (attrs.pool_type == "avg")
    return cpu::pool_kind::average;
  fail(errc::invalid_argument, pool_op,
       "unknown pool_type '" + attrs.pool_type + "'; known pool types: max, avg");
}

std::size_t pool_output_size(const window_dims& dims) {
  return dims.in.batch * dims.in.channels * to_size(dims.out_h) * to_size(dims.out_w);
}

std::vector<shape_vector> pool_infer_shape(const op_attrs& attrs,
                                           std::span<const shape_vector> inputs) {
  check_input_count(pool_op, data_only, inputs.size());
  pool_kind_of(attrs);
  const window_dims dims = window_geometry(pool_op, attrs, inputs[0]);
  return {{inputs[0][0], inputs[0][1], dims.out_h, dims.out_w}};
}

void pool_forward(const op_forward_call& call) {
  check_forward(pool_op, data_only, call);
  const cpu::pool_kind kind = pool_kind_of(call.attrs);
  const window_dims dims = window_geometry(pool_op, call.attrs, call.inputs[0].shape());
  ndarray& y = call.outputs[0];
  check_size(pool_op, "output 0", y, pool_output_size(dims));
  if (const int gpu = gpu_of(y); gpu >= 0)
    cuda::pooling_forward(gpu, kind, floats(call.inputs[0]), floats(y), dims.in, dims.window);
  else
    cpu::pooling_forward(kind, floats(call.inputs[0]), floats(y), dims.in, dims.window);
}

void pool_backward(const op_backward_call& call) {
  check_backward(pool_op, data_only, call);
  const cpu::pool_kind kind = pool_kind_of(call.attrs);
  const window_dims dims = window_geometry(pool_op, call.attrs, call.inputs[0].shape());
  const grad_target dx = gradient_of(call, 0);
  if (!dx)
    return;
  const ndarray& y = call.outputs[0];
  const ndarray& dy = call.output_grads[0];
  check_size(pool_op, "output 0", y, pool_output_size(dims));
  check_size(pool_op, "gradient of output 0", dy, pool_output_size(dims));
  if (dx.gpu >= 0)
    cuda::pooling_backward(dx.gpu, kind, floats(call.inputs[0]), floats(y), floats(dy), dx.data,
                           dx.mode, dims.in, dims.window);
  else
    cpu::pooling_backward(kind, floats(call.inputs[0]), floats(y), floats(dy), dx.data, dx.mode,
                          dims.in, dims.window);
}

std::string pool_describe(const op_attrs& attrs) {
  return describe_pair("kernel", attrs.kernel) + ", pool_type=" + attrs.pool_type + ", " +
         describe_pair("stride", attrs.stride) + ", " + describe_pair("pad", attrs.pad);
}

// ---------------------------------------------------------------------------------------------
// Activation

constexpr std::string_view act_op = "Activation";

cpu::activation_kind activation_kind_of(const op_attrs& attrs) {
  if (attrs.act_type == "relu")
    return cpu::activation_kind::relu;
  if (attrs.act_type == "sigmoid")
    return cpu::activation_kind::sigmoid;
  if (attrs.act_type == "tanh")
    return cpu::activation_kind::tanh;
  if (attrs.act_type == "softrelu")
    return cpu::activation_kind::softrelu;
  fail(errc::invalid_argument, act_op,
       "unknown act_type '" + attrs.act_type +
           "'; known activation types: relu, sigmoid, tanh, softrelu");
}

std::vector<shape_vector> act_infer_shape(const op_attrs& attrs,
                                          std::span<const shape_vector> inputs) {
  check_input_count(act_op, data_only, inputs.size());
  activation_kind_of(attrs);
  return {inputs[0]};
}

void act_forward(const op_forward_call& call) {
  check_forward(act_op, data_only, call);
  const cpu::activation_kind kind = activation_kind_of(call.attrs);
  const ndarray& x = call.inputs[0];
  ndarray& y = call.outputs[0];
  check_size(act_op, "output 0", y, to_size(x.size()));
  if (const int gpu = gpu_of(y); gpu >= 0)
    cuda::activation_forward(gpu, kind, floats(x), floats(y), to_size(x.size()));
  else
    cpu::activation_forward(kind, floats(x), floats(y), to_size(x.size()));
}

void act_backward(const op_backward_call& call) {
  check_backward(act_op, data_only, call);
  const cpu::activation_kind kind = activation_kind_of(call.attrs);
  const grad_target dx = gradient_of(call, 0);
  if (!dx)
    return;
  // The derivative comes from the output alone (backward_reads_inputs is false): the input's
  // buffer may be gone, its size is the gradient's.
  const ndarray& y = call.outputs[0];
  const ndarray& dy = call.output_grads[0];
  const std::size_t n = to_size(call.input_grads[0].size());
  check_size(act_op, "output 0", y, n);
  check_size(act_op, "gradient of output 0", dy, n);
  if (dx.gpu >= 0)
    cuda::activation_backward(dx.gpu, kind, floats(y), floats(dy), dx.data, n, dx.mode);
  else
    cpu::activation_backward(kind, floats(y), floats(dy), dx.data, n, dx.mode);
}

std::string act_describe(const op_attrs& attrs) {
  return "act_type=" + attrs.act_type;
}

// ---------------------------------------------------------------------------------------------
// Dropout

constexpr std::string_view dropout_op = "Dropout";

void check_dropout_p(const op_attrs& attrs) {
  if (!(attrs.p >= 0.0 && attrs.p < 1.0)) // also rejects NaN
    fail(errc::invalid_argument, dropout_op, "p must be in [0, 1), got " + number_text(attrs.p));
}

std::vector<shape_vector> dropout_infer_shape(const op_attrs& attrs,
                                              std::span<const shape_vector> inputs) {
  check_input_count(dropout_op, data_only, inputs.size());
  check_dropout_p(attrs);
  return {inputs[0]};
}

void dropout_forward(const op_forward_call& call) {
  check_forward(dropout_op, data_only, call);
  check_dropout_p(call.attrs);
  const ndarray& x = call.inputs[0];
  ndarray& y = call.outputs[0];
  if (!call.is_train || call.attrs.p == 0.0) {
    // The identity: no mask, and backward passes the gradient through.
    call.saved.clear();
    copy_forward(dropout_op, x, y);
    return;
  }
  check_size(dropout_op, "output 0", y, to_size(x.size()));
  ndarray& mask = reuse_saved(call.saved, 0, x.shape(), y.ctx());
  call.saved.resize(1);
  if (const int gpu = gpu_of(y); gpu >= 0)
    cuda::dropout_forward(gpu, floats(x), floats(y), floats(mask), to_size(x.size()), call.attrs.p,
                          call.seed);
  else
    cpu::dropout_forward(floats(x), floats(y), floats(mask), to_size(x.size()), call.attrs.p,
                         call.seed);
}

bool dropout_draws_seed(const op_attrs& attrs, bool is_train) {
  return is_train && attrs.p != 0.0;
}

void dropout_backward(const op_backward_call& call) {
  check_backward(dropout_op, data_only, call);
  if (call.saved.empty()) {
    copy_backward(dropout_op, call);
    return;
  }
  const grad_target dx = gradient_of(call, 0);
  if (!dx)
    return;
  const ndarray& dy = call.output_grads[0];
  const std::size_t n = to_size(dy.size());
  check_size(dropout_op, "gradient of input 'data'", call.input_grads[0], n);
  const ndarray& mask = call.saved[0];
  if (mask.is_none() || mask.dtype() != dtype::float32 || gpu_of(mask) != dx.gpu)
    fail(errc::invalid_argument, dropout_op,
         "the saved mask is not a float32 array on the gradient's device");
  check_size(dropout_op, "the saved mask", mask, n);
  if (dx.gpu >= 0)
    cuda::dropout_backward(dx.gpu, floats(mask), floats(dy), dx.data, n, dx.mode);
  else
    cpu::dropout_backward(floats(mask), floats(dy), dx.data, n, dx.mode);
}

std::string dropout_describe(const op_attrs& attrs) {
  return describe_double("p", attrs.p);
}

// ---------------------------------------------------------------------------------------------
// SoftmaxCrossEntropy

constexpr std::string_view sce_op = "SoftmaxCrossEntropy";
constexpr std::array<std::string_view, 2> sce_names{"data", "label"};

std::vector<std::string> sce_input_names(const op_attrs&) {
  return to_strings(sce_names);
}

struct sce_dims {
  std::int64_t batch = 0, classes = 0;
};

sce_dims sce_geometry(const shape_vector& data, const shape_vector& label) {
  if (data.size() != 2)
    fail(errc::shape_mismatch, sce_op,
         "input 'data' has shape " + shape_to_string(data) + ", expected 2 axes (batch, classes)");
  require_shape(sce_op, "label", label, {data[0]});
  return {data[0], data[1]};
}

std::vector<shape_vector> sce_infer_shape(const op_attrs&, std::span<const shape_vector> inputs) {
  check_input_count(sce_op, sce_names, inputs.size());
  const sce_dims dims = sce_geometry(inputs[0], inputs[1]);
  return {{dims.batch}};
}

/// The kernels index the probabilities by label: a label that is not a class index would read
/// outside the row, so each is checked on every call.
void check_labels(const float* label, const sce_dims& dims) {
  const auto classes = static_cast<float>(dims.classes);
  for (std::int64_t b = 0; b < dims.batch; ++b) {
    const float value = label[b];
    if (!(value >= 0.0f && value < classes && std::floor(value) == value))
      fail(errc::invalid_argument, sce_op,
           "label[" + std::to_string(b) + "] = " + number_text(value) +
               " is not a class index in [0, " + std::to_string(dims.classes) + ")");
  }
}

void sce_forward(const op_forward_call& call) {
  check_forward(sce_op, sce_names, call);
  const ndarray& logits = call.inputs[0];
  const ndarray& label = call.inputs[1];
  const sce_dims dims = sce_geometry(logits.shape(), label.shape());
  ndarray& loss = call.outputs[0];
  check_size(sce_op, "output 0", loss, to_size(dims.batch));
  if (const int gpu = gpu_of(label); gpu >= 0) {
    // The labels are few (one per row); checking them on the host costs one small copy.
    std::vector<float> host(to_size(dims.batch));
    cuda::copy_device_to_host(gpu, host.data(), floats(label), host.size() * sizeof(float));
    check_labels(host.data(), dims);
  } else {
    check_labels(floats(label), dims);
  }
  ndarray& probabilities = reuse_saved(call.saved, 0, logits.shape(), logits.ctx());
  call.saved.resize(1);
  if (const int gpu = gpu_of(loss); gpu >= 0)
    cuda::softmax_cross_entropy_forward(gpu, floats(logits), floats(label), floats(loss),
                                        floats(probabilities), to_size(dims.batch),
                                        to_size(dims.classes));
  else
    cpu::softmax_cross_entropy_forward(floats(logits), floats(label), floats(loss),
                                       floats(probabilities), to_size(dims.batch),
                                       to_size(dims.classes));
}

void sce_backward(const op_backward_call& call) {
  check_backward(sce_op, sce_names, call);
  const ndarray& label = call.inputs[1];
  const grad_target dlabel = gradient_of(call, 1);
  // Labels are not differentiable: a wanted label gradient is zero.
  if (dlabel && dlabel.mode == cpu::write_mode::overwrite)
    call.input_grads[1].fill(0.0);
  const grad_target dlogits = gradient_of(call, 0);
  if (!dlogits)
    return;
  const ndarray& dlogits_array = call.input_grads[0];
  const sce_dims dims = sce_geometry(dlogits_array.shape(), label.shape());
  const ndarray& dy = call.output_grads[0];
  check_size(sce_op, "gradient of output 0", dy, to_size(dims.batch));
  if (call.saved.empty() || call.saved[0].is_none() || call.saved[0].dtype() != dtype::float32 ||
      gpu_of(call.saved[0]) != dlogits.gpu)
    fail(errc::invalid_argument, sce_op,
         "backward needs the probabilities its forward saved, and has none");
  const ndarray& probabilities = call.saved[0];
  check_size(sce_op, "the saved probabilities", probabilities, to_size(dims.batch * dims.classes));
  if (dlogits.gpu >= 0)
    cuda::softmax_cross_entropy_backward(dlogits.gpu, floats(probabilities), floats(label),
                                         floats(dy), dlogits.data, dlogits.mode,
                                         to_size(dims.batch), to_size(dims.classes));
  else
    cpu::softmax_cross_entropy_backward(floats(probabilities), floats(label), floats(dy),
                                        dlogits.data, dlogits.mode, to_size(dims.batch),
                                        to_size(dims.classes));
}

// ---------------------------------------------------------------------------------------------
// Flatten and Reshape

constexpr std::string_view flatten_op = "Flatten";

std::vector<shape_vector> flatten_infer_shape(const op_attrs&,
                                              std::span<const shape_vector> inputs) {
  check_input_count(flatten_op, data_only, inputs.size());
  const shape_vector& data = inputs[0];
  if (data.empty())
    fail(errc::shape_mismatch, flatten_op, "input 'data' has shape (), expected at least one axis");
  return {{data[0], product(data, 1, data.size())}};
}

void flatten_forward(const op_forward_call& call) {
  check_forward(flatten_op, data_only, call);
  copy_forward(flatten_op, call.inputs[0], call.outputs[0]);
}

void flatten_backward(const op_backward_call& call) {
  check_backward(flatten_op, data_only, call);
  copy_backward(flatten_op, call);
}

constexpr std::string_view reshape_op = "Reshape";

std::vector<shape_vector> reshape_infer_shape(const op_attrs& attrs,
                                              std::span<const shape_vector> inputs) {
  check_input_count(reshape_op, data_only, inputs.size());
  return {infer_reshape(inputs[0], attrs.shape, reshape_op, "input 'data'")};
}

void reshape_forward(const op_forward_call& call) {
  check_forward(reshape_op, data_only, call);
  copy_forward(reshape_op, call.inputs[0], call.outputs[0]);
}

void reshape_backward(const op_backward_call& call) {
  check_backward(reshape_op, data_only, call);
  copy_backward(reshape_op, call);
}

std::string reshape_describe(const op_attrs& attrs) {
  return "shape=" + shape_to_string(attrs.shape);
}

// ---------------------------------------------------------------------------------------------
// Embedding

constexpr std::string_view embedding_op = "Embedding";
constexpr std::array<std::string_view, 2> embedding_names{"data", "weight"};

std::vector<std::string> embedding_input_names(const op_attrs&) {
  return to_strings(embedding_names);
}

void embedding_check_attrs(const op_attrs& attrs) {
  require_positive(embedding_op, "input_dim", attrs.input_dim);
  require_positive(embedding_op, "output_dim", attrs.output_dim);
}

std::vector<shape_vector> embedding_infer_shape(const op_attrs& attrs,
                                                std::span<const shape_vector> inputs) {
  check_input_count(embedding_op, embedding_names, inputs.size());
  embedding_check_attrs(attrs);
  require_shape(embedding_op, "weight", inputs[1], {attrs.input_dim, attrs.output_dim});
  shape_vector out = inputs[0];
  out.push_back(attrs.output_dim);
  return {out};
}

void embedding_fill_input_shapes(const op_attrs& attrs, std::span<shape_vector> inputs) {
  check_input_count(embedding_op, embedding_names, inputs.size());
  embedding_check_attrs(attrs);
  if (inputs[1].empty())
    inputs[1] = {attrs.input_dim, attrs.output_dim};
}

/// The indices index the weight's rows: one that is not a row number would read outside the
/// table, so each is checked on every call. (MXNet clips such an index to the nearest row;
/// troupe names it.)
void check_embedding_indices(const ndarray& data, std::int64_t rows) {
  if (gpu_of(data) >= 0)
    fail(errc::not_supported, embedding_op,
         "runs on the host; its input 'data' is on " + data.ctx().to_string());
  const float* index = floats(data);
  const auto limit = static_cast<float>(rows);
  for (std::size_t i = 0; i < to_size(data.size()); ++i)
    if (!(index[i] >= 0.0f && index[i] < limit && std::floor(index[i]) == index[i]))
      fail(errc::invalid_argument, embedding_op,
           "data[" + std::to_string(i) + "] = " + number_text(index[i]) +
               " is not a row of the weight: row indices are integers in [0, " +
               std::to_string(rows) + ")");
}

void embedding_forward(const op_forward_call& call) {
  check_forward(embedding_op, embedding_names, call);
  embedding_check_attrs(call.attrs);
  require_shape(embedding_op, "weight", call.inputs[1].shape(),
                {call.attrs.input_dim, call.attrs.output_dim});
  const ndarray& data = call.inputs[0];
  check_embedding_indices(data, call.attrs.input_dim);
  ndarray& out = call.outputs[0];
  const auto width = to_size(call.attrs.output_dim);
  check_size(embedding_op, "output 0", out, to_size(data.size()) * width);
  cpu::embedding_forward(floats(data), floats(call.inputs[1]), floats(out), to_size(data.size()),
                         width);
}

void embedding_backward(const op_backward_call& call) {
  check_backward(embedding_op, embedding_names, call);
  // Indices are not differentiable: a wanted data gradient is zero.
  if (const grad_target ddata = gradient_of(call, 0); ddata && !ddata.accumulates())
    call.input_grads[0].fill(0.0);
  const grad_target dweight = gradient_of(call, 1);
  if (!dweight)
    return;
  if (dweight.gpu >= 0)
    fail(errc::not_supported, embedding_op, "runs on the host; its weight gradient is on a gpu");
  const ndarray& data = call.inputs[0];
  const auto width = to_size(call.attrs.output_dim);
  check_size(embedding_op, "gradient of input 'weight'", call.input_grads[1],
             to_size(call.attrs.input_dim) * width);
  check_size(embedding_op, "gradient of output 0", call.output_grads[0],
             to_size(data.size()) * width);
  cpu::embedding_backward(floats(data), floats(call.output_grads[0]), dweight.data, dweight.mode,
                          to_size(data.size()), to_size(call.attrs.input_dim), width);
}

/// The weight's gradient as row_sparse: the batch's distinct rows, sorted, each the sum of the
/// output-gradient rows of its occurrences added in order (as embedding_backward adds them, so
/// the two agree bit for bit).
row_sparse_array embedding_backward_rows(const op_attrs& attrs, std::span<const ndarray> inputs,
                                         std::span<const ndarray> output_grads) {
  const ndarray& data = inputs[0];
  const ndarray& dy = output_grads[0];
  if (gpu_of(dy) >= 0)
    fail(errc::not_supported, embedding_op,
         "a row_sparse weight gradient is made on the host; the output gradient is on a gpu");
  const auto width = to_size(attrs.output_dim);
  const auto count = to_size(data.size());
  check_size(embedding_op, "gradient of output 0", dy, count * width);
  const float* index = floats(data);
  std::vector<std::int64_t> rows(count);
  for (std::size_t i = 0; i < count; ++i)
    rows[i] = static_cast<std::int64_t>(index[i]);
  std::sort(rows.begin(), rows.end());
  rows.erase(std::unique(rows.begin(), rows.end()), rows.end());
  ndarray values = ndarray::zeros({static_cast<std::int64_t>(rows.size()), attrs.output_dim});
  float* sums = floats(values);
  const float* from = floats(dy);
  for (std::size_t i = 0; i < count; ++i) {
    const auto row = static_cast<std::int64_t>(index[i]);
    const auto position =
        static_cast<std::size_t>(std::lower_bound(rows.begin(), rows.end(), row) - rows.begin());
    float* target = sums + position * width;
    for (std::size_t j = 0; j < width; ++j)
      target[j] += from[i * width + j];
  }
  return row_sparse_array::from_rows(values, rows, {attrs.input_dim, attrs.output_dim}).value();
}

std::string embedding_describe(const op_attrs& attrs) {
  return "input_dim=" + std::to_string(attrs.input_dim) +
         ", output_dim=" + std::to_string(attrs.output_dim) +
         ", sparse_grad=" + (attrs.sparse_grad ? "1" : "0");
}

} // namespace

void register_nn_ops(op_table& table) {
  table.push_back({{.name = std::string{fc_op},
                    .input_names = fc_input_names,
                    .infer_shape = fc_infer_shape,
                    .fill_input_shapes = fc_fill_input_shapes,
                    .forward = fc_forward,
                    .backward = fc_backward,
                    .backward_reads_inputs = true,
                    .backward_reads_outputs = false},
                   fc_describe});
  table.push_back({{.name = std::string{conv_op},
                    .input_names = conv_input_names,
                    .infer_shape = conv_infer_shape,
                    .fill_input_shapes = conv_fill_input_shapes,
                    .forward = conv_forward,
                    .backward = conv_backward,
                    .backward_reads_inputs = true,
                    .backward_reads_outputs = false},
                   conv_describe});
  // Max pooling's backward finds each window's maximum again from the input and the output.
  table.push_back({{.name = std::string{pool_op},
                    .input_names = data_only_names,
                    .infer_shape = pool_infer_shape,
                    .forward = pool_forward,
                    .backward = pool_backward,
                    .backward_reads_inputs = true,
                    .backward_reads_outputs = true},
                   pool_describe});
  table.push_back({{.name = std::string{act_op},
                    .input_names = data_only_names,
                    .infer_shape = act_infer_shape,
                    .forward = act_forward,
                    .backward = act_backward,
                    .backward_reads_inputs = false,
                    .backward_reads_outputs = true},
                   act_describe});
  table.push_back({{.name = std::string{dropout_op},
                    .input_names = data_only_names,
                    .infer_shape = dropout_infer_shape,
                    .forward = dropout_forward,
                    .draws_seed = dropout_draws_seed,
                    .backward = dropout_backward,
                    .backward_reads_inputs = false,
                    .backward_reads_outputs = false},
                   dropout_describe});
  // The probabilities are in `saved`; the labels are read again.
  table.push_back({{.name = std::string{sce_op},
                    .input_names = sce_input_names,
                    .infer_shape = sce_infer_shape,
                    .forward = sce_forward,
                    .backward = sce_backward,
                    .backward_reads_inputs = true,
                    .backward_reads_outputs = false},
                   nullptr});
  table.push_back({{.name = std::string{flatten_op},
                    .input_names = data_only_names,
                    .infer_shape = flatten_infer_shape,
                    .forward = flatten_forward,
                    .backward = flatten_backward,
                    .backward_reads_inputs = false,
                    .backward_reads_outputs = false},
                   nullptr});
  table.push_back({{.name = std::string{reshape_op},
                    .input_names = data_only_names,
                    .infer_shape = reshape_infer_shape,
                    .forward = reshape_forward,
                    .backward = reshape_backward,
                    .backward_reads_inputs = false,
                    .backward_reads_outputs = false},
                   reshape_describe});
  // Backward reads the indices again; the weight's gradient may be row_sparse (sparse_grad).
  table.push_back({{.name = std::string{embedding_op},
                    .input_names = embedding_input_names,
                    .infer_shape = embedding_infer_shape,
                    .fill_input_shapes = embedding_fill_input_shapes,
                    .forward = embedding_forward,
                    .backward = embedding_backward,
                    .backward_reads_inputs = true,
                    .backward_reads_outputs = false,
                    .backward_rows = embedding_backward_rows,
                    .rows_input = 1},
                   embedding_describe});
}

} // namespace troupe::ops
