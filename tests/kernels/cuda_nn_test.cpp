// kernels/cuda/nn.hpp. With a GPU, every layer is checked against its CPU kernel in
// kernels/cpu/nn.hpp (itself checked against naive references and finite differences in
// nn_test.cpp) on the same inputs: odd sizes, padding, strides, both write modes, null gradients,
// max-pool ties, and dropout's mask bit for bit. Without one, the GPU suite is reported as
// skipped, and every call is checked to throw a std::runtime_error naming it.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <memory>
#include <random>
#include <stdexcept>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "kernels/cpu/nn.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/nn.hpp"
#include "tests/kernels/cuda_test_support.hpp"
#include "tests/kernels/kernels_test_support.hpp"
#include "tests/kernels/nn_test_support.hpp"

namespace cpu = troupe::kernels::cpu;
namespace cuda = troupe::kernels::cuda;
using namespace troupe::kernels::testing;
using cpu::write_mode;

namespace {

constexpr int gpu = 0;

using buffer = device_buffer<float>;

std::vector<float> nans(std::size_t n) {
  return std::vector<float>(n, nan_f);
}

std::string name_of(write_mode mode) {
  return mode == write_mode::overwrite ? "overwrite" : "accumulate";
}

const write_mode modes[] = {write_mode::overwrite, write_mode::accumulate};

// ---------------------------------------------------------------------------------------------
// gradient outputs

/// How a backward call receives one gradient output: not at all (a null pointer), or with a mode.
struct gradient_spec {
  bool wanted;
  write_mode mode;
};

constexpr gradient_spec skipped{false, write_mode::overwrite};
constexpr gradient_spec overwritten{true, write_mode::overwrite};
constexpr gradient_spec accumulated{true, write_mode::accumulate};

std::string describe(const gradient_spec& g) {
  return g.wanted ? name_of(g.mode) : "null";
}

/// Every mode for every output together, mixed modes, each output alone, and none at all.
const gradient_spec gradient_combinations[][3] = {
    {overwritten, overwritten, overwritten}, {accumulated, accumulated, accumulated},
    {accumulated, overwritten, accumulated}, {overwritten, accumulated, overwritten},
    {overwritten, skipped, skipped},         {skipped, overwritten, skipped},
    {skipped, skipped, overwritten},         {skipped, skipped, skipped}};

std::string describe(const gradient_spec (&g)[3]) {
  return " (dx " + describe(g[0]) + ", dw " + describe(g[1]) + ", dbias " + describe(g[2]) + ")";
}

/// One gradient output on the CPU and on the GPU, starting from the same contents: NaN when it
/// is overwritten (a kernel that read it would show), random values when it is accumulated into.
class gradient_output {
public:
  gradient_output(const gradient_spec& spec, std::size_t n, std::mt19937_64& rng)
      : spec_{spec}, host_{spec.mode == write_mode::accumulate ? uniform(rng, n, -1.0f, 1.0f)
                                                               : nans(n)} {
    if (spec_.wanted)
      device_ = std::make_unique<buffer>(gpu, host_);
  }

  write_mode mode() const { return spec_.mode; }
  float* on_cpu() { return spec_.wanted ? host_.data() : nullptr; }
  float* on_gpu() const { return device_ ? device_->get() : nullptr; }

