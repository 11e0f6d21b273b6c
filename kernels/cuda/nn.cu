// CUDA build of kernels/cuda/nn.hpp: the layers of kernels/cpu/nn.cpp as CUDA kernels, GEMMs
// through cuBLAS. Every call follows the pattern of kernels/cuda/launch.cuh: activate the device,
// return early when there is nothing to do, queue every kernel, copy and GEMM on
// current_stream(device), check each of them, and finish(device) so that the call is complete
// when it returns.
//
// Reductions never use atomics, so every result is deterministic: a sum is done by one thread in
// a fixed order, or by a block or warp in a fixed tree. Backward passes that the CPU writes as
// scatters (col2im, pooling) gather instead: one thread per input element adds up the outputs
// that read it, in the order the CPU adds them, so that no two threads write one element.

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <math_constants.h>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include "kernels/cpu/nn.hpp"
#include "kernels/cuda/launch.cuh"
#include "kernels/cuda/nn.hpp"

namespace troupe::kernels::cuda {

namespace {

using cpu::activation_kind;
using cpu::image_shape;
using cpu::pool_kind;
using cpu::window_2d;
using cpu::write_mode;
using detail::block_threads;
using detail::first_index;
using detail::grid_for;
using detail::grid_stride;
using detail::launch;

constexpr unsigned warp_size = 32;
constexpr unsigned full_warp = 0xffffffffu;

bool accumulating(write_mode mode) {
  return mode == write_mode::accumulate;
}

float beta_for(write_mode mode) {
  return accumulating(mode) ? 1.0f : 0.0f;
}

// --- scratch memory --------------------------------------------------------------------------
//
// im2col needs a k × plane buffer per image (two in a backward pass). It comes from a device
// buffer per device per thread that only grows, so a steady shape never allocates, like the CPU's
// per-thread scratch. Not cudaMallocAsync per call: every call here ends by synchronising, and
// the default memory pool (release threshold 0) hands its memory back to the driver at every
// synchronisation, so each convolution would map and unmap its scratch again; raising the
// threshold is a process-wide setting of the device layer, not of one kernel. Per thread is safe
// because each call is complete when it returns, so no two calls ever use one buffer at once,
// whatever streams they run on; and growing frees the old buffer with cudaFree, which waits for
// the device, so nothing still reads it.

struct scratch_buffers {
  struct entry {
    void* data = nullptr;
    std::size_t bytes = 0;
  };
  std::vector<entry> by_device;

  scratch_buffers() = default;
  scratch_buffers(const scratch_buffers&) = delete;
  scratch_buffers& operator=(const scratch_buffers&) = delete;

