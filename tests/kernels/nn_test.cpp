// kernels/cpu/nn.hpp: every forward against a naive double-precision loop written here, every
// backward against central finite differences of its forward (and, where the shapes are too big
// for those, against a naive backward loop), then the write modes, null gradients, the max-pool
// tie rule, softmax on huge logits and dropout's seeded mask.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "kernels/cpu/nn.hpp"
#include "tests/kernels/kernels_test_support.hpp"
#include "tests/kernels/nn_test_support.hpp"

namespace cpu = troupe::kernels::cpu;
using namespace troupe::kernels::testing;
using cpu::write_mode;

namespace {

constexpr double inf_d = std::numeric_limits<double>::infinity();

/// Σ a·b in double: the scalar L = Σ dy·y whose gradient a backward computes.
double dot(const std::vector<float>& a, const std::vector<float>& b) {
  BOOST_TEST_REQUIRE(a.size() == b.size());
  double s = 0.0;
  for (std::size_t i = 0; i < a.size(); ++i)
    s += static_cast<double>(a[i]) * static_cast<double>(b[i]);
  return s;
}

/// dL/dv by central differences, one element of v at a time; loss reads v (captured by
/// reference) and returns L in double. The step is measured after rounding v ± h to float.
template <class Loss>
std::vector<double> numeric_gradient(std::vector<float>& v, float h, Loss loss) {
  std::vector<double> g(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    const float original = v[i];
    v[i] = original + h;
    const double up_value = static_cast<double>(v[i]);
    const double up = loss();
    v[i] = original - h;
    const double down_value = static_cast<double>(v[i]);
    const double down = loss();
    v[i] = original;
    g[i] = (up - down) / (up_value - down_value);
  }
  return g;
}

/// The analytic gradient agrees with the finite differences to ~1e-2 (float kernels).
void check_gradient(const std::vector<float>& analytic, const std::vector<double>& numeric,
                    const std::string& what) {
  check_close(analytic, numeric, 1e-2, 1e-2, what);
}

/// A layer's three gradients (data, weight, bias) against central differences of `loss`.
template <class Loss>
void check_layer_gradients(const std::vector<float>& dx, const std::vector<float>& dw,
                           const std::vector<float>& dbias, std::vector<float>& x,
                           std::vector<float>& w, std::vector<float>& bias, Loss loss,
                           const std::string& what) {
  check_gradient(dx, numeric_gradient(x, 1e-2f, loss), what + " dx");
  check_gradient(dw, numeric_gradient(w, 1e-2f, loss), what + " dw");
  check_gradient(dbias, numeric_gradient(bias, 1e-2f, loss), what + " dbias");
}

/// pre + delta, the expected result of an accumulating backward.
std::vector<double> plus(const std::vector<float>& pre, const std::vector<float>& delta) {
  std::vector<double> r(pre.size());
  for (std::size_t i = 0; i < pre.size(); ++i)
    r[i] = static_cast<double>(pre[i]) + static_cast<double>(delta[i]);
  return r;
}

// ---------------------------------------------------------------------------------------------
// activations

double activation_reference(cpu::activation_kind kind, double x) {
  switch (kind) {
  case cpu::activation_kind::relu:
    return x > 0 ? x : 0.0;
  case cpu::activation_kind::sigmoid:
    return 1.0 / (1.0 + std::exp(-x));
  case cpu::activation_kind::tanh:
    return std::tanh(x);
  case cpu::activation_kind::softrelu:
    return std::max(x, 0.0) + std::log1p(std::exp(-std::abs(x)));
  }
  return 0.0;
}

// ---------------------------------------------------------------------------------------------
// fully connected

std::vector<double> fc_reference(const std::vector<float>& x, const std::vector<float>& w,
                                 const float* bias, const fc_shape& s) {
  std::vector<double> y(s.batch * s.out);
  for (std::size_t b = 0; b < s.batch; ++b)
    for (std::size_t o = 0; o < s.out; ++o) {
      double acc = bias ? static_cast<double>(bias[o]) : 0.0;
      for (std::size_t i = 0; i < s.in; ++i)
        acc += static_cast<double>(x[b * s.in + i]) * static_cast<double>(w[o * s.in + i]);
      y[b * s.out + o] = acc;
    }
  return y;
}

// ---------------------------------------------------------------------------------------------
// convolution

/// Input position (ih, iw) of output (oh, ow) and kernel tap (ki, kj); false in the padding.
bool input_position(const cpu::image_shape& in, const cpu::window_2d& w, std::size_t oh,
                    std::size_t ow, std::size_t ki, std::size_t kj, std::size_t& ih,
                    std::size_t& iw) {
  const auto h = static_cast<long long>(oh * w.stride_h + ki) - static_cast<long long>(w.pad_h);
  const auto v = static_cast<long long>(ow * w.stride_w + kj) - static_cast<long long>(w.pad_w);
  if (h < 0 || v < 0 || h >= static_cast<long long>(in.height) ||
      v >= static_cast<long long>(in.width))
    return false;
  ih = static_cast<std::size_t>(h);
  iw = static_cast<std::size_t>(v);
  return true;
}

std::vector<double> conv_reference(const std::vector<float>& x, const std::vector<float>& w,
                                   const float* bias, const conv_case& c) {
  const auto& in = c.in;
  const std::size_t oh_n = out_h(in, c.win), ow_n = out_w(in, c.win);
  const std::size_t kh = c.win.kernel_h, kw = c.win.kernel_w;
  std::vector<double> y(y_size(c));
  for (std::size_t n = 0; n < in.batch; ++n)
    for (std::size_t f = 0; f < c.filters; ++f)
      for (std::size_t oh = 0; oh < oh_n; ++oh)
        for (std::size_t ow = 0; ow < ow_n; ++ow) {
          double acc = bias ? static_cast<double>(bias[f]) : 0.0;
          for (std::size_t ch = 0; ch < in.channels; ++ch)
            for (std::size_t ki = 0; ki < kh; ++ki)
              for (std::size_t kj = 0; kj < kw; ++kj) {
                std::size_t ih = 0, iw = 0;
                if (!input_position(in, c.win, oh, ow, ki, kj, ih, iw))
                  continue;
                acc += static_cast<double>(
                           x[((n * in.channels + ch) * in.height + ih) * in.width + iw]) *
                       static_cast<double>(w[((f * in.channels + ch) * kh + ki) * kw + kj]);
              }
          y[((n * c.filters + f) * oh_n + oh) * ow_n + ow] = acc;
        }
  return y;
}

struct conv_gradients {
  std::vector<double> dx, dw, dbias;
};

/// The naive backward: every (output, tap) pair scatters its product.
conv_gradients conv_backward_reference(const std::vector<float>& x, const std::vector<float>& w,
                                       const std::vector<float>& dy, const conv_case& c) {
  const auto& in = c.in;
  const std::size_t oh_n = out_h(in, c.win), ow_n = out_w(in, c.win);
  const std::size_t kh = c.win.kernel_h, kw = c.win.kernel_w;
  conv_gradients g{std::vector<double>(x.size()), std::vector<double>(w.size()),
                   std::vector<double>(c.filters)};
  for (std::size_t n = 0; n < in.batch; ++n)
    for (std::size_t f = 0; f < c.filters; ++f)
      for (std::size_t oh = 0; oh < oh_n; ++oh)
        for (std::size_t ow = 0; ow < ow_n; ++ow) {
          const double d = dy[((n * c.filters + f) * oh_n + oh) * ow_n + ow];
          g.dbias[f] += d;
          for (std::size_t ch = 0; ch < in.channels; ++ch)
            for (std::size_t ki = 0; ki < kh; ++ki)
              for (std::size_t kj = 0; kj < kw; ++kj) {
                std::size_t ih = 0, iw = 0;
                if (!input_position(in, c.win, oh, ow, ki, kj, ih, iw))
                  continue;
                const std::size_t xi = ((n * in.channels + ch) * in.height + ih) * in.width + iw;
                const std::size_t wi = ((f * in.channels + ch) * kh + ki) * kw + kj;
                g.dx[xi] += d * static_cast<double>(w[wi]);
                g.dw[wi] += d * static_cast<double>(x[xi]);
              }
        }
  return g;
}

// Shapes: batch 1 and 3, channels 1 and 3, stride 2 (and 3), padding 1 (and more than the
// kernel), non-square kernels, the 1×1 shortcut and a 1×1 with stride, LeNet's first layer, an
// exact fit and an empty output. Listed big-small-big so the per-thread scratch shrinks and grows.
const conv_case conv_cases[] = {
    {{1, 1, 5, 5}, 1, {3, 3, 1, 1, 0, 0}},   {{3, 3, 7, 6}, 4, {3, 2, 2, 1, 1, 0}},
    {{2, 3, 8, 8}, 5, {1, 1, 1, 1, 0, 0}},   {{1, 2, 5, 5}, 2, {1, 1, 2, 2, 0, 0}},
    {{3, 1, 28, 28}, 6, {5, 5, 1, 1, 2, 2}}, {{1, 3, 6, 7}, 2, {2, 3, 2, 2, 1, 1}},
    {{2, 2, 9, 9}, 3, {3, 3, 2, 2, 1, 1}},   {{1, 1, 3, 3}, 2, {5, 5, 1, 1, 1, 1}},
    {{1, 1, 2, 2}, 1, {5, 5, 1, 1, 1, 1}},   {{3, 3, 4, 5}, 2, {1, 3, 1, 2, 0, 1}},
    {{1, 1, 4, 4}, 1, {2, 2, 1, 1, 3, 3}},   {{2, 1, 6, 5}, 1, {3, 1, 3, 1, 2, 0}},
    {{3, 6, 12, 12}, 16, {5, 5, 1, 1, 0, 0}}};

// Small enough for finite differences over every input, weight and bias.
const conv_case conv_fd_cases[] = {{{1, 1, 4, 4}, 2, {3, 3, 1, 1, 0, 0}},
                                   {{2, 2, 5, 4}, 3, {3, 2, 2, 1, 1, 0}},
                                   {{1, 3, 3, 3}, 2, {1, 1, 1, 1, 0, 0}},
                                   {{3, 1, 5, 5}, 1, {2, 3, 2, 2, 1, 1}},
                                   {{1, 2, 4, 4}, 2, {2, 2, 1, 1, 3, 3}}};

// ---------------------------------------------------------------------------------------------
// pooling

// 2-wide, stride-2 windows without column padding (the common case) have a path of their own.
const pool_case pool_cases[] = {
    {{1, 1, 4, 4}, {2, 2, 2, 2, 0, 0}},   {{3, 3, 7, 7}, {2, 2, 2, 2, 0, 0}},
    {{2, 3, 7, 6}, {3, 3, 2, 2, 1, 1}},   {{1, 1, 5, 6}, {3, 2, 1, 1, 1, 0}},
    {{3, 1, 6, 6}, {6, 6, 1, 1, 0, 0}},   {{1, 2, 5, 5}, {3, 3, 2, 1, 1, 1}},
    {{2, 2, 24, 24}, {2, 2, 2, 2, 0, 0}}, {{1, 3, 5, 4}, {2, 3, 2, 2, 1, 1}},
    {{1, 2, 5, 6}, {3, 2, 2, 2, 1, 0}},   {{1, 1, 2, 2}, {5, 5, 1, 1, 1, 1}}};

const pool_case pool_fd_cases[] = {{{1, 1, 4, 4}, {2, 2, 2, 2, 0, 0}},
                                   {{2, 3, 5, 5}, {3, 3, 2, 2, 1, 1}},
                                   {{3, 1, 4, 5}, {3, 2, 1, 1, 1, 0}},
                                   {{1, 2, 3, 3}, {2, 2, 1, 1, 1, 1}}};

/// Padding is -inf for max (never wins) and 0 counted in the window size for average.
std::vector<double> pool_reference(cpu::pool_kind kind, const std::vector<float>& x,
                                   const pool_case& c) {
  const auto& in = c.in;
  const std::size_t oh_n = out_h(in, c.win), ow_n = out_w(in, c.win);
  std::vector<double> y(y_size(c));
  for (std::size_t p = 0; p < in.batch * in.channels; ++p)
    for (std::size_t oh = 0; oh < oh_n; ++oh)
      for (std::size_t ow = 0; ow < ow_n; ++ow) {
        double best = -inf_d, sum = 0.0;
        for (std::size_t ki = 0; ki < c.win.kernel_h; ++ki)
          for (std::size_t kj = 0; kj < c.win.kernel_w; ++kj) {
            std::size_t ih = 0, iw = 0;
            if (!input_position(in, c.win, oh, ow, ki, kj, ih, iw))
              continue;
            const double v = x[(p * in.height + ih) * in.width + iw];
            best = std::max(best, v);
            sum += v;
          }
        y[(p * oh_n + oh) * ow_n + ow] =
            kind == cpu::pool_kind::max
                ? best
                : sum / static_cast<double>(c.win.kernel_h * c.win.kernel_w);
      }
  return y;
}

/// Max backward by the contract's rule: the first tap (row-major) whose x equals y gets dy.
std::vector<double> max_pool_backward_reference(const std::vector<float>& x,
                                                const std::vector<float>& y,
                                                const std::vector<float>& dy, const pool_case& c) {
  const auto& in = c.in;
  const std::size_t oh_n = out_h(in, c.win), ow_n = out_w(in, c.win);
  std::vector<double> dx(x.size());
  for (std::size_t p = 0; p < in.batch * in.channels; ++p)
    for (std::size_t oh = 0; oh < oh_n; ++oh)
      for (std::size_t ow = 0; ow < ow_n; ++ow) {
        const std::size_t o = (p * oh_n + oh) * ow_n + ow;
        bool done = false;
        for (std::size_t ki = 0; ki < c.win.kernel_h && !done; ++ki)
          for (std::size_t kj = 0; kj < c.win.kernel_w && !done; ++kj) {
            std::size_t ih = 0, iw = 0;
            if (!input_position(in, c.win, oh, ow, ki, kj, ih, iw))
              continue;
            const std::size_t xi = (p * in.height + ih) * in.width + iw;
            if (x[xi] == y[o]) {
              dx[xi] += dy[o];
              done = true;
            }
          }
      }
  return dx;
}

/// Values 0.07 apart in random order: no ties, and no perturbation of 1e-3 changes a maximum.
std::vector<float> distinct_values(std::mt19937_64& rng, std::size_t n) {
  std::vector<float> v(n);
  for (std::size_t i = 0; i < n; ++i)
    v[i] = 0.07f * static_cast<float>(i) - 0.035f * static_cast<float>(n);
  std::shuffle(v.begin(), v.end(), rng);
  return v;
}

// ---------------------------------------------------------------------------------------------
// softmax cross-entropy

struct softmax_reference_result {
  std::vector<double> loss, probabilities;
};

softmax_reference_result softmax_reference(const std::vector<float>& logits,
                                           const std::vector<float>& label, std::size_t batch,
                                           std::size_t classes) {
  softmax_reference_result r{std::vector<double>(batch), std::vector<double>(batch * classes)};
  for (std::size_t b = 0; b < batch; ++b) {
    const float* z = logits.data() + b * classes;
    double m = -inf_d;
    for (std::size_t c = 0; c < classes; ++c)
      m = std::max(m, static_cast<double>(z[c]));
    double s = 0.0;
    for (std::size_t c = 0; c < classes; ++c)
      s += std::exp(static_cast<double>(z[c]) - m);
    for (std::size_t c = 0; c < classes; ++c)
      r.probabilities[b * classes + c] = std::exp(static_cast<double>(z[c]) - m) / s;
    const auto l = static_cast<std::size_t>(label[b]);
    r.loss[b] = std::log(s) - (static_cast<double>(z[l]) - m);
  }
  return r;
}

// ---------------------------------------------------------------------------------------------
// dropout

/// The mask the contract specifies, drawn here independently.
std::vector<float> dropout_mask_reference(std::size_t n, double p, std::uint64_t seed) {
  std::vector<float> mask(n, 1.0f);
  if (p == 0.0)
    return mask;
  std::mt19937_64 engine{seed};
  const auto keep = static_cast<float>(1.0 / (1.0 - p));
  for (auto& m : mask) {
    const double u = static_cast<double>(engine() >> 11) * 0x1.0p-53;
    m = u < p ? 0.0f : keep;
  }
  return mask;
}

} // namespace

