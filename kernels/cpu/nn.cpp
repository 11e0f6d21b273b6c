#include "kernels/cpu/nn.hpp"

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "kernels/cpu/gemm.hpp"

namespace troupe::kernels::cpu {

// Every loop below is a plain index loop over one kind and one write mode (the switch on either
// sits outside the loop), so that -O3 vectorises what it can. Calls of std::exp, std::tanh and
// friends stay scalar (there is no -ffast-math, so no libmvec): expf costs ~3 ns an element here,
// tanhf ~15 ns. Scratch memory is per thread and only grows, so a steady shape never allocates.

namespace {

bool accumulating(write_mode mode) noexcept {
  return mode == write_mode::accumulate;
}

float beta_for(write_mode mode) noexcept {
  return accumulating(mode) ? 1.0f : 0.0f;
}

/// dx[i] = f(i) or dx[i] += f(i); f is inlined into both loops.
template <class F>
void store(float* dx, std::size_t n, write_mode mode, F f) noexcept {
  if (accumulating(mode))
    for (std::size_t i = 0; i < n; ++i)
      dx[i] += f(i);
  else
    for (std::size_t i = 0; i < n; ++i)
      dx[i] = f(i);
}

/// Σ v[0..n) with eight interleaved partial sums: vectorisable without reassociation flags, and
/// not bound by the latency of one serial chain of additions.
float sum_of(const float* v, std::size_t n) noexcept {
  constexpr std::size_t lanes = 8;
  float partial[lanes] = {};
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes)
    for (std::size_t l = 0; l < lanes; ++l)
      partial[l] += v[i + l];
  float sum = 0.0f;
  for (; i < n; ++i)
    sum += v[i];
  for (std::size_t l = 0; l < lanes; ++l)
    sum += partial[l];
  return sum;
}

/// Per-thread scratch that only ever grows, so repeated calls of one shape do not allocate. Growth
/// can throw std::bad_alloc, which ends the process (the kernels are noexcept).
float* scratch(std::vector<float>& buffer, std::size_t n) {
  if (buffer.size() < n)
    buffer.resize(n);
  return buffer.data();
}

std::vector<float>& col_buffer() {
  thread_local std::vector<float> buffer;
  return buffer;
}

std::vector<float>& dcol_buffer() {
  thread_local std::vector<float> buffer;
  return buffer;
}

/// A half-open range [first, last) of indices; empty when first == last.
struct index_range {
  std::size_t first = 0, last = 0;
};

/// The outputs o in [0, extent) whose input index o·stride + k - pad lies in [0, in): the output
/// columns (rows) that kernel tap k reads from the image rather than from the padding.
index_range valid_outputs(std::size_t k, std::size_t pad, std::size_t stride, std::size_t in,
                          std::size_t extent) noexcept {
  // o·stride + k >= pad  and  o·stride + k < in + pad
  const std::size_t first = k >= pad ? 0 : (pad - k + stride - 1) / stride;
  const std::size_t last = in + pad <= k ? 0 : (in + pad - k + stride - 1) / stride;
  index_range r{std::min(first, extent), std::min(last, extent)};
  r.last = std::max(r.last, r.first);
  return r;
}

struct conv_geometry {
  std::size_t channels, height, width;
  window_2d win;
  std::size_t out_h, out_w;
};

conv_geometry conv_geometry_of(const image_shape& in, const window_2d& w) noexcept {
  return {in.channels,
          in.height,
          in.width,
          w,
          window_output_extent(in.height, w.kernel_h, w.stride_h, w.pad_h),
          window_output_extent(in.width, w.kernel_w, w.stride_w, w.pad_w)};
}

/// col[(c·kh + ki)·kw + kj][oh·OW + ow] = x[c][oh·sh + ki - ph][ow·sw + kj - pw], 0 in padding.
void im2col(const float* x, const conv_geometry& g, float* col) noexcept {
  const auto& w = g.win;
  const std::size_t plane = g.out_h * g.out_w;
  for (std::size_t c = 0; c < g.channels; ++c)
    for (std::size_t ki = 0; ki < w.kernel_h; ++ki) {
      const index_range rows = valid_outputs(ki, w.pad_h, w.stride_h, g.height, g.out_h);
      for (std::size_t kj = 0; kj < w.kernel_w; ++kj) {
        const index_range cols = valid_outputs(kj, w.pad_w, w.stride_w, g.width, g.out_w);
        float* row = col + ((c * w.kernel_h + ki) * w.kernel_w + kj) * plane;
        if (cols.first == cols.last) { // this kernel column only ever sees padding
          std::fill(row, row + plane, 0.0f);
          continue;
        }
        std::fill(row, row + rows.first * g.out_w, 0.0f);
        for (std::size_t oh = rows.first; oh < rows.last; ++oh) {
          float* out = row + oh * g.out_w;
          const std::size_t ih = oh * w.stride_h + ki - w.pad_h;
          // input column of output column cols.first (non-negative by construction)
          const float* in =
              x + (c * g.height + ih) * g.width + (cols.first * w.stride_w + kj - w.pad_w);
          std::fill(out, out + cols.first, 0.0f);
          const std::size_t count = cols.last - cols.first;
          float* dst = out + cols.first;
          if (w.stride_w == 1) {
            for (std::size_t i = 0; i < count; ++i)
              dst[i] = in[i];
          } else {
            const std::size_t s = w.stride_w;
            for (std::size_t i = 0; i < count; ++i)
              dst[i] = in[i * s];
          }
          std::fill(out + cols.last, out + g.out_w, 0.0f);
        }
        std::fill(row + rows.last * g.out_w, row + plane, 0.0f);
      }
    }
}

/// The adjoint of im2col: dx[c][ih][iw] += every col entry im2col copied from it.
void col2im(const float* col, const conv_geometry& g, float* dx) noexcept {
  const auto& w = g.win;
  const std::size_t plane = g.out_h * g.out_w;
  for (std::size_t c = 0; c < g.channels; ++c)
    for (std::size_t ki = 0; ki < w.kernel_h; ++ki) {
      const index_range rows = valid_outputs(ki, w.pad_h, w.stride_h, g.height, g.out_h);
      for (std::size_t kj = 0; kj < w.kernel_w; ++kj) {
        const index_range cols = valid_outputs(kj, w.pad_w, w.stride_w, g.width, g.out_w);
        const float* row = col + ((c * w.kernel_h + ki) * w.kernel_w + kj) * plane;
        const std::size_t count = cols.last - cols.first;
        if (count == 0)
          continue;
        for (std::size_t oh = rows.first; oh < rows.last; ++oh) {
          const float* src = row + oh * g.out_w + cols.first;
          const std::size_t ih = oh * w.stride_h + ki - w.pad_h;
          float* out =
              dx + (c * g.height + ih) * g.width + (cols.first * w.stride_w + kj - w.pad_w);
          if (w.stride_w == 1) {
            for (std::size_t i = 0; i < count; ++i)
              out[i] += src[i];
          } else {
            const std::size_t s = w.stride_w;
            for (std::size_t i = 0; i < count; ++i)
              out[i * s] += src[i];
          }
        }
      }
    }
}

/// A 1×1 kernel with unit stride and no padding: im2col is the identity on each image.
bool is_pointwise(const window_2d& w) noexcept {
  return w.kernel_h == 1 && w.kernel_w == 1 && w.stride_h == 1 && w.stride_w == 1 && w.pad_h == 0 &&
         w.pad_w == 0;
}

/// The input rows (or columns) [first, last) that window o covers, clipped to the input.
index_range window_span(std::size_t o, std::size_t kernel, std::size_t stride, std::size_t pad,
                        std::size_t in) noexcept {
  const std::size_t start = o * stride; // in padded coordinates
  const std::size_t first = start >= pad ? start - pad : 0;
  const std::size_t end = start + kernel; // padded, exclusive
  const std::size_t last = end >= pad ? std::min(end - pad, in) : 0;
  return {std::min(first, in), std::max(std::min(first, in), last)};
}

inline constexpr std::size_t no_position = static_cast<std::size_t>(-1);

/// The first position, scanning the window row-major, whose value equals the window's maximum m
/// (no_position when none does: a window that lies wholly in padding).
std::size_t first_max(const float* plane, std::size_t width, index_range rows, index_range cols,
                      float m) noexcept {
  // scanned backwards without early exit, so that the last match seen is the first in row-major
  // order: a conditional move per element instead of a mispredicted branch per window
  std::size_t at = no_position;
  for (std::size_t ih = rows.last; ih-- > rows.first;)
    for (std::size_t iw = cols.last; iw-- > cols.first;)
      at = plane[ih * width + iw] == m ? ih * width + iw : at;
  return at;
}

struct pool_geometry {
  std::size_t out_h, out_w, planes, in_plane, out_plane;
  window_2d window;
  std::size_t width;
};

pool_geometry pool_geometry_of(const image_shape& in, const window_2d& w) noexcept {
  pool_geometry g{};
  g.out_h = window_output_extent(in.height, w.kernel_h, w.stride_h, w.pad_h);
  g.out_w = window_output_extent(in.width, w.kernel_w, w.stride_w, w.pad_w);
  g.planes = in.batch * in.channels;
  g.in_plane = in.height * in.width;
  g.out_plane = g.out_h * g.out_w;
  g.window = w;
  g.width = in.width;
  return g;
}

/// The input columns of every output column's window, computed once per call (per-thread buffer).
const index_range* column_spans(const pool_geometry& g) {
  thread_local std::vector<index_range> spans;
  if (spans.size() < g.out_w)
    spans.resize(g.out_w);
  for (std::size_t ow = 0; ow < g.out_w; ++ow)
    spans[ow] = window_span(ow, g.window.kernel_w, g.window.stride_w, g.window.pad_w, g.width);
  return spans.data();
}

} // namespace

