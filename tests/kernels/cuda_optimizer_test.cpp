// kernels/cuda/optimizer.hpp. With a GPU, every rule is checked against the CPU rule of
// kernels/cpu/optimizer_rules.hpp (itself checked against MXNet's formulas in
// optimizer_rules_test.cpp) in float32, float16 and float16 with a float32 master copy, step by
// step: each step's reference starts from the state the GPU reached, so that a step's tolerance
// stays that of one update. sum_n_half must match cpu::sum_n_half bit for bit, and gemm_half a
// float32 GEMM of the same float16 inputs up to float16 output rounding. Without a GPU, every call
// must throw a std::runtime_error naming the function.

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <functional>
#include <ios>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/half.hpp"
#include "kernels/cpu/optimizer_rules.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/optimizer.hpp"
#include "tests/kernels/cuda_test_support.hpp"
#include "tests/kernels/gemm_test_support.hpp"
#include "tests/kernels/kernels_test_support.hpp"
#include "tests/kernels/optimizer_test_support.hpp"

namespace cpu = troupe::kernels::cpu;
namespace cuda = troupe::kernels::cuda;
using namespace troupe::kernels::testing;

namespace {

constexpr int gpu = 0;
constexpr int steps = 3;
// One float32 update on the GPU against the same update on the CPU: they differ only where nvcc
// contracts a multiply and an add into an FMA, a few ulps. A wrong formula, order of clip and
// decay, or epsilon placement is off by far more (the hyper-parameters below are chosen so).
constexpr double rel_tol = 1e-5;
constexpr double abs_tol = 1e-6;
// The weight decay of the variants that decay.
constexpr float weight_decay = 0.05f;

// --- helpers ---------------------------------------------------------------------------------

std::vector<float> widen(const std::vector<std::uint16_t>& bits) {
  std::vector<float> out(bits.size());
  cpu::half_to_float(bits.data(), out.data(), bits.size());
  return out;
}

std::vector<std::uint16_t> narrow(const std::vector<float>& values) {
  std::vector<std::uint16_t> out(values.size());
  cpu::float_to_half(values.data(), out.data(), values.size());
  return out;
}

/// A float16 as an integer that orders like its value (+0 and -0 both 0), so that adjacent
/// float16 values differ by 1.
int ordered(std::uint16_t bits) {
  const int magnitude = bits & 0x7fff;
  return (bits & 0x8000u) != 0 ? -magnitude : magnitude;
}

/// Every element within one float16 ulp of `expected` (a rounding of a float32 result that the
/// GPU computed up to a few float ulps differently), and at most 1% of them (+1) not equal: a
/// kernel that truncated instead of rounding to nearest would be off in about half of them.
void check_halves_within_one_ulp(const std::vector<std::uint16_t>& actual,
                                 const std::vector<std::uint16_t>& expected,
                                 std::string_view what) {
  BOOST_TEST_REQUIRE(actual.size() == expected.size());
  std::size_t far = 0, off_by_one = 0, first_far = 0;
  for (std::size_t i = 0; i < actual.size(); ++i) {
    const int distance = std::abs(ordered(actual[i]) - ordered(expected[i]));
    if (distance == 1)
      ++off_by_one;
    else if (distance > 1 && far++ == 0)
      first_far = i;
  }
  BOOST_TEST(far == 0u, what << " (n = " << actual.size() << "): " << far
                             << " elements more than one float16 ulp away, first at " << first_far
                             << ": got 0x" << std::hex << (far ? actual[first_far] : 0)
                             << ", expected 0x" << (far ? expected[first_far] : 0) << std::dec);
  BOOST_TEST(off_by_one <= actual.size() / 100 + 1,
             what << " (n = " << actual.size() << "): " << off_by_one
                  << " elements one float16 ulp away (rounding is not to nearest?)");
}

// --- the rules, on both sides ----------------------------------------------------------------

/// A rule's CPU and GPU forms with the same hyper-parameters. The epsilons are large enough
/// (1e-3) that adding one inside or outside a square root makes a visible difference.
struct rule {
  const char* name;
  std::size_t states; ///< float32 state buffers, all starting at zero
  std::function<void(float* weight, const float* grad, float* const* state, std::size_t n,
                     const variant& v)>
      on_cpu;
  std::function<void(cuda::weight_and_grad w, float* const* state, std::size_t n, const variant& v)>
      on_gpu;
};

const std::vector<rule>& rules() {
  static const std::vector<rule> all{
      {"test", 0,
       [](float* w, const float* g, float* const*, std::size_t n, const variant& v) {
         cpu::test_update(w, g, n, v.rescale_grad);
       },
       [](cuda::weight_and_grad w, float* const*, std::size_t n, const variant& v) {
         cuda::test_update(gpu, w, n, v.rescale_grad);
       }},
      {"sgd", 1,
       [](float* w, const float* g, float* const* s, std::size_t n, const variant& v) {
         cpu::sgd_update(w, g, s[0], n, 0.1f, v.momentum, v.wd, settings_of(v));
       },
       [](cuda::weight_and_grad w, float* const* s, std::size_t n, const variant& v) {
         cuda::sgd_update(gpu, w, s[0], n, 0.1f, v.momentum, v.wd, settings_of(v));
       }},
      {"nag", 1,
       [](float* w, const float* g, float* const* s, std::size_t n, const variant& v) {
         cpu::nag_update(w, g, s[0], n, 0.1f, v.momentum, v.wd, settings_of(v));
       },
       [](cuda::weight_and_grad w, float* const* s, std::size_t n, const variant& v) {
         cuda::nag_update(gpu, w, s[0], n, 0.1f, v.momentum, v.wd, settings_of(v));
       }},
      {"adam", 2,
       [](float* w, const float* g, float* const* s, std::size_t n, const variant& v) {
         cpu::adam_update(w, g, s[0], s[1], n, 0.01f, 0.9f, 0.999f, 1e-3f, v.wd, settings_of(v));
       },
       [](cuda::weight_and_grad w, float* const* s, std::size_t n, const variant& v) {
         cuda::adam_update(gpu, w, s[0], s[1], n, 0.01f, 0.9f, 0.999f, 1e-3f, v.wd, settings_of(v));
       }},
      {"rmsprop", 1,
       [](float* w, const float* g, float* const* s, std::size_t n, const variant& v) {
         cpu::rmsprop_update(w, g, s[0], n, 0.01f, 0.9f, 1e-3f, v.wd, v.clip_weights,
                             settings_of(v));
       },
       [](cuda::weight_and_grad w, float* const* s, std::size_t n, const variant& v) {
         cuda::rmsprop_update(gpu, w, s[0], n, 0.01f, 0.9f, 1e-3f, v.wd, v.clip_weights,
                              settings_of(v));
       }},
      {"rmsprop_centered", 3,
       [](float* w, const float* g, float* const* s, std::size_t n, const variant& v) {
         cpu::rmsprop_centered_update(w, g, s[0], s[1], s[2], n, 0.01f, 0.95f, v.momentum, 1e-3f,
                                      v.wd, v.clip_weights, settings_of(v));
       },
       [](cuda::weight_and_grad w, float* const* s, std::size_t n, const variant& v) {
         cuda::rmsprop_centered_update(gpu, w, s[0], s[1], s[2], n, 0.01f, 0.95f, v.momentum, 1e-3f,
                                       v.wd, v.clip_weights, settings_of(v));
       }},
      {"adagrad", 1,
       [](float* w, const float* g, float* const* s, std::size_t n, const variant& v) {
         cpu::adagrad_update(w, g, s[0], n, 0.1f, 1e-3f, v.wd, settings_of(v));
       },
       [](cuda::weight_and_grad w, float* const* s, std::size_t n, const variant& v) {
         cuda::adagrad_update(gpu, w, s[0], n, 0.1f, 1e-3f, v.wd, settings_of(v));
       }},
  };
  return all;
}

enum class precision { float32, float16, float16_master };

const char* name_of(precision p) {
  switch (p) {
  case precision::float32:
    return "float32";
  case precision::float16:
    return "float16";
  case precision::float16_master:
    return "float16 with a float32 master copy";
  }
  return "?";
}

/// `steps` updates of `r` on the GPU, each checked against the CPU rule run from the weight and
/// state that the GPU started that step from:
///   float32:        the CPU rule on the same buffers;
///   float16:        widen the weight, run the CPU rule in float32, round the weight back;
///   float16_master: the CPU rule on the master copy; the float16 weight = float16(master).
void check_rule(const rule& r, precision p, std::size_t n, const variant& v, std::uint64_t seed) {
  const bool half = p != precision::float32;
  const bool master = p == precision::float16_master;
  auto rng = rng_for(seed, n);

  device_buffer<float> weight32{gpu, half ? 0 : n}, grad32{gpu, half ? 0 : n};
  device_buffer<float> master32{gpu, master ? n : 0};
  device_buffer<std::uint16_t> weight16{gpu, half ? n : 0}, grad16{gpu, half ? n : 0};
  std::vector<std::unique_ptr<device_buffer<float>>> state;
  std::vector<float*> state_pointers;
  for (std::size_t k = 0; k < r.states; ++k) {
    state.push_back(std::make_unique<device_buffer<float>>(gpu, std::vector<float>(n, 0.0f)));
    state_pointers.push_back(state.back()->get());
  }

  const auto initial = random_vector<float>(rng, n, -1.0f, 1.0f);
  switch (p) {
  case precision::float32:
    weight32.upload(initial);
    break;
  case precision::float16:
    weight16.upload(narrow(initial));
    break;
  case precision::float16_master:
    master32.upload(initial);
    // The float16 weight is only written: 1.0 everywhere must not change the result.
    weight16.upload(std::vector<std::uint16_t>(n, 0x3c00u));
    break;
  }
  const cuda::weight_and_grad w{half ? static_cast<void*>(weight16.get()) : weight32.get(),
                                half ? static_cast<const void*>(grad16.get()) : grad32.get(),
                                half ? cuda::element_type::float16 : cuda::element_type::float32,
                                master ? master32.get() : nullptr};

  for (int step = 0; step < steps; ++step) {
    BOOST_TEST_CONTEXT(r.name << " in " << name_of(p) << ", n = " << n << ", step " << step
                              << ": rescale_grad " << v.rescale_grad << ", clip_gradient "
                              << v.clip_gradient << ", wd " << v.wd << ", momentum " << v.momentum
                              << ", clip_weights " << v.clip_weights) {
      // where the GPU starts this step from, as float32
      auto expected_weight = p == precision::float32 ? weight32.download()
                             : master                ? master32.download()
                                                     : widen(weight16.download());
      std::vector<std::vector<float>> expected_state;
      std::vector<float*> expected_pointers;
      for (const auto& s : state)
        expected_state.push_back(s->download());
      for (auto& s : expected_state)
        expected_pointers.push_back(s.data());

      // rescaled by 0.25 or not, these cross the clip bound of 0.5 often
      auto grad = random_vector<float>(rng, n, -3.0f, 3.0f);
      if (half) {
        const auto bits = narrow(grad);
        grad16.upload(bits);
        grad = widen(bits);
      } else {
        grad32.upload(grad);
      }

      r.on_cpu(expected_weight.data(), grad.data(), expected_pointers.data(), n, v);
      r.on_gpu(w, state_pointers.data(), n, v);

      switch (p) {
      case precision::float32:
        check_close(weight32.download(), expected_weight, rel_tol, abs_tol, "weight");
        break;
      case precision::float16:
        check_halves_within_one_ulp(weight16.download(), narrow(expected_weight), "float16 weight");
        break;
      case precision::float16_master: {
        const auto updated = master32.download();
        check_close(updated, expected_weight, rel_tol, abs_tol, "master weight");
        check_equal(weight16.download(), narrow(updated), "float16 weight = float16(master)");
        break;
      }
      }
      for (std::size_t k = 0; k < r.states; ++k)
        check_close(state[k]->download(), expected_state[k], rel_tol, abs_tol,
                    "state buffer " + std::to_string(k));
    }
  }
}

void check_every_rule(precision p) {
  std::uint64_t seed = 200;
  for (const rule& r : rules()) {
    ++seed;
    for (std::size_t n : sizes)
      for (const variant& v : variants_for(n, weight_decay))
        check_rule(r, p, n, v, seed);
  }
}

// --- sum_n_half and gemm_half ----------------------------------------------------------------

/// Float16 values of every kind the sum meets: zeros and subnormals (down to flushing), normals,
/// and magnitudes whose sums overflow to infinity when rounded.
std::vector<std::uint16_t> random_halves(std::mt19937_64& rng, std::size_t n) {
  auto values = random_vector<float>(rng, n, -20000.0f, 20000.0f);
  std::uniform_int_distribution<int> shift{-36, 0};
  for (auto& x : values)
    x = std::ldexp(x, shift(rng));
  return narrow(values);
}

void check_gemm_half(const gemm_case& g) {
  auto in = make_gemm_inputs(g, 91);
  // The GPU sees float16 operands; the reference sees exactly the same values, in float32.
  const auto a16 = narrow(in.a), b16 = narrow(in.b), c16 = narrow(in.c0);
  in.a = widen(a16);
  in.b = widen(b16);
  in.c0 = widen(c16);

  device_buffer<std::uint16_t> da{gpu, a16}, db{gpu, b16}, dc{gpu, c16};
  cuda::gemm_half(gpu, g.transpose_a, g.transpose_b, g.m, g.n, g.k, g.alpha, da.get(), in.lda,
                  db.get(), in.ldb, g.beta, dc.get(), in.ldc);
  const auto got16 = dc.download();

  const auto [expected, magnitude] = expected_gemm(g, in);
  std::size_t bad = 0, touched_padding = 0;
  for (std::size_t i = 0; i < g.m; ++i)
    for (std::size_t j = 0; j < in.ldc; ++j) {
      const std::size_t at = i * in.ldc + j;
      if (j >= g.n) { // padding past a row's n elements: never written
        if (got16[at] != c16[at])
          ++touched_padding;
        continue;
      }
      // Rounding the result to float16 costs at most 2^-11 relative (2^-25 absolute among the
      // subnormals); allow 2^-10 of the magnitude on top of the float32 accumulation's error.
      const double m = magnitude[at];
      const double tolerance = std::ldexp(m, -10) +
                               4.0 * (g.k + 2) * std::numeric_limits<float>::epsilon() * m +
                               std::ldexp(1.0, -24);
      const double got = cpu::half_to_float(got16[at]);
      if (!(std::abs(got - expected[at]) <= tolerance))
        ++bad;
    }
  BOOST_TEST(bad == 0u, bad << " wrong elements for m=" << g.m << " n=" << g.n << " k=" << g.k
                            << " ta=" << g.transpose_a << " tb=" << g.transpose_b
                            << " pad=" << g.pad << " alpha=" << g.alpha << " beta=" << g.beta);
  BOOST_TEST(touched_padding == 0u, touched_padding
                                        << " padding elements of C changed for m=" << g.m
                                        << " n=" << g.n << " k=" << g.k << " pad=" << g.pad);
}

} // namespace

