#pragma once
// Drives a shard_core message by message, with no network, no actors and a clock the test moves:
// what the server shard tests share. Replies are collected in order, with their keepalives, so a
// test can look up the answer to each request id.

#include <algorithm>
#include <cstring>
#include <memory>
#include <optional>
#include <vector>

#include "actors/logic/shard_core.hpp"
#include "actors/logic/wire_conversions.hpp"
#include "schema/chunking.hpp"

namespace troupe::testing {

/// A tensor chunk viewing a whole array.
inline wire::tensor_chunk whole(const ndarray& array) {
  wire::tensor_chunk tensor;
  tensor.type = to_wire(array.dtype());
  tensor.shape.assign(array.shape().begin(), array.shape().end());
  tensor.total_bytes = array.nbytes();
  tensor.data = {static_cast<const std::byte*>(array.raw_data()), array.nbytes()};
  return tensor;
}

/// The float32 values of a reply's tensor.
inline std::vector<float> floats_of(const wire::tensor_chunk& tensor) {
  std::vector<float> values(tensor.data.size() / sizeof(float));
  if (!values.empty())
    std::memcpy(values.data(), tensor.data.data(), tensor.data.size());
  return values;
}

struct shard_driver {
  shard_clock::time_point now{};
  std::vector<envelope> replies;
  std::unique_ptr<shard_core> shard;
  std::uint64_t next_id = 1000;

  /// A shard of a job of `workers` workers with `policy` (quorum 0: all), whose clock is `now`.
  explicit shard_driver(std::uint32_t workers, sync_policy policy = {},
                        shard_options options = {}) {
    options.num_workers = workers;
    options.policy = policy;
    options.clock = [this] { return now; };
    shard = std::make_unique<shard_core>(std::move(options));
  }

  /// The data connection send() delivers by.
  static constexpr std::uint64_t connection = 7;

  void send(wire::message msg, std::shared_ptr<const void> keepalive = nullptr) {
    send_by(connection, std::move(msg), std::move(keepalive));
  }

  /// Sends `msg` as if it came by data connection `by`.
  void send_by(std::uint64_t by, wire::message msg,
               std::shared_ptr<const void> keepalive = nullptr) {
    shard->handle(envelope{std::move(msg), std::move(keepalive), by},
                  [this](envelope out) { replies.push_back(std::move(out)); });
  }

  /// Sends `msg` whose tensor views `value`.
  void send(wire::message msg, const ndarray& value) { send(std::move(msg), value.keepalive()); }

  /// The chunks of a push of `value` (kept alive by the caller), to send one by one.
  static std::vector<wire::message> push_chunks(std::uint64_t id, std::uint64_t key,
                                                std::uint32_t sender, std::uint64_t round,
                                                const ndarray& value, std::size_t chunk_bytes,
                                                bool pushpull = false) {
    wire::message msg = pushpull
                            ? wire::message{wire::pushpull{id, key, sender, round, whole(value)}}
                            : wire::message{wire::push{id, key, sender, round, whole(value)}};
    wire::chunker chunks{std::move(msg), chunk_bytes};
    std::vector<wire::message> out;
    for (std::size_t i = 0; i < chunks.chunk_count(); ++i)
      out.push_back(chunks.chunk(i));
    return out;
  }

  /// Inits `key` with `value` (whole, one chunk) and returns whether it was acknowledged.
  bool init(std::uint64_t key, const ndarray& value) {
    auto id = next_id++;
    send(wire::init{id, key, whole(value)}, value.keepalive());
    return ack(id) != nullptr;
  }

  /// Pushes `value` whole as `sender`'s round `round`; returns the request id.
  std::uint64_t push(std::uint64_t key, std::uint32_t sender, std::uint64_t round,
                     const ndarray& value) {
    auto id = next_id++;
    send(wire::push{id, key, sender, round, whole(value)}, value.keepalive());
    return id;
  }

  std::uint64_t pushpull(std::uint64_t key, std::uint32_t sender, std::uint64_t round,
                         const ndarray& value, std::uint32_t timeout_ms = 0) {
    auto id = next_id++;
    send(wire::pushpull{id, key, sender, round, whole(value), timeout_ms}, value.keepalive());
    return id;
  }

  std::uint64_t pull(std::uint64_t key, std::uint32_t sender, std::uint64_t round,
                     std::uint32_t timeout_ms = 0) {
    auto id = next_id++;
    send(wire::pull_request{id, key, sender, round, timeout_ms});
    return id;
  }

  template <class T>
  const T* reply_to(std::uint64_t id) const {
    for (const auto& reply : replies)
      if (auto* typed = std::get_if<T>(&reply.msg); typed && typed->request_id == id)
        return typed;
    return nullptr;
  }
  const wire::ack* ack(std::uint64_t id) const { return reply_to<wire::ack>(id); }
  const wire::error_reply* error(std::uint64_t id) const { return reply_to<wire::error_reply>(id); }
  const wire::pull_reply* value_reply(std::uint64_t id) const {
    return reply_to<wire::pull_reply>(id);
  }
  /// How many replies (chunks included) went to request `id`.
  std::size_t replies_to(std::uint64_t id) const {
    std::size_t count = 0;
    for (const auto& reply : replies)
      if (wire::request_id_of(reply.msg) == id)
        ++count;
    return count;
  }
  /// The values a (one-chunk) pull reply carried, or nullopt when none came.
  std::optional<std::vector<float>> pulled(std::uint64_t id) const {
    auto* reply = value_reply(id);
    if (reply == nullptr)
      return std::nullopt;
    return floats_of(reply->tensor);
  }

  std::vector<float> stored(std::uint64_t key) const {
    return shard->value(key).to_vector<float>();
  }
};

/// A dist_sync policy whose rounds close with `quorum` workers.
inline sync_policy quorum_of(std::uint32_t quorum, std::uint32_t ahead = 2, bool rescale = false) {
  sync_policy policy;
  policy.quorum = quorum;
  policy.max_rounds_ahead = ahead;
  policy.rescale_quorum = rescale;
  return policy;
}

/// A membership table of `workers` workers (and one server) in which the ranks `lost` are gone
/// and the ranks `left` left the job.
inline wire::membership with_lost_workers(std::uint32_t workers,
                                          const std::vector<std::uint32_t>& lost,
                                          const std::vector<std::uint32_t>& left = {}) {
  wire::membership table;
  table.epoch = 2;
  table.num_workers = workers;
  table.num_servers = 1;
  for (std::uint32_t rank = 0; rank < workers; ++rank) {
    wire::node_info node;
    node.node_role = wire::role::worker;
    node.rank = rank;
    node.alive = std::find(lost.begin(), lost.end(), rank) == lost.end();
    node.left = std::find(left.begin(), left.end(), rank) != left.end();
    table.nodes.push_back(node);
  }
  return table;
}

/// A membership table of `workers` workers in which the ranks `left` left the job.
inline wire::membership with_left_workers(std::uint32_t workers,
                                          const std::vector<std::uint32_t>& left) {
  return with_lost_workers(workers, {}, left);
}

} // namespace troupe::testing