void activation_forward(activation_kind kind, const float* x, float* y, std::size_t n) noexcept {
  switch (kind) {
  case activation_kind::relu:
    for (std::size_t i = 0; i < n; ++i)
      y[i] = x[i] > 0.0f ? x[i] : 0.0f;
    break;
  case activation_kind::sigmoid:
    for (std::size_t i = 0; i < n; ++i)
      y[i] = 1.0f / (1.0f + std::exp(-x[i]));
    break;
  case activation_kind::tanh:
    for (std::size_t i = 0; i < n; ++i)
      y[i] = std::tanh(x[i]);
    break;
  case activation_kind::softrelu:
    // log(1 + e^x) = max(x, 0) + log(1 + e^-|x|): no overflow for large x, no loss for small
    for (std::size_t i = 0; i < n; ++i)
      y[i] = std::max(x[i], 0.0f) + std::log1p(std::exp(-std::abs(x[i])));
    break;
  }
}

void activation_backward(activation_kind kind, const float* y, const float* dy, float* dx,
                         std::size_t n, write_mode mode) noexcept {
  switch (kind) {
  case activation_kind::relu:
    store(dx, n, mode, [&](std::size_t i) {
      const float g = dy[i]; // loaded unconditionally, so that the select vectorises
      return y[i] > 0.0f ? g : 0.0f;
    });
    break;
  case activation_kind::sigmoid:
    store(dx, n, mode, [&](std::size_t i) { return dy[i] * (y[i] * (1.0f - y[i])); });
    break;
  case activation_kind::tanh:
    store(dx, n, mode, [&](std::size_t i) { return dy[i] * (1.0f - y[i] * y[i]); });
    break;
  case activation_kind::softrelu:
    // 1 - e^-y, without the cancellation of the literal form when y is tiny
    store(dx, n, mode, [&](std::size_t i) { return dy[i] * -std::expm1(-y[i]); });
    break;
  }
}