BOOST_AUTO_TEST_SUITE(cuda_optimizer)

BOOST_AUTO_TEST_SUITE(without_a_gpu, *boost::unit_test::precondition(has_no_cuda_device))

BOOST_AUTO_TEST_CASE(every_call_throws_a_runtime_error_naming_the_function) {
  float f[1] = {};
  std::uint16_t h[1] = {};
  const std::uint16_t* inputs[1] = {h};
  const cuda::weight_and_grad w{f, f, cuda::element_type::float32};
  const cpu::gradient_settings s{};
  // Without CUDA the message also says why.
  const char* why = cuda::built_with_cuda() ? nullptr : "built without CUDA";
  check_throws_runtime_error([&] { cuda::test_update(0, w, 1, 1.0f); }, "test_update", why);
  check_throws_runtime_error([&] { cuda::sgd_update(0, w, f, 1, 0.1f, 0.9f, 0.0f, s); },
                             "sgd_update", why);
  check_throws_runtime_error([&] { cuda::nag_update(0, w, f, 1, 0.1f, 0.9f, 0.0f, s); },
                             "nag_update", why);
  check_throws_runtime_error(
      [&] { cuda::adam_update(0, w, f, f, 1, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, s); }, "adam_update",
      why);
  check_throws_runtime_error(
      [&] { cuda::rmsprop_update(0, w, f, 1, 0.1f, 0.9f, 1e-8f, 0.0f, -1.0f, s); },
      "rmsprop_update", why);
  check_throws_runtime_error(
      [&] {
        cuda::rmsprop_centered_update(0, w, f, f, f, 1, 0.1f, 0.95f, 0.9f, 1e-8f, 0.0f, -1.0f, s);
      },
      "rmsprop_centered_update", why);
  check_throws_runtime_error([&] { cuda::adagrad_update(0, w, f, 1, 0.1f, 1e-7f, 0.0f, s); },
                             "adagrad_update", why);
  check_throws_runtime_error([&] { cuda::sum_n_half(0, inputs, 1, h, 1); }, "sum_n_half", why);
  check_throws_runtime_error(
      [&] { cuda::gemm_half(0, false, false, 1, 1, 1, 1.0f, h, 1, h, 1, 0.0f, h, 1); }, "gemm_half",
      why);
}

