#include "engine/gradient_compression.hpp"

#include <cmath>
#include <limits>
#include <sstream>

#include "kernels/cpu/compression.hpp"

namespace troupe {

namespace cpu = kernels::cpu;

result<gradient_compression> gradient_compression::make(std::string_view type,
                                                        std::optional<double> threshold) {
  gradient_compression rule;
  if (type == "2bit")
    rule.type = compression_type::two_bit;
  else if (type == "1bit")
    rule.type = compression_type::one_bit;
  else if (type == "none")
    return rule;
  else
    return error{errc::invalid_argument, "gradient compression type '" + std::string{type} +
                                             "' is not one of 2bit, 1bit, none"};
  if (threshold) {
    const double t = *threshold;
    const bool two_bit = rule.type == compression_type::two_bit;
    if (!std::isfinite(t) || t < 0 || (two_bit && t == 0) ||
        std::fabs(t) > static_cast<double>(std::numeric_limits<float>::max())) {
      std::ostringstream text;
      text << "gradient compression " << type << ": threshold " << t << " must be finite and "
           << (two_bit ? "> 0" : ">= 0");
      return error{errc::invalid_argument, text.str()};
    }
    rule.threshold = static_cast<float>(t);
  }
  return rule;
}

std::string_view gradient_compression::type_name() const noexcept {
  switch (type) {
  case compression_type::two_bit:
    return "2bit";
  case compression_type::one_bit:
    return "1bit";
  case compression_type::none:
    break;
  }
  return "none";
}

std::string gradient_compression::describe() const {
  if (!enabled())
    return "none";
  std::ostringstream text;
  text << type_name() << " with threshold " << threshold;
  if (pulls)
    text << ", pulls too";
  return text.str();
}

bool compressible(dtype type) noexcept {
  return type == dtype::float32 || type == dtype::float16;
}

std::size_t packed_bytes(compression_type type, std::size_t elements) noexcept {
  switch (type) {
  case compression_type::two_bit:
    return cpu::packed_bytes_2bit(elements);
  case compression_type::one_bit:
    return cpu::packed_bytes_1bit(elements);
  case compression_type::none:
    break;
  }
  return 0;
}

void quantize(const gradient_compression& rule, dtype type, const void* values, float* residual,
              std::byte* packed, std::size_t elements) noexcept {
  auto* out = reinterpret_cast<std::uint8_t*>(packed);
  const bool half = type == dtype::float16;
  const auto* f = static_cast<const float*>(values);
  const auto* h = static_cast<const cpu::half_bits*>(values);
  if (rule.type == compression_type::two_bit) {
    half ? cpu::quantize_2bit(h, residual, out, elements, rule.threshold)
         : cpu::quantize_2bit(f, residual, out, elements, rule.threshold);
  } else if (rule.type == compression_type::one_bit) {
    half ? cpu::quantize_1bit(h, residual, out, elements, rule.threshold)
         : cpu::quantize_1bit(f, residual, out, elements, rule.threshold);
  }
}

void dequantize(const gradient_compression& rule, dtype type, const std::byte* packed, void* out,
                std::size_t elements) noexcept {
  const auto* in = reinterpret_cast<const std::uint8_t*>(packed);
  const bool half = type == dtype::float16;
  auto* f = static_cast<float*>(out);
  auto* h = static_cast<cpu::half_bits*>(out);
  if (rule.type == compression_type::two_bit) {
    half ? cpu::dequantize_2bit(in, h, elements, rule.threshold)
         : cpu::dequantize_2bit(in, f, elements, rule.threshold);
  } else if (rule.type == compression_type::one_bit) {
    half ? cpu::dequantize_1bit(in, h, elements) : cpu::dequantize_1bit(in, f, elements);
  }
}

} // namespace troupe