void fully_connected_forward(const float* x, const float* w, const float* bias, float* y,
                             std::size_t batch, std::size_t in, std::size_t out) noexcept {
  float beta = 0.0f;
  if (bias != nullptr) {
    for (std::size_t b = 0; b < batch; ++b)
      std::copy(bias, bias + out, y + b * out);
    beta = 1.0f;
  }
  gemm(false, true, batch, out, in, 1.0f, x, in, w, in, beta, y, out);
}

void fully_connected_backward(const float* x, const float* w, const float* dy, float* dx,
                              write_mode dx_mode, float* dw, write_mode dw_mode, float* dbias,
                              write_mode dbias_mode, std::size_t batch, std::size_t in,
                              std::size_t out) noexcept {
  if (dx != nullptr) // dx[batch×in] = dy[batch×out] · w[out×in]
    gemm(false, false, batch, in, out, 1.0f, dy, out, w, in, beta_for(dx_mode), dx, in);
  if (dw != nullptr) // dw[out×in] = dyᵀ · x[batch×in]
    gemm(true, false, out, in, batch, 1.0f, dy, out, x, in, beta_for(dw_mode), dw, in);
  if (dbias != nullptr) {
    if (!accumulating(dbias_mode))
      std::fill(dbias, dbias + out, 0.0f);
    for (std::size_t b = 0; b < batch; ++b) {
      const float* row = dy + b * out;
      for (std::size_t o = 0; o < out; ++o)
        dbias[o] += row[o];
    }
  }
}

