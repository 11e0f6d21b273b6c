#include "engine/random.hpp"

#include <cmath>
#include <numbers>

namespace troupe {

namespace {

constexpr double two_to_minus_53 = 1.0 / 9007199254740992.0;

} // namespace

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