  /// The GPU's result against the CPU's, when the output was wanted.
  void check(double rel_tol, double abs_tol, const std::string& what) const {
    if (device_)
      check_close(device_->download(), host_, rel_tol, abs_tol, what);
  }
  void check_exact(const std::string& what) const {
    if (device_)
      check_equal(device_->download(), host_, what);
  }

private:
  gradient_spec spec_;
  std::vector<float> host_;
  std::unique_ptr<buffer> device_;
};

/// A layer's backward with every combination of its gradient outputs dx, dw and dbias (of nx, nw
/// and nbias elements): backward(dx, dw, dbias) runs it on the CPU and on the GPU, and every
/// output that was wanted must then agree. `what` names the layer.
template <class Backward>
void check_every_gradient_combination(const std::string& what, std::size_t nx, std::size_t nw,
                                      std::size_t nbias, std::mt19937_64& rng, Backward backward) {
  for (const auto& combination : gradient_combinations) {
    const std::string name = what + describe(combination);
    gradient_output dx{combination[0], nx, rng}, dw{combination[1], nw, rng},
        dbias{combination[2], nbias, rng};
    backward(dx, dw, dbias);
    dx.check(1e-4, 1e-3, name + " dx");
    dw.check(1e-4, 1e-3, name + " dw");
    dbias.check(1e-4, 1e-3, name + " dbias");
  }
}

// ---------------------------------------------------------------------------------------------
// activations

/// n values in [-6, 6], with the extremes (±0, ±20, ±100, ±1e30) at the front when they fit.
std::vector<float> activation_inputs(std::mt19937_64& rng, std::size_t n) {
  auto x = uniform(rng, n, -6.0f, 6.0f);
  const float extremes[] = {0.0f, -0.0f, 20.0f, -20.0f, 100.0f, -100.0f, 1e30f, -1e30f};
  for (std::size_t i = 0; i < n && i < std::size(extremes); ++i)
    x[i] = extremes[i];
  return x;
}

/// The CPU's forward of `kind` on x: what the GPU's must match.
std::vector<float> cpu_activation_forward(cpu::activation_kind kind, const std::vector<float>& x) {
  std::vector<float> y(x.size());
  cpu::activation_forward(kind, x.data(), y.data(), x.size());
  return y;
}

// ---------------------------------------------------------------------------------------------
// fully connected

// Odd sizes, an empty input dimension (y = bias), an empty batch, MNIST's first layer, and more
// output columns than one grid of the bias-gradient kernel covers.
const fc_shape fc_shapes[] = {{1, 1, 1}, {3, 7, 5}, {17, 33, 65},    {64, 100, 10},  {5, 0, 3},
                              {0, 4, 3}, {2, 3, 0}, {128, 784, 300}, {2, 1, 300000}, {1000, 3, 2}};

// ---------------------------------------------------------------------------------------------
// convolution and pooling

// nn_test.cpp's shapes (batch 1 and 3, channels 1 and 3, strides 2 and 3, padding 1 and more than
// the kernel, non-square kernels, the 1×1 shortcut and a 1×1 with stride, LeNet's first layer,
// an exact fit and an empty output), then a layer big enough for several blocks per image and
// more filters than one grid of the bias-gradient kernel covers. Big-small-big, so the scratch
// buffer is reused smaller and grown again.
const conv_case conv_cases[] = {
    {{1, 1, 5, 5}, 1, {3, 3, 1, 1, 0, 0}},    {{3, 3, 7, 6}, 4, {3, 2, 2, 1, 1, 0}},
    {{2, 3, 8, 8}, 5, {1, 1, 1, 1, 0, 0}},    {{1, 2, 5, 5}, 2, {1, 1, 2, 2, 0, 0}},
    {{3, 1, 28, 28}, 6, {5, 5, 1, 1, 2, 2}},  {{1, 3, 6, 7}, 2, {2, 3, 2, 2, 1, 1}},
    {{2, 2, 9, 9}, 3, {3, 3, 2, 2, 1, 1}},    {{1, 1, 3, 3}, 2, {5, 5, 1, 1, 1, 1}},
    {{1, 1, 2, 2}, 1, {5, 5, 1, 1, 1, 1}},    {{3, 3, 4, 5}, 2, {1, 3, 1, 2, 0, 1}},
    {{1, 1, 4, 4}, 1, {2, 2, 1, 1, 3, 3}},    {{2, 1, 6, 5}, 1, {3, 1, 3, 1, 2, 0}},
    {{3, 6, 12, 12}, 16, {5, 5, 1, 1, 0, 0}}, {{4, 16, 32, 32}, 32, {3, 3, 1, 1, 1, 1}},
    {{2, 8, 31, 33}, 12, {3, 3, 2, 2, 1, 1}}, {{1, 1, 2, 3}, 9000, {1, 1, 1, 1, 0, 0}}};

// nn_test.cpp's shapes (the 2-wide stride-2 window the CPU has a path of its own for, overlapping
// and padded windows, a global window, an empty output), then ResNet's stem pooling (more input
// elements than one grid covers) and an odd-sized padded plane with stride 2.
const pool_case pool_cases[] = {
    {{1, 1, 4, 4}, {2, 2, 2, 2, 0, 0}},      {{3, 3, 7, 7}, {2, 2, 2, 2, 0, 0}},
    {{2, 3, 7, 6}, {3, 3, 2, 2, 1, 1}},      {{1, 1, 5, 6}, {3, 2, 1, 1, 1, 0}},
    {{3, 1, 6, 6}, {6, 6, 1, 1, 0, 0}},      {{1, 2, 5, 5}, {3, 3, 2, 1, 1, 1}},
    {{2, 2, 24, 24}, {2, 2, 2, 2, 0, 0}},    {{1, 3, 5, 4}, {2, 3, 2, 2, 1, 1}},
    {{1, 2, 5, 6}, {3, 2, 2, 2, 1, 0}},      {{1, 1, 2, 2}, {5, 5, 1, 1, 1, 1}},
    {{4, 64, 112, 112}, {3, 3, 2, 2, 1, 1}}, {{3, 5, 13, 11}, {3, 3, 2, 2, 1, 1}}};

// ---------------------------------------------------------------------------------------------
// softmax cross-entropy

struct softmax_shape {
  std::size_t batch, classes;
};

std::string describe(const softmax_shape& s) {
  return "softmax CE " + std::to_string(s.batch) + "x" + std::to_string(s.classes);
}

// One class, fewer classes than a warp has lanes, one more than a warp, ImageNet's 1000, wide
// rows, and more rows than one grid of warps covers.
const softmax_shape softmax_shapes[] = {{1, 1},    {3, 2},  {64, 10}, {5, 33},   {7, 1000},
                                        {2, 5000}, {0, 10}, {4, 0},   {70000, 3}};

// ---------------------------------------------------------------------------------------------

/// `call` must throw a std::runtime_error whose message names `function`, qualified, so that one
/// function's name inside another's (none here) could not pass for it.
template <class F>
void check_throws_naming(F call, const std::string& function) {
  check_throws_runtime_error(call, "troupe::kernels::cuda::" + function);
}

/// Calls every function of kernels/cuda/nn.hpp on `device` with the given (never dereferenced)
/// pointers and non-empty shapes; each must throw a std::runtime_error naming it.
void check_every_function_throws(int device, float* p) {
  const cpu::image_shape in{1, 1, 4, 4};
  const cpu::window_2d win{2, 2, 2, 2, 0, 0};
  const auto relu = cpu::activation_kind::relu;
  const auto over = write_mode::overwrite;
  check_throws_naming([&] { cuda::activation_forward(device, relu, p, p, 1); },
                      "activation_forward");
  check_throws_naming([&] { cuda::activation_backward(device, relu, p, p, p, 1, over); },
                      "activation_backward");
  check_throws_naming([&] { cuda::fully_connected_forward(device, p, p, p, p, 1, 1, 1); },
                      "fully_connected_forward");
  check_throws_naming(
      [&] { cuda::fully_connected_backward(device, p, p, p, p, over, p, over, p, over, 1, 1, 1); },
      "fully_connected_backward");
  check_throws_naming([&] { cuda::convolution_forward(device, p, p, p, p, in, 1, win); },
                      "convolution_forward");
  check_throws_naming(
      [&] { cuda::convolution_backward(device, p, p, p, p, over, p, over, p, over, in, 1, win); },
      "convolution_backward");
  check_throws_naming([&] { cuda::pooling_forward(device, cpu::pool_kind::max, p, p, in, win); },
                      "pooling_forward");
  check_throws_naming(
      [&] { cuda::pooling_backward(device, cpu::pool_kind::average, p, p, p, p, over, in, win); },
      "pooling_backward");
  check_throws_naming([&] { cuda::softmax_cross_entropy_forward(device, p, p, p, p, 1, 1); },
                      "softmax_cross_entropy_forward");
  check_throws_naming([&] { cuda::softmax_cross_entropy_backward(device, p, p, p, p, over, 1, 1); },
                      "softmax_cross_entropy_backward");
  check_throws_naming([&] { cuda::dropout_forward(device, p, p, p, 1, 0.5, 1); },
                      "dropout_forward");
  check_throws_naming([&] { cuda::dropout_backward(device, p, p, p, 1, over); },
                      "dropout_backward");
}

// ---------------------------------------------------------------------------------------------
// the checks of the GPU suite, as functions so that they also run under a stream_scope

void check_fully_connected(const fc_shape& s, std::size_t seed) {
  auto rng = rng_for(seed, s.batch * 1'000'000 + s.in * 1000 + s.out);
  const auto x = uniform(rng, s.batch * s.in, -1.0f, 1.0f);
  const auto w = uniform(rng, s.out * s.in, -1.0f, 1.0f);
  const auto bias = uniform(rng, s.out, -1.0f, 1.0f);
  const auto dy = uniform(rng, s.batch * s.out, -1.0f, 1.0f);
  const buffer dx_in{gpu, x}, dw_in{gpu, w}, dbias_in{gpu, bias}, ddy{gpu, dy};
  for (const float* b : {bias.data(), static_cast<const float*>(nullptr)}) {
    const std::string what = describe(s) + (b ? " with bias" : " without bias");
    std::vector<float> y(s.batch * s.out);
    cpu::fully_connected_forward(x.data(), w.data(), b, y.data(), s.batch, s.in, s.out);
    const buffer dyy{gpu, nans(y.size())};
    cuda::fully_connected_forward(gpu, dx_in.get(), dw_in.get(), b ? dbias_in.get() : nullptr,
                                  dyy.get(), s.batch, s.in, s.out);
    check_close(dyy.download(), y, 1e-4, 1e-4, what + " y");
  }
  check_every_gradient_combination(
      describe(s), x.size(), w.size(), bias.size(), rng,
      [&](gradient_output& dx, gradient_output& dw, gradient_output& dbias) {
        cpu::fully_connected_backward(x.data(), w.data(), dy.data(), dx.on_cpu(), dx.mode(),
                                      dw.on_cpu(), dw.mode(), dbias.on_cpu(), dbias.mode(), s.batch,
                                      s.in, s.out);
        cuda::fully_connected_backward(gpu, dx_in.get(), dw_in.get(), ddy.get(), dx.on_gpu(),
                                       dx.mode(), dw.on_gpu(), dw.mode(), dbias.on_gpu(),
                                       dbias.mode(), s.batch, s.in, s.out);
      });
}

void check_convolution(const conv_case& c, std::size_t seed) {
  auto rng = rng_for(seed, x_size(c.in) * 100 + c.filters);
  const auto x = uniform(rng, x_size(c.in), -1.0f, 1.0f);
  const auto w = uniform(rng, w_size(c), -1.0f, 1.0f);
  const auto bias = uniform(rng, c.filters, -1.0f, 1.0f);
  const auto dy = uniform(rng, y_size(c), -1.0f, 1.0f);
  const buffer gx{gpu, x}, gw{gpu, w}, gbias{gpu, bias}, gdy{gpu, dy};
  for (const float* b : {bias.data(), static_cast<const float*>(nullptr)}) {
    const std::string what = describe(c) + (b ? " with bias" : " without bias");
    std::vector<float> y(y_size(c));
    cpu::convolution_forward(x.data(), w.data(), b, y.data(), c.in, c.filters, c.win);
    const buffer gy{gpu, nans(y.size())};
    cuda::convolution_forward(gpu, gx.get(), gw.get(), b ? gbias.get() : nullptr, gy.get(), c.in,
                              c.filters, c.win);
    check_close(gy.download(), y, 1e-4, 1e-4, what + " y");
  }
  check_every_gradient_combination(
      describe(c), x.size(), w.size(), bias.size(), rng,
      [&](gradient_output& dx, gradient_output& dw, gradient_output& dbias) {
        cpu::convolution_backward(x.data(), w.data(), dy.data(), dx.on_cpu(), dx.mode(),
                                  dw.on_cpu(), dw.mode(), dbias.on_cpu(), dbias.mode(), c.in,
                                  c.filters, c.win);
        cuda::convolution_backward(gpu, gx.get(), gw.get(), gdy.get(), dx.on_gpu(), dx.mode(),
                                   dw.on_gpu(), dw.mode(), dbias.on_gpu(), dbias.mode(), c.in,
                                   c.filters, c.win);
      });
}

/// Forward and backward of one pooling case against the CPU, from inputs x: max bit for bit
/// (the same comparisons, and the same additions in the same order), average within rounding.
void check_pooling(cpu::pool_kind kind, const pool_case& c, const std::vector<float>& x,
                   std::mt19937_64& rng, const std::string& what) {
  const bool exact = kind == cpu::pool_kind::max;
  std::vector<float> y(y_size(c));
  cpu::pooling_forward(kind, x.data(), y.data(), c.in, c.win);
  const buffer gx{gpu, x};
  buffer gy{gpu, nans(y.size())};
  cuda::pooling_forward(gpu, kind, gx.get(), gy.get(), c.in, c.win);
  if (exact)
    check_equal(gy.download(), y, what + " y");
  else
    check_close(gy.download(), y, 1e-5, 1e-6, what + " y");
  // the backward reads the CPU's y, so that it is checked on its own
  gy.upload(y);
  const auto dy = uniform(rng, y.size(), -1.0f, 1.0f);
  const buffer gdy{gpu, dy};
  for (write_mode mode : modes) {
    gradient_output dx{{true, mode}, x.size(), rng};
    cpu::pooling_backward(kind, x.data(), y.data(), dy.data(), dx.on_cpu(), mode, c.in, c.win);
    cuda::pooling_backward(gpu, kind, gx.get(), gy.get(), gdy.get(), dx.on_gpu(), mode, c.in,
                           c.win);
    if (exact)
      dx.check_exact(what + " dx " + name_of(mode));
    else
      dx.check(1e-5, 1e-6, what + " dx " + name_of(mode));
  }
}

void check_softmax_cross_entropy(const softmax_shape& s, std::size_t seed) {
  auto rng = rng_for(seed, s.batch * 10000 + s.classes);
  const auto logits = uniform(rng, s.batch * s.classes, -10.0f, 10.0f);
  const auto label =
      s.classes == 0 ? std::vector<float>(s.batch, 0.0f) : random_labels(rng, s.batch, s.classes);
  std::vector<float> loss(s.batch, nan_f), probabilities(logits.size(), nan_f);
  cpu::softmax_cross_entropy_forward(logits.data(), label.data(), loss.data(), probabilities.data(),
                                     s.batch, s.classes);
  const buffer glogits{gpu, logits}, glabel{gpu, label}, gloss{gpu, nans(s.batch)};
  buffer gprobabilities{gpu, nans(logits.size())};
  cuda::softmax_cross_entropy_forward(gpu, glogits.get(), glabel.get(), gloss.get(),
                                      gprobabilities.get(), s.batch, s.classes);
  if (s.classes != 0) // with no classes both leave their outputs alone
    check_close(gloss.download(), loss, 1e-5, 1e-5, describe(s) + " loss");
  check_close(gprobabilities.download(), probabilities, 1e-5, 1e-7, describe(s) + " probabilities");

  const auto dloss = uniform(rng, s.batch, -2.0f, 2.0f);
  const buffer gdloss{gpu, dloss};
  gprobabilities.upload(probabilities); // the backward on the CPU's probabilities
  for (write_mode mode : modes) {
    gradient_output dlogits{{true, mode}, logits.size(), rng};
    cpu::softmax_cross_entropy_backward(probabilities.data(), label.data(), dloss.data(),
                                        dlogits.on_cpu(), mode, s.batch, s.classes);
    cuda::softmax_cross_entropy_backward(gpu, gprobabilities.get(), glabel.get(), gdloss.get(),
                                         dlogits.on_gpu(), mode, s.batch, s.classes);
    dlogits.check(1e-6, 1e-6, describe(s) + " dlogits " + name_of(mode));
  }
}

void check_dropout(std::size_t n, double p, std::uint64_t seed) {
  const std::string what = "dropout n = " + std::to_string(n) + ", p = " + std::to_string(p) +
                           ", seed " + std::to_string(seed);
  auto rng = rng_for(seed, n);
  const auto x = uniform(rng, n, -2.0f, 2.0f);
  std::vector<float> y(n, nan_f), mask(n, nan_f);
  cpu::dropout_forward(x.data(), y.data(), mask.data(), n, p, seed);
  const buffer gx{gpu, x}, gy{gpu, nans(n)}, gmask{gpu, nans(n)};
  cuda::dropout_forward(gpu, gx.get(), gy.get(), gmask.get(), n, p, seed);
  check_equal(gmask.download(), mask, what + " mask");
  check_equal(gy.download(), y, what + " y");
  const auto dy = uniform(rng, n, -1.0f, 1.0f);
  const buffer gdy{gpu, dy};
  for (write_mode mode : modes) {
    gradient_output dx{{true, mode}, n, rng};
    cpu::dropout_backward(mask.data(), dy.data(), dx.on_cpu(), n, mode);
    cuda::dropout_backward(gpu, gmask.get(), gdy.get(), dx.on_gpu(), n, mode);
    if (mode == write_mode::overwrite)
      dx.check_exact(what + " dx overwrite"); // one multiplication, rounded once on both
    else
      dx.check(1e-6, 1e-6, what + " dx accumulate");
  }
}

} // namespace

