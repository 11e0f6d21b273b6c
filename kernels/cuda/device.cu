// CUDA build of kernels/cuda/device.hpp: CUDA runtime for memory and element-wise kernels,
// cuBLAS for GEMM. Every call is synchronous with the host (see device.hpp), and every CUDA and
// cuBLAS status goes through TROUPE_CUDA_CHECK, which throws std::runtime_error naming the call,
// the device and the error.

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/launch.cuh"

namespace troupe::kernels::cuda {

namespace detail {

[[noreturn]] void throw_failure(const char* call, int device, const char* name, const char* message,
                                const char* file, int line) {
  throw std::runtime_error(std::string{"CUDA call "} + call + " failed on device " +
                           std::to_string(device) + ": " + name + " (" + message + ") at " + file +
                           ":" + std::to_string(line));
}

void check_status(cudaError_t status, const char* call, int device, const char* file, int line) {
  if (status == cudaSuccess)
    return;
  // Clear the error so that an unrelated later cudaGetLastError() does not report it again
  // (sticky errors such as an illegal address stay with the context regardless).
  cudaGetLastError();
  throw_failure(call, device, cudaGetErrorName(status), cudaGetErrorString(status), file, line);
}

void check_status(cublasStatus_t status, const char* call, int device, const char* file, int line) {
  if (status == CUBLAS_STATUS_SUCCESS)
    return;
  throw_failure(call, device, cublasGetStatusName(status), cublasGetStatusString(status), file,
                line);
}

} // namespace detail

using namespace detail;

namespace {

/// Device discovery, once per process: the set of visible devices cannot change after the
/// runtime has initialised.
struct discovery {
  int count = 0;                   ///< devices troupe offers: gpu(0) to gpu(count - 1)
  int physical_count = 0;          ///< GPUs the CUDA runtime reports
  cudaError_t error = cudaSuccess; ///< why count is 0, when cudaGetDeviceCount failed
};

/// TROUPE_GPU_CONTEXTS=N (N > the physical count, at most 64) offers N gpu contexts on fewer
/// GPUs, gpu(i) running on GPU i % physical_count with its own stream: a one-GPU machine can then
/// run what two GPU contexts run (a pipeline's stages on two streams). Anything else: unset.
int requested_contexts() noexcept {
  const char* text = std::getenv("TROUPE_GPU_CONTEXTS");
  if (text == nullptr || *text == '\0')
    return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 1 || value > 64) {
    std::fprintf(stderr, "troupe: TROUPE_GPU_CONTEXTS='%s' is not a count from 1 to 64; ignored\n",
                 text);
    return 0;
  }
  return static_cast<int>(value);
}

const discovery& discover() noexcept {
  static const discovery result = [] {
    discovery d;
    // Not through TROUPE_CUDA_CHECK on purpose: without a driver this fails with
    // cudaErrorInsufficientDriver (not cudaErrorNoDevice), and any failure means "no GPU".
    d.error = cudaGetDeviceCount(&d.physical_count);
    if (d.error != cudaSuccess) {
      d.physical_count = 0;
      cudaGetLastError();
    }
    d.count = d.physical_count > 0 ? std::max(d.physical_count, requested_contexts()) : 0;
    return d;
  }();
  return result;
}

/// Per-process CUDA state shared by all callers. Leaked on purpose: destroying cuBLAS handles from
/// a static destructor can run after the CUDA runtime has been torn down, which crashes at exit.
struct registry {
  std::mutex mutex;
  std::vector<cublasHandle_t> handles;     ///< one per device, created on first gemm
  std::vector<signed char> peer_enabled;   ///< [dst * count + src]: 0 unknown, 1 yes, -1 no
  std::map<int, std::string> descriptions; ///< node-based: c_str() stays valid for callers
};

registry& state() {
  static registry* r = [] {
    auto* created = new registry;
    const auto count = static_cast<std::size_t>(discover().physical_count);
    created->handles.assign(count, nullptr);
    created->peer_enabled.assign(count * count, 0);
    return created;
  }();
  return *r;
}

cublasHandle_t default_handle_for(int device) {
  registry& r = state();
  std::lock_guard lock{r.mutex};
  cublasHandle_t& handle = r.handles[static_cast<std::size_t>(physical_device(device))];
  if (handle == nullptr) {
    cublasHandle_t created = nullptr;
    // binds to the current device, which activate() has set, and to the legacy default stream
    TROUPE_CUDA_CHECK(device, cublasCreate(&created));
    handle = created;
  }
  return handle;
}

/// The stream this thread's stream_scope installed, or null.
thread_local const stream* installed_stream = nullptr;

/// Page-locked host memory of one thread, grown on demand and released with the thread.
struct pinned_buffer {
  void* pointer = nullptr;
  std::size_t bytes = 0;
  ~pinned_buffer() {
    if (pointer != nullptr)
      cudaFreeHost(pointer); // at thread exit: nothing to report to
  }
};

cudaError_t tolerate_already_enabled(cudaError_t status) noexcept {
  if (status != cudaErrorPeerAccessAlreadyEnabled)
    return status;
  cudaGetLastError();
  return cudaSuccess;
}

/// Lets dst_device read src_device's memory directly when the hardware allows it; otherwise
/// cudaMemcpyPeer stages through the host, which is still correct.
void enable_peer_access(int dst_device, int src_device) {
  registry& r = state();
  std::lock_guard lock{r.mutex};
  const auto count = static_cast<std::size_t>(discover().physical_count);
  signed char& known =
      r.peer_enabled[static_cast<std::size_t>(physical_device(dst_device)) * count +
                     static_cast<std::size_t>(physical_device(src_device))];
  if (known != 0)
    return;
  int possible = 0;
  TROUPE_CUDA_CHECK(dst_device, cudaDeviceCanAccessPeer(&possible, physical_device(dst_device),
                                                        physical_device(src_device)));
  if (possible != 0) {
    TROUPE_CUDA_CHECK(dst_device, cudaSetDevice(physical_device(dst_device)));
    TROUPE_CUDA_CHECK(dst_device, tolerate_already_enabled(
                                      cudaDeviceEnablePeerAccess(physical_device(src_device), 0)));
  }
  known = possible != 0 ? 1 : -1;
}

// --- kernels ---------------------------------------------------------------------------------

struct plus_op {
  __device__ float operator()(float x, float y) const { return x + y; }
};
struct minus_op {
  __device__ float operator()(float x, float y) const { return x - y; }
};
struct times_op {
  __device__ float operator()(float x, float y) const { return x * y; }
};

template <class Op>
__global__ void binary_kernel(const float* a, const float* b, float* out, std::size_t n, Op op) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    out[i] = op(a[i], b[i]);
}

