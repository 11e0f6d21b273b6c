// CUDA build of kernels/cuda/optimizer.hpp. One grid-stride kernel, templated on how the weight
// is stored (float32, float16, float16 with a float32 master copy) and on the rule, a functor that
// holds the rule's state pointers and hyper-parameters and maps (weight, grad) to the new weight.
// Each rule repeats the expression order of kernels/cpu/optimizer_rules.cpp, so that float32
// results differ from the CPU's only where nvcc contracts a multiply and an add into one FMA.

#include <algorithm>
#include <cstdint>
#include <stdexcept>
#include <string>

#include <cublas_v2.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/optimizer.hpp"

namespace troupe::kernels::cuda {

using namespace detail;

namespace {

[[noreturn]] void invalid_argument(const char* function, int device, const std::string& what) {
  throw std::runtime_error(std::string{"troupe::kernels::cuda::"} + function + " on device " +
                           std::to_string(device) + ": " + what);
}

// --- element access --------------------------------------------------------------------------

/// How a weight is stored: the three cases of optimizer.hpp's weight_and_grad.
enum class storage { f32, f16, f16_master };

__device__ inline float widen(std::uint16_t bits) {
  return __half2float(__ushort_as_half(bits));
}

__device__ inline std::uint16_t narrow(float value) {
  return __half_as_ushort(__float2half_rn(value));
}

/// The weight a rule starts from: the float32 weight, the widened float16 weight, or the master.
template <storage S>
__device__ inline float load_weight(const void* weight, const float* master, std::size_t i) {
  if constexpr (S == storage::f32)
    return static_cast<const float*>(weight)[i];
  else if constexpr (S == storage::f16)
    return widen(static_cast<const std::uint16_t*>(weight)[i]);
  else
    return master[i];
}

template <storage S>
__device__ inline float load_grad(const void* grad, std::size_t i) {
  if constexpr (S == storage::f32)
    return static_cast<const float*>(grad)[i];
  else
    return widen(static_cast<const std::uint16_t*>(grad)[i]);
}

template <storage S>
__device__ inline void store_weight(void* weight, float* master, std::size_t i, float value) {
  if constexpr (S == storage::f32) {
    static_cast<float*>(weight)[i] = value;
  } else {
    if constexpr (S == storage::f16_master)
      master[i] = value;
    static_cast<std::uint16_t*>(weight)[i] = narrow(value);
  }
}

// --- gradient preparation (optimizer_rules.cpp's helpers) ------------------------------------

/// gradient_settings as a plain kernel argument.
struct clip_settings {
  float rescale_grad;
  float clip_gradient;
};

clip_settings to_clip(gradient_settings s) {
  return {s.rescale_grad, s.clip_gradient};
}

/// mshadow_op::clip: a NaN passes through unchanged, as on the CPU (so not fminf/fmaxf).
__device__ inline float clip(float x, float bound) {
  if (x > bound)
    return bound;
  if (x < -bound)
    return -bound;
  return x;
}

__device__ inline float prepared(float raw, clip_settings s) {
  const float g = s.rescale_grad * raw;
  return s.clip_gradient >= 0.0f ? clip(g, s.clip_gradient) : g;
}

/// Adam and both RMSProps add the weight decay before clipping.
__device__ inline float prepared_with_decay(float raw, float weight, float wd, clip_settings s) {
  const float g = s.rescale_grad * raw + wd * weight;
  return s.clip_gradient >= 0.0f ? clip(g, s.clip_gradient) : g;
}

__device__ inline float clip_weight(float w, float clip_weights) {
  return clip_weights >= 0.0f ? clip(w, clip_weights) : w;
}

// --- rules: (weight, raw grad, index) -> new weight, updating their state at the index ------

struct test_rule {
  float rescale_grad;
  __device__ float operator()(float w, float raw, std::size_t) const {
    return w + rescale_grad * raw;
  }
};

struct sgd_rule {
  float decay; ///< 1 - lr * wd, computed on the host as the CPU does
  float lr;
  clip_settings s;
  __device__ float operator()(float w, float raw, std::size_t) const {
    return decay * w - lr * prepared(raw, s);
  }
};

struct sgd_momentum_rule {
  float* mom;
  float lr, momentum, wd;
  clip_settings s;
  __device__ float operator()(float w, float raw, std::size_t i) const {
    const float m = momentum * mom[i] - lr * wd * w - lr * prepared(raw, s);
    mom[i] = m;
    return w + m;
  }
};

struct nag_rule {
  float* mom;
  float lr, momentum, wd;
  clip_settings s;
  __device__ float operator()(float w, float raw, std::size_t i) const {
    const float g = prepared(raw, s) + wd * w;
    const float m = momentum * mom[i] + g;
    mom[i] = m;
    return w - lr * (g + momentum * m);
  }
};

struct adam_rule {
  float* mean;
  float* var;
  float lr, beta1, beta2, epsilon, wd;
  clip_settings s;
  __device__ float operator()(float w, float raw, std::size_t i) const {
    const float g = prepared_with_decay(raw, w, wd, s);
    const float m = beta1 * mean[i] + (1.0f - beta1) * g;
    const float v = beta2 * var[i] + (1.0f - beta2) * g * g;
    mean[i] = m;
    var[i] = v;
    return w - lr * m / (sqrtf(v) + epsilon);
  }
};

struct rmsprop_rule {
  float* mean_square;
  float lr, gamma1, epsilon, wd, clip_weights;
  clip_settings s;
  __device__ float operator()(float w, float raw, std::size_t i) const {
    const float g = prepared_with_decay(raw, w, wd, s);
    const float ms = (1.0f - gamma1) * g * g + gamma1 * mean_square[i];
    mean_square[i] = ms;
    return clip_weight(w - lr * (g / sqrtf(ms + epsilon)), clip_weights);
  }
};

struct rmsprop_centered_rule {
  float* mean_square;
  float* mean_grad;
  float* delta;
  float lr, gamma1, gamma2, epsilon, wd, clip_weights;
  clip_settings s;
  __device__ float operator()(float w, float raw, std::size_t i) const {
    const float g = prepared_with_decay(raw, w, wd, s);
    const float ms = (1.0f - gamma1) * g * g + gamma1 * mean_square[i];
    const float mg = (1.0f - gamma1) * g + gamma1 * mean_grad[i];
    const float d = gamma2 * delta[i] - lr * (g / sqrtf(ms - mg * mg + epsilon));
    mean_square[i] = ms;
    mean_grad[i] = mg;
    delta[i] = d;
    return clip_weight(w + d, clip_weights);
  }
};

struct adagrad_rule {
  float* history;
  float lr, epsilon, wd;
  clip_settings s;
  __device__ float operator()(float w, float raw, std::size_t i) const {
    const float g = prepared(raw, s);
    const float h = history[i] + g * g;
    history[i] = h;
    return w + (g / sqrtf(h + epsilon) + w * wd) * -lr;
  }
};

template <storage S, class Rule>
__global__ void update_kernel(void* weight, const void* grad, float* master, std::size_t n,
                              Rule rule) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float w = load_weight<S>(weight, master, i);
    const float g = load_grad<S>(grad, i);
    store_weight<S>(weight, master, i, rule(w, g, i));
  }
}