BOOST_AUTO_TEST_SUITE(cuda_nn)

BOOST_AUTO_TEST_SUITE(without_a_gpu, *boost::unit_test::precondition(has_no_cuda_device))

BOOST_AUTO_TEST_CASE(every_layer_throws_a_runtime_error_naming_it) {
  float host[16] = {};
  check_every_function_throws(0, host);
}

BOOST_AUTO_TEST_CASE(the_error_says_why_there_is_no_device) {
  float host[1] = {};
  try {
    cuda::activation_forward(0, cpu::activation_kind::relu, host, host, 1);
    BOOST_ERROR("activation_forward did not throw without a device");
  } catch (const std::runtime_error& e) {
    const std::string message = e.what();
    const std::string why = cuda::built_with_cuda() ? "no CUDA device" : "built without CUDA";
    BOOST_TEST(message.find(why) != std::string::npos, message);
  }
}

BOOST_AUTO_TEST_SUITE_END() // without_a_gpu

BOOST_AUTO_TEST_SUITE(on_a_gpu, *boost::unit_test::precondition(has_cuda_device))

BOOST_AUTO_TEST_CASE(an_out_of_range_device_index_throws_a_runtime_error_naming_the_layer) {
  buffer scratch{gpu, nans(16)};
  check_every_function_throws(cuda::device_count(), scratch.get());
  check_every_function_throws(-1, scratch.get());
}

