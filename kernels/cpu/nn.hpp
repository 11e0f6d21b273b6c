#pragma once
// Neural-network layers on raw float32 buffers, forward and backward, for the engine's operators
// (engine/op.hpp). Layouts are MXNet's: activations are row-major, images NCHW, a fully connected
// weight is [out, in], a convolution weight [filters, channels, kh, kw].
//
// Every backward writes or adds into its gradient outputs as `mode` says (MXNet's grad_req write
// and add); a null gradient pointer means "not wanted" and is skipped. Buffers never alias unless
// a function says so. Work that needs scratch memory (im2col) keeps it per thread.

#include <cstddef>
#include <cstdint>

namespace troupe::kernels::cpu {

/// How a backward pass stores a gradient: overwrite it, or add to what is there.
enum class write_mode : std::uint8_t { overwrite, accumulate };

enum class activation_kind : std::uint8_t { relu, sigmoid, tanh, softrelu };

/// y = f(x) element-wise; y may equal x.
void activation_forward(activation_kind kind, const float* x, float* y, std::size_t n) noexcept;
/// dx (=|+=) dy · f'(x), where f' is computed from the forward output y (relu: y > 0; sigmoid:
/// y(1-y); tanh: 1-y²; softrelu: 1-exp(-y)).
void activation_backward(activation_kind kind, const float* y, const float* dy, float* dx,
                         std::size_t n, write_mode mode) noexcept;

/// y[batch×out] = x[batch×in] · w[out×in]ᵀ (+ bias[out] on every row when bias is not null).
void fully_connected_forward(const float* x, const float* w, const float* bias, float* y,
                             std::size_t batch, std::size_t in, std::size_t out) noexcept;
/// dx[batch×in] = dy·w, dw[out×in] = dyᵀ·x, dbias[out] = Σ_rows dy; each optional (nullable),
/// each with its own mode.
void fully_connected_backward(const float* x, const float* w, const float* dy, float* dx,
                              write_mode dx_mode, float* dw, write_mode dw_mode, float* dbias,
                              write_mode dbias_mode, std::size_t batch, std::size_t in,
                              std::size_t out) noexcept;

/// Geometry of a 2-D convolution or pooling window over NCHW data.
struct window_2d {
  std::size_t kernel_h = 1, kernel_w = 1;
  std::size_t stride_h = 1, stride_w = 1;
  std::size_t pad_h = 0, pad_w = 0;
};

/// MXNet's "valid" output extent: (in + 2·pad - kernel) / stride + 1, or 0 when the padded input
/// is smaller than the kernel.
std::size_t window_output_extent(std::size_t in, std::size_t kernel, std::size_t stride,
                                 std::size_t pad) noexcept;

/// Shape of the data of a convolution or pooling call.
struct image_shape {
  std::size_t batch = 0, channels = 0, height = 0, width = 0;
};

/// y[N, F, OH, OW] = conv(x[N, C, H, W], w[F, C, kh, kw]) (+ bias[F]); im2col + GEMM.
void convolution_forward(const float* x, const float* w, const float* bias, float* y,
                         image_shape in, std::size_t filters, window_2d window) noexcept;
/// Gradients of convolution_forward; each output optional (nullable) with its own mode.
void convolution_backward(const float* x, const float* w, const float* dy, float* dx,
                          write_mode dx_mode, float* dw, write_mode dw_mode, float* dbias,
                          write_mode dbias_mode, image_shape in, std::size_t filters,
                          window_2d window) noexcept;

enum class pool_kind : std::uint8_t { max, average };

/// y[N, C, OH, OW] = pool(x). Padding never wins a max (it is -inf); an average divides by the
/// full window size, padding included (MXNet's count_include_pad=True).
void pooling_forward(pool_kind kind, const float* x, float* y, image_shape in,
                     window_2d window) noexcept;
/// dx (=|+=) gradient of pooling_forward. max sends each dy to the first position in its window
/// that holds the maximum (recomputed from x and y); average spreads dy / (kh·kw) over the
/// window.
void pooling_backward(pool_kind kind, const float* x, const float* y, const float* dy, float* dx,
                      write_mode mode, image_shape in, window_2d window) noexcept;

/// Per row b of logits[batch×classes]: loss[b] = -log softmax(logits[b])[label[b]], computed
/// stably (max subtracted); probabilities[batch×classes] receives softmax(logits) for the
/// backward pass. Labels are float class indices (as MXNet passes them); a label outside
/// [0, classes) is the caller's error and is checked by the caller.
void softmax_cross_entropy_forward(const float* logits, const float* label, float* loss,
                                   float* probabilities, std::size_t batch,
                                   std::size_t classes) noexcept;
/// dlogits[b, c] (=|+=) dloss[b] · (probabilities[b, c] - [c == label[b]]).
void softmax_cross_entropy_backward(const float* probabilities, const float* label,
                                    const float* dloss, float* dlogits, write_mode mode,
                                    std::size_t batch, std::size_t classes) noexcept;

/// The mask of dropout_forward alone: mask[i] = 0 with probability p, else 1/(1-p), the i-th
/// draw of a std::mt19937_64 seeded with `seed` deciding element i (u = (engine() >> 11)·2⁻⁵³,
/// dropped when u < p); p <= 0 gives a mask of ones. The GPU dropout (kernels/cuda/nn.hpp) draws
/// its mask here too, so that a seed gives the same mask on every device.
void dropout_mask(float* mask, std::size_t n, double p, std::uint64_t seed) noexcept;

/// Inverted dropout: mask[i] = 0 with probability p, else 1/(1-p); y = x · mask. The mask comes
/// from a std::mt19937_64 seeded with `seed` (so a seed reproduces it); p in [0, 1), and p == 0
/// gives a mask of ones.
void dropout_forward(const float* x, float* y, float* mask, std::size_t n, double p,
                     std::uint64_t seed) noexcept;
/// dx (=|+=) dy · mask.
void dropout_backward(const float* mask, const float* dy, float* dx, std::size_t n,
                      write_mode mode) noexcept;

/// out[i, :] = weight[index[i], :] for each of `count` indices (float values holding row numbers,
/// as MXNet passes them, already checked to lie in [0, rows)); rows of `width` elements.
void embedding_forward(const float* index, const float* weight, float* out, std::size_t count,
                       std::size_t width) noexcept;
/// dweight[rows×width] (=|+=) Σ_i e_{index[i]} ⊗ dy[i, :], adding the dy rows in order of i: the
/// dense gradient of embedding_forward with respect to the weight.
void embedding_backward(const float* index, const float* dy, float* dweight, write_mode mode,
                        std::size_t count, std::size_t rows, std::size_t width) noexcept;

} // namespace troupe::kernels::cpu