  /// At thread exit. Errors are ignored: at process exit the runtime may be gone already, and a
  /// destructor must not throw.
  ~scratch_buffers() {
    int current = 0;
    const bool restore = cudaGetDevice(&current) == cudaSuccess;
    for (std::size_t d = 0; d < by_device.size(); ++d)
      if (by_device[d].data != nullptr &&
          cudaSetDevice(detail::physical_device(static_cast<int>(d))) == cudaSuccess)
        cudaFree(by_device[d].data);
    if (restore)
      cudaSetDevice(current);
    cudaGetLastError();
  }
};

/// At least `floats` floats of device memory on `device` (current), owned by this thread; valid
/// until this thread's next call of scratch() for the device. nullptr when floats == 0.
float* scratch(int device, std::size_t floats) {
  if (floats == 0)
    return nullptr;
  thread_local scratch_buffers buffers;
  const auto index = static_cast<std::size_t>(device);
  if (buffers.by_device.size() <= index)
    buffers.by_device.resize(index + 1);
  scratch_buffers::entry& entry = buffers.by_device[index];
  const std::size_t bytes = floats * sizeof(float);
  if (entry.bytes < bytes) {
    if (entry.data != nullptr) {
      void* old = entry.data;
      entry = {};
      TROUPE_CUDA_CHECK(device, cudaFree(old));
    }
    void* fresh = nullptr;
    TROUPE_CUDA_CHECK(device, cudaMalloc(&fresh, bytes));
    entry = {fresh, bytes};
  }
  return static_cast<float*>(entry.data);
}

// --- GEMM ------------------------------------------------------------------------------------

/// Row-major C[m×n] = op(A)·op(B) + beta·C on the calling thread's stream (device.cu's GEMM).
void row_major_gemm(int device, const char* function, bool transpose_a, bool transpose_b,
                    std::size_t m, std::size_t n, std::size_t k, const float* a, std::size_t lda,
                    const float* b, std::size_t ldb, float beta, float* c, std::size_t ldc) {
  detail::row_major_sgemm(device, function, transpose_a, transpose_b, m, n, k, 1.0f, a, lda, b, ldb,
                          beta, c, ldc);
}

// --- reductions ------------------------------------------------------------------------------

__device__ float warp_sum(float v) {
  for (unsigned offset = warp_size / 2; offset > 0; offset /= 2)
    v += __shfl_xor_sync(full_warp, v, offset);
  return v; // the same in every lane: each step adds the same two values in every pair
}

__device__ float warp_max(float v) {
  for (unsigned offset = warp_size / 2; offset > 0; offset /= 2) {
    const float other = __shfl_xor_sync(full_warp, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

/// Σ v over a block of block_threads threads, in a fixed tree; the result is valid in thread 0.
/// Every thread of the block must call it (it synchronises the block).
__device__ float block_sum(float v) {
  __shared__ float partial[block_threads / warp_size];
  const unsigned lane = threadIdx.x % warp_size, warp = threadIdx.x / warp_size;
  v = warp_sum(v);
  if (lane == 0)
    partial[warp] = v;
  __syncthreads();
  float total = 0.0f;
  if (warp == 0)
    total = warp_sum(lane < block_threads / warp_size ? partial[lane] : 0.0f);
  __syncthreads(); // partial is free again for the next call
  return total;
}

// --- element-wise kernels --------------------------------------------------------------------

template <activation_kind Kind>
__device__ float activation_of(float x) {
  if constexpr (Kind == activation_kind::relu) {
    return x > 0.0f ? x : 0.0f;
  } else if constexpr (Kind == activation_kind::sigmoid) {
    return 1.0f / (1.0f + expf(-x));
  } else if constexpr (Kind == activation_kind::tanh) {
    return tanhf(x);
  } else {
    // log(1 + e^x) = max(x, 0) + log(1 + e^-|x|): no overflow for large x, no loss for small
    return (x < 0.0f ? 0.0f : x) + log1pf(expf(-fabsf(x)));
  }
}

/// f'(x) · dy from the forward output y (relu: y > 0; sigmoid: y(1-y); tanh: 1-y²; softrelu:
/// 1-exp(-y), as -expm1(-y) to keep tiny y exact).
template <activation_kind Kind>
__device__ float activation_gradient(float y, float dy) {
  if constexpr (Kind == activation_kind::relu) {
    return y > 0.0f ? dy : 0.0f;
  } else if constexpr (Kind == activation_kind::sigmoid) {
    return dy * (y * (1.0f - y));
  } else if constexpr (Kind == activation_kind::tanh) {
    return dy * (1.0f - y * y);
  } else {
    return dy * -expm1f(-y);
  }
}

template <activation_kind Kind>
__global__ void activation_forward_kernel(const float* x, float* y, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    y[i] = activation_of<Kind>(x[i]);
}

template <activation_kind Kind>
__global__ void activation_backward_kernel(const float* y, const float* dy, float* dx,
                                           std::size_t n, bool accumulate) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float g = activation_gradient<Kind>(y[i], dy[i]);
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

/// y[i] = bias[(i / inner) % count]: a bias broadcast over rows (inner 1) or planes.
__global__ void broadcast_bias_kernel(const float* bias, float* y, std::size_t n, std::size_t inner,
                                      std::size_t count) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    y[i] = bias[(i / inner) % count];
}

constexpr unsigned column_tile = warp_size; ///< columns per block of column_sum_kernel
constexpr unsigned column_rows = block_threads / column_tile; ///< row lanes per block

/// sums[c] (=|+=) Σ_r m[r·cols + c] for a row-major m[rows×cols]. A block of column_tile ×
/// column_rows threads owns column_tile adjacent columns (reads are coalesced along a row); row
/// lane t adds rows t, t + column_rows, ..., then lane 0 adds the lanes' sums in order.
__global__ void column_sum_kernel(const float* m, float* sums, std::size_t rows, std::size_t cols,
                                  bool accumulate) {
  __shared__ float partial[column_rows][column_tile + 1];
  for (std::size_t tile = blockIdx.x; tile * column_tile < cols; tile += gridDim.x) {
    const std::size_t col = tile * column_tile + threadIdx.x;
    float sum = 0.0f;
    if (col < cols)
      for (std::size_t r = threadIdx.y; r < rows; r += column_rows)
        sum += m[r * cols + col];
    partial[threadIdx.y][threadIdx.x] = sum;
    __syncthreads();
    if (threadIdx.y == 0 && col < cols) {
      float total = 0.0f;
      for (unsigned t = 0; t < column_rows; ++t)
        total += partial[t][threadIdx.x];
      sums[col] = accumulate ? sums[col] + total : total;
    }
    __syncthreads(); // partial is rewritten by the next tile
  }
}

/// sums[f] (=|+=) Σ_n Σ_j dy[(n·filters + f)·plane + j]: one block per filter (grid-stride).
__global__ void filter_sum_kernel(const float* dy, float* sums, std::size_t batch,
                                  std::size_t filters, std::size_t plane, bool accumulate) {
  const std::size_t count = batch * plane;
  for (std::size_t f = blockIdx.x; f < filters; f += gridDim.x) {
    float sum = 0.0f;
    for (std::size_t t = threadIdx.x; t < count; t += blockDim.x) {
      const std::size_t n = t / plane;
      sum += dy[(n * filters + f) * plane + (t - n * plane)];
    }
    const float total = block_sum(sum);
    if (threadIdx.x == 0)
      sums[f] = accumulate ? sums[f] + total : total;
  }
}

// --- convolution -----------------------------------------------------------------------------

/// Geometry of one image of a convolution or pooling call (for pooling, one plane: channels is
/// unused).
struct geometry {
  std::size_t channels, height, width;
  std::size_t kernel_h, kernel_w, stride_h, stride_w, pad_h, pad_w;
  std::size_t out_h, out_w;
};

geometry geometry_of(const image_shape& in, const window_2d& w) {
  return {in.channels,
          in.height,
          in.width,
          w.kernel_h,
          w.kernel_w,
          w.stride_h,
          w.stride_w,
          w.pad_h,
          w.pad_w,
          cpu::window_output_extent(in.height, w.kernel_h, w.stride_h, w.pad_h),
          cpu::window_output_extent(in.width, w.kernel_w, w.stride_w, w.pad_w)};
}

/// A 1×1 kernel with unit stride and no padding: im2col is the identity on each image.
bool is_pointwise(const window_2d& w) {
  return w.kernel_h == 1 && w.kernel_w == 1 && w.stride_h == 1 && w.stride_w == 1 && w.pad_h == 0 &&
         w.pad_w == 0;
}

/// col[(c·kh + ki)·kw + kj][oh·OW + ow] = x[c][oh·sh + ki - ph][ow·sw + kj - pw], 0 in padding;
/// one thread per element of col (n = C·kh·kw·OH·OW), so the writes are coalesced.
__global__ void im2col_kernel(const float* x, float* col, geometry g, std::size_t n) {
  const std::size_t plane = g.out_h * g.out_w;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const std::size_t row = i / plane, j = i - row * plane;
    const std::size_t kj = row % g.kernel_w, ki = (row / g.kernel_w) % g.kernel_h;
    const std::size_t c = row / (g.kernel_w * g.kernel_h);
    const std::size_t oh = j / g.out_w, ow = j - oh * g.out_w;
    // padded coordinates; the image occupies [pad, pad + extent)
    const std::size_t ih = oh * g.stride_h + ki, iw = ow * g.stride_w + kj;
    const bool inside =
        ih >= g.pad_h && ih - g.pad_h < g.height && iw >= g.pad_w && iw - g.pad_w < g.width;
    col[i] = inside ? x[(c * g.height + ih - g.pad_h) * g.width + (iw - g.pad_w)] : 0.0f;
  }
}

/// The adjoint of im2col as a gather: dx[c][ih][iw] (=|+=) Σ of the col entries that im2col
/// copied from it, one thread per input element (n = C·H·W), taps in the CPU's order (ki, kj).
__global__ void col2im_kernel(const float* col, float* dx, geometry g, std::size_t n,
                              bool accumulate) {
  const std::size_t plane = g.out_h * g.out_w;
  const std::size_t image_plane = g.height * g.width;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const std::size_t c = i / image_plane, r = i - c * image_plane;
    const std::size_t ih = r / g.width, iw = r - ih * g.width;
    float sum = accumulate ? dx[i] : 0.0f;
    if (plane != 0) // else no output reads x (and a stride may be 0)
      for (std::size_t ki = 0; ki < g.kernel_h && ki <= ih + g.pad_h; ++ki) {
        // output row oh reads input row ih through tap ki when oh·sh + ki = ih + ph
        const std::size_t th = ih + g.pad_h - ki;
        const std::size_t oh = th / g.stride_h;
        if (oh * g.stride_h != th || oh >= g.out_h)
          continue;
        for (std::size_t kj = 0; kj < g.kernel_w && kj <= iw + g.pad_w; ++kj) {
          const std::size_t tw = iw + g.pad_w - kj;
          const std::size_t ow = tw / g.stride_w;
          if (ow * g.stride_w != tw || ow >= g.out_w)
            continue;
          sum += col[((c * g.kernel_h + ki) * g.kernel_w + kj) * plane + oh * g.out_w + ow];
        }
      }
    dx[i] = sum;
  }
}

// --- pooling ---------------------------------------------------------------------------------

__device__ std::size_t smaller(std::size_t a, std::size_t b) {
  return a < b ? a : b;
}
__device__ std::size_t larger(std::size_t a, std::size_t b) {
  return a < b ? b : a;
}

/// A half-open range [first, last) of indices; empty when first == last.
struct index_range {
  std::size_t first, last;
};

/// The input rows (or columns) [first, last) that window o covers, clipped to the input; the same
/// arithmetic as window_span in kernels/cpu/nn.cpp.
__device__ index_range window_span(std::size_t o, std::size_t kernel, std::size_t stride,
                                   std::size_t pad, std::size_t in) {
  const std::size_t start = o * stride; // in padded coordinates
  const std::size_t first = start >= pad ? start - pad : 0;
  const std::size_t end = start + kernel; // padded, exclusive
  const std::size_t last = end >= pad ? smaller(end - pad, in) : 0;
  const std::size_t clipped = smaller(first, in);
  return {clipped, larger(clipped, last)};
}

/// The windows [first, last) of extent `out` that cover input index i: o·stride <= i + pad <
/// o·stride + kernel. Needs out > 0 (so stride > 0).
__device__ index_range covering_windows(std::size_t i, std::size_t kernel, std::size_t stride,
                                        std::size_t pad, std::size_t out) {
  const std::size_t padded = i + pad;
  const std::size_t first = padded + 1 > kernel ? (padded + 1 - kernel + stride - 1) / stride : 0;
  const std::size_t last = smaller(padded / stride + 1, out);
  return {first, larger(first, last)};
}

/// One thread per output element (n = planes·OH·OW). Padding never wins a max (it starts at
/// -inf); an average multiplies the window's sum by scale = 1/(kh·kw), padding included.
template <pool_kind Kind>
__global__ void pooling_forward_kernel(const float* x, float* y, geometry g, std::size_t n,
                                       float scale) {
  const std::size_t out_plane = g.out_h * g.out_w;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const std::size_t p = i / out_plane, r = i - p * out_plane;
    const std::size_t oh = r / g.out_w, ow = r - oh * g.out_w;
    const index_range rows = window_span(oh, g.kernel_h, g.stride_h, g.pad_h, g.height);
    const index_range cols = window_span(ow, g.kernel_w, g.stride_w, g.pad_w, g.width);
    const float* xp = x + p * g.height * g.width;
    if constexpr (Kind == pool_kind::max) {
      float m = -CUDART_INF_F;
      for (std::size_t ih = rows.first; ih < rows.last; ++ih)
        for (std::size_t iw = cols.first; iw < cols.last; ++iw) {
          const float v = xp[ih * g.width + iw];
          m = v > m ? v : m;
        }
      y[i] = m;
    } else {
      float sum = 0.0f;
      for (std::size_t ih = rows.first; ih < rows.last; ++ih)
        for (std::size_t iw = cols.first; iw < cols.last; ++iw)
          sum += xp[ih * g.width + iw];
      y[i] = sum * scale;
    }
  }
}

/// One thread per input element (n = planes·H·W), gathering over the windows that cover it in
/// the CPU's order (oh, then ow), so that no two threads write one element. Max: the element
/// receives dy[o] when it is the first position of window o (row-major) whose x equals y[o].
/// Average: it receives dy[o]·scale from every window o that covers it.
template <pool_kind Kind>
__global__ void pooling_backward_kernel(const float* x, const float* y, const float* dy, float* dx,
                                        geometry g, std::size_t n, float scale, bool accumulate) {
  const std::size_t in_plane = g.height * g.width;
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const std::size_t p = i / in_plane, r = i - p * in_plane;
    const std::size_t ih = r / g.width, iw = r - ih * g.width;
    float sum = accumulate ? dx[i] : 0.0f;
    if (g.out_h != 0 && g.out_w != 0) { // else no window exists (and a stride may be 0)
      const index_range ohs = covering_windows(ih, g.kernel_h, g.stride_h, g.pad_h, g.out_h);
      const index_range ows = covering_windows(iw, g.kernel_w, g.stride_w, g.pad_w, g.out_w);
      const std::size_t o_plane = p * g.out_h;
      if constexpr (Kind == pool_kind::max) {
        const float* xp = x + p * in_plane;
        const float v = x[i];
        for (std::size_t oh = ohs.first; oh < ohs.last; ++oh) {
          const index_range rows = window_span(oh, g.kernel_h, g.stride_h, g.pad_h, g.height);
          for (std::size_t ow = ows.first; ow < ows.last; ++ow) {
            const std::size_t o = (o_plane + oh) * g.out_w + ow;
            const float m = y[o];
            if (!(v == m))
              continue;
            // is any position of the window before (ih, iw), row-major, equal to m as well?
            const index_range cols = window_span(ow, g.kernel_w, g.stride_w, g.pad_w, g.width);
            bool first = true;
            for (std::size_t sh = rows.first; sh <= ih && first; ++sh) {
              const std::size_t end = sh == ih ? iw : cols.last;
              for (std::size_t sw = cols.first; sw < end; ++sw)
                if (xp[sh * g.width + sw] == m) {
                  first = false;
                  break;
                }
            }
            if (first)
              sum += dy[o];
          }
        }
      } else {
        for (std::size_t oh = ohs.first; oh < ohs.last; ++oh)
          for (std::size_t ow = ows.first; ow < ows.last; ++ow)
            sum +=
                __fmul_rn(dy[(o_plane + oh) * g.out_w + ow], scale); // no FMA: the CPU's rounding
      }
    }
    dx[i] = sum;
  }
}