BOOST_AUTO_TEST_CASE(activation_forward_matches_the_cpu_on_every_size_and_may_run_in_place) {
  for (auto kind : activation_kinds)
    for (std::size_t n : sizes) {
      auto rng = rng_for(101, n);
      const auto x = activation_inputs(rng, n);
      const auto y = cpu_activation_forward(kind, x);
      const std::string what = name_of(kind) + " forward";
      const buffer gx{gpu, x}, gy{gpu, nans(n)};
      cuda::activation_forward(gpu, kind, gx.get(), gy.get(), n);
      check_close(gy.download(), y, 1e-5, 1e-6, what);
      cuda::activation_forward(gpu, kind, gx.get(), gx.get(), n);
      check_close(gx.download(), y, 1e-5, 1e-6, what + " in place");
    }
}

BOOST_AUTO_TEST_CASE(relu_is_bit_identical_to_the_cpu) {
  for (std::size_t n : sizes) {
    auto rng = rng_for(102, n);
    const auto x = activation_inputs(rng, n);
    const auto dy = uniform(rng, n, -1.0f, 1.0f);
    std::vector<float> y(n), dx(n);
    cpu::activation_forward(cpu::activation_kind::relu, x.data(), y.data(), n);
    cpu::activation_backward(cpu::activation_kind::relu, y.data(), dy.data(), dx.data(), n,
                             write_mode::overwrite);
    const buffer gx{gpu, x}, gy{gpu, nans(n)}, gdy{gpu, dy}, gdx{gpu, nans(n)};
    cuda::activation_forward(gpu, cpu::activation_kind::relu, gx.get(), gy.get(), n);
    check_equal(gy.download(), y, "relu forward");
    cuda::activation_backward(gpu, cpu::activation_kind::relu, gy.get(), gdy.get(), gdx.get(), n,
                              write_mode::overwrite);
    check_equal(gdx.download(), dx, "relu backward");
  }
}

