// CUDA build of kernels/cuda/elementwise.hpp.

#include "kernels/cuda/elementwise.hpp"
#include "kernels/cuda/launch.cuh"

namespace troupe::kernels::cuda {

using namespace detail;

namespace {

__global__ void binary_kernel(binary_kind kind, const float* a, std::size_t a_step, const float* b,
                              std::size_t b_step, float* out, std::size_t n) {
  for (std::size_t k = first_index(); k < n; k += grid_stride()) {
    const float x = a[k * a_step];
    const float y = b[k * b_step];
    float r;
    switch (kind) {
    case binary_kind::add:
      r = x + y;
      break;
    case binary_kind::sub:
      r = x - y;
      break;
    case binary_kind::mul:
      r = x * y;
      break;
    default:
      r = x / y;
      break;
    }
    out[k] = r;
  }
}

__global__ void add_scalar_kernel(const float* x, float scalar, float* y, std::size_t n) {
  for (std::size_t k = first_index(); k < n; k += grid_stride())
    y[k] = x[k] + scalar;
}

__device__ float gradient_at(const gradient_terms& t, std::size_t k) {
  const float dy = t.dy[t.dy_one ? 0 : k];
  switch (t.formula) {
  case gradient_formula::copy:
    return dy;
  case gradient_formula::scaled:
    return dy * t.scalar;
  case gradient_formula::times_u:
    return dy * t.u[t.u_one ? 0 : k];
  case gradient_formula::over_u:
    return dy / t.u[t.u_one ? 0 : k];
  case gradient_formula::quotient_rhs: {
    const float v = t.v[t.v_one ? 0 : k];
    return -dy * t.u[t.u_one ? 0 : k] / (v * v);
  }
  default:
    return 2.0f * t.u[k] * dy;
  }
}

__global__ void store_gradient_kernel(gradient_terms terms, std::size_t n, float* dx,
                                      bool accumulate) {
  for (std::size_t k = first_index(); k < n; k += grid_stride()) {
    const float g = gradient_at(terms, k);
    dx[k] = accumulate ? dx[k] + g : g;
  }
}

/// One block of block_threads sums g(k) (or x[k]) in double; thread 0 stores the result.
/// One block is enough here (the broadcast gradients and loss sums it serves are small), and it
/// makes the order of the additions fixed, so the result is deterministic.
template <class Term>
__device__ double block_sum(std::size_t n, Term term) {
  __shared__ double partial[block_threads];
  double own = 0.0;
  for (std::size_t k = threadIdx.x; k < n; k += blockDim.x)
    own += static_cast<double>(term(k));
  partial[threadIdx.x] = own;
  __syncthreads();
  for (unsigned half = blockDim.x / 2; half > 0; half /= 2) {
    if (threadIdx.x < half)
      partial[threadIdx.x] += partial[threadIdx.x + half];
    __syncthreads();
  }
  return partial[0];
}

__global__ void reduce_gradient_kernel(gradient_terms terms, std::size_t n, float* dx,
                                       bool accumulate) {
  const double total = block_sum(n, [&](std::size_t k) { return gradient_at(terms, k); });
  if (threadIdx.x == 0) {
    const auto value = static_cast<float>(total);
    dx[0] = accumulate ? dx[0] + value : value;
  }
}

__global__ void sum_kernel(const float* x, std::size_t n, double factor, float* out) {
  const double total = block_sum(n, [&](std::size_t k) { return x[k]; });
  if (threadIdx.x == 0)
    out[0] = static_cast<float>(total * factor);
}

} // namespace

void binary(int device, binary_kind kind, const float* a, bool lhs_one, const float* b,
            bool rhs_one, float* out, std::size_t n) {
  activate(device, "binary");
  if (n == 0)
    return;
  launch(device, current_stream(device), n, &binary_kernel, kind, a, std::size_t{lhs_one ? 0u : 1u},
         b, std::size_t{rhs_one ? 0u : 1u}, out, n);
  finish(device);
}

void add_scalar(int device, const float* x, float scalar, float* y, std::size_t n) {
  activate(device, "add_scalar");
  if (n == 0)
    return;
  launch(device, current_stream(device), n, &add_scalar_kernel, x, scalar, y, n);
  finish(device);
}

void store_gradient(int device, const gradient_terms& terms, std::size_t n, float* dx,
                    bool accumulate, bool reduce_to_one) {
  activate(device, "store_gradient");
  if (reduce_to_one) {
    // An empty broadcast still stores its zero sum, as the CPU loop does.
    reduce_gradient_kernel<<<1, block_threads, 0, current_stream(device)>>>(terms, n, dx,
                                                                            accumulate);
    TROUPE_CUDA_CHECK(device, cudaGetLastError());
  } else {
    if (terms.formula == gradient_formula::copy && !terms.dy_one && !accumulate && terms.dy == dx)
      return;
    launch(device, current_stream(device), n, &store_gradient_kernel, terms, n, dx, accumulate);
  }
  finish(device);
}

void sum(int device, const float* x, std::size_t n, double factor, float* out) {
  activate(device, "sum");
  sum_kernel<<<1, block_threads, 0, current_stream(device)>>>(x, n, factor, out);
  TROUPE_CUDA_CHECK(device, cudaGetLastError());
  finish(device);
}

} // namespace troupe::kernels::cuda
