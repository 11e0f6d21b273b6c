#pragma once
// Shared by the CPU and GPU layer tests (nn_test.cpp, cuda_nn_test.cpp): the layers' kinds and
// names, the shapes of their cases with the sizes derived from them and the words that describe
// them in a failure, and the seeded inputs both draw.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/nn.hpp"
#include "tests/kernels/kernels_test_support.hpp"

namespace troupe::kernels::testing {

inline constexpr float nan_f = std::numeric_limits<float>::quiet_NaN();

inline std::vector<float> uniform(std::mt19937_64& rng, std::size_t n, float lo, float hi) {
  return random_vector<float>(rng, n, lo, hi);
}

/// `batch` labels, each a class index in [0, classes) stored as a float.
inline std::vector<float> random_labels(std::mt19937_64& rng, std::size_t batch,
                                        std::size_t classes) {
  std::uniform_int_distribution<std::size_t> pick{0, classes - 1};
  std::vector<float> label(batch);
  for (auto& l : label)
    l = static_cast<float>(pick(rng));
  return label;
}

// ---------------------------------------------------------------------------------------------
// activations

inline constexpr cpu::activation_kind activation_kinds[] = {
    cpu::activation_kind::relu, cpu::activation_kind::sigmoid, cpu::activation_kind::tanh,
    cpu::activation_kind::softrelu};

inline std::string name_of(cpu::activation_kind kind) {
  switch (kind) {
  case cpu::activation_kind::relu:
    return "relu";
  case cpu::activation_kind::sigmoid:
    return "sigmoid";
  case cpu::activation_kind::tanh:
    return "tanh";
  case cpu::activation_kind::softrelu:
    return "softrelu";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// fully connected

struct fc_shape {
  std::size_t batch, in, out;
};

inline std::string describe(const fc_shape& s) {
  return "fc " + std::to_string(s.batch) + "x" + std::to_string(s.in) + "->" +
         std::to_string(s.out);
}

// ---------------------------------------------------------------------------------------------
// convolution and pooling

struct conv_case {
  cpu::image_shape in;
  std::size_t filters;
  cpu::window_2d win;
};

struct pool_case {
  cpu::image_shape in;
  cpu::window_2d win;
};

inline constexpr cpu::pool_kind pool_kinds[] = {cpu::pool_kind::max, cpu::pool_kind::average};

inline std::size_t out_h(const cpu::image_shape& in, const cpu::window_2d& w) {
  return cpu::window_output_extent(in.height, w.kernel_h, w.stride_h, w.pad_h);
}
inline std::size_t out_w(const cpu::image_shape& in, const cpu::window_2d& w) {
  return cpu::window_output_extent(in.width, w.kernel_w, w.stride_w, w.pad_w);
}
inline std::size_t x_size(const cpu::image_shape& in) {
  return in.batch * in.channels * in.height * in.width;
}
inline std::size_t w_size(const conv_case& c) {
  return c.filters * c.in.channels * c.win.kernel_h * c.win.kernel_w;
}
inline std::size_t y_size(const conv_case& c) {
  return c.in.batch * c.filters * out_h(c.in, c.win) * out_w(c.in, c.win);
}
inline std::size_t y_size(const pool_case& c) {
  return c.in.batch * c.in.channels * out_h(c.in, c.win) * out_w(c.in, c.win);
}

inline std::string describe(const cpu::image_shape& in, const cpu::window_2d& w) {
  return "x " + std::to_string(in.batch) + "x" + std::to_string(in.channels) + "x" +
         std::to_string(in.height) + "x" + std::to_string(in.width) + ", kernel " +
         std::to_string(w.kernel_h) + "x" + std::to_string(w.kernel_w) + ", stride " +
         std::to_string(w.stride_h) + "x" + std::to_string(w.stride_w) + ", pad " +
         std::to_string(w.pad_h) + "x" + std::to_string(w.pad_w);
}
inline std::string describe(const conv_case& c) {
  return "conv " + describe(c.in, c.win) + ", filters " + std::to_string(c.filters);
}
inline std::string describe(cpu::pool_kind kind, const pool_case& c) {
  return std::string(kind == cpu::pool_kind::max ? "max" : "average") + " pool " +
         describe(c.in, c.win);
}

/// Calls check(kind, c, x, rng, what) for every pool kind and every case c of `cases`, twice:
/// on inputs x in [-3, 3], then on all-negative ones in [-5, -1], where a max that let padding
/// (0) win, or an average that left padding out of the window size, would show. Each x is drawn
/// from its own rng_for(seed, i), i counting the inputs of one kind; `what` describes the input.
template <class Cases, class Check>
void for_each_pooling_input(const Cases& cases, std::uint64_t seed, Check check) {
  for (auto kind : pool_kinds) {
    std::size_t index = 0;
    for (const pool_case& c : cases)
      for (float lo : {-3.0f, -5.0f}) {
        auto rng = rng_for(seed, index++);
        const float hi = lo < -4.0f ? -1.0f : 3.0f;
        const auto x = uniform(rng, x_size(c.in), lo, hi);
        check(kind, c, x, rng, describe(kind, c) + (hi < 0 ? " (all negative)" : ""));
      }
  }
}

/// n pooling inputs with many ties: values from {-2, -1, 0}, so that the padding's 0 would tie
/// with real maxima.
inline std::vector<float> tied_values(std::mt19937_64& rng, std::size_t n) {
  auto x = uniform(rng, n, 0.0f, 3.0f);
  for (auto& v : x)
    v = std::floor(v) - 2.0f;
  return x;
}

} // namespace troupe::kernels::testing
