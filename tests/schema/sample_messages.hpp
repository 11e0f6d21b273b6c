#pragma once
// One message of every kind, with every field set to a value distinct from its default, shared by
// the round-trip and the hostile-frame tests.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "schema/messages.hpp"

namespace troupe::test {

/// An 8-byte-aligned byte buffer of `size` bytes holding a repeatable pattern (never all zero).
class pattern_buffer {
public:
  explicit pattern_buffer(std::size_t size, std::uint64_t seed = 1)
      : words_(new std::uint64_t[(size + 7) / 8]), size_(size) {
    std::uint64_t x = seed * 0x9e3779b97f4a7c15ull + 1;
    for (std::size_t i = 0; i < (size + 7) / 8; ++i) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      words_[i] = x;
    }
  }
  std::span<std::byte> bytes() noexcept {
    return {reinterpret_cast<std::byte*>(words_.get()), size_};
  }
  std::span<const std::byte> bytes() const noexcept {
    return {reinterpret_cast<const std::byte*>(words_.get()), size_};
  }

private:
  std::unique_ptr<std::uint64_t[]> words_;
  std::size_t size_;
};

/// A whole float32 tensor of shape {rows, cols} over `payload` (payload.size() == rows*cols*4).
inline wire::tensor_chunk float_tensor(std::span<const std::byte> payload, std::int64_t rows,
                                       std::int64_t cols) {
  return wire::tensor_chunk{wire::dtype::float32, {rows, cols}, payload.size(), 0, payload};
}

/// Every alternative of wire::message, in variant order; tensor payloads view `payload`, whose
/// size must be a multiple of 8 (it is used as float32, int64 and float16 data).
inline std::vector<wire::message> sample_messages(std::span<const std::byte> payload) {
  using namespace troupe::wire;
  const auto n = static_cast<std::int64_t>(payload.size());
  std::vector<message> out;
  out.push_back(registration{101, protocol_version, role::server, "job-42", "10.0.0.7", 9091, 5});
  out.push_back(
      registration{103, protocol_version, role::worker, "job-42", "10.0.0.8", 0, -1, false, true});
  sealed_secret sealed{};
  sealed.fill(0xA5);
  out.push_back(admission{102, admitted{3, 11, sealed, true, {1, 4, 2}}});
  out.push_back(membership{7,
                           4,
                           2,
                           {node_info{1, role::scheduler, 0, "sched.example", 9000, true},
                            node_info{8, role::server, 0, "10.0.0.7", 9091, true},
                            node_info{9, role::worker, 1, "10.0.0.9", 0, false}},
                           {key_range{0, 1000, 0, 0}, key_range{1000, 5000, 0, 1},
                            key_range{5000, ~std::uint64_t{0}, 1, 0}}});
  out.push_back(init{103, 5, tensor_chunk{dtype::int64, {n / 8}, payload.size(), 0, payload}});
  out.push_back(push{104, 6, 2, 17, float_tensor(payload, 2, n / 8)});
  // The same push 2bit compressed: payload's words pack 4 elements per byte.
  out.push_back(
      push{104, 6, 2, 18,
           tensor_chunk{dtype::float32,
                        {n * 4},
                        payload.size() * 16,
                        0,
                        payload,
                        std::nullopt,
                        tensor_compression{compression_type::two_bit, 0.5f, payload.size() * 4}}});
  out.push_back(pull_request{105, 6, 2, 17, 30'000});
  out.push_back(
      pull_reply{105, 6, 17, tensor_chunk{dtype::float16, {n / 2}, payload.size(), 0, payload}});
  out.push_back(pushpull{106, 7, 3, 18, float_tensor(payload, n / 4, 1), 5'000});
  // Compressed pulls: the offer, and a packed reply (payload.size() * 8 one-bit elements).
  out.push_back(pull_request{105, 6, 2, 17, 30'000, false, {}, {compression_type::one_bit, 0}});
  out.push_back(pull_reply{
      105, 6, 17,
      tensor_chunk{dtype::float32,
                   {static_cast<std::int64_t>(payload.size() * 8)},
                   payload.size() * 32,
                   0,
                   payload,
                   std::nullopt,
                   tensor_compression{compression_type::one_bit, 0.0f, payload.size() * 8}}});
  out.push_back(ack{107, 12, true});
  out.push_back(barrier{108, 4, group::workers | group::servers, 9, {2.5, -1.0}});
  out.push_back(barrier{109, 2, group::workers, 11, {}, true});
  out.push_back(
      barrier_release{108, 4, group::workers | group::servers, {{role::worker, 1, {2.5, -1.0}}}});
  out.push_back(set_optimizer{
      109, "sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}, {"rescale_grad", 1.0 / 32}}});
  out.push_back(set_gradient_compression{110, "2bit", 0.25});
  out.push_back(command{111, command_kind::save_checkpoint, "/tmp/ckpt/epoch-3"});
  out.push_back(heartbeat{9, 12345, 1'700'000'000'123'456'789});
  out.push_back(error_reply{104, 6, error_code::shape_mismatch, "push of (2,3) to key 6 of (3,3)"});
  link_digest nonce{}, proof{};
  for (std::size_t i = 0; i < nonce.size(); ++i) {
    nonce[i] = static_cast<std::uint8_t>(i * 7 + 1);
    proof[i] = static_cast<std::uint8_t>(255 - i);
  }
  // The listener's hello has no proof, the connector's has one.
  out.push_back(link_hello{"0b1c2d3e-boot-id/host", std::uint64_t{64} << 20,
                           std::uint64_t{32} << 20, nonce, std::nullopt});
  out.push_back(link_hello{"other-boot-id/host", 0, 0, proof, nonce});
  // A node's control link sends its key share; a worker's data link claims its rank and proves
  // its node key.
  out.push_back(link_hello{"other-boot-id/host", 0, 0, proof, nonce, nonce});
  out.push_back(link_hello{"other-boot-id/host", 0, 0, proof, nonce, std::nullopt,
                           node_identity{role::worker, 7}, proof});
  out.push_back(arena_offer{"/troupe-0123456789abcdef0123456789abcdef", std::uint64_t{64} << 20});
  out.push_back(arena_accept{false, "shared memory is off here"});
  out.push_back(arena_release{{0, 4096, std::uint64_t{1} << 40}});
  out.push_back(sync_settings{112, consistency_mode::async, 3, true, 2, 4});
  out.push_back(link_credit{std::uint64_t{8} << 20});
  out.push_back(link_auth{proof});
  out.push_back(link_auth{proof, nonce, std::nullopt});
  out.push_back(link_auth{proof, std::nullopt, nonce});
  // A worker's requests and a server's answers, fused.
  out.push_back(
      batch{{push{113, 6, 2, 18, float_tensor(payload, 2, n / 8)}, pull_request{114, 8, 2, 3, 0},
             pushpull{115, 9, 2, 4, float_tensor(payload, n / 4, 1), 5'000, true}}});
  out.push_back(
      batch{{ack{113, 19, false, 7}, pull_reply{114, 8, 3, float_tensor(payload, 2, n / 8), 2},
             error_reply{115, 9, error_code::shape_mismatch, "pushpull of key 9"}}});
  // Elastic servers: the scheduler's hand-over order, and one shard's snapshot as int64 words
  // (n bytes of payload, the last 3 padding).
  out.push_back(hand_over{116, {1, 3}, 2});
  out.push_back(range_data{117, 1, payload.size() - 3,
                           tensor_chunk{dtype::int64,
                                        {static_cast<std::int64_t>(payload.size() / 8)},
                                        payload.size(),
                                        0,
                                        payload}});
  return out;
}

} // namespace troupe::test