// --- host side of the rules ------------------------------------------------------------------

storage storage_of(const weight_and_grad& w, int device, const char* function) {
  switch (w.type) {
  case element_type::float32:
    if (w.master != nullptr)
      invalid_argument(function, device,
                       "a float32 weight has no master copy (master is for float16 weights)");
    return storage::f32;
  case element_type::float16:
    return w.master != nullptr ? storage::f16_master : storage::f16;
  }
  invalid_argument(function, device,
                   "unknown element_type " + std::to_string(static_cast<int>(w.type)));
}

void require(const void* pointer, int device, const char* function, const char* what) {
  if (pointer == nullptr)
    invalid_argument(function, device, std::string{what} + " is null");
}

/// The checks every rule starts with; false when there is nothing to do (n == 0).
bool start_update(int device, const char* function, const weight_and_grad& w, std::size_t n) {
  activate(device, function);
  storage_of(w, device, function);
  if (n == 0)
    return false;
  require(w.weight, device, function, "weight");
  require(w.grad, device, function, "grad");
  return true;
}

template <class Rule>
void run_update(int device, const char* function, const weight_and_grad& w, std::size_t n,
                const Rule& rule) {
  const cudaStream_t work = current_stream(device);
  switch (storage_of(w, device, function)) {
  case storage::f32:
    launch(device, work, n, &update_kernel<storage::f32, Rule>, w.weight, w.grad, w.master, n,
           rule);
    break;
  case storage::f16:
    launch(device, work, n, &update_kernel<storage::f16, Rule>, w.weight, w.grad, w.master, n,
           rule);
    break;
  case storage::f16_master:
    launch(device, work, n, &update_kernel<storage::f16_master, Rule>, w.weight, w.grad, w.master,
           n, rule);
    break;
  }
  finish(device);
}