std::size_t window_output_extent(std::size_t in, std::size_t kernel, std::size_t stride,
                                 std::size_t pad) noexcept {
  if (stride == 0 || in + 2 * pad < kernel)
    return 0;
  return (in + 2 * pad - kernel) / stride + 1;
}

void convolution_forward(const float* x, const float* w, const float* bias, float* y,
                         image_shape in, std::size_t filters, window_2d window) noexcept {
  const conv_geometry g = conv_geometry_of(in, window);
  const std::size_t plane = g.out_h * g.out_w;
  const std::size_t k = in.channels * window.kernel_h * window.kernel_w;
  if (in.batch == 0 || filters == 0 || plane == 0)
    return;
  const std::size_t image = in.channels * in.height * in.width;
  const bool pointwise = is_pointwise(window);
  float* col = pointwise ? nullptr : scratch(col_buffer(), k * plane);
  for (std::size_t n = 0; n < in.batch; ++n) {
    const float* xn = x + n * image;
    float* yn = y + n * filters * plane;
    const float* cols = xn;
    if (!pointwise) {
      im2col(xn, g, col);
      cols = col;
    }
    float beta = 0.0f;
    if (bias != nullptr) {
      for (std::size_t f = 0; f < filters; ++f)
        std::fill(yn + f * plane, yn + (f + 1) * plane, bias[f]);
      beta = 1.0f;
    }
    // y[F × plane] = w[F × k] · col[k × plane]
    gemm(false, false, filters, plane, k, 1.0f, w, k, cols, plane, beta, yn, plane);
  }
}