__global__ void scale_kernel(const float* x, float alpha, float* out, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    out[i] = alpha * x[i];
}

__global__ void axpy_kernel(float alpha, const float* x, float* y, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    y[i] += alpha * x[i];
}

/// c[i·ldc + j] *= beta over an m×n row-major matrix.
__global__ void scale_matrix_kernel(float* c, std::size_t ldc, std::size_t m, std::size_t n,
                                    float beta) {
  for (std::size_t index = first_index(); index < m * n; index += grid_stride())
    c[(index / n) * ldc + index % n] *= beta;
}

__global__ void fill_kernel(float* out, float value, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    out[i] = value;
}

/// Up to this many inputs per sum_n launch, passed by value as kernel parameters.
constexpr std::size_t inputs_per_launch = 8;

struct input_group {
  const float* inputs[inputs_per_launch];
  unsigned count;
};

/// out[i] = (continue ? out[i] : in[0][i]) + in[...][i] ..., adding strictly left to right so
/// that the result is bit-identical to kernels::cpu::sum_n.
__global__ void sum_group_kernel(input_group group, bool continue_sum, float* out, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float acc = continue_sum ? out[i] : group.inputs[0][i];
    for (unsigned k = continue_sum ? 0u : 1u; k < group.count; ++k)
      acc += group.inputs[k][i];
    out[i] = acc;
  }
}

__global__ void float_to_half_kernel(const float* in, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    out[i] = __half_as_ushort(__float2half_rn(in[i]));
}

__global__ void half_to_float_kernel(const std::uint16_t* in, float* out, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    out[i] = __half2float(__ushort_as_half(in[i]));
}

template <class Op>
void binary(int device, const char* function, const float* a, const float* b, float* out,
            std::size_t n) {
  activate(device, function);
  if (n == 0)
    return;
  launch(device, current_stream(device), n, &binary_kernel<Op>, a, b, out, n, Op{});
  finish(device);
}

} // namespace