// --- sum_n_half ------------------------------------------------------------------------------

/// Up to this many inputs per sum_n_half launch, passed by value as kernel parameters.
constexpr std::size_t half_inputs_per_launch = 8;

struct half_input_group {
  const std::uint16_t* inputs[half_inputs_per_launch];
  unsigned count;
};

/// One group of a float32 sum, strictly left to right: starts from partial_in[i] (a previous
/// group's float sum) or, when partial_in is null, from inputs[0][i]; ends in partial_out[i] or,
/// when partial_out is null, rounded once into out[i]. A thread reads every input at i before it
/// writes i, so out may alias inputs[0] and partial_in may equal partial_out.
__global__ void sum_half_group_kernel(half_input_group group, const float* partial_in,
                                      float* partial_out, std::uint16_t* out, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    float acc;
    unsigned k;
    if (partial_in != nullptr) {
      acc = partial_in[i];
      k = 0;
    } else {
      acc = widen(group.inputs[0][i]);
      k = 1;
    }
    for (; k < group.count; ++k)
      acc += widen(group.inputs[k][i]);
    if (partial_out != nullptr)
      partial_out[i] = acc;
    else
      out[i] = narrow(acc);
  }
}

/// Device memory for the float32 partial sums of a sum over more inputs than one launch takes,
/// allocated and freed in stream order on the call's stream.
class stream_scratch {
public:
  /// bytes == 0 allocates nothing (get() is null).
  stream_scratch(int device, cudaStream_t work, std::size_t bytes) : device_{device}, work_{work} {
    if (bytes != 0)
      TROUPE_CUDA_CHECK(device, cudaMallocAsync(&pointer_, bytes, work));
  }
  stream_scratch(const stream_scratch&) = delete;
  stream_scratch& operator=(const stream_scratch&) = delete;
  ~stream_scratch() {
    // Only reached with the pointer still set when an exception is on its way: free without
    // throwing, and clear any error of the free so that no later call reports it.
    if (pointer_ != nullptr && cudaFreeAsync(pointer_, work_) != cudaSuccess)
      (void)cudaGetLastError();
  }

  float* get() const { return static_cast<float*>(pointer_); }

  void free() {
    void* pointer = pointer_;
    pointer_ = nullptr;
    TROUPE_CUDA_CHECK(device_, cudaFreeAsync(pointer, work_));
  }

private:
  int device_;
  cudaStream_t work_;
  void* pointer_ = nullptr;
};

// --- gemm_half with k == 0 -------------------------------------------------------------------