BOOST_AUTO_TEST_SUITE_END() // without_a_gpu

BOOST_AUTO_TEST_SUITE(on_a_gpu, *boost::unit_test::precondition(has_cuda_device))

BOOST_AUTO_TEST_CASE(every_rule_matches_the_cpu_rule_in_float32_on_every_size_and_variant) {
  check_every_rule(precision::float32);
}

BOOST_AUTO_TEST_CASE(float16_weights_are_updated_in_float32_and_rounded_to_nearest_even) {
  check_every_rule(precision::float16);
}

BOOST_AUTO_TEST_CASE(float16_weights_with_a_master_copy_update_the_master_in_float32) {
  check_every_rule(precision::float16_master);
}

BOOST_AUTO_TEST_CASE(sgd_without_momentum_neither_reads_nor_writes_mom_which_may_be_null) {
  const std::size_t n = 1000;
  auto rng = rng_for(230, n);
  const auto weight = random_vector<float>(rng, n, -1.0f, 1.0f);
  const auto grad = random_vector<float>(rng, n, -3.0f, 3.0f);
  const cpu::gradient_settings s{0.5f, 0.75f};
  auto expected = weight;
  cpu::sgd_update(expected.data(), grad.data(), nullptr, n, 0.1f, 0.0f, 0.05f, s);

  device_buffer<float> dw{gpu, weight}, dg{gpu, grad};
  cuda::sgd_update(gpu, {dw.get(), dg.get(), cuda::element_type::float32}, nullptr, n, 0.1f, 0.0f,
                   0.05f, s);
  check_close(dw.download(), expected, rel_tol, abs_tol, "float32 weight");

  device_buffer<std::uint16_t> dw16{gpu, narrow(weight)}, dg16{gpu, narrow(grad)};
  device_buffer<float> master{gpu, weight};
  auto expected_master = weight;
  const auto grad16 = widen(narrow(grad));
  cpu::sgd_update(expected_master.data(), grad16.data(), nullptr, n, 0.1f, 0.0f, 0.05f, s);
  cuda::sgd_update(gpu, {dw16.get(), dg16.get(), cuda::element_type::float16, master.get()},
                   nullptr, n, 0.1f, 0.0f, 0.05f, s);
  const auto updated = master.download();
  check_close(updated, expected_master, rel_tol, abs_tol, "master weight");
  check_equal(dw16.download(), narrow(updated), "float16 weight = float16(master)");
}