BOOST_AUTO_TEST_SUITE(nn)

// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(window_output_extent_follows_mxnet_valid_convention) {
  BOOST_TEST(cpu::window_output_extent(28, 5, 1, 0) == 24u);
  BOOST_TEST(cpu::window_output_extent(28, 5, 1, 2) == 28u);
  BOOST_TEST(cpu::window_output_extent(24, 2, 2, 0) == 12u);
  BOOST_TEST(cpu::window_output_extent(7, 2, 2, 0) == 3u); // floor: the last row is dropped
  BOOST_TEST(cpu::window_output_extent(7, 3, 2, 1) == 4u);
  BOOST_TEST(cpu::window_output_extent(6, 3, 3, 2) == 3u);
  BOOST_TEST(cpu::window_output_extent(1, 1, 1, 0) == 1u);
  BOOST_TEST(cpu::window_output_extent(3, 5, 1, 1) == 1u); // padded input exactly the kernel
  BOOST_TEST(cpu::window_output_extent(4, 5, 1, 0) == 0u); // kernel larger than the input
  BOOST_TEST(cpu::window_output_extent(2, 5, 1, 1) == 0u); // ... than the padded input
  BOOST_TEST(cpu::window_output_extent(0, 1, 1, 0) == 0u);
  BOOST_TEST(cpu::window_output_extent(0, 3, 1, 1) == 0u);
}

// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(activation_forward_matches_the_reference_and_may_run_in_place) {
  for (auto kind : activation_kinds)
    for (std::size_t n : sizes) {
      auto rng = rng_for(101, n);
      const auto x = uniform(rng, n, -8.0f, 8.0f);
      std::vector<double> expected(n);
      for (std::size_t i = 0; i < n; ++i)
        expected[i] = activation_reference(kind, x[i]);
      std::vector<float> y(n, nan_f);
      cpu::activation_forward(kind, x.data(), y.data(), n);
      check_close(y, expected, 1e-5, 1e-6, name_of(kind) + " forward");
      auto in_place = x;
      cpu::activation_forward(kind, in_place.data(), in_place.data(), n);
      check_equal(in_place, y, name_of(kind) + " forward in place");
    }
}

BOOST_AUTO_TEST_CASE(activation_forward_stays_finite_and_exact_at_the_extremes) {
  const std::vector<float> x = {-1e4f, -100.0f, -20.0f, 0.0f, 20.0f, 100.0f, 1e4f};
  for (auto kind : activation_kinds) {
    std::vector<float> y(x.size(), nan_f);
    cpu::activation_forward(kind, x.data(), y.data(), x.size());
    std::vector<double> expected(x.size());
    for (std::size_t i = 0; i < x.size(); ++i) {
      BOOST_TEST(std::isfinite(y[i]), name_of(kind) << "(" << x[i] << ") = " << y[i]);
      expected[i] = activation_reference(kind, x[i]);
    }
    check_close(y, expected, 1e-6, 1e-30, name_of(kind) + " at the extremes");
  }
}

