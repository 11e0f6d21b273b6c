#pragma once
// nn::initializer: the initial values of parameters (mx.init.*).
//
// A block's initialize() hands one initializer to every parameter that has none of its own;
// that default dispatches on the parameter's name as MXNet's Initializer.__call__ does (names
// ending in "bias" or "beta" start at zero, "gamma" at one, everything else — weights — gets the
// initializer's own rule). A parameter's own initializer (a dense layer's bias) applies its rule
// whatever the name, as gluon does with an InitDesc carrying __init__.
//
// Random initializers draw from ndarray::random_uniform / random_normal seeded with the seed
// passed mixed with a stable hash of the parameter's name: the same seed gives the same values
// in every run, and two parameters of one network do not get the same values.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include "engine/ndarray.hpp"

namespace troupe::nn {

class initializer {
public:
  virtual ~initializer() = default;

  /// Fills `array` for the parameter `param_name` by MXNet's name rule: "...bias", "...beta",
  /// "...running_mean", "...moving_mean" → 0; "...gamma", "...running_var", "...moving_var" → 1;
  /// any other name → init_weight (MXNet raises for names it does not know; troupe treats them
  /// as weights).
  virtual void fill(const std::string& param_name, ndarray& array, std::uint64_t seed) const;
  /// This initializer's rule, whatever the name (MXNet's _init_weight). `array` is a float32
  /// array whose shape is complete; an error names the parameter when the rule cannot apply.
  virtual void init_weight(const std::string& param_name, ndarray& array,
                           std::uint64_t seed) const = 0;

  /// The seed a random rule uses for `param_name`: `seed` mixed with a stable (FNV-1a) hash of
  /// the name, so each parameter gets its own stream and a seed reproduces all of them.
  static std::uint64_t seed_for(std::string_view param_name, std::uint64_t seed) noexcept;
};

/// Uniform in [-scale, scale) (mx.init.Uniform, default 0.07).
class uniform final : public initializer {
public:
  explicit uniform(double scale = 0.07);
  void init_weight(const std::string& param_name, ndarray& array,
                   std::uint64_t seed) const override;

private:
  double scale_;
};

/// Normal with mean 0 and standard deviation sigma (mx.init.Normal, default 0.01).
class normal final : public initializer {
public:
  explicit normal(double sigma = 0.01);
  void init_weight(const std::string& param_name, ndarray& array,
                   std::uint64_t seed) const override;

private:
  double sigma_;
};

/// mx.init.Xavier: scale = sqrt(magnitude / factor) with fan_in = shape[1]·prod(shape[2:]),
/// fan_out = shape[0]·prod(shape[2:]) and factor their average, fan_in or fan_out; samples are
/// uniform in [-scale, scale) or normal with standard deviation scale. A parameter of fewer than
/// two axes is an error naming it.
class xavier final : public initializer {
public:
  enum class rnd_type : std::uint8_t { uniform, gaussian };
  enum class factor_type : std::uint8_t { avg, in, out };

  explicit xavier(rnd_type rnd = rnd_type::uniform, factor_type factor = factor_type::avg,
                  double magnitude = 3.0);
  void init_weight(const std::string& param_name, ndarray& array,
                   std::uint64_t seed) const override;

private:
  rnd_type rnd_;
  factor_type factor_;
  double magnitude_;
};

/// Every element `value` (mx.init.Constant).
class constant : public initializer {
public:
  explicit constant(double value);
  void init_weight(const std::string& param_name, ndarray& array,
                   std::uint64_t seed) const override;

private:
  double value_;
};

/// mx.init.Zero and mx.init.One.
class zero final : public constant {
public:
  zero() : constant(0.0) {}
};
class one final : public constant {
public:
  one() : constant(1.0) {}
};

} // namespace troupe::nn