BOOST_AUTO_TEST_CASE(activation_backward_matches_the_cpu_in_both_write_modes) {
  for (auto kind : activation_kinds)
    for (std::size_t n : sizes) {
      auto rng = rng_for(103, n);
      const auto x = activation_inputs(rng, n);
      const auto y = cpu_activation_forward(kind, x);
      const auto dy = uniform(rng, n, -1.0f, 1.0f);
      const buffer gy{gpu, y}, gdy{gpu, dy};
      for (write_mode mode : modes) {
        gradient_output dx{{true, mode}, n, rng};
        cpu::activation_backward(kind, y.data(), dy.data(), dx.on_cpu(), n, mode);
        cuda::activation_backward(gpu, kind, gy.get(), gdy.get(), dx.on_gpu(), n, mode);
        dx.check(1e-5, 1e-6, name_of(kind) + " backward " + name_of(mode));
      }
    }
}

BOOST_AUTO_TEST_CASE(fully_connected_matches_the_cpu_in_every_mode_and_with_null_gradients) {
  for (const auto& s : fc_shapes)
    check_fully_connected(s, 201);
}

BOOST_AUTO_TEST_CASE(convolution_matches_the_cpu_in_every_mode_and_with_null_gradients) {
  for (const auto& c : conv_cases)
    check_convolution(c, 301);
}

