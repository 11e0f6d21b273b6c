#include "kernels/cpu/optimizer_rules.hpp"

#include <cmath>

// Each rule is built twice, for AVX2 and for baseline x86-64, and the loader binds the one this CPU
// runs (GCC's target_clones, an ifunc). The rules that divide and take square roots (Adam, both
// RMSProps, AdaGrad) are bound by those units at the baseline's 4 lanes, not by memory: 8 lanes
// take Adam from about 0.5x to about 0.9x the bandwidth of `a += b` (bench/cpu_kernel_bench). The
// bits are the same in both: each element's arithmetic is unchanged, and no multiply-add is fused
// (kernels/CMakeLists.txt builds with -ffp-contract=off).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TROUPE_RULE_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define TROUPE_RULE_CLONES
#endif

namespace troupe::kernels::cpu {

namespace {

/// mshadow_op::clip: bound to [-bound, bound]; a NaN passes through unchanged, as in MXNet.
inline float clip(float x, float bound) noexcept {
  if (x > bound)
    return bound;
  if (x < -bound)
    return -bound;
  return x;
}

/// The rescaled and (when enabled) clipped gradient that every rule starts from.
inline float prepared(float raw, gradient_settings s) noexcept {
  const float g = s.rescale_grad * raw;
  return s.clip_gradient >= 0.0f ? clip(g, s.clip_gradient) : g;
}

/// Adam and both RMSProps add weight decay before clipping (MXNet's kernels clip
/// rescale_grad * grad + wd * weight), unlike SGD, NAG and AdaGrad.
inline float prepared_with_decay(float raw, float weight, float wd, gradient_settings s) noexcept {
  const float g = s.rescale_grad * raw + wd * weight;
  return s.clip_gradient >= 0.0f ? clip(g, s.clip_gradient) : g;
}

inline float clip_weight(float w, float clip_weights) noexcept {
  return clip_weights >= 0.0f ? clip(w, clip_weights) : w;
}

} // namespace

TROUPE_RULE_CLONES void test_update(float* weight, const float* grad, std::size_t n,
                                    float rescale_grad) noexcept {
  for (std::size_t i = 0; i < n; ++i)
    weight[i] += rescale_grad * grad[i];
}

TROUPE_RULE_CLONES void sgd_update(float* weight, const float* grad, float* mom, std::size_t n,
                                   float lr, float momentum, float wd,
                                   gradient_settings settings) noexcept {
  if (momentum == 0.0f) {
    // MXNet's SGDKernel folds the decay into the weight's factor.
    const float decay = 1.0f - lr * wd;
    for (std::size_t i = 0; i < n; ++i)
      weight[i] = decay * weight[i] - lr * prepared(grad[i], settings);
    return;
  }
  for (std::size_t i = 0; i < n; ++i) {
    mom[i] = momentum * mom[i] - lr * wd * weight[i] - lr * prepared(grad[i], settings);
    weight[i] += mom[i];
  }
}

TROUPE_RULE_CLONES void nag_update(float* weight, const float* grad, float* mom, std::size_t n,
                                   float lr, float momentum, float wd,
                                   gradient_settings settings) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const float g = prepared(grad[i], settings) + wd * weight[i];
    mom[i] = momentum * mom[i] + g;
    weight[i] -= lr * (g + momentum * mom[i]);
  }
}

TROUPE_RULE_CLONES void adam_update(float* weight, const float* grad, float* mean, float* var,
                                    std::size_t n, float lr, float beta1, float beta2,
                                    float epsilon, float wd, gradient_settings settings) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const float g = prepared_with_decay(grad[i], weight[i], wd, settings);
    mean[i] = beta1 * mean[i] + (1.0f - beta1) * g;
    var[i] = beta2 * var[i] + (1.0f - beta2) * g * g;
    weight[i] -= lr * mean[i] / (std::sqrt(var[i]) + epsilon);
  }
}

TROUPE_RULE_CLONES void rmsprop_update(float* weight, const float* grad, float* mean_square,
                                       std::size_t n, float lr, float gamma1, float epsilon,
                                       float wd, float clip_weights,
                                       gradient_settings settings) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const float g = prepared_with_decay(grad[i], weight[i], wd, settings);
    mean_square[i] = (1.0f - gamma1) * g * g + gamma1 * mean_square[i];
    weight[i] =
        clip_weight(weight[i] - lr * (g / std::sqrt(mean_square[i] + epsilon)), clip_weights);
  }
}

TROUPE_RULE_CLONES void rmsprop_centered_update(float* weight, const float* grad,
                                                float* mean_square, float* mean_grad, float* delta,
                                                std::size_t n, float lr, float gamma1, float gamma2,
                                                float epsilon, float wd, float clip_weights,
                                                gradient_settings settings) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const float g = prepared_with_decay(grad[i], weight[i], wd, settings);
    mean_square[i] = (1.0f - gamma1) * g * g + gamma1 * mean_square[i];
    mean_grad[i] = (1.0f - gamma1) * g + gamma1 * mean_grad[i];
    delta[i] = gamma2 * delta[i] -
               lr * (g / std::sqrt(mean_square[i] - mean_grad[i] * mean_grad[i] + epsilon));
    weight[i] = clip_weight(weight[i] + delta[i], clip_weights);
  }
}

TROUPE_RULE_CLONES void adagrad_update(float* weight, const float* grad, float* history,
                                       std::size_t n, float lr, float epsilon, float wd,
                                       gradient_settings settings) noexcept {
  for (std::size_t i = 0; i < n; ++i) {
    const float g = prepared(grad[i], settings);
    history[i] += g * g;
    weight[i] += (g / std::sqrt(history[i] + epsilon) + weight[i] * wd) * -lr;
  }
}

} // namespace troupe::kernels::cpu