struct stream::resources {
  cudaStream_t handle = nullptr;
  cublasHandle_t blas = nullptr;
};

// --- launch.cuh ------------------------------------------------------------------------------

namespace detail {

void activate(int device, const char* function) {
  const int count = discover().count;
  if (device < 0 || device >= count)
    throw std::runtime_error(std::string{"troupe::kernels::cuda::"} + function +
                             ": no CUDA device " + std::to_string(device) + " (" +
                             std::to_string(count) + " present)");
  TROUPE_CUDA_CHECK(device, cudaSetDevice(physical_device(device)));
}

int physical_device(int device) noexcept {
  const int physical = discover().physical_count;
  return physical > 0 ? device % physical : device;
}

cudaStream_t current_stream(int device) {
  const stream* installed = installed_stream;
  if (installed != nullptr && installed->device() == device)
    return installed->get()->handle;
  return cudaStreamLegacy;
}

cublasHandle_t current_blas(int device) {
  const stream* installed = installed_stream;
  if (installed != nullptr && installed->device() == device)
    return installed->get()->blas;
  return default_handle_for(device);
}

void finish(int device) {
  TROUPE_CUDA_CHECK(device, cudaStreamSynchronize(current_stream(device)));
}

int to_int(std::size_t value, int device, const char* function, const char* what) {
  if (value > static_cast<std::size_t>(INT_MAX))
    throw std::runtime_error(std::string{"troupe::kernels::cuda::"} + function + " on device " +
                             std::to_string(device) + ": " + what + " = " + std::to_string(value) +
                             " does not fit a 32-bit int");
  return static_cast<int>(value);
}

void* pinned_scratch(int device, std::size_t bytes) {
  thread_local pinned_buffer buffer;
  if (buffer.bytes < bytes) {
    if (buffer.pointer != nullptr) {
      // Work queued earlier on this thread may still read the old buffer.
      finish(device);
      TROUPE_CUDA_CHECK(device, cudaFreeHost(buffer.pointer));
      buffer = {};
    }
    void* pointer = nullptr;
    TROUPE_CUDA_CHECK(device, cudaMallocHost(&pointer, bytes));
    buffer.pointer = pointer;
    buffer.bytes = bytes;
  }
  return buffer.pointer;
}

void row_major_sgemm(int device, const char* function, bool transpose_a, bool transpose_b,
                     std::size_t m, std::size_t n, std::size_t k, float alpha, const float* a,
                     std::size_t lda, const float* b, std::size_t ldb, float beta, float* c,
                     std::size_t ldc) {
  if (m == 0 || n == 0)
    return;
  const cudaStream_t stream = current_stream(device);
  if (k == 0) {
    // C = beta·C, done here: cuBLAS wants leading dimensions >= 1 even for operands it never
    // reads, and beta == 0 must not read C (it may hold NaN).
    if (beta == 0.0f)
      TROUPE_CUDA_CHECK(device,
                        cudaMemset2DAsync(c, ldc * sizeof(float), 0, n * sizeof(float), m, stream));
    else if (beta != 1.0f)
      launch(device, stream, m * n, &scale_matrix_kernel, c, ldc, m, n, beta);
    return;
  }
  // cuBLAS is column-major, and a row-major matrix read column-major is its transpose. So
  // compute Cᵀ (n×m) = op(B)ᵀ · op(A)ᵀ: swap the operands and m/n, keep each transpose flag.
  TROUPE_CUDA_CHECK(
      device,
      cublasSgemm(current_blas(device), transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                  transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, to_int(n, device, function, "n"),
                  to_int(m, device, function, "m"), to_int(k, device, function, "k"), &alpha, b,
                  to_int(ldb, device, function, "ldb"), a, to_int(lda, device, function, "lda"),
                  &beta, c, to_int(ldc, device, function, "ldc")));
}

} // namespace detail

// --- streams ---------------------------------------------------------------------------------

