#pragma once
// Single-precision GEMM through OpenBLAS, row-major:
//   C[m×n] = alpha · op(A) · op(B) + beta · C, with op(X) = X or Xᵀ.
// lda/ldb/ldc are row strides in elements of the matrices as stored.

#include <cstddef>

namespace troupe::kernels::cpu {

void gemm(bool transpose_a, bool transpose_b, std::size_t m, std::size_t n, std::size_t k,
          float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb, float beta,
          float* c, std::size_t ldc) noexcept;

/// The name of the kernels OpenBLAS chose when it loaded ("SkylakeX", "Haswell", "Prescott"...).
const char* blas_core_name() noexcept;

/// Threads OpenBLAS may use for one GEMM (1: the calling thread only).
void set_blas_threads(int threads) noexcept;

/// Reference triple loop with the same contract, the oracle for gemm() in tests.
void gemm_reference(bool transpose_a, bool transpose_b, std::size_t m, std::size_t n, std::size_t k,
                    float alpha, const float* a, std::size_t lda, const float* b, std::size_t ldb,
                    float beta, float* c, std::size_t ldc) noexcept;

} // namespace troupe::kernels::cpu
