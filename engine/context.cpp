#include "engine/context.hpp"

#include <charconv>

#include "kernels/cuda/device.hpp"

namespace troupe {

std::string context::to_string() const {
  std::string text = is_gpu() ? "gpu(" : "cpu(";
  text += std::to_string(id);
  text += ')';
  return text;
}

std::optional<context> parse_context(std::string_view text) {
  // Exactly "<kind>(<decimal id>)", as to_string writes it: no spaces, no sign, no other kinds.
  if (text.size() < 6 || text.back() != ')')
    return std::nullopt;
  context ctx;
  if (text.starts_with("cpu("))
    ctx.kind = device_kind::cpu;
  else if (text.starts_with("gpu("))
    ctx.kind = device_kind::gpu;
  else
    return std::nullopt;
  const auto digits = text.substr(4, text.size() - 5);
  if (digits.empty() || digits.front() < '0' || digits.front() > '9')
    return std::nullopt;
  const auto [end, err] = std::from_chars(digits.data(), digits.data() + digits.size(), ctx.id);
  if (err != std::errc{} || end != digits.data() + digits.size())
    return std::nullopt;
  return ctx;
}

int num_gpus() noexcept {
  return kernels::cuda::device_count();
}

status check_available(context ctx) {
  if (ctx.id < 0)
    return error{errc::invalid_argument,
                 ctx.to_string() + " is not a valid context: device ids are >= 0"};
  if (ctx.is_cpu())
    return {};
  const int count = num_gpus();
  if (ctx.id < count)
    return {};
  std::string why;
  if (!kernels::cuda::built_with_cuda())
    why = "troupe was built without CUDA (TROUPE_ENABLE_CUDA=OFF or no nvcc), so there is no "
          "CUDA device";
  else if (count == 0)
    why = std::string{"no CUDA device ("} + kernels::cuda::describe_device(0) + ")";
  else
    why = "this process sees " + std::to_string(count) + " CUDA device(s), gpu(0) to gpu(" +
          std::to_string(count - 1) + ")";
  return error{errc::device_unavailable, ctx.to_string() + " is not available: " + why};
}

std::ostream& operator<<(std::ostream& out, const context& ctx) {
  return out << ctx.to_string();
}

} // namespace troupe