// --- softmax cross-entropy -------------------------------------------------------------------

/// One warp per row (grid-stride over rows): the row's max, then p = e^(z - max) and their sum,
/// then p /= sum; lane 0 writes loss = log(sum) - (z[label] - max). Every lane of a warp takes
/// the same rows, so the shuffles always see the full warp.
__global__ void softmax_cross_entropy_kernel(const float* logits, const float* label, float* loss,
                                             float* probabilities, std::size_t batch,
                                             std::size_t classes) {
  const unsigned lane = threadIdx.x % warp_size;
  const std::size_t warps = grid_stride() / warp_size;
  for (std::size_t row = first_index() / warp_size; row < batch; row += warps) {
    const float* z = logits + row * classes;
    float* p = probabilities + row * classes;
    float m = -CUDART_INF_F;
    for (std::size_t c = lane; c < classes; c += warp_size)
      m = z[c] > m ? z[c] : m;
    m = warp_max(m);
    float sum = 0.0f;
    for (std::size_t c = lane; c < classes; c += warp_size) {
      const float e = expf(z[c] - m);
      p[c] = e;
      sum += e;
    }
    sum = warp_sum(sum);
    const float inv = 1.0f / sum;
    for (std::size_t c = lane; c < classes; c += warp_size) // the elements this lane wrote
      p[c] *= inv;
    if (lane == 0) {
      const auto l = static_cast<std::size_t>(label[row]);
      // -log(e^(z_l - m) / sum); sum >= 1 because the max term is e^0
      loss[row] = logf(sum) - (z[l] - m);
    }
  }
}