void convolution_backward(const float* x, const float* w, const float* dy, float* dx,
                          write_mode dx_mode, float* dw, write_mode dw_mode, float* dbias,
                          write_mode dbias_mode, image_shape in, std::size_t filters,
                          window_2d window) noexcept {
  const conv_geometry g = conv_geometry_of(in, window);
  const std::size_t plane = g.out_h * g.out_w;
  const std::size_t k = in.channels * window.kernel_h * window.kernel_w;
  const std::size_t image = in.channels * in.height * in.width;
  const bool pointwise = is_pointwise(window);

  if (dbias != nullptr) {
    if (!accumulating(dbias_mode))
      std::fill(dbias, dbias + filters, 0.0f);
    for (std::size_t n = 0; n < in.batch; ++n)
      for (std::size_t f = 0; f < filters; ++f)
        dbias[f] += sum_of(dy + (n * filters + f) * plane, plane);
  }
  if (dw != nullptr && in.batch == 0 && !accumulating(dw_mode))
    std::fill(dw, dw + filters * k, 0.0f);
  if (dx == nullptr && dw == nullptr)
    return;

  float* col = (dw != nullptr && !pointwise) ? scratch(col_buffer(), k * plane) : nullptr;
  float* dcol = (dx != nullptr && !pointwise) ? scratch(dcol_buffer(), k * plane) : nullptr;
  for (std::size_t n = 0; n < in.batch; ++n) {
    const float* xn = x + n * image;
    const float* dyn = dy + n * filters * plane;
    if (dw != nullptr) {
      // dw[F × k] (+)= dy[F × plane] · col[k × plane]ᵀ, summed over the images
      const float* cols = xn;
      if (!pointwise) {
        im2col(xn, g, col);
        cols = col;
      }
      const float beta = n == 0 ? beta_for(dw_mode) : 1.0f;
      gemm(false, true, filters, k, plane, 1.0f, dyn, plane, cols, plane, beta, dw, k);
    }
    if (dx != nullptr) {
      // dcol[k × plane] = w[F × k]ᵀ · dy[F × plane], then folded back onto the image
      float* dxn = dx + n * image;
      if (pointwise) {
        gemm(true, false, k, plane, filters, 1.0f, w, k, dyn, plane, beta_for(dx_mode), dxn, plane);
      } else {
        if (!accumulating(dx_mode))
          std::fill(dxn, dxn + image, 0.0f);
        gemm(true, false, k, plane, filters, 1.0f, w, k, dyn, plane, 0.0f, dcol, plane);
        col2im(dcol, g, dxn);
      }
    }
  }
}

void pooling_forward(pool_kind kind, const float* x, float* y, image_shape in,
                     window_2d window) noexcept {
  const pool_geometry g = pool_geometry_of(in, window);
  const index_range* cols = column_spans(g);
  // The common 2-wide, stride-2 window without column padding gets a path of its own: each output
  // row accumulates the input rows its windows cover, one straight loop over a row at a time.
  // Every other window is reduced on its own, over the spans precomputed for its column.
  const bool pairs = window.kernel_w == 2 && window.stride_w == 2 && window.pad_w == 0;
  switch (kind) {
  case pool_kind::max:
    for (std::size_t p = 0; p < g.planes; ++p) {
      const float* xp = x + p * g.in_plane;
      for (std::size_t oh = 0; oh < g.out_h; ++oh) {
        float* out = y + p * g.out_plane + oh * g.out_w;
        const index_range rows =
            window_span(oh, window.kernel_h, window.stride_h, window.pad_h, in.height);
        if (pairs) {
          std::fill(out, out + g.out_w, -std::numeric_limits<float>::infinity());
          for (std::size_t ih = rows.first; ih < rows.last; ++ih) {
            const float* row = xp + ih * in.width;
            for (std::size_t ow = 0; ow < g.out_w; ++ow) {
              const float a = row[2 * ow], b = row[2 * ow + 1];
              const float m = a > b ? a : b;
              out[ow] = m > out[ow] ? m : out[ow];
            }
          }
        } else {
          for (std::size_t ow = 0; ow < g.out_w; ++ow) {
            const index_range c = cols[ow];
            float m = -std::numeric_limits<float>::infinity();
            for (std::size_t ih = rows.first; ih < rows.last; ++ih)
              for (std::size_t iw = c.first; iw < c.last; ++iw) {
                const float v = xp[ih * in.width + iw];
                m = v > m ? v : m;
              }
            out[ow] = m;
          }
        }
      }
    }
    break;
  case pool_kind::average: {
    const float scale = 1.0f / static_cast<float>(window.kernel_h * window.kernel_w);
    for (std::size_t p = 0; p < g.planes; ++p) {
      const float* xp = x + p * g.in_plane;
      for (std::size_t oh = 0; oh < g.out_h; ++oh) {
        float* out = y + p * g.out_plane + oh * g.out_w;
        const index_range rows =
            window_span(oh, window.kernel_h, window.stride_h, window.pad_h, in.height);
        if (pairs) {
          std::fill(out, out + g.out_w, 0.0f);
          for (std::size_t ih = rows.first; ih < rows.last; ++ih) {
            const float* row = xp + ih * in.width;
            for (std::size_t ow = 0; ow < g.out_w; ++ow)
              out[ow] += row[2 * ow] + row[2 * ow + 1];
          }
          for (std::size_t ow = 0; ow < g.out_w; ++ow)
            out[ow] *= scale;
        } else {
          for (std::size_t ow = 0; ow < g.out_w; ++ow) {
            const index_range c = cols[ow];
            float sum = 0.0f;
            for (std::size_t ih = rows.first; ih < rows.last; ++ih)
              for (std::size_t iw = c.first; iw < c.last; ++iw)
                sum += xp[ih * in.width + iw];
            out[ow] = sum * scale;
          }
        }
      }
    }
    break;
  }
  }
}