BOOST_AUTO_TEST_CASE(convolution_with_an_empty_batch_overwrites_weight_gradients_with_zero) {
  const conv_case c{{0, 2, 5, 5}, 3, {3, 3, 1, 1, 1, 1}};
  const buffer w{gpu, std::vector<float>(w_size(c), 1.0f)};
  buffer dw{gpu, nans(w_size(c))};
  const buffer dbias{gpu, nans(c.filters)};
  cuda::convolution_backward(gpu, nullptr, w.get(), nullptr, nullptr, write_mode::overwrite,
                             dw.get(), write_mode::overwrite, dbias.get(), write_mode::overwrite,
                             c.in, c.filters, c.win);
  check_equal(dw.download(), std::vector<float>(w_size(c), 0.0f), "dw of an empty batch");
  check_equal(dbias.download(), std::vector<float>(c.filters, 0.0f), "dbias of an empty batch");
  // accumulating nothing leaves them as they are
  const auto pre = std::vector<float>(w_size(c), 2.5f);
  dw.upload(pre);
  cuda::convolution_backward(gpu, nullptr, w.get(), nullptr, nullptr, write_mode::overwrite,
                             dw.get(), write_mode::accumulate, nullptr, write_mode::overwrite, c.in,
                             c.filters, c.win);
  check_equal(dw.download(), pre, "dw accumulated over an empty batch");
}