BOOST_AUTO_TEST_CASE(activation_backward_matches_finite_differences) {
  for (auto kind : activation_kinds) {
    auto rng = rng_for(102, static_cast<std::size_t>(kind));
    const std::size_t n = 60;
    // magnitudes >= 0.05 keep relu's kink out of reach of the 1e-3 steps
    auto x = random_nonzero_vector<float>(rng, n, 0.05f, 4.0f);
    const auto dy = uniform(rng, n, -2.0f, 2.0f);
    std::vector<float> y(n), dx(n, nan_f);
    cpu::activation_forward(kind, x.data(), y.data(), n);
    cpu::activation_backward(kind, y.data(), dy.data(), dx.data(), n, write_mode::overwrite);
    std::vector<float> yy(n);
    const auto numeric = numeric_gradient(x, 1e-3f, [&] {
      cpu::activation_forward(kind, x.data(), yy.data(), n);
      return dot(dy, yy);
    });
    check_gradient(dx, numeric, name_of(kind) + " backward");
  }
}

BOOST_AUTO_TEST_CASE(activation_backward_overwrites_or_accumulates) {
  for (auto kind : activation_kinds)
    for (std::size_t n : {std::size_t{0}, std::size_t{1}, std::size_t{7}, std::size_t{1000}}) {
      auto rng = rng_for(103, n);
      const auto x = uniform(rng, n, -4.0f, 4.0f);
      const auto dy = uniform(rng, n, -2.0f, 2.0f);
      const auto pre = uniform(rng, n, -1.0f, 1.0f);
      std::vector<float> y(n);
      cpu::activation_forward(kind, x.data(), y.data(), n);
      std::vector<float> fresh(n, nan_f); // overwrite never reads what is there
      cpu::activation_backward(kind, y.data(), dy.data(), fresh.data(), n, write_mode::overwrite);
      for (float v : fresh)
        BOOST_TEST_REQUIRE(std::isfinite(v));
      auto acc = pre;
      cpu::activation_backward(kind, y.data(), dy.data(), acc.data(), n, write_mode::accumulate);
      check_close(acc, plus(pre, fresh), 1e-6, 1e-6, name_of(kind) + " backward, accumulate");
    }
}

// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(fully_connected_forward_matches_the_reference) {
  const fc_shape shapes[] = {{1, 1, 1}, {3, 7, 5}, {1, 784, 256},  {16, 256, 10}, {5, 33, 17},
                             {0, 4, 3}, {2, 0, 3}, {64, 784, 256}, {3, 10, 1}};
  for (const auto& s : shapes) {
    auto rng = rng_for(201, s.batch * 1000 + s.in * 10 + s.out);
    const auto x = uniform(rng, s.batch * s.in, -1.0f, 1.0f);
    const auto w = uniform(rng, s.out * s.in, -0.5f, 0.5f);
    const auto bias = uniform(rng, s.out, -1.0f, 1.0f);
    for (bool with_bias : {false, true}) {
      const float* b = with_bias ? bias.data() : nullptr;
      std::vector<float> y(s.batch * s.out, nan_f);
      cpu::fully_connected_forward(x.data(), w.data(), b, y.data(), s.batch, s.in, s.out);
      check_close(y, fc_reference(x, w, b, s), 1e-4, 1e-4,
                  describe(s) + (with_bias ? " with bias" : " without bias"));
    }
  }
}

BOOST_AUTO_TEST_CASE(fully_connected_backward_matches_finite_differences) {
  const fc_shape shapes[] = {{1, 1, 1}, {1, 3, 2}, {3, 5, 4}, {4, 2, 6}};
  for (const auto& s : shapes) {
    auto rng = rng_for(202, s.batch * 100 + s.in * 10 + s.out);
    auto x = uniform(rng, s.batch * s.in, -1.0f, 1.0f);
    auto w = uniform(rng, s.out * s.in, -1.0f, 1.0f);
    auto bias = uniform(rng, s.out, -1.0f, 1.0f);
    const auto dy = uniform(rng, s.batch * s.out, -1.0f, 1.0f);
    std::vector<float> dx(x.size(), nan_f), dw(w.size(), nan_f), dbias(s.out, nan_f);
    cpu::fully_connected_backward(x.data(), w.data(), dy.data(), dx.data(), write_mode::overwrite,
                                  dw.data(), write_mode::overwrite, dbias.data(),
                                  write_mode::overwrite, s.batch, s.in, s.out);
    std::vector<float> y(s.batch * s.out);
    const auto loss = [&] {
      cpu::fully_connected_forward(x.data(), w.data(), bias.data(), y.data(), s.batch, s.in, s.out);
      return dot(dy, y);
    };
    check_layer_gradients(dx, dw, dbias, x, w, bias, loss, describe(s));
  }
}

