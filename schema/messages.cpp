#include "schema/messages.hpp"

#include <algorithm>
#include <type_traits>
#include <utility>

namespace troupe::wire {

std::size_t size_of(dtype type) noexcept {
  switch (type) {
  case dtype::float32:
  case dtype::int32:
    return 4;
  case dtype::float16:
    return 2;
  case dtype::int64:
  case dtype::float64:
    return 8;
  }
  return 0;
}

std::string_view to_string(dtype type) noexcept {
  switch (type) {
  case dtype::float32:
    return "float32";
  case dtype::float16:
    return "float16";
  case dtype::int32:
    return "int32";
  case dtype::int64:
    return "int64";
  case dtype::float64:
    return "float64";
  }
  return "invalid dtype";
}

std::string_view to_string(role node_role) noexcept {
  switch (node_role) {
  case role::scheduler:
    return "scheduler";
  case role::server:
    return "server";
  case role::worker:
    return "worker";
  }
  return "invalid role";
}

std::string describe(role node_role, std::uint32_t rank, std::uint32_t node_id) {
  return std::string{to_string(node_role)} + " " + std::to_string(rank) + " (node " +
         std::to_string(node_id) + ")";
}

std::string describe(const node_identity& who) {
  return std::string{to_string(who.node_role)} + " " + std::to_string(who.rank);
}

std::string describe(const node_info& node) {
  return describe(node.node_role, node.rank, node.node_id);
}

bool operator==(const tensor_chunk& a, const tensor_chunk& b) noexcept {
  return a.type == b.type && a.shape == b.shape && a.total_bytes == b.total_bytes &&
         a.offset == b.offset && std::ranges::equal(a.data, b.data) &&
         a.compression == b.compression && a.row_sparse == b.row_sparse &&
         std::ranges::equal(a.row_ids, b.row_ids);
}

std::uint64_t tensor_chunk::dense_bytes() const noexcept {
  if (compression.type == compression_type::none)
    return data.size();
  return compression.elements * size_of(type);
}

std::string_view to_string(compression_type type) noexcept {
  switch (type) {
  case compression_type::none:
    return "none";
  case compression_type::two_bit:
    return "2bit";
  case compression_type::one_bit:
    return "1bit";
  }
  return "unknown compression";
}

std::string_view kind_name(const message& msg) noexcept {
  static constexpr std::string_view names[] = {"registration",
                                               "admission",
                                               "membership",
                                               "init",
                                               "push",
                                               "pull_request",
                                               "pull_reply",
                                               "pushpull",
                                               "ack",
                                               "barrier",
                                               "barrier_release",
                                               "set_optimizer",
                                               "set_gradient_compression",
                                               "command",
                                               "heartbeat",
                                               "error_reply",
                                               "link_hello",
                                               "arena_offer",
                                               "arena_accept",
                                               "arena_release",
                                               "sync_settings",
                                               "link_credit",
                                               "link_auth",
                                               "batch",
                                               "hand_over",
                                               "range_data"};
  static_assert(std::size(names) == std::variant_size_v<message>);
  if (msg.valueless_by_exception())
    return "valueless";
  return names[msg.index()];
}

bool is_link_control(const message& msg) noexcept {
  return std::holds_alternative<link_hello>(msg) || std::holds_alternative<arena_offer>(msg) ||
         std::holds_alternative<arena_accept>(msg) || std::holds_alternative<arena_release>(msg) ||
         std::holds_alternative<link_credit>(msg) || std::holds_alternative<link_auth>(msg);
}

namespace {
template <class Variant>
const tensor_chunk* tensor_in(const Variant& msg) noexcept {
  return std::visit(
      [](const auto& m) -> const tensor_chunk* {
        if constexpr (requires { m.tensor; })
          return &m.tensor;
        else
          return nullptr;
      },
      msg);
}
} // namespace

const tensor_chunk* tensor_of(const message& msg) noexcept {
  return tensor_in(msg);
}

tensor_chunk* tensor_of(message& msg) noexcept {
  return const_cast<tensor_chunk*>(tensor_in(std::as_const(msg)));
}

const tensor_chunk* tensor_of(const batched& msg) noexcept {
  return tensor_in(msg);
}

tensor_chunk* tensor_of(batched& msg) noexcept {
  return const_cast<tensor_chunk*>(tensor_in(std::as_const(msg)));
}

std::uint64_t request_id_of(const message& msg) noexcept {
  return std::visit(
      [](const auto& m) -> std::uint64_t {
        if constexpr (requires { m.request_id; })
          return m.request_id;
        else
          return 0;
      },
      msg);
}

std::uint64_t* request_id_field(message& msg) noexcept {
  return std::visit(
      [](auto& m) -> std::uint64_t* {
        if constexpr (requires { m.request_id; })
          return &m.request_id;
        else
          return nullptr;
      },
      msg);
}

std::optional<std::uint64_t> key_of(const message& msg) noexcept {
  return std::visit(
      [](const auto& m) -> std::optional<std::uint64_t> {
        if constexpr (requires { m.key; })
          return m.key;
        else
          return std::nullopt;
      },
      msg);
}

message unbatched(batched&& one) {
  return std::visit([](auto& m) -> message { return std::move(m); }, one);
}

namespace {
template <class T, class... Alternatives>
constexpr bool alternative_of(const std::variant<Alternatives...>*) {
  return (std::is_same_v<T, Alternatives> || ...);
}
} // namespace

std::optional<batched> to_batched(message&& msg) {
  return std::visit(
      [](auto& m) -> std::optional<batched> {
        if constexpr (alternative_of<std::remove_cvref_t<decltype(m)>>(
                          static_cast<const batched*>(nullptr)))
          return batched{std::move(m)};
        else
          return std::nullopt;
      },
      msg);
}

} // namespace troupe::wire
