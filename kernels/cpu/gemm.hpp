#pragma once
// Single-precision GEMM through OpenBLAS, row-major:
//   C[m×n] = alpha · op(A) · op(B) + beta · C, with op(X) = X or Xᵀ.
// lda/ldb/ldc are row strides in elements of the matrices as stored.

#include <cstddef>

namespace troupe::kernels::cpu {

void gemm(bool transpose_a, bool transpose_b, std::size_t m, std::size_t n, std::size_t k,
          float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta,
          float* c, std::size_t ldc) noexcept;

/// Reference triple loop with the same contract, the oracle for gemm() in tests.
void gemm_reference(bool transpose_a, bool transpose_b, std::size_t m, std::size_t n, std::size_t k,
                    float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb,
                    float beta, float* c, std::size_t ldc) noexcept;

} // namespace troupe::kernels::cpu
