#pragma once
// The neural-network layers of kernels/cpu/nn.hpp on a GPU: the same functions with the same
// contracts (layouts, write modes, nullable gradient pointers, MXNet's rules), each taking the
// device first. One header, two implementations: nn.cu (built when TROUPE_HAVE_CUDA) and
// nn_none.cpp (CPU-only build: every call throws).
//
// All pointers are device pointers on `device`. A call runs on this thread's stream for the
// device (see kernels/cuda/device.hpp) and is complete when it returns. Failures (no such device,
// a CUDA or cuBLAS error, a size that does not fit cuBLAS' int) throw std::runtime_error naming
// the function. Results agree with the CPU kernels within float rounding (GEMMs and sums run in
// another order), except where a function says they are bit-identical.

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/nn.hpp"

namespace troupe::kernels::cuda {

/// y = f(x) element-wise; y may equal x.
void activation_forward(int device, cpu::activation_kind kind, const float* x, float* y,
                        std::size_t n);
/// dx (=|+=) dy · f'(x), f' computed from the forward output y.
void activation_backward(int device, cpu::activation_kind kind, const float* y, const float* dy,
                         float* dx, std::size_t n, cpu::write_mode mode);

/// y[batch×out] = x[batch×in] · w[out×in]ᵀ (+ bias[out] on every row when bias is not null).
void fully_connected_forward(int device, const float* x, const float* w, const float* bias,
                             float* y, std::size_t batch, std::size_t in, std::size_t out);
/// dx[batch×in] = dy·w, dw[out×in] = dyᵀ·x, dbias[out] = Σ_rows dy; each optional (nullable),
/// each with its own mode.
void fully_connected_backward(int device, const float* x, const float* w, const float* dy,
                              float* dx, cpu::write_mode dx_mode, float* dw,
                              cpu::write_mode dw_mode, float* dbias, cpu::write_mode dbias_mode,
                              std::size_t batch, std::size_t in, std::size_t out);

/// y[N, F, OH, OW] = conv(x[N, C, H, W], w[F, C, kh, kw]) (+ bias[F]); im2col + GEMM per image.
void convolution_forward(int device, const float* x, const float* w, const float* bias, float* y,
                         cpu::image_shape in, std::size_t filters, cpu::window_2d window);
/// Gradients of convolution_forward; each output optional (nullable) with its own mode. An empty
/// batch overwrites dw and dbias with zeros (or leaves them, when accumulating).
void convolution_backward(int device, const float* x, const float* w, const float* dy, float* dx,
                          cpu::write_mode dx_mode, float* dw, cpu::write_mode dw_mode, float* dbias,
                          cpu::write_mode dbias_mode, cpu::image_shape in, std::size_t filters,
                          cpu::window_2d window);

/// y[N, C, OH, OW] = pool(x). Padding never wins a max; an average divides by kh·kw, padding
/// included. Max pooling is bit-identical to the CPU's.
void pooling_forward(int device, cpu::pool_kind kind, const float* x, float* y, cpu::image_shape in,
                     cpu::window_2d window);
/// dx (=|+=) gradient of pooling_forward: max sends each dy to the first position (row-major) of
/// its window that holds y; average spreads dy / (kh·kw) over the window. Deterministic (no
/// atomics), and for max bit-identical to the CPU's.
void pooling_backward(int device, cpu::pool_kind kind, const float* x, const float* y,
                      const float* dy, float* dx, cpu::write_mode mode, cpu::image_shape in,
                      cpu::window_2d window);

/// Per row b: loss[b] = -log softmax(logits[b])[label[b]] (stable), probabilities = softmax.
/// Labels are float class indices that the caller has checked to lie in [0, classes).
void softmax_cross_entropy_forward(int device, const float* logits, const float* label, float* loss,
                                   float* probabilities, std::size_t batch, std::size_t classes);
/// dlogits[b, c] (=|+=) dloss[b] · (probabilities[b, c] - [c == label[b]]).
void softmax_cross_entropy_backward(int device, const float* probabilities, const float* label,
                                    const float* dloss, float* dlogits, cpu::write_mode mode,
                                    std::size_t batch, std::size_t classes);

/// Inverted dropout with the CPU's mask: the mask is drawn on the host by cpu::dropout_mask (same
/// seed, same mask, bit for bit) and uploaded; y = x · mask on the device (bit-identical too).
void dropout_forward(int device, const float* x, float* y, float* mask, std::size_t n, double p,
                     std::uint64_t seed);
/// dx (=|+=) dy · mask.
void dropout_backward(int device, const float* mask, const float* dy, float* dx, std::size_t n,
                      cpu::write_mode mode);

} // namespace troupe::kernels::cuda
