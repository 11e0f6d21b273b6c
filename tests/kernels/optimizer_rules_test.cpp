// kernels/cpu/optimizer_rules.hpp against double-precision transcriptions of MXNet 1.x's
// formulas, over several steps so that the state buffers matter, with and without clipping,
// weight decay and momentum.

#include <algorithm>
#include <cmath>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "kernels/cpu/optimizer_rules.hpp"
#include "tests/kernels/kernels_test_support.hpp"
#include "tests/kernels/optimizer_test_support.hpp"

namespace cpu = troupe::kernels::cpu;
using namespace troupe::kernels::testing;

namespace {

constexpr int steps = 4;
// A float kernel against a double reference, compounded over `steps` updates.
constexpr double rel_tol = 2e-5;
constexpr double abs_tol = 2e-6;
// The weight decay of the variants that decay.
constexpr float weight_decay = 0.01f;

double clip(double x, double bound) {
  return bound >= 0 ? std::clamp(x, -bound, bound) : x;
}

double prepared(float grad, const variant& v) {
  return clip(static_cast<double>(v.rescale_grad) * grad, v.clip_gradient);
}

// Adam and the RMSProps add weight decay before clipping, as MXNet's kernels do.
double prepared_with_decay(float grad, double weight, const variant& v) {
  return clip(static_cast<double>(v.rescale_grad) * grad + v.wd * weight, v.clip_gradient);
}

std::vector<double> widen(const std::vector<float>& x) {
  return {x.begin(), x.end()};
}

/// Runs `steps` updates of the kernel and the reference on fresh seeded gradients each step,
/// then compares the weights and every state buffer.
template <class Step>
void run_steps(std::uint64_t seed, std::size_t n, std::size_t state_count, const char* name,
               Step step) {
  auto rng = rng_for(seed, n);
  auto weight = random_vector<float>(rng, n, -1.0f, 1.0f);
  std::vector<std::vector<float>> state(state_count, std::vector<float>(n, 0.0f));
  auto ref_weight = widen(weight);
  std::vector<std::vector<double>> ref_state(state_count, std::vector<double>(n, 0.0));
  for (int s = 0; s < steps; ++s) {
    const auto grad = random_vector<float>(rng, n, -2.0f, 2.0f);
    step(weight, grad, state, ref_weight, ref_state);
  }
  check_close(weight, ref_weight, rel_tol, abs_tol, name);
  for (std::size_t k = 0; k < state_count; ++k)
    check_close(state[k], ref_state[k], rel_tol, abs_tol, name);
}

using fvec = std::vector<float>;
using dvec = std::vector<double>;

} // namespace

BOOST_AUTO_TEST_SUITE(optimizer_rules)

BOOST_AUTO_TEST_CASE(test_update_adds_the_rescaled_gradient_on_every_size) {
  for (std::size_t n : sizes)
    run_steps(60, n, 0, "test_update",
              [](fvec& w, const fvec& g, std::vector<fvec>&, dvec& rw, std::vector<dvec>&) {
                cpu::test_update(w.data(), g.data(), w.size(), 0.5f);
                for (std::size_t i = 0; i < rw.size(); ++i)
                  rw[i] += 0.5 * g[i];
              });
}

BOOST_AUTO_TEST_CASE(sgd_with_and_without_momentum_matches_the_reference_on_every_size) {
  const float lr = 0.1f;
  for (std::size_t n : sizes)
    for (const variant& v : variants_for(n, weight_decay))
      run_steps(
          61, n, 1, "sgd",
          [&](fvec& w, const fvec& g, std::vector<fvec>& st, dvec& rw, std::vector<dvec>& rs) {
            cpu::sgd_update(w.data(), g.data(), st[0].data(), n, lr, v.momentum, v.wd,
                            settings_of(v));
            for (std::size_t i = 0; i < n; ++i) {
              const double gi = prepared(g[i], v);
              if (v.momentum == 0.0f) {
                rw[i] -= lr * (gi + v.wd * rw[i]); // mom stays untouched (zero)
              } else {
                rs[0][i] = v.momentum * rs[0][i] - lr * (gi + v.wd * rw[i]);
                rw[i] += rs[0][i];
              }
            }
          });
}

BOOST_AUTO_TEST_CASE(sgd_without_momentum_accepts_a_null_momentum_buffer) {
  std::vector<float> w = {1.0f, -2.0f}, g = {0.5f, 4.0f};
  cpu::sgd_update(w.data(), g.data(), nullptr, w.size(), 0.5f, 0.0f, 0.0f, {1.0f, 1.0f});
  BOOST_TEST(w[0] == 0.75f);
  BOOST_TEST(w[1] == -2.5f); // gradient 4 clipped to 1
}

BOOST_AUTO_TEST_CASE(nag_matches_the_reference_on_every_size) {
  const float lr = 0.05f;
  for (std::size_t n : sizes)
    for (const variant& v : variants_for(n, weight_decay))
      run_steps(
          62, n, 1, "nag",
          [&](fvec& w, const fvec& g, std::vector<fvec>& st, dvec& rw, std::vector<dvec>& rs) {
            cpu::nag_update(w.data(), g.data(), st[0].data(), n, lr, v.momentum, v.wd,
                            settings_of(v));
            for (std::size_t i = 0; i < n; ++i) {
              const double gi = prepared(g[i], v) + v.wd * rw[i];
              rs[0][i] = v.momentum * rs[0][i] + gi;
              rw[i] -= lr * (gi + v.momentum * rs[0][i]);
            }
          });
}

