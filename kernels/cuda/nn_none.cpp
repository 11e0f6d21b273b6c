// CPU-only build of kernels/cuda/nn.hpp: there is no device, so every call throws, naming the
// function, and a caller that forgot to check device_count() fails loudly, not silently.

#include "kernels/cuda/nn.hpp"
#include "kernels/cuda/none.hpp"

namespace troupe::kernels::cuda {

using detail::built_without_cuda;

void activation_forward(int device, cpu::activation_kind, const float*, float*, std::size_t) {
  built_without_cuda("activation_forward", device);
}

void activation_backward(int device, cpu::activation_kind, const float*, const float*, float*,
                         std::size_t, cpu::write_mode) {
  built_without_cuda("activation_backward", device);
}

void fully_connected_forward(int device, const float*, const float*, const float*, float*,
                             std::size_t, std::size_t, std::size_t) {
  built_without_cuda("fully_connected_forward", device);
}

void fully_connected_backward(int device, const float*, const float*, const float*, float*,
                              cpu::write_mode, float*, cpu::write_mode, float*, cpu::write_mode,
                              std::size_t, std::size_t, std::size_t) {
  built_without_cuda("fully_connected_backward", device);
}

void convolution_forward(int device, const float*, const float*, const float*, float*,
                         cpu::image_shape, std::size_t, cpu::window_2d) {
  built_without_cuda("convolution_forward", device);
}

void convolution_backward(int device, const float*, const float*, const float*, float*,
                          cpu::write_mode, float*, cpu::write_mode, float*, cpu::write_mode,
                          cpu::image_shape, std::size_t, cpu::window_2d) {
  built_without_cuda("convolution_backward", device);
}

void pooling_forward(int device, cpu::pool_kind, const float*, float*, cpu::image_shape,
                     cpu::window_2d) {
  built_without_cuda("pooling_forward", device);
}

void pooling_backward(int device, cpu::pool_kind, const float*, const float*, const float*, float*,
                      cpu::write_mode, cpu::image_shape, cpu::window_2d) {
  built_without_cuda("pooling_backward", device);
}

void softmax_cross_entropy_forward(int device, const float*, const float*, float*, float*,
                                   std::size_t, std::size_t) {
  built_without_cuda("softmax_cross_entropy_forward", device);
}

void softmax_cross_entropy_backward(int device, const float*, const float*, const float*, float*,
                                    cpu::write_mode, std::size_t, std::size_t) {
  built_without_cuda("softmax_cross_entropy_backward", device);
}

void dropout_forward(int device, const float*, float*, float*, std::size_t, double, std::uint64_t) {
  built_without_cuda("dropout_forward", device);
}

void dropout_backward(int device, const float*, const float*, float*, std::size_t,
                      cpu::write_mode) {
  built_without_cuda("dropout_backward", device);
}

} // namespace troupe::kernels::cuda
