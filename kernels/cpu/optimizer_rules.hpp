#pragma once
// Optimizer update rules as pure functions on float32 buffers, with MXNet 1.x's exact formulas
// (src/operator/optimizer_op-inl.h, python/mxnet/optimizer/optimizer.py). Every rule first forms
//   g = clip(rescale_grad * grad, clip_gradient)        (no clipping when clip_gradient < 0)
// and updates `weight` and its state buffers in place. `n` is the element count of every buffer.
// Exception, as in MXNet's kernels: Adam and both RMSProps add the weight decay before clipping,
//   g = clip(rescale_grad * grad + wd * weight, clip_gradient)
// so their "g += wd * weight" below happens inside the clip; SGD, NAG and AdaGrad clip first.

#include <cstddef>

namespace troupe::kernels::cpu {

/// Settings shared by all rules.
struct gradient_settings {
  float rescale_grad = 1.0f;   ///< factor applied to the raw gradient first
  float clip_gradient = -1.0f; ///< clip the rescaled gradient to [-c, c]; < 0 disables
};

/// MXNet 1.x `test` optimizer: weight += rescale_grad * grad (no clipping, no state).
void test_update(float* weight, const float* grad, std::size_t n, float rescale_grad) noexcept;

/// SGD, MXNet's sgd_update / sgd_mom_update:
///   momentum == 0: weight = weight - lr * (g + wd * weight)  (mom is neither read nor written
///                  and may be null)
///   otherwise:     mom = momentum * mom - lr * (g + wd * weight); weight += mom
void sgd_update(float* weight, const float* grad, float* mom, std::size_t n, float lr,
                float momentum, float wd, gradient_settings settings) noexcept;

/// Nesterov momentum, MXNet's nag_mom_update:
///   g += wd * weight; mom = momentum * mom + g; weight -= lr * (g + momentum * mom)
void nag_update(float* weight, const float* grad, float* mom, std::size_t n, float lr,
                float momentum, float wd, gradient_settings settings) noexcept;

/// Adam, MXNet's adam_update. `lr` is the caller's bias-corrected rate
/// lr * sqrt(1 - beta2^t) / (1 - beta1^t), as MXNet's Python optimizer passes it:
///   g += wd * weight; mean = beta1 * mean + (1 - beta1) * g; var = beta2 * var + (1 - beta2) * g²
///   weight -= lr * mean / (sqrt(var) + epsilon)
void adam_update(float* weight, const float* grad, float* mean, float* var, std::size_t n, float lr,
                 float beta1, float beta2, float epsilon, float wd,
                 gradient_settings settings) noexcept;

/// RMSProp (Tieleman & Hinton), MXNet's rmsprop_update:
///   g += wd * weight; n = (1 - gamma1) * g² + gamma1 * n; weight -= lr * g / sqrt(n + epsilon)
/// then, when clip_weights >= 0, weight is clipped to [-clip_weights, clip_weights].
void rmsprop_update(float* weight, const float* grad, float* mean_square, std::size_t n, float lr,
                    float gamma1, float epsilon, float wd, float clip_weights,
                    gradient_settings settings) noexcept;

/// Centered RMSProp (Graves 2013), MXNet's rmspropalex_update:
///   g += wd * weight; n = (1 - gamma1) * g² + gamma1 * n; gm = (1 - gamma1) * g + gamma1 * gm
///   delta = gamma2 * delta - lr * g / sqrt(n - gm² + epsilon); weight += delta (then clip_weights)
void rmsprop_centered_update(float* weight, const float* grad, float* mean_square, float* mean_grad,
                             float* delta, std::size_t n, float lr, float gamma1, float gamma2,
                             float epsilon, float wd, float clip_weights,
                             gradient_settings settings) noexcept;

/// AdaGrad, MXNet 1.x's AdaGrad optimizer:
///   history += g²; weight -= lr * (g / sqrt(history + epsilon) + wd * weight)
void adagrad_update(float* weight, const float* grad, float* history, std::size_t n, float lr,
                    float epsilon, float wd, gradient_settings settings) noexcept;

} // namespace troupe::kernels::cpu