BOOST_AUTO_TEST_CASE(fully_connected_backward_accumulates_and_skips_null_gradients) {
  const fc_shape shapes[] = {{3, 7, 5}, {64, 784, 256}, {0, 4, 3}, {2, 0, 3}};
  for (const auto& s : shapes) {
    auto rng = rng_for(203, s.batch * 1000 + s.in * 10 + s.out);
    const auto x = uniform(rng, s.batch * s.in, -1.0f, 1.0f);
    const auto w = uniform(rng, s.out * s.in, -1.0f, 1.0f);
    const auto dy = uniform(rng, s.batch * s.out, -1.0f, 1.0f);
    // overwrite into NaN garbage: the reference values for everything below
    std::vector<float> dx(x.size(), nan_f), dw(w.size(), nan_f), dbias(s.out, nan_f);
    cpu::fully_connected_backward(x.data(), w.data(), dy.data(), dx.data(), write_mode::overwrite,
                                  dw.data(), write_mode::overwrite, dbias.data(),
                                  write_mode::overwrite, s.batch, s.in, s.out);
    // dx = dy·w, dw = dyᵀ·x, dbias = Σ rows: checked against the naive products
    std::vector<double> ex(dx.size()), ew(dw.size()), eb(s.out);
    for (std::size_t b = 0; b < s.batch; ++b)
      for (std::size_t o = 0; o < s.out; ++o) {
        const double d = dy[b * s.out + o];
        eb[o] += d;
        for (std::size_t i = 0; i < s.in; ++i) {
          ex[b * s.in + i] += d * static_cast<double>(w[o * s.in + i]);
          ew[o * s.in + i] += d * static_cast<double>(x[b * s.in + i]);
        }
      }
    check_close(dx, ex, 1e-4, 1e-4, describe(s) + " dx");
    check_close(dw, ew, 1e-4, 1e-4, describe(s) + " dw");
    check_close(dbias, eb, 1e-4, 1e-4, describe(s) + " dbias");

    // accumulate, each gradient with its own mode
    const auto pre_x = uniform(rng, dx.size(), -1.0f, 1.0f);
    const auto pre_w = uniform(rng, dw.size(), -1.0f, 1.0f);
    const auto pre_b = uniform(rng, dbias.size(), -1.0f, 1.0f);
    auto ax = pre_x, aw = pre_w, ab = pre_b;
    cpu::fully_connected_backward(x.data(), w.data(), dy.data(), ax.data(), write_mode::accumulate,
                                  aw.data(), write_mode::accumulate, ab.data(),
                                  write_mode::accumulate, s.batch, s.in, s.out);
    check_close(ax, plus(pre_x, dx), 1e-5, 1e-5, describe(s) + " dx accumulate");
    check_close(aw, plus(pre_w, dw), 1e-5, 1e-5, describe(s) + " dw accumulate");
    check_close(ab, plus(pre_b, dbias), 1e-5, 1e-5, describe(s) + " dbias accumulate");
    auto mx = pre_x, mw = std::vector<float>(dw.size(), nan_f), mb = pre_b;
    cpu::fully_connected_backward(x.data(), w.data(), dy.data(), mx.data(), write_mode::accumulate,
                                  mw.data(), write_mode::overwrite, mb.data(),
                                  write_mode::accumulate, s.batch, s.in, s.out);
    check_close(mx, plus(pre_x, dx), 1e-5, 1e-5, describe(s) + " dx accumulate (mixed)");
    check_equal(mw, dw, describe(s) + " dw overwrite (mixed)");
    check_close(mb, plus(pre_b, dbias), 1e-5, 1e-5, describe(s) + " dbias accumulate (mixed)");

    // each gradient alone: the others are null and must be skipped
    std::vector<float> only(dx.size(), nan_f);
    cpu::fully_connected_backward(x.data(), w.data(), dy.data(), only.data(), write_mode::overwrite,
                                  nullptr, write_mode::overwrite, nullptr, write_mode::overwrite,
                                  s.batch, s.in, s.out);
    check_equal(only, dx, describe(s) + " dx alone");
    only.assign(dw.size(), nan_f);
    cpu::fully_connected_backward(x.data(), w.data(), dy.data(), nullptr, write_mode::overwrite,
                                  only.data(), write_mode::overwrite, nullptr,
                                  write_mode::overwrite, s.batch, s.in, s.out);
    check_equal(only, dw, describe(s) + " dw alone");
    only.assign(dbias.size(), nan_f);
    cpu::fully_connected_backward(x.data(), w.data(), dy.data(), nullptr, write_mode::overwrite,
                                  nullptr, write_mode::overwrite, only.data(),
                                  write_mode::overwrite, s.batch, s.in, s.out);
    check_equal(only, dbias, describe(s) + " dbias alone");
    cpu::fully_connected_backward(x.data(), w.data(), dy.data(), nullptr, write_mode::overwrite,
                                  nullptr, write_mode::overwrite, nullptr, write_mode::overwrite,
                                  s.batch, s.in, s.out);
  }
}

// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(convolution_forward_matches_a_naive_convolution) {
  std::size_t index = 0;
  for (const auto& c : conv_cases) {
    auto rng = rng_for(301, index++);
    const auto x = uniform(rng, x_size(c.in), -1.0f, 1.0f);
    const auto w = uniform(rng, w_size(c), -1.0f, 1.0f);
    const auto bias = uniform(rng, c.filters, -1.0f, 1.0f);
    for (bool with_bias : {false, true}) {
      const float* b = with_bias ? bias.data() : nullptr;
      std::vector<float> y(y_size(c), nan_f);
      cpu::convolution_forward(x.data(), w.data(), b, y.data(), c.in, c.filters, c.win);
      check_close(y, conv_reference(x, w, b, c), 1e-4, 1e-4,
                  describe(c) + (with_bias ? " with bias" : " without bias"));
    }
  }
}

BOOST_AUTO_TEST_CASE(convolution_backward_matches_finite_differences) {
  std::size_t index = 0;
  for (const auto& c : conv_fd_cases) {
    auto rng = rng_for(302, index++);
    auto x = uniform(rng, x_size(c.in), -1.0f, 1.0f);
    auto w = uniform(rng, w_size(c), -1.0f, 1.0f);
    auto bias = uniform(rng, c.filters, -1.0f, 1.0f);
    const auto dy = uniform(rng, y_size(c), -1.0f, 1.0f);
    BOOST_TEST_REQUIRE(!dy.empty());
    std::vector<float> dx(x.size(), nan_f), dw(w.size(), nan_f), dbias(c.filters, nan_f);
    cpu::convolution_backward(x.data(), w.data(), dy.data(), dx.data(), write_mode::overwrite,
                              dw.data(), write_mode::overwrite, dbias.data(), write_mode::overwrite,
                              c.in, c.filters, c.win);
    std::vector<float> y(dy.size());
    const auto loss = [&] {
      cpu::convolution_forward(x.data(), w.data(), bias.data(), y.data(), c.in, c.filters, c.win);
      return dot(dy, y);
    };
    check_layer_gradients(dx, dw, dbias, x, w, bias, loss, describe(c));
  }
}