/// C = beta * C over an m×n block of a row-major C; beta == 0 writes zeros without reading C.
__global__ void scale_half_matrix_kernel(std::uint16_t* c, std::size_t ldc, std::size_t m,
                                         std::size_t n, float beta) {
  const std::size_t total = m * n;
  for (std::size_t index = first_index(); index < total; index += grid_stride()) {
    const std::size_t row = index / n;
    const std::size_t column = index - row * n;
    std::uint16_t& element = c[row * ldc + column];
    element = beta == 0.0f ? narrow(0.0f) : narrow(beta * widen(element));
  }
}

} // namespace

// --- rules -----------------------------------------------------------------------------------

void test_update(int device, weight_and_grad w, std::size_t n, float rescale_grad) {
  if (!start_update(device, "test_update", w, n))
    return;
  run_update(device, "test_update", w, n, test_rule{rescale_grad});
}

void sgd_update(int device, weight_and_grad w, float* mom, std::size_t n, float lr, float momentum,
                float wd, gradient_settings settings) {
  if (!start_update(device, "sgd_update", w, n))
    return;
  if (momentum == 0.0f) {
    // As cpu::sgd_update (MXNet's SGDKernel): the decay folded into the weight's factor.
    const float decay = 1.0f - lr * wd;
    run_update(device, "sgd_update", w, n, sgd_rule{decay, lr, to_clip(settings)});
    return;
  }
  require(mom, device, "sgd_update", "mom");
  run_update(device, "sgd_update", w, n,
             sgd_momentum_rule{mom, lr, momentum, wd, to_clip(settings)});
}

void nag_update(int device, weight_and_grad w, float* mom, std::size_t n, float lr, float momentum,
                float wd, gradient_settings settings) {
  if (!start_update(device, "nag_update", w, n))
    return;
  require(mom, device, "nag_update", "mom");
  run_update(device, "nag_update", w, n, nag_rule{mom, lr, momentum, wd, to_clip(settings)});
}

void adam_update(int device, weight_and_grad w, float* mean, float* var, std::size_t n, float lr,
                 float beta1, float beta2, float epsilon, float wd, gradient_settings settings) {
  if (!start_update(device, "adam_update", w, n))
    return;
  require(mean, device, "adam_update", "mean");
  require(var, device, "adam_update", "var");
  run_update(device, "adam_update", w, n,
             adam_rule{mean, var, lr, beta1, beta2, epsilon, wd, to_clip(settings)});
}

void rmsprop_update(int device, weight_and_grad w, float* mean_square, std::size_t n, float lr,
                    float gamma1, float epsilon, float wd, float clip_weights,
                    gradient_settings settings) {
  if (!start_update(device, "rmsprop_update", w, n))
    return;
  require(mean_square, device, "rmsprop_update", "mean_square");
  run_update(device, "rmsprop_update", w, n,
             rmsprop_rule{mean_square, lr, gamma1, epsilon, wd, clip_weights, to_clip(settings)});
}

void rmsprop_centered_update(int device, weight_and_grad w, float* mean_square, float* mean_grad,
                             float* delta, std::size_t n, float lr, float gamma1, float gamma2,
                             float epsilon, float wd, float clip_weights,
                             gradient_settings settings) {
  if (!start_update(device, "rmsprop_centered_update", w, n))
    return;
  require(mean_square, device, "rmsprop_centered_update", "mean_square");
  require(mean_grad, device, "rmsprop_centered_update", "mean_grad");
  require(delta, device, "rmsprop_centered_update", "delta");
  run_update(device, "rmsprop_centered_update", w, n,
             rmsprop_centered_rule{mean_square, mean_grad, delta, lr, gamma1, gamma2, epsilon, wd,
                                   clip_weights, to_clip(settings)});
}

void adagrad_update(int device, weight_and_grad w, float* history, std::size_t n, float lr,
                    float epsilon, float wd, gradient_settings settings) {
  if (!start_update(device, "adagrad_update", w, n))
    return;
  require(history, device, "adagrad_update", "history");
  run_update(device, "adagrad_update", w, n,
             adagrad_rule{history, lr, epsilon, wd, to_clip(settings)});
}