/// dlogits[b, c] (=|+=) dloss[b]·p[b, c], then minus dloss[b] at c == label[b]: the CPU's
/// operations in the CPU's order.
__global__ void softmax_cross_entropy_backward_kernel(const float* probabilities,
                                                      const float* label, const float* dloss,
                                                      float* dlogits, std::size_t n,
                                                      std::size_t classes, bool accumulate) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const std::size_t b = i / classes, c = i - b * classes;
    const float g = dloss[b];
    const float v = __fmul_rn(g, probabilities[i]);
    float d = accumulate ? dlogits[i] + v : v;
    if (c == static_cast<std::size_t>(label[b]))
      d -= g;
    dlogits[i] = d;
  }
}

// --- dropout ---------------------------------------------------------------------------------

/// p == 0: a mask of ones and y = x exactly (y may equal x).
__global__ void dropout_keep_all_kernel(const float* x, float* y, float* mask, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    mask[i] = 1.0f;
    y[i] = x[i];
  }
}

__global__ void dropout_apply_kernel(const float* x, const float* mask, float* y, std::size_t n) {
  for (std::size_t i = first_index(); i < n; i += grid_stride())
    y[i] = x[i] * mask[i];
}

__global__ void dropout_backward_kernel(const float* mask, const float* dy, float* dx,
                                        std::size_t n, bool accumulate) {
  for (std::size_t i = first_index(); i < n; i += grid_stride()) {
    const float g = __fmul_rn(dy[i], mask[i]); // no FMA: the CPU's rounding
    dx[i] = accumulate ? dx[i] + g : g;
  }
}