BOOST_AUTO_TEST_CASE(pooling_matches_the_cpu_in_both_modes_on_every_shape) {
  for_each_pooling_input(pool_cases, 401, check_pooling);
}

BOOST_AUTO_TEST_CASE(max_pooling_backward_sends_dy_to_the_first_maximum_of_its_window) {
  // hand-worked (as in nn_test.cpp): a 2×3 plane of equal values, 2×2 windows with stride 1:
  // each dy lands on its window's top-left element
  {
    const cpu::image_shape in{1, 1, 2, 3};
    const cpu::window_2d win{2, 2, 1, 1, 0, 0};
    const buffer x{gpu, std::vector<float>(6, 1.0f)}, y{gpu, {1.0f, 1.0f}},
        dy{gpu, {10.0f, 100.0f}}, dx{gpu, nans(6)};
    cuda::pooling_backward(gpu, cpu::pool_kind::max, x.get(), y.get(), dy.get(), dx.get(),
                           write_mode::overwrite, in, win);
    check_equal(dx.download(), std::vector<float>{10, 100, 0, 0, 0, 0}, "ties, hand-worked");
  }
  // hand-worked: padding never wins even though every value is negative
  {
    const cpu::image_shape in{1, 1, 2, 2};
    const cpu::window_2d win{2, 2, 1, 1, 1, 1};
    const buffer x{gpu, {-4, -3, -2, -1}}, y{gpu, nans(9)};
    cuda::pooling_forward(gpu, cpu::pool_kind::max, x.get(), y.get(), in, win);
    check_equal(y.download(), std::vector<float>{-4, -3, -3, -2, -1, -1, -2, -1, -1},
                "padded max forward");
    const buffer dy{gpu, {1, 2, 3, 4, 5, 6, 7, 8, 9}}, dx{gpu, nans(4)};
    cuda::pooling_backward(gpu, cpu::pool_kind::max, x.get(), y.get(), dy.get(), dx.get(),
                           write_mode::overwrite, in, win);
    check_equal(dx.download(), std::vector<float>{1, 2 + 3, 4 + 7, 5 + 6 + 8 + 9},
                "padded max backward");
  }
  // many ties, every shape
  std::size_t index = 0;
  for (const auto& c : pool_cases) {
    auto rng = rng_for(403, index++);
    const auto x = tied_values(rng, x_size(c.in));
    check_pooling(cpu::pool_kind::max, c, x, rng, describe(cpu::pool_kind::max, c) + " ties");
  }
}