// --- float16 sum and GEMM --------------------------------------------------------------------

void sum_n_half(int device, const std::uint16_t* const* inputs, std::size_t count,
                std::uint16_t* out, std::size_t n) {
  activate(device, "sum_n_half");
  if (n == 0)
    return;
  const cudaStream_t work = current_stream(device);
  const std::size_t bytes = n * sizeof(std::uint16_t);
  if (count == 0) {
    TROUPE_CUDA_CHECK(device, cudaMemsetAsync(out, 0, bytes, work)); // +0 is all zero bits
  } else if (count == 1) {
    // widening and rounding back is the identity on every non-NaN half
    if (out != inputs[0])
      TROUPE_CUDA_CHECK(device,
                        cudaMemcpyAsync(out, inputs[0], bytes, cudaMemcpyDeviceToDevice, work));
  } else {
    // More inputs than one launch takes: the groups carry the float32 sum in a scratch buffer,
    // so that the result is still rounded only once. Only the first group reads inputs[0],
    // which out may alias, and only the last one writes out.
    stream_scratch partial{device, work,
                           count > half_inputs_per_launch ? n * sizeof(float) : std::size_t{0}};
    for (std::size_t begin = 0; begin < count; begin += half_inputs_per_launch) {
      half_input_group group{};
      const std::size_t group_count = std::min(half_inputs_per_launch, count - begin);
      group.count = static_cast<unsigned>(group_count);
      std::copy(inputs + begin, inputs + begin + group_count, group.inputs);
      const bool first = begin == 0;
      const bool last = begin + group_count == count;
      const float* partial_in = first ? nullptr : partial.get();
      float* partial_out = last ? nullptr : partial.get();
      launch(device, work, n, &sum_half_group_kernel, group, partial_in, partial_out, out, n);
    }
    if (partial.get() != nullptr)
      partial.free();
  }
  finish(device);
}

void gemm_half(int device, bool transpose_a, bool transpose_b, std::size_t m, std::size_t n,
               std::size_t k, float alpha, const std::uint16_t* a, std::size_t lda,
               const std::uint16_t* b, std::size_t ldb, float beta, std::uint16_t* c,
               std::size_t ldc) {
  activate(device, "gemm_half");
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    // A and B are empty: C = beta * C, as cpu::gemm does it, without asking cuBLAS.
    if (ldc < n)
      invalid_argument("gemm_half", device,
                       "ldc = " + std::to_string(ldc) + " is less than n = " + std::to_string(n));
    launch(device, current_stream(device), m * n, &scale_half_matrix_kernel, c, ldc, m, n, beta);
    finish(device);
    return;
  }
  // As cuda::gemm: cuBLAS is column-major, so compute Cᵀ (n×m) = op(B)ᵀ · op(A)ᵀ by swapping the
  // operands and m/n and keeping each transpose flag.
  const int ld_a = to_int(std::max<std::size_t>(lda, 1), device, "gemm_half", "lda");
  const int ld_b = to_int(std::max<std::size_t>(ldb, 1), device, "gemm_half", "ldb");
  const int ld_c = to_int(ldc, device, "gemm_half", "ldc");
  const int rows = to_int(n, device, "gemm_half", "n");
  const int columns = to_int(m, device, "gemm_half", "m");
  const int inner = to_int(k, device, "gemm_half", "k");
  TROUPE_CUDA_CHECK(device,
                    cublasGemmEx(current_blas(device), transpose_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                 transpose_a ? CUBLAS_OP_T : CUBLAS_OP_N, rows, columns, inner,
                                 &alpha, b, CUDA_R_16F, ld_b, a, CUDA_R_16F, ld_a, &beta, c,
                                 CUDA_R_16F, ld_c, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  finish(device);
}

} // namespace troupe::kernels::cuda
