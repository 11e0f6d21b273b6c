#pragma once
// A raw TCP peer of a troupe listener on this host, for bytes no encoder would write: junk, a
// lying length prefix, frames out of protocol order. Reads time out after 5 s. It can also do
// the link handshake properly (handshake()), with any token.

#include <arpa/inet.h>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <netinet/in.h>
#include <optional>
#include <poll.h>
#include <span>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>
#include <utility>
#include <vector>

#include "actors/logic/link_auth.hpp"
#include "schema/codec.hpp"

namespace troupe::testing {

struct raw_peer {
  explicit raw_peer(std::uint16_t port, const char* address = "127.0.0.1") {
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval timeout{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
    ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &timeout, sizeof timeout);
    sockaddr_in to{};
    to.sin_family = AF_INET;
    to.sin_port = htons(port);
    ::inet_pton(AF_INET, address, &to.sin_addr);
    connected = ::connect(fd, reinterpret_cast<sockaddr*>(&to), sizeof to) == 0;
  }
  /// No connection yet: a test fills in fd (an accepted socket).
  raw_peer() = default;
  raw_peer(raw_peer&& other) noexcept
      : fd(std::exchange(other.fd, -1)), connected(other.connected),
        last_body(std::move(other.last_body)), credited(other.credited) {}
  raw_peer(const raw_peer&) = delete;
  raw_peer& operator=(const raw_peer&) = delete;
  raw_peer& operator=(raw_peer&&) = delete;
  ~raw_peer() { close(); }

  void close() {
    if (fd >= 0)
      ::close(fd);
    fd = -1;
  }

  bool send(std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      auto n = ::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL);
      if (n <= 0)
        return false;
      bytes = bytes.subspan(static_cast<std::size_t>(n));
    }
    return true;
  }
  /// An 8-byte little-endian frame length prefix announcing `body_length` bytes.
  static std::vector<std::byte> prefix_bytes(std::uint64_t body_length) {
    std::vector<std::byte> prefix(wire::frame_prefix_bytes);
    for (std::size_t i = 0; i < prefix.size(); ++i)
      prefix[i] = static_cast<std::byte>(body_length >> (8 * i));
    return prefix;
  }
  bool send_prefix(std::uint64_t body_length) { return send(prefix_bytes(body_length)); }
  /// Reads exactly `size` bytes; false on close, error or timeout.
  bool receive(void* out, std::size_t size) {
    auto* at = static_cast<char*>(out);
    while (size > 0) {
      auto n = ::recv(fd, at, size, 0);
      if (n <= 0)
        return false;
      at += n;
      size -= static_cast<std::size_t>(n);
    }
    return true;
  }
  /// The next frame from the server, decoded (into a buffer kept in `last_body`).
  std::optional<wire::message> receive_frame() {
    std::byte prefix[8];
    if (!receive(prefix, sizeof prefix))
      return std::nullopt;
    auto length = wire::read_frame_prefix(prefix);
    if (!length)
      return std::nullopt;
    last_body.assign(*length / 8, 0);
    if (!receive(last_body.data(), *length))
      return std::nullopt;
    auto decoded = wire::decode_body(std::as_bytes(std::span(last_body)));
    if (!decoded)
      return std::nullopt;
    return decoded->msg;
  }
  /// The link handshake as a connector: reads the server's hello (sent as the connection opens),
  /// answers with ours and its proof of `token` (window 0: the server may send without credit)
  /// and reads the server's link_auth. Returns the server's hello; nullopt when a step failed
  /// (the server refused the proof, or its link_auth did not check out).
  std::optional<wire::link_hello> handshake(std::uint64_t window = 0, const std::string& token = "",
                                            const std::string& host_id = "raw peer",
                                            std::uint64_t arena_bytes = 0) {
    auto theirs = server_hello();
    if (!theirs)
      return std::nullopt;
    const auto ours = connector_hello(*theirs, token, window, host_id, arena_bytes);
    if (!send(wire::encode(ours).flatten()))
      return std::nullopt;
    auto auth = receive_frame();
    if (!auth || !std::holds_alternative<wire::link_auth>(*auth) ||
        !same_digest(std::get<wire::link_auth>(*auth).proof,
                     link_proof(link_secret(token), true, *theirs, ours)))
      return std::nullopt;
    return theirs;
  }
  /// A connector's hello answering `listener`'s, with a fresh nonce and the proof of `token`.
  static wire::link_hello connector_hello(const wire::link_hello& listener,
                                          const std::string& token, std::uint64_t window = 0,
                                          const std::string& host_id = "raw peer",
                                          std::uint64_t arena_bytes = 0) {
    wire::link_hello ours{host_id, arena_bytes, window, fresh_nonce(), std::nullopt};
    ours.proof = link_proof(link_secret(token), false, listener, ours);
    return ours;
  }
  /// The server's link hello: its first frame.
  std::optional<wire::link_hello> server_hello() {
    auto frame = receive_frame();
    if (!frame || !std::holds_alternative<wire::link_hello>(*frame))
      return std::nullopt;
    return std::get<wire::link_hello>(*frame);
  }
  /// The next frame that is not a link credit (credits are added up in `credited`).
  std::optional<wire::message> receive_reply() {
    for (;;) {
      auto frame = receive_frame();
      if (!frame || !std::holds_alternative<wire::link_credit>(*frame))
        return frame;
      credited += std::get<wire::link_credit>(*frame).bytes;
    }
  }
  /// Reads for up to `timeout`, until the peer closes; returns the bytes and whether it closed.
  std::pair<std::vector<std::byte>, bool> read_until_closed(std::chrono::milliseconds timeout) {
    std::vector<std::byte> got;
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left <= std::chrono::milliseconds{0})
        return {got, false};
      pollfd probe{fd, POLLIN, 0};
      if (::poll(&probe, 1, static_cast<int>(left.count())) <= 0)
        continue;
      std::byte buffer[4096];
      const ssize_t n = ::recv(fd, buffer, sizeof buffer, 0);
      if (n <= 0)
        return {got, true};
      got.insert(got.end(), buffer, buffer + n);
    }
  }
  /// The whole frames at the start of `bytes`, decoded, until one does not decode.
  static std::vector<wire::message> frames(std::span<const std::byte> bytes) {
    std::vector<wire::message> decoded;
    while (bytes.size() >= wire::frame_prefix_bytes) {
      auto length = wire::read_frame_prefix(bytes.first(wire::frame_prefix_bytes));
      if (!length || bytes.size() < wire::frame_prefix_bytes + *length)
        break;
      auto frame = wire::decode(bytes.first(wire::frame_prefix_bytes + *length));
      if (!frame)
        break;
      decoded.push_back(frame->msg);
      bytes = bytes.subspan(wire::frame_prefix_bytes + *length);
    }
    return decoded;
  }
  /// The first frame in `bytes` that is not the link's own (a listener's hello comes first).
  static std::optional<wire::message> first_frame(std::span<const std::byte> bytes) {
    for (auto& frame : frames(bytes))
      if (!wire::is_link_control(frame))
        return frame;
    return std::nullopt;
  }
  /// True when the server closed the connection (EOF) within the receive timeout.
  bool sees_close() {
    char byte;
    return ::recv(fd, &byte, 1, 0) == 0;
  }

  int fd = -1;
  bool connected = false;
  std::vector<std::uint64_t> last_body;
  std::uint64_t credited = 0;
};

} // namespace troupe::testing