using activation_forward_fn = void (*)(const float*, float*, std::size_t);
using activation_backward_fn = void (*)(const float*, const float*, float*, std::size_t, bool);

activation_forward_fn forward_kernel_for(activation_kind kind) {
  switch (kind) {
  case activation_kind::relu:
    return &activation_forward_kernel<activation_kind::relu>;
  case activation_kind::sigmoid:
    return &activation_forward_kernel<activation_kind::sigmoid>;
  case activation_kind::tanh:
    return &activation_forward_kernel<activation_kind::tanh>;
  case activation_kind::softrelu:
    break;
  }
  return &activation_forward_kernel<activation_kind::softrelu>;
}

activation_backward_fn backward_kernel_for(activation_kind kind) {
  switch (kind) {
  case activation_kind::relu:
    return &activation_backward_kernel<activation_kind::relu>;
  case activation_kind::sigmoid:
    return &activation_backward_kernel<activation_kind::sigmoid>;
  case activation_kind::tanh:
    return &activation_backward_kernel<activation_kind::tanh>;
  case activation_kind::softrelu:
    break;
  }
  return &activation_backward_kernel<activation_kind::softrelu>;
}

} // namespace

// --- activations -----------------------------------------------------------------------------

void activation_forward(int device, activation_kind kind, const float* x, float* y, std::size_t n) {
  detail::activate(device, "activation_forward");
  if (n == 0)
    return;
  launch(device, detail::current_stream(device), n, forward_kernel_for(kind), x, y, n);
  detail::finish(device);
}

