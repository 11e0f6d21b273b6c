#pragma once
// The GPU side of kernels/cpu/optimizer_rules.hpp, plus the float16 reductions and GEMM that
// mixed-precision training needs. Same formulas, same operation order and same arguments as the
// CPU rules, with a leading `device`; every pointer is device memory on `device` (except
// sum_n_half's host array of device pointers). Like every kernels/cuda call, a call runs on this
// thread's stream for the device (device.hpp, stream_scope) and is complete when it returns.
// Failures throw std::runtime_error naming the function and the device. One header, two
// implementations: optimizer.cu (CUDA build) and optimizer_none.cpp (CPU-only build: every call
// throws).
//
// Weights and gradients are float32 or float16 (IEEE binary16 as raw bits), both of the same type
// (weight_and_grad::type); state buffers (momentum, Adam's mean and var, ...) are always float32:
//   float32:                  exactly the CPU rule (up to FMA contraction: a few ulps).
//   float16, master == null:  weight and grad are widened to float, the rule runs in float32, and
//                             the new weight is rounded back to float16 (to nearest even), as
//                             troupe's CPU path does for a float16 weight.
//   float16, master != null:  MXNet's multi_precision (mp_sgd_update, mp_sgd_mom_update,
//                             mp_nag_mom_update; for the other rules, what MXNet's Python optimizer
//                             does with its float32 copy): the grad is widened, the rule updates
//                             the float32 `master` copy, and weight = float16(master). The float16
//                             weight is only written, never read.
// A float32 weight with a master copy is an error (std::runtime_error).

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/optimizer_rules.hpp"

namespace troupe::kernels::cuda {

/// The settings every rule starts from (rescale_grad, clip_gradient), shared with the CPU rules.
using gradient_settings = kernels::cpu::gradient_settings;

/// Element type of a weight and its gradient.
enum class element_type : std::uint8_t { float32, float16 };

/// A weight buffer and its gradient, both of `type` (float16: std::uint16_t bits), and for a
/// float16 weight optionally its float32 master copy (multi-precision).
struct weight_and_grad {
  void* weight;
  const void* grad;
  element_type type;
  float* master = nullptr;
};

/// MXNet 1.x `test` optimizer: weight += rescale_grad * grad.
void test_update(int device, weight_and_grad w, std::size_t n, float rescale_grad);

/// SGD (sgd_update / sgd_mom_update; mp_ variants with a master copy). With momentum == 0, `mom`
/// is neither read nor written and may be null.
void sgd_update(int device, weight_and_grad w, float* mom, std::size_t n, float lr, float momentum,
                float wd, gradient_settings settings);

/// Nesterov momentum (nag_mom_update, mp_nag_mom_update).
void nag_update(int device, weight_and_grad w, float* mom, std::size_t n, float lr, float momentum,
                float wd, gradient_settings settings);

/// Adam (adam_update); `lr` is the caller's bias-corrected rate, as for cpu::adam_update.
void adam_update(int device, weight_and_grad w, float* mean, float* var, std::size_t n, float lr,
                 float beta1, float beta2, float epsilon, float wd, gradient_settings settings);

/// RMSProp (rmsprop_update); clip_weights < 0 disables the weight clip.
void rmsprop_update(int device, weight_and_grad w, float* mean_square, std::size_t n, float lr,
                    float gamma1, float epsilon, float wd, float clip_weights,
                    gradient_settings settings);

/// Centered RMSProp (rmspropalex_update).
void rmsprop_centered_update(int device, weight_and_grad w, float* mean_square, float* mean_grad,
                             float* delta, std::size_t n, float lr, float gamma1, float gamma2,
                             float epsilon, float wd, float clip_weights,
                             gradient_settings settings);

/// AdaGrad (MXNet 1.x's AdaGrad optimizer).
void adagrad_update(int device, weight_and_grad w, float* history, std::size_t n, float lr,
                    float epsilon, float wd, gradient_settings settings);

/// out[i] = Σ inputs[k][i] over float16 buffers, accumulated in float32 strictly left to right
/// and rounded once (to nearest even): bit-identical to cpu::sum_n_half for every non-NaN input.
/// `inputs` is a host array of `count` device pointers, all on `device`; `out` may alias
/// inputs[0]. count == 0 writes zeros.
void sum_n_half(int device, const std::uint16_t* const* inputs, std::size_t count,
                std::uint16_t* out, std::size_t n);

/// Row-major float16 GEMM through cuBLAS (cublasGemmEx, float16 A, B and C, float32 accumulation
/// and float32 alpha/beta), same contract as cuda::gemm: C = alpha · op(A) · op(B) + beta · C.
void gemm_half(int device, bool transpose_a, bool transpose_b, std::size_t m, std::size_t n,
               std::size_t k, float alpha, const std::uint16_t* a, std::size_t lda,
               const std::uint16_t* b, std::size_t ldb, float beta, std::uint16_t* c,
               std::size_t ldc);

} // namespace troupe::kernels::cuda
