#pragma once
// Element-wise arithmetic on device pointers for the engine's element-wise operators
// (engine/ops/elementwise_ops.cpp): broadcasting of a one-element side, the scalar forms, their
// gradients, and the sum of all elements. Same contracts as those operators' CPU loops; sums are
// accumulated in double, as on the CPU. Calls are complete when they return (device.hpp).

#include <cstddef>
#include <cstdint>

namespace troupe::kernels::cuda {

enum class binary_kind : std::uint8_t { add, sub, mul, div };

/// out[k] = a[lhs_one ? 0 : k] (op) b[rhs_one ? 0 : k] for k < n; out may equal a or b.
void binary(int device, binary_kind kind, const float* a, bool lhs_one, const float* b,
            bool rhs_one, float* out, std::size_t n);
/// y[k] = x[k] + scalar; y may equal x.
void add_scalar(int device, const float* x, float scalar, float* y, std::size_t n);

/// The gradient g(k) that a backward pass stores; dy[k], u[k] and v[k] stand for element 0 of
/// their array when its `_one` flag says so.
enum class gradient_formula : std::uint8_t {
  copy,         ///< dy[k]
  scaled,       ///< scalar · dy[k]
  times_u,      ///< dy[k] · u[k]
  over_u,       ///< dy[k] / u[k]
  quotient_rhs, ///< -dy[k] · u[k] / (v[k] · v[k])   (the right side of a division)
  square,       ///< 2 · u[k] · dy[k]
};

struct gradient_terms {
  gradient_formula formula = gradient_formula::copy;
  const float* dy = nullptr;
  bool dy_one = false; ///< dy[k] stands for dy[0] (the gradient of a reduction to one element)
  const float* u = nullptr;
  bool u_one = false;
  const float* v = nullptr;
  bool v_one = false;
  float scalar = 1.0f;
};

/// dx[k] (=|+=) g(k) for k < n; or, with reduce_to_one (a broadcast input), dx[0] (=|+=) Σ g(k)
/// accumulated in double. dx may equal dy.
void store_gradient(int device, const gradient_terms& terms, std::size_t n, float* dx,
                    bool accumulate, bool reduce_to_one);

/// out[0] = factor · Σ x[k], accumulated in double (n == 0 gives 0 · factor).
void sum(int device, const float* x, std::size_t n, double factor, float* out);

} // namespace troupe::kernels::cuda