BOOST_AUTO_TEST_CASE(adam_matches_the_reference_on_every_size) {
  const float beta1 = 0.9f, beta2 = 0.999f, epsilon = 1e-8f;
  for (std::size_t n : sizes)
    for (const variant& v : variants_for(n, weight_decay)) {
      int t = 0;
      run_steps(
          63, n, 2, "adam",
          [&](fvec& w, const fvec& g, std::vector<fvec>& st, dvec& rw, std::vector<dvec>& rs) {
            ++t; // the caller's bias correction, as MXNet's Python optimizer passes it
            const auto lr = static_cast<float>(0.01 * std::sqrt(1 - std::pow(beta2, t)) /
                                               (1 - std::pow(beta1, t)));
            cpu::adam_update(w.data(), g.data(), st[0].data(), st[1].data(), n, lr, beta1, beta2,
                             epsilon, v.wd, settings_of(v));
            for (std::size_t i = 0; i < n; ++i) {
              const double gi = prepared_with_decay(g[i], rw[i], v);
              rs[0][i] = beta1 * rs[0][i] + (1 - double{beta1}) * gi;
              rs[1][i] = beta2 * rs[1][i] + (1 - double{beta2}) * gi * gi;
              rw[i] -= lr * rs[0][i] / (std::sqrt(rs[1][i]) + epsilon);
            }
          });
    }
}

BOOST_AUTO_TEST_CASE(rmsprop_matches_the_reference_with_and_without_weight_clipping) {
  const float lr = 0.01f, gamma1 = 0.95f, epsilon = 1e-8f;
  for (std::size_t n : sizes)
    for (const variant& v : variants_for(n, weight_decay))
      run_steps(
          64, n, 1, "rmsprop",
          [&](fvec& w, const fvec& g, std::vector<fvec>& st, dvec& rw, std::vector<dvec>& rs) {
            cpu::rmsprop_update(w.data(), g.data(), st[0].data(), n, lr, gamma1, epsilon, v.wd,
                                v.clip_weights, settings_of(v));
            for (std::size_t i = 0; i < n; ++i) {
              const double gi = prepared_with_decay(g[i], rw[i], v);
              rs[0][i] = (1 - double{gamma1}) * gi * gi + gamma1 * rs[0][i];
              rw[i] = clip(rw[i] - lr * gi / std::sqrt(rs[0][i] + epsilon), v.clip_weights);
            }
          });
}

BOOST_AUTO_TEST_CASE(centered_rmsprop_matches_the_reference_with_and_without_weight_clipping) {
  const float lr = 0.01f, gamma1 = 0.95f, gamma2 = 0.9f, epsilon = 1e-8f;
  for (std::size_t n : sizes)
    for (const variant& v : variants_for(n, weight_decay))
      run_steps(
          65, n, 3, "rmsprop_centered",
          [&](fvec& w, const fvec& g, std::vector<fvec>& st, dvec& rw, std::vector<dvec>& rs) {
            cpu::rmsprop_centered_update(w.data(), g.data(), st[0].data(), st[1].data(),
                                         st[2].data(), n, lr, gamma1, gamma2, epsilon, v.wd,
                                         v.clip_weights, settings_of(v));
            for (std::size_t i = 0; i < n; ++i) {
              const double gi = prepared_with_decay(g[i], rw[i], v);
              rs[0][i] = (1 - double{gamma1}) * gi * gi + gamma1 * rs[0][i];
              rs[1][i] = (1 - double{gamma1}) * gi + gamma1 * rs[1][i];
              rs[2][i] =
                  gamma2 * rs[2][i] - lr * gi / std::sqrt(rs[0][i] - rs[1][i] * rs[1][i] + epsilon);
              rw[i] = clip(rw[i] + rs[2][i], v.clip_weights);
            }
          });
}

BOOST_AUTO_TEST_CASE(adagrad_matches_the_reference_on_every_size) {
  const float lr = 0.1f, epsilon = 1e-7f;
  for (std::size_t n : sizes)
    for (const variant& v : variants_for(n, weight_decay))
      run_steps(
          66, n, 1, "adagrad",
          [&](fvec& w, const fvec& g, std::vector<fvec>& st, dvec& rw, std::vector<dvec>& rs) {
            cpu::adagrad_update(w.data(), g.data(), st[0].data(), n, lr, epsilon, v.wd,
                                settings_of(v));
            for (std::size_t i = 0; i < n; ++i) {
              const double gi = prepared(g[i], v);
              rs[0][i] += gi * gi;
              rw[i] -= lr * (gi / std::sqrt(rs[0][i] + epsilon) + v.wd * rw[i]);
            }
          });
}

BOOST_AUTO_TEST_CASE(adam_and_rmsprop_clip_after_adding_weight_decay_unlike_sgd) {
  // weight 10, grad 0, wd 0.1, clip 0.5: SGD clips the raw gradient (0) and then decays by the
  // full wd * weight = 1; Adam clips wd * weight itself to 0.5.
  cpu::gradient_settings clipped{1.0f, 0.5f};
  float w = 10.0f, g = 0.0f;
  cpu::sgd_update(&w, &g, nullptr, 1, 1.0f, 0.0f, 0.1f, clipped);
  BOOST_TEST(w == 9.0f);

  float aw = 10.0f, mean = 0.0f, var = 0.0f;
  cpu::adam_update(&aw, &g, &mean, &var, 1, 1.0f, 0.0f, 0.0f, 0.0f, 0.1f, clipped);
  BOOST_TEST(mean == 0.5f);
  BOOST_TEST(var == 0.25f);
  BOOST_TEST(aw == 9.0f); // 10 - 0.5 / sqrt(0.25)
}

BOOST_AUTO_TEST_SUITE_END()