void pooling_backward(pool_kind kind, const float* x, const float* y, const float* dy, float* dx,
                      write_mode mode, image_shape in, window_2d window) noexcept {
  const pool_geometry g = pool_geometry_of(in, window);
  const index_range* cols = column_spans(g);
  const bool pairs = window.kernel_w == 2 && window.stride_w == 2 && window.pad_w == 0;
  if (!accumulating(mode))
    std::fill(dx, dx + g.planes * g.in_plane, 0.0f);
  switch (kind) {
  case pool_kind::max:
    for (std::size_t p = 0; p < g.planes; ++p) {
      const float* xp = x + p * g.in_plane;
      float* dxp = dx + p * g.in_plane;
      for (std::size_t oh = 0; oh < g.out_h; ++oh) {
        const index_range rows =
            window_span(oh, window.kernel_h, window.stride_h, window.pad_h, in.height);
        const std::size_t o = p * g.out_plane + oh * g.out_w;
        for (std::size_t ow = 0; ow < g.out_w; ++ow) {
          const std::size_t at = first_max(xp, in.width, rows, cols[ow], y[o + ow]);
          if (at != no_position)
            dxp[at] += dy[o + ow];
        }
      }
    }
    break;
  case pool_kind::average: {
    const float scale = 1.0f / static_cast<float>(window.kernel_h * window.kernel_w);
    for (std::size_t p = 0; p < g.planes; ++p) {
      float* dxp = dx + p * g.in_plane;
      for (std::size_t oh = 0; oh < g.out_h; ++oh) {
        const index_range rows =
            window_span(oh, window.kernel_h, window.stride_h, window.pad_h, in.height);
        const float* d = dy + p * g.out_plane + oh * g.out_w;
        for (std::size_t ih = rows.first; ih < rows.last; ++ih) {
          float* row = dxp + ih * in.width;
          if (pairs)
            for (std::size_t ow = 0; ow < g.out_w; ++ow) {
              const float v = d[ow] * scale;
              row[2 * ow] += v;
              row[2 * ow + 1] += v;
            }
          else
            for (std::size_t ow = 0; ow < g.out_w; ++ow) {
              const float v = d[ow] * scale;
              for (std::size_t iw = cols[ow].first; iw < cols[ow].last; ++iw)
                row[iw] += v;
            }
        }
      }
    }
    break;
  }
  }
}