BOOST_AUTO_TEST_CASE(convolution_backward_matches_a_naive_backward_accumulates_and_skips_nulls) {
  std::size_t index = 0;
  for (const auto& c : conv_cases) {
    auto rng = rng_for(303, index++);
    const auto x = uniform(rng, x_size(c.in), -1.0f, 1.0f);
    const auto w = uniform(rng, w_size(c), -1.0f, 1.0f);
    const auto dy = uniform(rng, y_size(c), -1.0f, 1.0f);
    std::vector<float> dx(x.size(), nan_f), dw(w.size(), nan_f), dbias(c.filters, nan_f);
    cpu::convolution_backward(x.data(), w.data(), dy.data(), dx.data(), write_mode::overwrite,
                              dw.data(), write_mode::overwrite, dbias.data(), write_mode::overwrite,
                              c.in, c.filters, c.win);
    // an empty output (kernel larger than the padded input) overwrites every gradient with 0
    const auto expected = conv_backward_reference(x, w, dy, c);
    check_close(dx, expected.dx, 1e-4, 1e-4, describe(c) + " dx");
    check_close(dw, expected.dw, 1e-4, 1e-4, describe(c) + " dw");
    check_close(dbias, expected.dbias, 1e-4, 1e-4, describe(c) + " dbias");

    const auto pre_x = uniform(rng, dx.size(), -1.0f, 1.0f);
    const auto pre_w = uniform(rng, dw.size(), -1.0f, 1.0f);
    const auto pre_b = uniform(rng, dbias.size(), -1.0f, 1.0f);
    auto ax = pre_x, aw = pre_w, ab = pre_b;
    cpu::convolution_backward(x.data(), w.data(), dy.data(), ax.data(), write_mode::accumulate,
                              aw.data(), write_mode::accumulate, ab.data(), write_mode::accumulate,
                              c.in, c.filters, c.win);
    check_close(ax, plus(pre_x, dx), 1e-5, 1e-5, describe(c) + " dx accumulate");
    check_close(aw, plus(pre_w, dw), 1e-5, 1e-5, describe(c) + " dw accumulate");
    check_close(ab, plus(pre_b, dbias), 1e-5, 1e-5, describe(c) + " dbias accumulate");
    auto mx = std::vector<float>(dx.size(), nan_f), mw = pre_w,
         mb = std::vector<float>(dbias.size(), nan_f);
    cpu::convolution_backward(x.data(), w.data(), dy.data(), mx.data(), write_mode::overwrite,
                              mw.data(), write_mode::accumulate, mb.data(), write_mode::overwrite,
                              c.in, c.filters, c.win);
    check_equal(mx, dx, describe(c) + " dx overwrite (mixed)");
    check_close(mw, plus(pre_w, dw), 1e-5, 1e-5, describe(c) + " dw accumulate (mixed)");
    check_equal(mb, dbias, describe(c) + " dbias overwrite (mixed)");

    std::vector<float> only(dx.size(), nan_f);
    cpu::convolution_backward(x.data(), w.data(), dy.data(), only.data(), write_mode::overwrite,
                              nullptr, write_mode::overwrite, nullptr, write_mode::overwrite, c.in,
                              c.filters, c.win);
    check_equal(only, dx, describe(c) + " dx alone");
    only.assign(dw.size(), nan_f);
    cpu::convolution_backward(x.data(), w.data(), dy.data(), nullptr, write_mode::overwrite,
                              only.data(), write_mode::overwrite, nullptr, write_mode::overwrite,
                              c.in, c.filters, c.win);
    check_equal(only, dw, describe(c) + " dw alone");
    only.assign(dbias.size(), nan_f);
    cpu::convolution_backward(x.data(), w.data(), dy.data(), nullptr, write_mode::overwrite,
                              nullptr, write_mode::overwrite, only.data(), write_mode::overwrite,
                              c.in, c.filters, c.win);
    check_equal(only, dbias, describe(c) + " dbias alone");
    cpu::convolution_backward(x.data(), w.data(), dy.data(), nullptr, write_mode::overwrite,
                              nullptr, write_mode::overwrite, nullptr, write_mode::overwrite, c.in,
                              c.filters, c.win);
  }
}

BOOST_AUTO_TEST_CASE(convolution_with_an_empty_batch_overwrites_weight_gradients_with_zero) {
  const conv_case c{{0, 2, 5, 5}, 3, {3, 3, 1, 1, 1, 1}};
  std::vector<float> dw(w_size(c), nan_f), dbias(c.filters, nan_f);
  const std::vector<float> w(w_size(c), 1.0f);
  cpu::convolution_backward(nullptr, w.data(), nullptr, nullptr, write_mode::overwrite, dw.data(),
                            write_mode::overwrite, dbias.data(), write_mode::overwrite, c.in,
                            c.filters, c.win);
  check_equal(dw, std::vector<float>(dw.size(), 0.0f), "dw of an empty batch");
  check_equal(dbias, std::vector<float>(dbias.size(), 0.0f), "dbias of an empty batch");
}

// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(pooling_forward_matches_a_naive_pooling) {
  for_each_pooling_input(pool_cases, 401,
                         [](cpu::pool_kind kind, const pool_case& c, const std::vector<float>& x,
                            std::mt19937_64&, const std::string& what) {
                           std::vector<float> y(y_size(c), nan_f);
                           cpu::pooling_forward(kind, x.data(), y.data(), c.in, c.win);
                           check_close(y, pool_reference(kind, x, c), 1e-6, 1e-6, what);
                         });
}

BOOST_AUTO_TEST_CASE(pooling_backward_matches_finite_differences) {
  for (auto kind : pool_kinds) {
    std::size_t index = 0;
    for (const auto& c : pool_fd_cases) {
      auto rng = rng_for(402, index++);
      auto x = distinct_values(rng, x_size(c.in));
      const auto dy = uniform(rng, y_size(c), -1.0f, 1.0f);
      std::vector<float> y(dy.size()), dx(x.size(), nan_f);
      cpu::pooling_forward(kind, x.data(), y.data(), c.in, c.win);
      cpu::pooling_backward(kind, x.data(), y.data(), dy.data(), dx.data(), write_mode::overwrite,
                            c.in, c.win);
      std::vector<float> yy(dy.size());
      const auto numeric = numeric_gradient(x, 1e-3f, [&] {
        cpu::pooling_forward(kind, x.data(), yy.data(), c.in, c.win);
        return dot(dy, yy);
      });
      check_gradient(dx, numeric, describe(kind, c) + " dx");
    }
  }
}