stream::stream(int device) : device_{device}, resources_{std::make_unique<resources>()} {
  activate(device, "stream");
  TROUPE_CUDA_CHECK(device, cudaStreamCreateWithFlags(&resources_->handle, cudaStreamNonBlocking));
  try {
    TROUPE_CUDA_CHECK(device, cublasCreate(&resources_->blas));
    TROUPE_CUDA_CHECK(device, cublasSetStream(resources_->blas, resources_->handle));
  } catch (...) {
    if (resources_->blas != nullptr)
      cublasDestroy(resources_->blas);
    cudaStreamDestroy(resources_->handle);
    throw;
  }
}

stream::~stream() {
  // A destructor must not throw: failures here (a device already lost) are only reported.
  if (cudaSetDevice(physical_device(device_)) != cudaSuccess ||
      cudaStreamSynchronize(resources_->handle) != cudaSuccess)
    std::fprintf(stderr,
                 "troupe::kernels::cuda::stream: device %d failed while its stream closed: %s\n",
                 device_, cudaGetErrorString(cudaGetLastError()));
  cublasDestroy(resources_->blas);
  cudaStreamDestroy(resources_->handle);
}

stream_scope::stream_scope(const stream& s) noexcept : previous_{installed_stream} {
  installed_stream = &s;
}

stream_scope::~stream_scope() {
  installed_stream = previous_;
}

// --- discovery -------------------------------------------------------------------------------

bool built_with_cuda() noexcept {
  return true;
}

int device_count() noexcept {
  return discover().count;
}

const char* describe_device(int device) {
  const discovery& d = discover();
  if (d.count == 0) {
    static const std::string none =
        std::string{"no GPU: cudaGetDeviceCount reports "} +
        (d.error == cudaSuccess
             ? std::string{"0 devices"}
             : std::string{cudaGetErrorName(d.error)} + " (" + cudaGetErrorString(d.error) + ")");
    return none.c_str();
  }
  if (device < 0 || device >= d.count)
    return "no such CUDA device (index out of range)";
  registry& r = state();
  std::lock_guard lock{r.mutex};
  if (auto found = r.descriptions.find(device); found != r.descriptions.end())
    return found->second.c_str();
  cudaDeviceProp properties{};
  const int physical = physical_device(device);
  TROUPE_CUDA_CHECK(device, cudaGetDeviceProperties(&properties, physical));
  const auto gib = properties.totalGlobalMem >> 30;
  std::string text = std::string{properties.name} + " (sm_" + std::to_string(properties.major) +
                     std::to_string(properties.minor) + ", " + std::to_string(gib) + " GiB)";
  if (physical != device)
    text += " as context gpu(" + std::to_string(device) + ") on GPU " + std::to_string(physical) +
            " (TROUPE_GPU_CONTEXTS)";
  return r.descriptions.emplace(device, std::move(text)).first->second.c_str();
}

// --- memory ----------------------------------------------------------------------------------

void* allocate(int device, std::size_t bytes) {
  activate(device, "allocate");
  if (bytes == 0)
    return nullptr;
  void* pointer = nullptr;
  TROUPE_CUDA_CHECK(device, cudaMalloc(&pointer, bytes));
  return pointer;
}

void release(int device, void* pointer) noexcept {
  if (pointer == nullptr)
    return;
  // Called from destructors, so it must not throw: a failed free is reported and swallowed.
  try {
    activate(device, "release");
    TROUPE_CUDA_CHECK(device, cudaFree(pointer));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe::kernels::cuda::release: %s\n", e.what());
  }
}

void copy_host_to_device(int device, void* dst, const void* src, std::size_t bytes) {
  activate(device, "copy_host_to_device");
  if (bytes == 0)
    return;
  TROUPE_CUDA_CHECK(
      device, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, current_stream(device)));
  finish(device);
}

void copy_device_to_host(int device, void* dst, const void* src, std::size_t bytes) {
  activate(device, "copy_device_to_host");
  if (bytes == 0)
    return;
  TROUPE_CUDA_CHECK(
      device, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, current_stream(device)));
  finish(device);
}

