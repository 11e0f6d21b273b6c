// CPU-only build of kernels/cuda/optimizer.hpp: there is no device, so every call throws, naming
// the function, so that a caller that forgot to check device_count() fails loudly.

#include "kernels/cuda/none.hpp"
#include "kernels/cuda/optimizer.hpp"

namespace troupe::kernels::cuda {

using detail::built_without_cuda;

void test_update(int device, weight_and_grad, std::size_t, float) {
  built_without_cuda("test_update", device);
}

void sgd_update(int device, weight_and_grad, float*, std::size_t, float, float, float,
                gradient_settings) {
  built_without_cuda("sgd_update", device);
}

void nag_update(int device, weight_and_grad, float*, std::size_t, float, float, float,
                gradient_settings) {
  built_without_cuda("nag_update", device);
}

void adam_update(int device, weight_and_grad, float*, float*, std::size_t, float, float, float,
                 float, float, gradient_settings) {
  built_without_cuda("adam_update", device);
}

void rmsprop_update(int device, weight_and_grad, float*, std::size_t, float, float, float, float,
                    float, gradient_settings) {
  built_without_cuda("rmsprop_update", device);
}

void rmsprop_centered_update(int device, weight_and_grad, float*, float*, float*, std::size_t,
                             float, float, float, float, float, float, gradient_settings) {
  built_without_cuda("rmsprop_centered_update", device);
}

void adagrad_update(int device, weight_and_grad, float*, std::size_t, float, float, float,
                    gradient_settings) {
  built_without_cuda("adagrad_update", device);
}

void sum_n_half(int device, const std::uint16_t* const*, std::size_t, std::uint16_t*, std::size_t) {
  built_without_cuda("sum_n_half", device);
}

void gemm_half(int device, bool, bool, std::size_t, std::size_t, std::size_t, float,
               const std::uint16_t*, std::size_t, const std::uint16_t*, std::size_t, float,
               std::uint16_t*, std::size_t) {
  built_without_cuda("gemm_half", device);
}

} // namespace troupe::kernels::cuda