void activation_backward(int device, activation_kind kind, const float* y, const float* dy,
                         float* dx, std::size_t n, write_mode mode) {
  detail::activate(device, "activation_backward");
  if (n == 0)
    return;
  launch(device, detail::current_stream(device), n, backward_kernel_for(kind), y, dy, dx, n,
         accumulating(mode));
  detail::finish(device);
}

// --- fully connected -------------------------------------------------------------------------

void fully_connected_forward(int device, const float* x, const float* w, const float* bias,
                             float* y, std::size_t batch, std::size_t in, std::size_t out) {
  constexpr const char* function = "fully_connected_forward";
  detail::activate(device, function);
  if (batch == 0 || out == 0)
    return;
  float beta = 0.0f;
  if (bias != nullptr) { // y = bias on every row, then y += x·wᵀ
    launch(device, detail::current_stream(device), batch * out, &broadcast_bias_kernel, bias, y,
           batch * out, std::size_t{1}, out);
    beta = 1.0f;
  }
  row_major_gemm(device, function, false, true, batch, out, in, x, in, w, in, beta, y, out);
  detail::finish(device);
}

void fully_connected_backward(int device, const float* x, const float* w, const float* dy,
                              float* dx, write_mode dx_mode, float* dw, write_mode dw_mode,
                              float* dbias, write_mode dbias_mode, std::size_t batch,
                              std::size_t in, std::size_t out) {
  constexpr const char* function = "fully_connected_backward";
  detail::activate(device, function);
  if (dx != nullptr) // dx[batch×in] = dy[batch×out] · w[out×in]
    row_major_gemm(device, function, false, false, batch, in, out, dy, out, w, in,
                   beta_for(dx_mode), dx, in);
  if (dw != nullptr) // dw[out×in] = dyᵀ · x[batch×in]
    row_major_gemm(device, function, true, false, out, in, batch, dy, out, x, in, beta_for(dw_mode),
                   dw, in);
  if (dbias != nullptr && out != 0) {
    const auto blocks = static_cast<unsigned>(
        std::min<std::size_t>((out + column_tile - 1) / column_tile, detail::max_blocks));
    column_sum_kernel<<<blocks, dim3(column_tile, column_rows), 0,
                        detail::current_stream(device)>>>(dy, dbias, batch, out,
                                                          accumulating(dbias_mode));
    TROUPE_CUDA_CHECK(device, cudaGetLastError());
  }
  detail::finish(device);
}