BOOST_AUTO_TEST_CASE(max_pooling_backward_sends_dy_to_the_first_maximum_of_its_window) {
  // hand-worked: a 2×3 plane of equal values, 2×2 windows with stride 1 (two overlapping
  // windows): each dy lands on its window's top-left element
  {
    const cpu::image_shape in{1, 1, 2, 3};
    const cpu::window_2d win{2, 2, 1, 1, 0, 0};
    const std::vector<float> x(6, 1.0f), y = {1.0f, 1.0f}, dy = {10.0f, 100.0f};
    std::vector<float> dx(6, nan_f);
    cpu::pooling_backward(cpu::pool_kind::max, x.data(), y.data(), dy.data(), dx.data(),
                          write_mode::overwrite, in, win);
    check_equal(dx, std::vector<float>{10, 100, 0, 0, 0, 0}, "ties, hand-worked");
  }
  // hand-worked: padding never wins even though every value is negative; windows of a 2×2
  // plane padded by 1 with a 2×2 kernel see one real element at each corner
  {
    const cpu::image_shape in{1, 1, 2, 2};
    const cpu::window_2d win{2, 2, 1, 1, 1, 1};
    const std::vector<float> x = {-4, -3, -2, -1};
    std::vector<float> y(9, nan_f);
    cpu::pooling_forward(cpu::pool_kind::max, x.data(), y.data(), in, win);
    check_equal(y, std::vector<float>{-4, -3, -3, -2, -1, -1, -2, -1, -1}, "padded max forward");
    const std::vector<float> dy = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    std::vector<float> dx(4, nan_f);
    cpu::pooling_backward(cpu::pool_kind::max, x.data(), y.data(), dy.data(), dx.data(),
                          write_mode::overwrite, in, win);
    check_equal(dx, std::vector<float>{1, 2 + 3, 4 + 7, 5 + 6 + 8 + 9}, "padded max backward");
  }
  // many ties, every shape, against the rule written out naively
  std::size_t index = 0;
  for (const auto& c : pool_cases) {
    auto rng = rng_for(403, index++);
    const auto x = tied_values(rng, x_size(c.in));
    const auto dy = uniform(rng, y_size(c), -1.0f, 1.0f);
    std::vector<float> y(dy.size(), nan_f), dx(x.size(), nan_f);
    cpu::pooling_forward(cpu::pool_kind::max, x.data(), y.data(), c.in, c.win);
    cpu::pooling_backward(cpu::pool_kind::max, x.data(), y.data(), dy.data(), dx.data(),
                          write_mode::overwrite, c.in, c.win);
    check_close(dx, max_pool_backward_reference(x, y, dy, c), 1e-6, 1e-6,
                describe(cpu::pool_kind::max, c) + " with ties");
  }
}

BOOST_AUTO_TEST_CASE(pooling_backward_overwrites_or_accumulates) {
  for (auto kind : pool_kinds) {
    std::size_t index = 0;
    for (const auto& c : pool_cases) {
      auto rng = rng_for(404, index++);
      const auto x = uniform(rng, x_size(c.in), -2.0f, 2.0f);
      const auto dy = uniform(rng, y_size(c), -1.0f, 1.0f);
      std::vector<float> y(dy.size(), nan_f), dx(x.size(), nan_f);
      cpu::pooling_forward(kind, x.data(), y.data(), c.in, c.win);
      cpu::pooling_backward(kind, x.data(), y.data(), dy.data(), dx.data(), write_mode::overwrite,
                            c.in, c.win);
      if (kind == cpu::pool_kind::max)
        check_close(dx, max_pool_backward_reference(x, y, dy, c), 1e-6, 1e-6,
                    describe(kind, c) + " overwrite");
      const auto pre = uniform(rng, x.size(), -1.0f, 1.0f);
      auto acc = pre;
      cpu::pooling_backward(kind, x.data(), y.data(), dy.data(), acc.data(), write_mode::accumulate,
                            c.in, c.win);
      check_close(acc, plus(pre, dx), 1e-5, 1e-5, describe(kind, c) + " accumulate");
    }
  }
}

// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(softmax_cross_entropy_forward_matches_the_reference) {
  const std::size_t batches[] = {1, 3, 64};
  const std::size_t class_counts[] = {1, 2, 10, 1000};
  for (std::size_t batch : batches)
    for (std::size_t classes : class_counts) {
      auto rng = rng_for(501, batch * 10000 + classes);
      const auto logits = uniform(rng, batch * classes, -10.0f, 10.0f);
      const auto label = random_labels(rng, batch, classes);
      std::vector<float> loss(batch, nan_f), probabilities(batch * classes, nan_f);
      cpu::softmax_cross_entropy_forward(logits.data(), label.data(), loss.data(),
                                         probabilities.data(), batch, classes);
      const auto expected = softmax_reference(logits, label, batch, classes);
      const std::string what =
          "softmax CE " + std::to_string(batch) + "x" + std::to_string(classes);
      check_close(loss, expected.loss, 1e-5, 1e-5, what + " loss");
      check_close(probabilities, expected.probabilities, 1e-5, 1e-7, what + " probabilities");
    }
}

BOOST_AUTO_TEST_CASE(softmax_cross_entropy_stays_finite_on_huge_logits) {
  const std::size_t batch = 3, classes = 4;
  const std::vector<float> logits = {1e4f,  -1e4f, 0.0f,  9998.0f, // label 1: loss 2e4
                                     -1e4f, -1e4f, -1e4f, -1e4f,   // uniform
                                     3e4f,  1e4f,  -3e4f, 2.9999e4f};
  const std::vector<float> label = {1, 2, 0};
  std::vector<float> loss(batch, nan_f), probabilities(batch * classes, nan_f);
  cpu::softmax_cross_entropy_forward(logits.data(), label.data(), loss.data(), probabilities.data(),
                                     batch, classes);
  for (float v : loss)
    BOOST_TEST(std::isfinite(v));
  for (float v : probabilities)
    BOOST_TEST(std::isfinite(v));
  const auto expected = softmax_reference(logits, label, batch, classes);
  check_close(loss, expected.loss, 1e-6, 1e-6, "huge logits loss");
  check_close(probabilities, expected.probabilities, 1e-6, 1e-7, "huge logits probabilities");
  BOOST_TEST(std::abs(loss[1] - std::log(4.0)) < 1e-6);
  std::vector<float> dlogits(batch * classes, nan_f);
  const std::vector<float> dloss(batch, 1.0f);
  cpu::softmax_cross_entropy_backward(probabilities.data(), label.data(), dloss.data(),
                                      dlogits.data(), write_mode::overwrite, batch, classes);
  for (float v : dlogits)
    BOOST_TEST(std::isfinite(v));
}

