// kernels/cpu/gemm.hpp: gemm_reference against a hand-worked product, then gemm (OpenBLAS)
// against gemm_reference for every transpose, odd and empty sizes, padded leading dimensions.

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "kernels/cpu/gemm.hpp"
#include "tests/kernels/kernels_test_support.hpp"

namespace cpu = troupe::kernels::cpu;
using namespace troupe::kernels::testing;

namespace {

struct gemm_case {
  bool transpose_a, transpose_b;
  std::size_t m, n, k;
  std::size_t pad; ///< extra elements per stored row, so that ld > row length
  float alpha, beta;
};

/// Runs gemm and gemm_reference on the same seeded inputs and checks them against each other,
/// with a tolerance scaled by Σ|alpha·a·b| + |beta·c| (the magnitudes the rounding works on).
void check_case(const gemm_case& g, std::uint64_t seed) {
  const std::size_t a_rows = g.transpose_a ? g.k : g.m, a_cols = g.transpose_a ? g.m : g.k;
  const std::size_t b_rows = g.transpose_b ? g.n : g.k, b_cols = g.transpose_b ? g.k : g.n;
  const std::size_t lda = a_cols + g.pad, ldb = b_cols + g.pad, ldc = g.n + g.pad;
  auto rng = rng_for(seed, g.m * 10'000 + g.n * 100 + g.k);
  const auto a = random_vector<float>(rng, a_rows * lda, -1.0f, 1.0f);
  const auto b = random_vector<float>(rng, b_rows * ldb, -1.0f, 1.0f);
  auto c0 = random_vector<float>(rng, g.m * ldc, -1.0f, 1.0f);
  if (g.beta == 0.0f) // BLAS semantics: C is not read, so garbage in it must not survive
    std::fill(c0.begin(), c0.end(), std::numeric_limits<float>::quiet_NaN());

  auto c = c0;
  auto expected = c0;
  cpu::gemm(g.transpose_a, g.transpose_b, g.m, g.n, g.k, g.alpha, a.data(), lda, b.data(), ldb,
            g.beta, c.data(), ldc);
  cpu::gemm_reference(g.transpose_a, g.transpose_b, g.m, g.n, g.k, g.alpha, a.data(), lda, b.data(),
                      ldb, g.beta, expected.data(), ldc);

  std::vector<float> abs_a(a.size()), abs_b(b.size()), magnitude(c0.size());
  for (std::size_t i = 0; i < a.size(); ++i)
    abs_a[i] = std::abs(a[i]);
  for (std::size_t i = 0; i < b.size(); ++i)
    abs_b[i] = std::abs(b[i]);
  for (std::size_t i = 0; i < c0.size(); ++i)
    magnitude[i] = g.beta == 0.0f ? 0.0f : std::abs(c0[i]);
  cpu::gemm_reference(g.transpose_a, g.transpose_b, g.m, g.n, g.k, std::abs(g.alpha), abs_a.data(),
                      lda, abs_b.data(), ldb, std::abs(g.beta), magnitude.data(), ldc);

  std::size_t bad = 0;
  for (std::size_t i = 0; i < g.m; ++i)
    for (std::size_t j = 0; j < g.n; ++j) {
      const std::size_t at = i * ldc + j;
      const double tolerance = 4 * (g.k + 2) * std::numeric_limits<float>::epsilon() *
                               (static_cast<double>(magnitude[at]) + 1e-30);
      if (!(std::abs(static_cast<double>(c[at]) - expected[at]) <= tolerance))
        ++bad;
    }
  BOOST_TEST(bad == 0u, bad << " wrong elements for m=" << g.m << " n=" << g.n << " k=" << g.k
                            << " ta=" << g.transpose_a << " tb=" << g.transpose_b
                            << " pad=" << g.pad << " alpha=" << g.alpha << " beta=" << g.beta);
  // padding columns of C lie outside the product and must be left alone
  std::size_t touched = 0;
  for (std::size_t i = 0; i < g.m; ++i)
    for (std::size_t j = g.n; j < ldc; ++j) {
      const float before = c0[i * ldc + j], after = c[i * ldc + j];
      if (!(after == before || (std::isnan(after) && std::isnan(before))))
        ++touched;
    }
  BOOST_TEST(touched == 0u, "gemm wrote " << touched << " elements of C's padding");
}

} // namespace

BOOST_AUTO_TEST_SUITE(gemm)

BOOST_AUTO_TEST_CASE(gemm_reference_computes_a_hand_worked_product) {
  // [1 2 3; 4 5 6] · [7 8; 9 10; 11 12] = [58 64; 139 154]
  const float a[] = {1, 2, 3, 4, 5, 6};
  const float b[] = {7, 8, 9, 10, 11, 12};
  float c[] = {1, 1, 1, 1};
  cpu::gemm_reference(false, false, 2, 2, 3, 2.0f, a, 3, b, 2, -1.0f, c, 2);
  BOOST_TEST(c[0] == 115.0f);
  BOOST_TEST(c[1] == 127.0f);
  BOOST_TEST(c[2] == 277.0f);
  BOOST_TEST(c[3] == 307.0f);
  // the same product from the transposed storage of both operands
  const float at[] = {1, 4, 2, 5, 3, 6};
  const float bt[] = {7, 9, 11, 8, 10, 12};
  float ct[4] = {};
  cpu::gemm_reference(true, true, 2, 2, 3, 1.0f, at, 2, bt, 3, 0.0f, ct, 2);
  BOOST_TEST(ct[0] == 58.0f);
  BOOST_TEST(ct[1] == 64.0f);
  BOOST_TEST(ct[2] == 139.0f);
  BOOST_TEST(ct[3] == 154.0f);
}

BOOST_AUTO_TEST_CASE(gemm_matches_the_reference_for_every_transpose_and_odd_or_empty_sizes) {
  const std::size_t dims[] = {0, 1, 2, 7, 33};
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (std::size_t m : dims)
        for (std::size_t n : dims)
          for (std::size_t k : dims)
            check_case({ta, tb, m, n, k, (m + n + k) % 3, 1.0f, 0.0f}, 51);
}

BOOST_AUTO_TEST_CASE(gemm_applies_alpha_and_beta_like_blas) {
  const float scalars[][2] = {{1.0f, 0.0f}, {0.5f, 2.0f}, {-1.5f, 1.0f},
                              {0.0f, 3.0f}, {0.0f, 0.0f}, {2.0f, -0.25f}};
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (const auto& s : scalars) {
        check_case({ta, tb, 5, 3, 4, 1, s[0], s[1]}, 52);
        check_case({ta, tb, 4, 6, 0, 2, s[0], s[1]}, 53); // k = 0: C = beta * C only
      }
}

BOOST_AUTO_TEST_CASE(gemm_matches_the_reference_on_a_large_odd_product) {
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      check_case({ta, tb, 129, 67, 301, 5, 0.75f, -0.5f}, 54);
}

BOOST_AUTO_TEST_SUITE_END()
