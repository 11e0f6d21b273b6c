#include "engine/nn/initializer.hpp"

#include <cmath>
#include <string>

#include "engine/error.hpp"
#include "engine/random.hpp"

namespace troupe::nn {

namespace {

bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

} // namespace

void initializer::fill(const std::string& param_name, ndarray& array, std::uint64_t seed) const {
  for (std::string_view suffix : {"bias", "beta", "running_mean", "moving_mean"})
    if (ends_with(param_name, suffix)) {
      array.fill(0.0);
      return;
    }
  for (std::string_view suffix : {"gamma", "running_var", "moving_var"})
    if (ends_with(param_name, suffix)) {
      array.fill(1.0);
      return;
    }
  init_weight(param_name, array, seed);
}

std::uint64_t initializer::seed_for(std::string_view param_name, std::uint64_t seed) noexcept {
  std::uint64_t hash = 0xcbf29ce484222325ULL; // FNV-1a: stable across runs and libraries
  for (char c : param_name) {
    hash ^= static_cast<unsigned char>(c);
    hash *= 0x100000001b3ULL;
  }
  return mix_bits(mix_bits(seed) ^ hash);
}

uniform::uniform(double scale) : scale_(scale) {
  if (!(scale >= 0.0) || !std::isfinite(scale))
    throw exception(errc::invalid_argument,
                    "uniform initializer scale must be finite and >= 0, got " +
                        std::to_string(scale));
}

void uniform::init_weight(const std::string& param_name, ndarray& array, std::uint64_t seed) const {
  ndarray::random_uniform(-scale_, scale_, array.shape(), seed_for(param_name, seed), array.ctx(),
                          array.dtype())
      .copy_to(array);
}

normal::normal(double sigma) : sigma_(sigma) {
  if (!(sigma >= 0.0) || !std::isfinite(sigma))
    throw exception(errc::invalid_argument,
                    "normal initializer sigma must be finite and >= 0, got " +
                        std::to_string(sigma));
}

void normal::init_weight(const std::string& param_name, ndarray& array, std::uint64_t seed) const {
  ndarray::random_normal(0.0, sigma_, array.shape(), seed_for(param_name, seed), array.ctx(),
                         array.dtype())
      .copy_to(array);
}

xavier::xavier(rnd_type rnd, factor_type factor, double magnitude)
    : rnd_(rnd), factor_(factor), magnitude_(magnitude) {
  if (!(magnitude >= 0.0) || !std::isfinite(magnitude))
    throw exception(errc::invalid_argument,
                    "xavier initializer magnitude must be finite and >= 0, got " +
                        std::to_string(magnitude));
}

void xavier::init_weight(const std::string& param_name, ndarray& array, std::uint64_t seed) const {
  const auto& shape = array.shape();
  if (shape.size() < 2)
    throw exception(errc::invalid_argument, "xavier initializer cannot be applied to parameter " +
                                                param_name + " of shape " + shape_to_string(shape) +
                                                ": it needs at least 2 axes");
  double receptive_field = 1.0;
  for (std::size_t axis = 2; axis < shape.size(); ++axis)
    receptive_field *= static_cast<double>(shape[axis]);
  double fan_in = static_cast<double>(shape[1]) * receptive_field;
  double fan_out = static_cast<double>(shape[0]) * receptive_field;
  double factor = factor_ == factor_type::avg  ? (fan_in + fan_out) / 2.0
                  : factor_ == factor_type::in ? fan_in
                                               : fan_out;
  if (!(factor > 0.0))
    throw exception(errc::invalid_argument, "xavier initializer cannot be applied to parameter " +
                                                param_name + " of shape " + shape_to_string(shape) +
                                                ": its fan is 0");
  double scale = std::sqrt(magnitude_ / factor);
  auto seeded = seed_for(param_name, seed);
  ndarray values =
      rnd_ == rnd_type::uniform
          ? ndarray::random_uniform(-scale, scale, shape, seeded, array.ctx(), array.dtype())
          : ndarray::random_normal(0.0, scale, shape, seeded, array.ctx(), array.dtype());
  values.copy_to(array);
}

constant::constant(double value) : value_(value) {}

void constant::init_weight(const std::string&, ndarray& array, std::uint64_t) const {
  array.fill(value_);
}

} // namespace troupe::nn
