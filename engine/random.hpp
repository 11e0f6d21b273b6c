#pragma once
// The random source of ndarray's random_uniform / random_normal.
//
// The values depend on the seed alone: std::mt19937_64's output sequence is fixed by the C++
// standard, and the mappings to [0, 1) and to normal samples are written here, because the
// standard leaves std::uniform_real_distribution and std::normal_distribution to each library.
// (std::log, std::sin and std::cos come from the C library; glibc's are accurate to well under an
// ulp, so samples agree across machines to the last bit or, at worst, the last ulp.)

#include <cstdint>
#include <random>

namespace troupe {

class random_generator {
public:
  explicit random_generator(std::uint64_t seed) noexcept : engine_(seed) {}

  /// Uniform in [0, 1): the top 53 bits of one 64-bit draw, scaled by 2^-53.
  double uniform01() noexcept;
  /// Standard normal (mean 0, standard deviation 1) by the Box-Muller transform; each pair of
  /// uniform draws yields two samples, the second kept for the next call.
  double normal() noexcept;

private:
  std::mt19937_64 engine_;
  double spare_ = 0.0;
  bool has_spare_ = false;
};

} // namespace troupe
