// CPU-only build of kernels/cuda/elementwise.hpp: every call throws (see device_none.cpp).

#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/none.hpp"

namespace troupe::kernels::cuda {

using detail::built_without_cuda;

void binary(int device, binary_kind, const float*, bool, const float*, bool, float*, std::size_t) {
  built_without_cuda("binary", device);
}

void add_scalar(int device, const float*, float, float*, std::size_t) {
  built_without_cuda("add_scalar", device);
}

void store_gradient(int device, const gradient_terms&, std::size_t, float*, bool, bool) {
  built_without_cuda("store_gradient", device);
}

void sum(int device, const float*, std::size_t, double, float*) {
  built_without_cuda("sum", device);
}

} // namespace troupe::kernels::cuda