// --- convolution -----------------------------------------------------------------------------

void convolution_forward(int device, const float* x, const float* w, const float* bias, float* y,
                         image_shape in, std::size_t filters, window_2d window) {
  constexpr const char* function = "convolution_forward";
  detail::activate(device, function);
  const geometry g = geometry_of(in, window);
  const std::size_t plane = g.out_h * g.out_w;
  if (in.batch == 0 || filters == 0 || plane == 0)
    return;
  const cudaStream_t stream = detail::current_stream(device);
  const std::size_t k = in.channels * window.kernel_h * window.kernel_w;
  const std::size_t image = in.channels * in.height * in.width;
  const bool pointwise = is_pointwise(window);
  float* col = pointwise ? nullptr : scratch(device, k * plane);
  float beta = 0.0f;
  if (bias != nullptr) { // y = bias on every plane of its filter, then y += w·col per image
    const std::size_t total = in.batch * filters * plane;
    launch(device, stream, total, &broadcast_bias_kernel, bias, y, total, plane, filters);
    beta = 1.0f;
  }
  for (std::size_t n = 0; n < in.batch; ++n) {
    const float* xn = x + n * image;
    const float* cols = xn;
    if (!pointwise) {
      launch(device, stream, k * plane, &im2col_kernel, xn, col, g, k * plane);
      cols = col;
    }
    // y[F × plane] = w[F × k] · col[k × plane]
    row_major_gemm(device, function, false, false, filters, plane, k, w, k, cols, plane, beta,
                   y + n * filters * plane, plane);
  }
  detail::finish(device);
}

void convolution_backward(int device, const float* x, const float* w, const float* dy, float* dx,
                          write_mode dx_mode, float* dw, write_mode dw_mode, float* dbias,
                          write_mode dbias_mode, image_shape in, std::size_t filters,
                          window_2d window) {
  constexpr const char* function = "convolution_backward";
  detail::activate(device, function);
  const cudaStream_t stream = detail::current_stream(device);
  const geometry g = geometry_of(in, window);
  const std::size_t plane = g.out_h * g.out_w;
  const std::size_t k = in.channels * window.kernel_h * window.kernel_w;
  const std::size_t image = in.channels * in.height * in.width;
  const bool pointwise = is_pointwise(window);

  if (dbias != nullptr && filters != 0) {
    const auto blocks = static_cast<unsigned>(std::min<std::size_t>(filters, detail::max_blocks));
    filter_sum_kernel<<<blocks, block_threads, 0, stream>>>(dy, dbias, in.batch, filters, plane,
                                                            accumulating(dbias_mode));
    TROUPE_CUDA_CHECK(device, cudaGetLastError());
  }
  // an empty batch sums no image into dw: overwriting leaves zeros
  if (dw != nullptr && in.batch == 0 && !accumulating(dw_mode) && filters * k != 0)
    TROUPE_CUDA_CHECK(device, cudaMemsetAsync(dw, 0, filters * k * sizeof(float), stream));

  if (in.batch != 0 && (dx != nullptr || dw != nullptr)) {
    // col (for dw) and dcol (for dx) side by side in one scratch buffer
    const std::size_t col_size = k * plane;
    const bool need_col = dw != nullptr && !pointwise, need_dcol = dx != nullptr && !pointwise;
    float* base = scratch(device, (need_col ? col_size : 0) + (need_dcol ? col_size : 0));
    float* col = need_col ? base : nullptr;
    float* dcol = need_dcol ? base + (need_col ? col_size : 0) : nullptr;
    for (std::size_t n = 0; n < in.batch; ++n) {
      const float* xn = x + n * image;
      const float* dyn = dy + n * filters * plane;
      if (dw != nullptr) {
        // dw[F × k] (+)= dy[F × plane] · col[k × plane]ᵀ, summed over the images
        const float* cols = xn;
        if (!pointwise) {
          launch(device, stream, col_size, &im2col_kernel, xn, col, g, col_size);
          cols = col;
        }
        const float beta = n == 0 ? beta_for(dw_mode) : 1.0f;
        row_major_gemm(device, function, false, true, filters, k, plane, dyn, plane, cols, plane,
                       beta, dw, k);
      }
      if (dx != nullptr) {
        // dcol[k × plane] = w[F × k]ᵀ · dy[F × plane], then folded back onto the image
        float* dxn = dx + n * image;
        if (pointwise) {
          row_major_gemm(device, function, true, false, k, plane, filters, w, k, dyn, plane,
                         beta_for(dx_mode), dxn, plane);
        } else {
          row_major_gemm(device, function, true, false, k, plane, filters, w, k, dyn, plane, 0.0f,
                         dcol, plane);
          launch(device, stream, image, &col2im_kernel, dcol, dxn, g, image, accumulating(dx_mode));
        }
      }
    }
  }
  detail::finish(device);
}

