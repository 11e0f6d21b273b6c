// CPU-only build of kernels/cuda/device.hpp: reports zero devices, and every call that would touch
// a device throws, so a caller that forgot to check device_count() fails loudly, not silently.

#include <stdexcept>
#include <string>

#include "kernels/cuda/device.hpp"
#include "kernels/cuda/none.hpp"

namespace troupe::kernels::cuda {

namespace detail {

[[noreturn]] void built_without_cuda(const char* function, int device) {
  throw std::runtime_error(std::string{"troupe::kernels::cuda::"} + function + " on device " +
                           std::to_string(device) +
                           ": troupe was built without CUDA (TROUPE_ENABLE_CUDA=OFF or no nvcc)");
}

} // namespace detail

using detail::built_without_cuda;

bool built_with_cuda() noexcept {
  return false;
}

int device_count() noexcept {
  return 0;
}

const char* describe_device(int) {
  return "no GPU: troupe was built without CUDA";
}

struct stream::resources {};

stream::stream(int device) : device_{device} {
  built_without_cuda("stream", device);
}

stream::~stream() = default;

// Nothing runs on a stream here, so a scope has nothing to route.
stream_scope::stream_scope(const stream&) noexcept : previous_{nullptr} {}

stream_scope::~stream_scope() = default;

void* allocate(int device, std::size_t) {
  built_without_cuda("allocate", device);
}

// Nothing can have been allocated, so there is nothing to free; noexcept forbids throwing anyway.
void release(int, void*) noexcept {}

void copy_host_to_device(int device, void*, const void*, std::size_t) {
  built_without_cuda("copy_host_to_device", device);
}

void copy_device_to_host(int device, void*, const void*, std::size_t) {
  built_without_cuda("copy_device_to_host", device);
}

void copy_device_to_device(int dst_device, void*, int, const void*, std::size_t) {
  built_without_cuda("copy_device_to_device", dst_device);
}

void zero(int device, void*, std::size_t) {
  built_without_cuda("zero", device);
}

void add(int device, const float*, const float*, float*, std::size_t) {
  built_without_cuda("add", device);
}

void sub(int device, const float*, const float*, float*, std::size_t) {
  built_without_cuda("sub", device);
}

void mul(int device, const float*, const float*, float*, std::size_t) {
  built_without_cuda("mul", device);
}

void scale(int device, const float*, float, float*, std::size_t) {
  built_without_cuda("scale", device);
}

void axpy(int device, float, const float*, float*, std::size_t) {
  built_without_cuda("axpy", device);
}

void fill(int device, float*, float, std::size_t) {
  built_without_cuda("fill", device);
}

void sum_n(int device, const float* const*, std::size_t, float*, std::size_t) {
  built_without_cuda("sum_n", device);
}

void float_to_half(int device, const float*, std::uint16_t*, std::size_t) {
  built_without_cuda("float_to_half", device);
}

void half_to_float(int device, const std::uint16_t*, float*, std::size_t) {
  built_without_cuda("half_to_float", device);
}

void gemm(int device, bool, bool, std::size_t, std::size_t, std::size_t, float, const float*,
          std::size_t, const float*, std::size_t, float, float*, std::size_t) {
  built_without_cuda("gemm", device);
}

} // namespace troupe::kernels::cuda