BOOST_AUTO_TEST_CASE(softmax_cross_entropy_matches_the_cpu_in_both_modes) {
  for (const auto& s : softmax_shapes)
    check_softmax_cross_entropy(s, 501);
}

BOOST_AUTO_TEST_CASE(softmax_cross_entropy_stays_finite_on_huge_logits) {
  const std::size_t batch = 3, classes = 4;
  const std::vector<float> logits = {1e4f,  -1e4f, 0.0f,  9998.0f, // label 1: loss 2e4
                                     -1e4f, -1e4f, -1e4f, -1e4f,   // uniform
                                     3e4f,  1e4f,  -3e4f, 2.9999e4f};
  const std::vector<float> label = {1, 2, 0};
  std::vector<float> loss(batch), probabilities(batch * classes);
  cpu::softmax_cross_entropy_forward(logits.data(), label.data(), loss.data(), probabilities.data(),
                                     batch, classes);
  const buffer glogits{gpu, logits}, glabel{gpu, label}, gloss{gpu, nans(batch)},
      gprobabilities{gpu, nans(batch * classes)};
  cuda::softmax_cross_entropy_forward(gpu, glogits.get(), glabel.get(), gloss.get(),
                                      gprobabilities.get(), batch, classes);
  const auto got_loss = gloss.download();
  const auto got_probabilities = gprobabilities.download();
  for (float v : got_loss)
    BOOST_TEST(std::isfinite(v));
  for (float v : got_probabilities)
    BOOST_TEST(std::isfinite(v));
  check_close(got_loss, loss, 1e-6, 1e-6, "huge logits loss");
  check_close(got_probabilities, probabilities, 1e-6, 1e-7, "huge logits probabilities");
  BOOST_TEST(std::abs(got_loss[1] - std::log(4.0)) < 1e-6);
}

BOOST_AUTO_TEST_CASE(dropout_draws_the_cpus_mask_bit_for_bit) {
  for (std::size_t n : sizes)
    for (double p : {0.0, 0.1, 0.5, 0.75})
      for (std::uint64_t seed : {42u, 43u})
        check_dropout(n, p, seed);
  // and two seeds draw two masks on the GPU too
  const std::size_t n = 1000;
  const buffer x{gpu, std::vector<float>(n, 1.0f)}, y{gpu, n}, m42{gpu, n}, m43{gpu, n};
  cuda::dropout_forward(gpu, x.get(), y.get(), m42.get(), n, 0.5, 42);
  cuda::dropout_forward(gpu, x.get(), y.get(), m43.get(), n, 0.5, 43);
  BOOST_TEST((m42.download() != m43.download()), "seeds 42 and 43 drew the same mask");
}

BOOST_AUTO_TEST_CASE(every_layer_runs_on_the_stream_of_a_stream_scope) {
  // A GPU device actor installs a stream of its own (non-blocking with respect to the legacy
  // default stream): every launch, copy and GEMM must go there, and the call must wait for it.
  cuda::stream stream{gpu};
  cuda::stream_scope scope{stream};
  check_fully_connected({17, 33, 65}, 601);
  check_convolution({{3, 3, 7, 6}, 4, {3, 2, 2, 1, 1, 0}}, 602);
  check_convolution({{4, 16, 32, 32}, 32, {3, 3, 1, 1, 1, 1}}, 603);
  const pool_case pool{{2, 3, 7, 6}, {3, 3, 2, 2, 1, 1}};
  for (auto kind : pool_kinds) {
    auto rng = rng_for(604, 0);
    check_pooling(kind, pool, uniform(rng, x_size(pool.in), -3.0f, 3.0f), rng,
                  describe(kind, pool) + " on a stream");
  }
  check_softmax_cross_entropy({64, 1000}, 605);
  check_dropout(1'000'000, 0.3, 606);
  for (auto kind : activation_kinds) {
    const std::size_t n = 100'000;
    auto rng = rng_for(607, n);
    const auto x = activation_inputs(rng, n);
    const auto y = cpu_activation_forward(kind, x);
    const buffer gx{gpu, x}, gy{gpu, nans(n)};
    cuda::activation_forward(gpu, kind, gx.get(), gy.get(), n);
    check_close(gy.download(), y, 1e-5, 1e-6, name_of(kind) + " forward on a stream");
  }
}

BOOST_AUTO_TEST_SUITE_END() // on_a_gpu

BOOST_AUTO_TEST_SUITE_END() // cuda_nn
