#pragma once
// The random source of ndarray's random_uniform / random_normal, and the seed mixing and
// shuffling that the data loaders and initializers share.
//
// The values depend on the seed alone: std::mt19937_64's output sequence is fixed by the C++
// standard, and the mappings to [0, 1) and to normal samples are written here, because the
// standard leaves std::uniform_real_distribution and std::normal_distribution to each library.
// (std::log, std::sin and std::cos come from the C library; glibc's are accurate to well under an
// ulp, so samples agree across machines to the last bit or, at worst, the last ulp.)

#include <cstdint>
#include <random>
#include <span>

namespace troupe {

/// splitmix64's finaliser: spreads every input bit over the output, so that seeds that differ in
/// a few bits (neighbouring epochs, similar names' hashes) seed unrelated generators.
std::uint64_t mix_bits(std::uint64_t value) noexcept;

/// Uniform in [0, bound) (bound > 0) by rejection, so that the result depends only on
/// mt19937_64's standard-fixed output (std::uniform_int_distribution differs between standard
/// libraries).
std::uint64_t uniform_below(std::mt19937_64& engine, std::uint64_t bound);

/// Fisher-Yates over `values` with uniform_below: the same permutation for the same engine state
/// on every standard library (std::shuffle's is unspecified).
void shuffle_indices(std::span<std::int64_t> values, std::mt19937_64& engine);

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