// --- pooling ---------------------------------------------------------------------------------

void pooling_forward(int device, pool_kind kind, const float* x, float* y, image_shape in,
                     window_2d window) {
  detail::activate(device, "pooling_forward");
  const geometry g = geometry_of(in, window);
  const std::size_t n = in.batch * in.channels * g.out_h * g.out_w;
  if (n == 0)
    return;
  const float scale = 1.0f / static_cast<float>(window.kernel_h * window.kernel_w);
  launch(device, detail::current_stream(device), n,
         kind == pool_kind::max ? &pooling_forward_kernel<pool_kind::max>
                                : &pooling_forward_kernel<pool_kind::average>,
         x, y, g, n, scale);
  detail::finish(device);
}

void pooling_backward(int device, pool_kind kind, const float* x, const float* y, const float* dy,
                      float* dx, write_mode mode, image_shape in, window_2d window) {
  detail::activate(device, "pooling_backward");
  const geometry g = geometry_of(in, window);
  const std::size_t n = in.batch * in.channels * in.height * in.width;
  if (n == 0)
    return;
  const float scale = 1.0f / static_cast<float>(window.kernel_h * window.kernel_w);
  launch(device, detail::current_stream(device), n,
         kind == pool_kind::max ? &pooling_backward_kernel<pool_kind::max>
                                : &pooling_backward_kernel<pool_kind::average>,
         x, y, dy, dx, g, n, scale, accumulating(mode));
  detail::finish(device);
}

// --- softmax cross-entropy -------------------------------------------------------------------

void softmax_cross_entropy_forward(int device, const float* logits, const float* label, float* loss,
                                   float* probabilities, std::size_t batch, std::size_t classes) {
  detail::activate(device, "softmax_cross_entropy_forward");
  if (batch == 0 || classes == 0)
    return;
  // one warp per row: grid_for counts threads, warp_size of them per row
  launch(device, detail::current_stream(device), batch * warp_size, &softmax_cross_entropy_kernel,
         logits, label, loss, probabilities, batch, classes);
  detail::finish(device);
}

void softmax_cross_entropy_backward(int device, const float* probabilities, const float* label,
                                    const float* dloss, float* dlogits, write_mode mode,
                                    std::size_t batch, std::size_t classes) {
  detail::activate(device, "softmax_cross_entropy_backward");
  const std::size_t n = batch * classes;
  if (n == 0)
    return;
  launch(device, detail::current_stream(device), n, &softmax_cross_entropy_backward_kernel,
         probabilities, label, dloss, dlogits, n, classes, accumulating(mode));
  detail::finish(device);
}

// --- dropout ---------------------------------------------------------------------------------

void dropout_forward(int device, const float* x, float* y, float* mask, std::size_t n, double p,
                     std::uint64_t seed) {
  detail::activate(device, "dropout_forward");
  if (n == 0)
    return;
  const cudaStream_t stream = detail::current_stream(device);
  if (!(p > 0.0)) { // cpu::dropout_mask would give ones: no draw, no upload
    launch(device, stream, n, &dropout_keep_all_kernel, x, y, mask, n);
    detail::finish(device);
    return;
  }
  // The CPU's mask, drawn on the host into page-locked memory and uploaded; finish() below waits
  // for the copy, so this thread's pinned scratch is free again when the call returns.
  const std::size_t bytes = n * sizeof(float);
  auto* host = static_cast<float*>(detail::pinned_scratch(device, bytes));
  cpu::dropout_mask(host, n, p, seed);
  TROUPE_CUDA_CHECK(device, cudaMemcpyAsync(mask, host, bytes, cudaMemcpyHostToDevice, stream));
  launch(device, stream, n, &dropout_apply_kernel, x, mask, y, n);
  detail::finish(device);
}

void dropout_backward(int device, const float* mask, const float* dy, float* dx, std::size_t n,
                      write_mode mode) {
  detail::activate(device, "dropout_backward");
  if (n == 0)
    return;
  launch(device, detail::current_stream(device), n, &dropout_backward_kernel, mask, dy, dx, n,
         accumulating(mode));
  detail::finish(device);
}

} // namespace troupe::kernels::cuda
