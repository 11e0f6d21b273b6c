#pragma once
// Internal to kernels/cuda/*.cu: the one way those files check CUDA and cuBLAS calls, pick the
// stream and cuBLAS handle of the calling thread, and size their launches. Not installed, not
// included by anything outside kernels/cuda.
//
// Every public function follows the same pattern:
//   activate(device, "name");                       // checks the device, makes it current
//   if (n == 0) return;
//   launch(device, current_stream(device), n, &kernel, args...);   // grid-stride over n
//   (or a launch of another shape, then TROUPE_CUDA_CHECK(device, cudaGetLastError()))
//   finish(device);                                 // the call is complete when it returns

#include <cstddef>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/cuda/device.hpp"

namespace troupe::kernels::cuda::detail {

[[noreturn]] void throw_failure(const char* call, int device, const char* name, const char* message,
                                const char* file, int line);
void check_status(cudaError_t status, const char* call, int device, const char* file, int line);
void check_status(cublasStatus_t status, const char* call, int device, const char* file, int line);

/// Checks that `device` exists and makes it current for this thread; throws std::runtime_error
/// naming `function` otherwise.
void activate(int device, const char* function);

/// The GPU that context gpu(device) runs on: `device` itself, unless TROUPE_GPU_CONTEXTS offers
/// more contexts than there are GPUs (device.hpp). Code that calls cudaSetDevice itself must pass
/// it this.
int physical_device(int device) noexcept;

/// The stream that this thread's work on `device` goes to: the installed stream_scope's when it
/// is for `device`, else the legacy default stream.
cudaStream_t current_stream(int device);
/// The cuBLAS handle bound to current_stream(device).
cublasHandle_t current_blas(int device);
/// Waits for current_stream(device); throws on an asynchronous kernel error.
void finish(int device);

/// `value` as int for cuBLAS, or std::runtime_error naming `function`, `what` and the value.
int to_int(std::size_t value, int device, const char* function, const char* what);

/// Row-major C[m×n] = alpha·op(A)·op(B) + beta·C (lda, ldb, ldc as in kernels/cpu/gemm.hpp) on
/// current_stream(device), through cuBLAS; k == 0 gives C = beta·C without reading C when beta
/// is 0. Queued, not finished: the caller calls finish(). `function` names the caller in errors.
void row_major_sgemm(int device, const char* function, bool transpose_a, bool transpose_b,
                     std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                     std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                     std::size_t ldc);

/// Host scratch memory in page-locked pages, grown on demand, one buffer per thread (uploads of
/// host-made data such as dropout masks go through it without a staging copy by the driver).
void* pinned_scratch(int device, std::size_t bytes);

constexpr unsigned block_threads = 256;
/// Enough blocks to fill any current GPU; larger inputs are covered by grid-stride loops.
constexpr std::size_t max_blocks = 8192;

inline unsigned grid_for(std::size_t n) {
  const std::size_t blocks = (n + block_threads - 1) / block_threads;
  return static_cast<unsigned>(blocks < max_blocks ? blocks : max_blocks);
}

__device__ inline std::size_t first_index() {
  return static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline std::size_t grid_stride() {
  return static_cast<std::size_t>(gridDim.x) * blockDim.x;
}

/// Evaluates `call` (a cudaError_t or cublasStatus_t expression) and throws std::runtime_error
/// naming the call, `device` and the error when it does not succeed.
#define TROUPE_CUDA_CHECK(device, call)                                                            \
  ::troupe::kernels::cuda::detail::check_status((call), #call, (device), __FILE__, __LINE__)

/// Launches `kernel` over n elements (grid_for(n) blocks of block_threads) on `stream` and checks
/// the launch; nothing when n == 0, as an empty grid is an invalid configuration.
template <class... Params, class... Args>
void launch(int device, cudaStream_t stream, std::size_t n, void (*kernel)(Params...),
            const Args&... args) {
  if (n == 0)
    return;
  kernel<<<grid_for(n), block_threads, 0, stream>>>(args...);
  TROUPE_CUDA_CHECK(device, cudaGetLastError());
}

} // namespace troupe::kernels::cuda::detail