void copy_device_to_device(int dst_device, void* dst, int src_device, const void* src,
                           std::size_t bytes) {
  activate(src_device, "copy_device_to_device");
  activate(dst_device, "copy_device_to_device");
  if (bytes == 0)
    return;
  if (physical_device(dst_device) == physical_device(src_device)) {
    TROUPE_CUDA_CHECK(dst_device, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                                  current_stream(dst_device)));
    finish(dst_device);
    return;
  }
  enable_peer_access(dst_device, src_device);
  TROUPE_CUDA_CHECK(dst_device, cudaSetDevice(physical_device(dst_device)));
  // The source was complete when the call that wrote it returned (every call finishes its
  // stream), so ordering the copy on the destination's stream is enough.
  TROUPE_CUDA_CHECK(dst_device, cudaMemcpyPeerAsync(dst, physical_device(dst_device), src,
                                                    physical_device(src_device), bytes,
                                                    current_stream(dst_device)));
  finish(dst_device);
}

void zero(int device, void* pointer, std::size_t bytes) {
  activate(device, "zero");
  if (bytes == 0)
    return;
  TROUPE_CUDA_CHECK(device, cudaMemsetAsync(pointer, 0, bytes, current_stream(device)));
  finish(device);
}

// --- element-wise ----------------------------------------------------------------------------

void add(int device, const float* a, const float* b, float* out, std::size_t n) {
  binary<plus_op>(device, "add", a, b, out, n);
}

void sub(int device, const float* a, const float* b, float* out, std::size_t n) {
  binary<minus_op>(device, "sub", a, b, out, n);
}

void mul(int device, const float* a, const float* b, float* out, std::size_t n) {
  binary<times_op>(device, "mul", a, b, out, n);
}

void scale(int device, const float* x, float alpha, float* out, std::size_t n) {
  activate(device, "scale");
  if (n == 0)
    return;
  launch(device, current_stream(device), n, &scale_kernel, x, alpha, out, n);
  finish(device);
}

void axpy(int device, float alpha, const float* x, float* y, std::size_t n) {
  activate(device, "axpy");
  if (n == 0)
    return;
  launch(device, current_stream(device), n, &axpy_kernel, alpha, x, y, n);
  finish(device);
}

void fill(int device, float* out, float value, std::size_t n) {
  activate(device, "fill");
  if (n == 0)
    return;
  launch(device, current_stream(device), n, &fill_kernel, out, value, n);
  finish(device);
}

void sum_n(int device, const float* const* inputs, std::size_t count, float* out, std::size_t n) {
  activate(device, "sum_n");
  if (n == 0)
    return;
  if (count == 0) {
    TROUPE_CUDA_CHECK(device, cudaMemsetAsync(out, 0, n * sizeof(float), current_stream(device)));
  } else if (count == 1) {
    if (out != inputs[0])
      TROUPE_CUDA_CHECK(device, cudaMemcpyAsync(out, inputs[0], n * sizeof(float),
                                                cudaMemcpyDeviceToDevice, current_stream(device)));
  } else {
    // Groups run one after another on the stream; each continues the running sum in
    // `out`, so only the first group may read inputs[0] (which `out` may alias).
    for (std::size_t begin = 0; begin < count; begin += inputs_per_launch) {
      input_group group{};
      group.count = static_cast<unsigned>(std::min(inputs_per_launch, count - begin));
      std::copy(inputs + begin, inputs + begin + group.count, group.inputs);
      const bool continue_sum = begin != 0;
      launch(device, current_stream(device), n, &sum_group_kernel, group, continue_sum, out, n);
    }
  }
  finish(device);
}

void float_to_half(int device, const float* in, std::uint16_t* out, std::size_t n) {
  activate(device, "float_to_half");
  if (n == 0)
    return;
  launch(device, current_stream(device), n, &float_to_half_kernel, in, out, n);
  finish(device);
}

void half_to_float(int device, const std::uint16_t* in, float* out, std::size_t n) {
  activate(device, "half_to_float");
  if (n == 0)
    return;
  launch(device, current_stream(device), n, &half_to_float_kernel, in, out, n);
  finish(device);
}

// --- GEMM ------------------------------------------------------------------------------------

void gemm(int device, bool transpose_a, bool transpose_b, std::size_t m, std::size_t n,
          std::size_t k, float alpha, const float* a, std::size_t lda, const float* b,
          std::size_t ldb, float beta, float* c, std::size_t ldc) {
  activate(device, "gemm");
  row_major_sgemm(device, "gemm", transpose_a, transpose_b, m, n, k, alpha, a, lda, b, ldb, beta, c,
                  ldc);
  finish(device);
}

} // namespace troupe::kernels::cuda
