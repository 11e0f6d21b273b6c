#include "kernels/cpu/gemm.hpp"

#include <algorithm>
#include <cassert>
#include <climits>

#include <cblas.h>

namespace troupe::kernels::cpu {

namespace {

/// C = beta * C over an m×n block; beta == 0 writes zeros without reading C (BLAS semantics, so
/// that NaN garbage in an uninitialised C does not survive).
void scale_c(std::size_t m, std::size_t n, float beta, float* c, std::size_t ldc) noexcept {
  for (std::size_t i = 0; i < m; ++i) {
    float* row = c + i * ldc;
    if (beta == 0.0f)
      std::fill(row, row + n, 0.0f);
    else
      for (std::size_t j = 0; j < n; ++j)
        row[j] *= beta;
  }
}

[[maybe_unused]] bool fits_blas_int(std::size_t v) noexcept {
  return v <= static_cast<std::size_t>(INT_MAX);
}

} // namespace

void gemm(bool transpose_a, bool transpose_b, std::size_t m, std::size_t n, std::size_t k,
          float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta,
          float* c, std::size_t ldc) noexcept {
  if (m == 0 || n == 0)
    return;
  if (k == 0) {
    // A and B are empty; handled here because BLAS rejects the leading dimensions callers
    // naturally pass for empty matrices (lda = 0).
    scale_c(m, n, beta, c, ldc);
    return;
  }
  // OpenBLAS' cblas takes 32-bit ints (no INTERFACE64 build on Debian).
  assert(fits_blas_int(m) && fits_blas_int(n) && fits_blas_int(k));
  assert(fits_blas_int(lda) && fits_blas_int(ldb) && fits_blas_int(ldc));
  cblas_sgemm(CblasRowMajor, transpose_a ? CblasTrans : CblasNoTrans,
              transpose_b ? CblasTrans : CblasNoTrans, static_cast<int>(m), static_cast<int>(n),
              static_cast<int>(k), alpha, a, static_cast<int>(lda), b, static_cast<int>(ldb), beta,
              c, static_cast<int>(ldc));
}

void gemm_reference(bool transpose_a, bool transpose_b, std::size_t m, std::size_t n, std::size_t k,
                    float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb,
                    float beta, float* c, std::size_t ldc) noexcept {
  for (std::size_t i = 0; i < m; ++i) {
    for (std::size_t j = 0; j < n; ++j) {
      // double accumulation makes the oracle more accurate than the code it checks
      double acc = 0.0;
      for (std::size_t p = 0; p < k; ++p) {
        const float av = transpose_a ? a[p * lda + i] : a[i * lda + p];
        const float bv = transpose_b ? b[j * ldb + p] : b[p * ldb + j];
        acc += static_cast<double>(av) * static_cast<double>(bv);
      }
      float& out = c[i * ldc + j];
      const double scaled = static_cast<double>(alpha) * acc;
      out = static_cast<float>(beta == 0.0f ? scaled : scaled + static_cast<double>(beta) * out);
    }
  }
}

void set_blas_threads(int threads) noexcept {
  openblas_set_num_threads(threads);
}

const char* blas_core_name() noexcept {
  return openblas_get_corename();
}

} // namespace troupe::kernels::cpu
