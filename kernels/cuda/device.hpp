#pragma once
// The GPU side of kernels/: device discovery, memory and the float32 kernels that the engine
// dispatches to for gpu(i) contexts. One header, two implementations: device.cu (built when
// TROUPE_HAVE_CUDA) and device_none.cpp (CPU-only build: zero devices, every other call throws).
// A call runs on the stream that this thread has installed for the device (stream_scope: a GPU
// device actor installs its own), or else on the device's legacy default stream, and is complete
// when it returns, so that the engine's host-side semantics hold.
//
// No call is made when device_count() == 0 except device_count() and built_with_cuda().

#include <cstddef>
#include <cstdint>
#include <memory>

namespace troupe::kernels::cuda {

/// True when this build contains the CUDA implementation.
bool built_with_cuda() noexcept;
/// Number of usable GPU contexts: the GPUs present, or TROUPE_GPU_CONTEXTS=N of them when N is
/// larger (gpu(i) then runs on GPU i % present, with its own stream and memory, so that one GPU
/// can stand for several, e.g. a pipeline's stages on two streams). 0 when built without CUDA,
/// when no driver is loaded or no device exists (any CUDA error counts as zero devices and is
/// cleared).
int device_count() noexcept;
/// "NVIDIA H200 (sm_90, 139 GiB)" or a note saying why there is none.
const char* describe_device(int device);

/// A CUDA stream of one device (non-blocking with respect to the legacy default stream) and a
/// cuBLAS handle bound to it: what a GPU device actor owns, so that two actors' work can overlap
/// on the device. Throws std::runtime_error when the device does not exist.
class stream {
public:
  explicit stream(int device);
  ~stream();
  stream(const stream&) = delete;
  stream& operator=(const stream&) = delete;

  int device() const noexcept { return device_; }

  struct resources; ///< defined by the implementation
  resources* get() const noexcept { return resources_.get(); }

private:
  int device_;
  std::unique_ptr<resources> resources_;
};

/// While it lives, this thread's calls on `s.device()` run on `s` (scopes nest; the previous one
/// comes back on destruction).
class stream_scope {
public:
  explicit stream_scope(const stream& s) noexcept;
  ~stream_scope();
  stream_scope(const stream_scope&) = delete;
  stream_scope& operator=(const stream_scope&) = delete;

private:
  [[maybe_unused]] const stream* previous_; ///< unused by the build without CUDA
};

// Memory. Failures throw std::runtime_error naming the device and the CUDA error.
void* allocate(int device, std::size_t bytes);
void release(int device, void* pointer) noexcept;
void copy_host_to_device(int device, void* dst, const void* src, std::size_t bytes);
void copy_device_to_host(int device, void* dst, const void* src, std::size_t bytes);
/// Copies between two devices (or within one), peer-to-peer where possible. The ranges must not
/// overlap (cudaMemcpy's rule).
void copy_device_to_device(int dst_device, void* dst, int src_device, const void* src,
                           std::size_t bytes);
void zero(int device, void* pointer, std::size_t bytes);

// float32 kernels on device pointers; same contracts as kernels/cpu/elementwise.hpp.
void add(int device, const float* a, const float* b, float* out, std::size_t n);
void sub(int device, const float* a, const float* b, float* out, std::size_t n);
void mul(int device, const float* a, const float* b, float* out, std::size_t n);
void scale(int device, const float* x, float alpha, float* out, std::size_t n);
void axpy(int device, float alpha, const float* x, float* y, std::size_t n);
void fill(int device, float* out, float value, std::size_t n);
/// inputs is a host array of `count` device pointers, all on `device`.
void sum_n(int device, const float* const* inputs, std::size_t count, float* out, std::size_t n);
void float_to_half(int device, const float* in, std::uint16_t* out, std::size_t n);
void half_to_float(int device, const std::uint16_t* in, float* out, std::size_t n);

/// Row-major GEMM through cuBLAS, same contract as kernels/cpu/gemm.hpp.
void gemm(int device, bool transpose_a, bool transpose_b, std::size_t m, std::size_t n,
          std::size_t k, float alpha, const float* a, std::size_t lda, const float* b,
          std::size_t ldb, float beta, float* c, std::size_t ldc);

} // namespace troupe::kernels::cuda