BOOST_AUTO_TEST_CASE(invalid_arguments_throw_before_anything_runs_and_leave_no_error_behind) {
  const std::size_t n = 4;
  device_buffer<float> w{gpu, std::vector<float>(n, 1.0f)}, g{gpu, std::vector<float>(n, 2.0f)};
  device_buffer<float> state{gpu, std::vector<float>(n, 0.0f)};
  const cpu::gradient_settings s{};
  using cuda::element_type;

  check_throws_runtime_error(
      [&] {
        cuda::sgd_update(gpu, {w.get(), g.get(), element_type::float32, state.get()}, state.get(),
                         n, 0.1f, 0.9f, 0.0f, s);
      },
      "sgd_update", "master");
  check_throws_runtime_error(
      [&] {
        cuda::adam_update(gpu, {nullptr, g.get(), element_type::float32}, state.get(), state.get(),
                          n, 0.1f, 0.9f, 0.999f, 1e-8f, 0.0f, s);
      },
      "adam_update", "weight is null");
  check_throws_runtime_error(
      [&] {
        cuda::nag_update(gpu, {w.get(), g.get(), element_type::float32}, nullptr, n, 0.1f, 0.9f,
                         0.0f, s);
      },
      "nag_update", "mom is null");
  check_throws_runtime_error(
      [&] {
        cuda::test_update(gpu, {w.get(), g.get(), static_cast<element_type>(7)}, n, 1.0f);
      },
      "test_update", "element_type");
  device_buffer<std::uint16_t> c{gpu, std::vector<std::uint16_t>(6, 0x3c00u)};
  check_throws_runtime_error(
      [&] {
        // k == 0, and ldc = 2 is too small for n = 3
        cuda::gemm_half(gpu, false, false, 2, 3, 0, 1.0f, nullptr, 0, nullptr, 0, 0.5f, c.get(), 2);
      },
      "gemm_half", "ldc");

  // nothing was changed, and the next call works
  check_equal(w.download(), std::vector<float>(n, 1.0f), "weight after the failed calls");
  check_equal(state.download(), std::vector<float>(n, 0.0f), "state after the failed calls");
  cuda::test_update(gpu, {w.get(), g.get(), element_type::float32}, n, 0.5f);
  check_equal(w.download(), std::vector<float>(n, 2.0f), "test_update after the failed calls");
}