BOOST_AUTO_TEST_CASE(softmax_cross_entropy_backward_matches_finite_differences) {
  const std::size_t shapes[][2] = {{1, 1}, {1, 2}, {3, 5}, {4, 10}};
  for (const auto& shape : shapes) {
    const std::size_t batch = shape[0], classes = shape[1];
    auto rng = rng_for(502, batch * 100 + classes);
    auto logits = uniform(rng, batch * classes, -3.0f, 3.0f);
    const auto label = random_labels(rng, batch, classes);
    const auto dloss = uniform(rng, batch, -2.0f, 2.0f);
    std::vector<float> loss(batch), probabilities(batch * classes);
    cpu::softmax_cross_entropy_forward(logits.data(), label.data(), loss.data(),
                                       probabilities.data(), batch, classes);
    std::vector<float> dlogits(logits.size(), nan_f);
    cpu::softmax_cross_entropy_backward(probabilities.data(), label.data(), dloss.data(),
                                        dlogits.data(), write_mode::overwrite, batch, classes);
    std::vector<float> l2(batch), p2(batch * classes);
    const auto numeric = numeric_gradient(logits, 1e-2f, [&] {
      cpu::softmax_cross_entropy_forward(logits.data(), label.data(), l2.data(), p2.data(), batch,
                                         classes);
      return dot(dloss, l2);
    });
    const std::string what = "softmax CE " + std::to_string(batch) + "x" + std::to_string(classes);
    check_gradient(dlogits, numeric, what + " dlogits");

    const auto pre = uniform(rng, logits.size(), -1.0f, 1.0f);
    auto acc = pre;
    cpu::softmax_cross_entropy_backward(probabilities.data(), label.data(), dloss.data(),
                                        acc.data(), write_mode::accumulate, batch, classes);
    check_close(acc, plus(pre, dlogits), 1e-5, 1e-5, what + " dlogits accumulate");
  }
}

// ---------------------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(dropout_mask_is_the_specified_draw_and_reproduces_per_seed) {
  const std::size_t n = 1000;
  auto rng = rng_for(601, n);
  const auto x = uniform(rng, n, -2.0f, 2.0f);
  for (double p : {0.1, 0.5, 0.75}) {
    std::vector<float> y1(n, nan_f), m1(n, nan_f), y2(n, nan_f), m2(n, nan_f), y3(n), m3(n);
    cpu::dropout_forward(x.data(), y1.data(), m1.data(), n, p, 42);
    cpu::dropout_forward(x.data(), y2.data(), m2.data(), n, p, 42);
    cpu::dropout_forward(x.data(), y3.data(), m3.data(), n, p, 43);
    check_equal(m1, m2, "same seed, same mask");
    check_equal(y1, y2, "same seed, same output");
    BOOST_TEST((m1 != m3), "another seed draws another mask (p = " << p << ")");
    check_equal(m1, dropout_mask_reference(n, p, 42), "mask of seed 42");
    check_equal(m3, dropout_mask_reference(n, p, 43), "mask of seed 43");
    std::vector<float> expected(n);
    for (std::size_t i = 0; i < n; ++i)
      expected[i] = x[i] * m1[i];
    check_equal(y1, expected, "y = x · mask");
  }
}

BOOST_AUTO_TEST_CASE(dropout_drops_a_fraction_p_and_scales_the_rest_by_one_over_one_minus_p) {
  const std::size_t n = 100000;
  const std::vector<float> x(n, 1.0f);
  for (double p : {0.1, 0.3, 0.5, 0.9}) {
    std::vector<float> y(n), mask(n);
    cpu::dropout_forward(x.data(), y.data(), mask.data(), n, p, 7);
    const auto keep = static_cast<float>(1.0 / (1.0 - p));
    std::size_t zeros = 0, others = 0;
    for (float m : mask) {
      if (m == 0.0f)
        ++zeros;
      else if (m != keep)
        ++others;
    }
    const double fraction = static_cast<double>(zeros) / static_cast<double>(n);
    // the standard deviation of the fraction is at most 0.0016 here: 0.01 is over 6 of them
    BOOST_TEST(std::abs(fraction - p) < 0.01, "p = " << p << ", dropped " << fraction);
    BOOST_TEST(others == 0u,
               "p = " << p << ": " << others << " kept values not scaled by " << keep);
  }
}

BOOST_AUTO_TEST_CASE(dropout_with_p_zero_keeps_everything) {
  const std::size_t n = 1001;
  auto rng = rng_for(603, n);
  const auto x = uniform(rng, n, -2.0f, 2.0f);
  std::vector<float> y(n, nan_f), mask(n, nan_f);
  cpu::dropout_forward(x.data(), y.data(), mask.data(), n, 0.0, 9);
  check_equal(mask, std::vector<float>(n, 1.0f), "mask at p = 0");
  check_equal(y, x, "y at p = 0");
}

BOOST_AUTO_TEST_CASE(dropout_backward_matches_finite_differences_and_accumulates) {
  const std::size_t n = 200;
  auto rng = rng_for(604, n);
  auto x = uniform(rng, n, -2.0f, 2.0f);
  const auto dy = uniform(rng, n, -1.0f, 1.0f);
  std::vector<float> y(n), mask(n), dx(n, nan_f);
  cpu::dropout_forward(x.data(), y.data(), mask.data(), n, 0.4, 11);
  cpu::dropout_backward(mask.data(), dy.data(), dx.data(), n, write_mode::overwrite);
  std::vector<float> yy(n), mm(n);
  const auto numeric = numeric_gradient(x, 1e-2f, [&] {
    cpu::dropout_forward(x.data(), yy.data(), mm.data(), n, 0.4, 11);
    return dot(dy, yy);
  });
  check_gradient(dx, numeric, "dropout dx");
  std::vector<double> exact(n);
  for (std::size_t i = 0; i < n; ++i)
    exact[i] = static_cast<double>(dy[i] * mask[i]);
  check_close(dx, exact, 0.0, 0.0, "dropout dx = dy · mask");
  const auto pre = uniform(rng, n, -1.0f, 1.0f);
  auto acc = pre;
  cpu::dropout_backward(mask.data(), dy.data(), acc.data(), n, write_mode::accumulate);
  check_close(acc, plus(pre, dx), 1e-6, 1e-6, "dropout dx accumulate");
}

BOOST_AUTO_TEST_SUITE_END()
