#pragma once
// Reductions over raw host buffers.

#include <cstddef>

namespace troupe::kernels::cpu {

/// Σ x[i], accumulated in double; 0 for n == 0.
double sum(const float* x, std::size_t n) noexcept;
double sum(const double* x, std::size_t n) noexcept;
/// sqrt(Σ x[i]²), accumulated in double; 0 for n == 0.
double l2_norm(const float* x, std::size_t n) noexcept;
double l2_norm(const double* x, std::size_t n) noexcept;

} // namespace troupe::kernels::cpu