BOOST_AUTO_TEST_CASE(sum_n_half_matches_the_cpu_bit_for_bit_on_every_size_and_count) {
  // 9 and 17 inputs take two and three launches, whose float32 partial sums must not be rounded
  // to float16 in between.
  for (std::size_t n : sizes)
    for (std::size_t count : {0u, 1u, 2u, 3u, 8u, 9u, 17u}) {
      BOOST_TEST_CONTEXT("n = " << n << ", count = " << count) {
        auto rng = rng_for(240 + count, n);
        // out starts as NaNs, which must not survive
        check_sum_matches_the_cpu(
            gpu, n, count, [&] { return random_halves(rng, n); }, cpu::sum_n_half, cuda::sum_n_half,
            std::uint16_t{0x7e00u}, "sum_n_half");
      }
    }
}

BOOST_AUTO_TEST_CASE(gemm_half_matches_a_float32_gemm_of_the_same_inputs_up_to_float16_rounding) {
  for (const auto& g : gpu_gemm_cases())
    check_gemm_half(g);
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (float alpha : {0.5f, -1.5f, 0.0f})
        check_gemm_half({ta, tb, 4, 6, 0, 2, alpha, 0.0f}); // k = 0, beta = 0: zeros, C unread
  check_gemm_half({false, false, 256, 192, 1024, 0, 1.0f, 0.0f});
}

BOOST_AUTO_TEST_CASE(gemm_half_reports_cublas_errors_as_runtime_errors_naming_the_call) {
  device_buffer<std::uint16_t> a{gpu, 16}, b{gpu, 16}, c{gpu, 16};
  // lda = 1 is too small for a 4×4 row-major A
  check_throws_runtime_error(
      [&] {
        cuda::gemm_half(gpu, false, false, 4, 4, 4, 1.0f, a.get(), 1, b.get(), 4, 0.0f, c.get(), 4);
      },
      "cublasGemmEx", "device 0");
}

BOOST_AUTO_TEST_SUITE_END() // on_a_gpu

BOOST_AUTO_TEST_SUITE_END() // cuda_optimizer