void softmax_cross_entropy_forward(const float* logits, const float* label, float* loss,
                                   float* probabilities, std::size_t batch,
                                   std::size_t classes) noexcept {
  if (classes == 0)
    return;
  for (std::size_t b = 0; b < batch; ++b) {
    const float* z = logits + b * classes;
    float* p = probabilities + b * classes;
    float m = z[0];
    for (std::size_t c = 1; c < classes; ++c)
      m = z[c] > m ? z[c] : m;
    float sum = 0.0f;
    for (std::size_t c = 0; c < classes; ++c) {
      p[c] = std::exp(z[c] - m);
      sum += p[c];
    }
    const float inv = 1.0f / sum;
    for (std::size_t c = 0; c < classes; ++c)
      p[c] *= inv;
    const auto l = static_cast<std::size_t>(label[b]);
    // -log(e^(z_l - m) / sum); sum >= 1 because the max term is e^0
    loss[b] = std::log(sum) - (z[l] - m);
  }
}

void softmax_cross_entropy_backward(const float* probabilities, const float* label,
                                    const float* dloss, float* dlogits, write_mode mode,
                                    std::size_t batch, std::size_t classes) noexcept {
  if (classes == 0)
    return;
  for (std::size_t b = 0; b < batch; ++b) {
    const float* p = probabilities + b * classes;
    float* d = dlogits + b * classes;
    const float g = dloss[b];
    store(d, classes, mode, [&](std::size_t c) { return g * p[c]; });
    d[static_cast<std::size_t>(label[b])] -= g;
  }
}

void dropout_mask(float* mask, std::size_t n, double p, std::uint64_t seed) noexcept {
  if (!(p > 0.0)) {
    std::fill(mask, mask + n, 1.0f);
    return;
  }
  std::mt19937_64 engine{seed};
  const auto keep = static_cast<float>(1.0 / (1.0 - p));
  // The contract's draw u = k·2⁻⁵³ with k = engine() >> 11, and u < p  ⟺  k < p·2⁵³  ⟺
  // k < ceil(p·2⁵³) for an integer k: the same mask, compared as integers (no conversion, no
  // branch). p >= 1 would drop everything.
  const auto threshold = static_cast<std::uint64_t>(std::ceil(std::min(p, 1.0) * 0x1.0p53));
  for (std::size_t i = 0; i < n; ++i)
    mask[i] = (engine() >> 11) < threshold ? 0.0f : keep;
}

void dropout_forward(const float* x, float* y, float* mask, std::size_t n, double p,
                     std::uint64_t seed) noexcept {
  dropout_mask(mask, n, p, seed);
  // a mask of ones: y is x exactly (copied, as x · 1 would quiet a signalling NaN)
  if (!(p > 0.0)) {
    for (std::size_t i = 0; i < n; ++i)
      y[i] = x[i];
    return;
  }
  for (std::size_t i = 0; i < n; ++i)
    y[i] = x[i] * mask[i];
}

void dropout_backward(const float* mask, const float* dy, float* dx, std::size_t n,
                      write_mode mode) noexcept {
  store(dx, n, mode, [&](std::size_t i) { return dy[i] * mask[i]; });
}

void embedding_forward(const float* index, const float* weight, float* out, std::size_t count,
                       std::size_t width) noexcept {
  for (std::size_t i = 0; i < count; ++i)
    std::memcpy(out + i * width, weight + static_cast<std::size_t>(index[i]) * width,
                width * sizeof(float));
}

void embedding_backward(const float* index, const float* dy, float* dweight, write_mode mode,
                        std::size_t count, std::size_t rows, std::size_t width) noexcept {
  if (mode == write_mode::overwrite)
    std::fill(dweight, dweight + rows * width, 0.0f);
  for (std::size_t i = 0; i < count; ++i) {
    float* row = dweight + static_cast<std::size_t>(index[i]) * width;
    const float* from = dy + i * width;
    for (std::size_t j = 0; j < width; ++j)
      row[j] += from[j];
  }
}

} // namespace troupe::kernels::cpu
