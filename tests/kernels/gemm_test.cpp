// kernels/cpu/gemm.hpp: gemm_reference against a hand-worked product, then gemm (OpenBLAS)
// against gemm_reference for every transpose, odd and empty sizes, padded leading dimensions.

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "kernels/cpu/gemm.hpp"
#include "tests/kernels/gemm_test_support.hpp"

namespace cpu = troupe::kernels::cpu;
using namespace troupe::kernels::testing;

namespace {

/// Runs gemm on a case's seeded inputs and checks it against gemm_reference.
void check_case(const gemm_case& g, std::uint64_t seed) {
  const auto in = make_gemm_inputs(g, seed);
  const std::size_t ldc = in.ldc;
  const auto& c0 = in.c0;
  auto c = in.c0;
  cpu::gemm(g.transpose_a, g.transpose_b, g.m, g.n, g.k, g.alpha, in.a.data(), in.lda, in.b.data(),
            in.ldb, g.beta, c.data(), ldc);
  check_gemm_result(g, in, c);

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
