#pragma once
// Where an ndarray lives: MXNet's Context, cpu(i) or gpu(i). cpu(i) for any i is host memory
// (several cpu contexts model several devices in one process, as MXNet's tests do).

#include <compare>
#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <string_view>

#include "engine/error.hpp"

namespace troupe {

enum class device_kind : std::uint8_t { cpu = 0, gpu = 1 };

struct context {
  device_kind kind = device_kind::cpu;
  int id = 0;

  static constexpr context cpu(int id = 0) noexcept { return {device_kind::cpu, id}; }
  static constexpr context gpu(int id = 0) noexcept { return {device_kind::gpu, id}; }

  bool is_cpu() const noexcept { return kind == device_kind::cpu; }
  bool is_gpu() const noexcept { return kind == device_kind::gpu; }
  /// "cpu(0)", "gpu(1)".
  std::string to_string() const;

  friend constexpr auto operator<=>(const context&, const context&) = default;
};

/// Parses "cpu(0)" or "gpu(3)"; nullopt for anything else.
std::optional<context> parse_context(std::string_view text);
/// Number of GPUs usable by this process (0 in a CPU-only build or without a driver).
int num_gpus() noexcept;
/// Succeeds when this process has the device `ctx` names; otherwise device_unavailable (or
/// invalid_argument for a negative id) with a message saying which device and why it is missing
/// ("gpu(0) is not available: troupe was built without CUDA ...").
status check_available(context ctx);

std::ostream& operator<<(std::ostream& out, const context& ctx);

} // namespace troupe
