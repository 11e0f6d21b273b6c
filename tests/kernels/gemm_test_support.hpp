#pragma once
// GEMM cases shared by the CPU and GPU GEMM tests: seeded inputs for a case, and the check of a
// result against gemm_reference with a tolerance scaled by the magnitudes the rounding works on.

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <limits>
#include <utility>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "kernels/cpu/gemm.hpp"
#include "tests/kernels/kernels_test_support.hpp"

namespace troupe::kernels::testing {

struct gemm_case {
  bool transpose_a, transpose_b;
  std::size_t m, n, k;
  std::size_t pad; ///< extra elements per stored row, so that ld > row length
  float alpha, beta;
};

/// The cases the GPU GEMMs are checked on, for every transpose: every m, n and k from
/// {0, 1, 2, 7, 33} (the padding varying with them), three (alpha, beta) pairs on a small product
/// and with k = 0 (C = beta * C, lda may be 0), and a product of several tiles with odd sizes.
inline std::vector<gemm_case> gpu_gemm_cases() {
  std::vector<gemm_case> out;
  const std::size_t dims[] = {0, 1, 2, 7, 33};
  for (bool ta : {false, true})
    for (bool tb : {false, true}) {
      for (std::size_t m : dims)
        for (std::size_t n : dims)
          for (std::size_t k : dims)
            out.push_back({ta, tb, m, n, k, (m + n + k) % 3, 1.0f, 0.0f});
      for (const auto& [alpha, beta] :
           {std::pair{0.5f, 2.0f}, std::pair{-1.5f, 1.0f}, std::pair{0.0f, 3.0f}}) {
        out.push_back({ta, tb, 5, 3, 4, 1, alpha, beta});
        out.push_back({ta, tb, 4, 6, 0, 0, alpha, beta});
      }
      out.push_back({ta, tb, 129, 67, 301, 5, 0.75f, -0.5f});
    }
  return out;
}

/// A case's operands as stored (row strides include the padding) and the C it starts from.
struct gemm_inputs {
  std::size_t lda, ldb, ldc;
  std::vector<float> a, b, c0;
};

inline gemm_inputs make_gemm_inputs(const gemm_case& g, std::uint64_t seed) {
  const std::size_t a_rows = g.transpose_a ? g.k : g.m, a_cols = g.transpose_a ? g.m : g.k;
  const std::size_t b_rows = g.transpose_b ? g.n : g.k, b_cols = g.transpose_b ? g.k : g.n;
  gemm_inputs in;
  in.lda = a_cols + g.pad;
  in.ldb = b_cols + g.pad;
  in.ldc = g.n + g.pad;
  auto rng = rng_for(seed, g.m * 10'000 + g.n * 100 + g.k);
  in.a = random_vector<float>(rng, a_rows * in.lda, -1.0f, 1.0f);
  in.b = random_vector<float>(rng, b_rows * in.ldb, -1.0f, 1.0f);
  in.c0 = random_vector<float>(rng, g.m * in.ldc, -1.0f, 1.0f);
  if (g.beta == 0.0f) // BLAS semantics: C is not read, so garbage in it must not survive
    std::fill(in.c0.begin(), in.c0.end(), std::numeric_limits<float>::quiet_NaN());
  return in;
}

/// What a GEMM of `in` must give, by gemm_reference, and beside it, element by element, the
/// magnitude that its float32 rounding works on: Σ|alpha·a·b| + |beta·c|.
struct gemm_expectation {
  std::vector<float> expected, magnitude;
};

inline gemm_expectation expected_gemm(const gemm_case& g, const gemm_inputs& in) {
  gemm_expectation r{in.c0, std::vector<float>(in.c0.size())};
  cpu::gemm_reference(g.transpose_a, g.transpose_b, g.m, g.n, g.k, g.alpha, in.a.data(), in.lda,
                      in.b.data(), in.ldb, g.beta, r.expected.data(), in.ldc);
  std::vector<float> abs_a(in.a.size()), abs_b(in.b.size());
  for (std::size_t i = 0; i < in.a.size(); ++i)
    abs_a[i] = std::abs(in.a[i]);
  for (std::size_t i = 0; i < in.b.size(); ++i)
    abs_b[i] = std::abs(in.b[i]);
  for (std::size_t i = 0; i < in.c0.size(); ++i)
    r.magnitude[i] = g.beta == 0.0f ? 0.0f : std::abs(in.c0[i]);
  cpu::gemm_reference(g.transpose_a, g.transpose_b, g.m, g.n, g.k, std::abs(g.alpha), abs_a.data(),
                      in.lda, abs_b.data(), in.ldb, std::abs(g.beta), r.magnitude.data(), in.ldc);
  return r;
}

/// Checks `c`, a GEMM of `in`, against gemm_reference element by element, with the tolerance
/// 4 (k + 2) eps (Σ|alpha·a·b| + |beta·c|).
inline void check_gemm_result(const gemm_case& g, const gemm_inputs& in,
                              const std::vector<float>& c) {
  const auto [expected, magnitude] = expected_gemm(g, in);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < g.m; ++i)
    for (std::size_t j = 0; j < g.n; ++j) {
      const std::size_t at = i * in.ldc + j;
      const double tolerance = 4 * (g.k + 2) * std::numeric_limits<float>::epsilon() *
                               (static_cast<double>(magnitude[at]) + 1e-30);
      if (!(std::abs(static_cast<double>(c[at]) - expected[at]) <= tolerance))
        ++bad;
    }
  BOOST_TEST(bad == 0u, bad << " wrong elements for m=" << g.m << " n=" << g.n << " k=" << g.k
                            << " ta=" << g.transpose_a << " tb=" << g.transpose_b
                            << " pad=" << g.pad << " alpha=" << g.alpha << " beta=" << g.beta);
}

} // namespace troupe::kernels::testing
