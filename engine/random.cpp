#include "engine/random.hpp"

#include <cmath>
#include <numbers>
#include <utility>

namespace troupe {

namespace {

constexpr double two_to_minus_53 = 1.0 / 9007199254740992.0;

} // namespace

std::uint64_t mix_bits(std::uint64_t value) noexcept {
  value += 0x9e3779b97f4a7c15ULL;
  value = (value ^ (value >> 30)) * 0xbf58476d1ce4e5b9ULL;
  value = (value ^ (value >> 27)) * 0x94d049bb133111ebULL;
  return value ^ (value >> 31);
}

std::uint64_t uniform_below(std::mt19937_64& engine, std::uint64_t bound) {
  const std::uint64_t limit = std::mt19937_64::max() - std::mt19937_64::max() % bound;
  std::uint64_t draw = engine();
  while (draw >= limit)
    draw = engine();
  return draw % bound;
}

void shuffle_indices(std::span<std::int64_t> values, std::mt19937_64& engine) {
  for (std::size_t i = values.size(); i > 1; --i)
    std::swap(values[i - 1], values[uniform_below(engine, i)]);
}

double random_generator::uniform01() noexcept {
  return static_cast<double>(engine_() >> 11) * two_to_minus_53;
}

double random_generator::normal() noexcept {
  if (has_spare_) {
    has_spare_ = false;
    return spare_;
  }
  // u1 in (0, 1] so that the logarithm is finite; u2 in [0, 1).
  const double u1 = static_cast<double>((engine_() >> 11) + 1) * two_to_minus_53;
  const double u2 = uniform01();
  const double radius = std::sqrt(-2.0 * std::log(u1));
  const double angle = 2.0 * std::numbers::pi * u2;
  spare_ = radius * std::sin(angle);
  has_spare_ = true;
  return radius * std::cos(angle);
}

} // namespace troupe
