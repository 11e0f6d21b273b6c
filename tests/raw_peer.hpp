#pragma once
// A raw TCP peer of a troupe listener on this host, for bytes no encoder would write: junk, a
// lying length prefix, frames out of protocol order. Reads time out after 5 s. It can also do
// the link handshake properly (handshake()), with any token, as an admitted node with any node
// key (handshake_as(): an insider, a compromised worker), and speak TLS 1.3 with any
// certificate, key and CA, or none (start_tls()), which troupe's own links would refuse to load.
// A real node key comes from registering with a job's scheduler as a node (node_agent::join as a
// worker, then node_agent::key()), or from derive_node_key for a job secret the test chose.

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <optional>
#include <poll.h>
#include <span>
#include <string>
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
        refusal(std::move(other.refusal)), last_body(std::move(other.last_body)),
        credited(other.credited), tls_context(std::move(other.tls_context)),
        tls(std::exchange(other.tls, nullptr)), tls_failure(std::move(other.tls_failure)) {}
  raw_peer(const raw_peer&) = delete;
  raw_peer& operator=(const raw_peer&) = delete;
  raw_peer& operator=(raw_peer&&) = delete;
  ~raw_peer() { close(); }

  void close() {
    SSL_free(tls);
    tls = nullptr;
    if (fd >= 0)
      ::close(fd);
    fd = -1;
  }

  /// Speaks TLS 1.3 from now on, as the connector: presents `cert_file` with `key_file` (no
  /// certificate when empty) and checks the listener's certificate against `ca_file` (no check
  /// when empty). Returns why the handshake failed, empty when it went through: a TLS 1.3 client
  /// is done before the listener has checked its certificate, so a refusal shows at the next read
  /// (tls_failure then says why).
  std::string start_tls(const std::string& ca_file, const std::string& cert_file = "",
                        const std::string& key_file = "") {
    tls_context.reset(SSL_CTX_new(TLS_client_method()), SSL_CTX_free);
    auto* context = tls_context.get();
    SSL_CTX_set_min_proto_version(context, TLS1_3_VERSION);
    if (!ca_file.empty()) {
      if (SSL_CTX_load_verify_locations(context, ca_file.c_str(), nullptr) != 1)
        return "cannot load " + ca_file;
      SSL_CTX_set_verify(context, SSL_VERIFY_PEER, nullptr);
    }
    if (!cert_file.empty() &&
        (SSL_CTX_use_certificate_chain_file(context, cert_file.c_str()) != 1 ||
         SSL_CTX_use_PrivateKey_file(context, key_file.c_str(), SSL_FILETYPE_PEM) != 1))
      return "cannot load " + cert_file + " and " + key_file;
    tls = SSL_new(context);
    SSL_set_fd(tls, fd);
    ERR_clear_error();
    if (SSL_connect(tls) != 1) {
      note_tls_failure();
      return tls_failure;
    }
    return {};
  }

  /// Whether a TLS listener refuses this connection when it presents `cert_file` (none when
  /// empty) and checks the listener against `ca_file`: the handshake fails, or (a TLS 1.3 client
  /// finishes first) the listener's alert and close come instead of its hello. tls_failure then
  /// says why.
  bool refused_over_tls(const std::string& ca_file, const std::string& cert_file,
                        const std::string& key_file) {
    if (!start_tls(ca_file, cert_file, key_file).empty())
      return true;
    return !server_hello().has_value() && sees_close();
  }

  /// What ::send does, through TLS once it is on.
  ssize_t write_some(const void* data, std::size_t size) {
    if (!tls)
      return ::send(fd, data, size, MSG_NOSIGNAL);
    const int n = SSL_write(tls, data, static_cast<int>(size));
    if (n <= 0)
      note_tls_failure();
    return n > 0 ? n : -1;
  }
  /// What ::recv does (0: the peer closed, -1: an error or the timeout), through TLS once it is
  /// on, where a fatal alert from the peer also reads as closed (tls_failure says which alert).
  ssize_t read_some(void* out, std::size_t size) {
    if (!tls)
      return ::recv(fd, out, size, 0);
    ERR_clear_error();
    const int n = SSL_read(tls, out, static_cast<int>(size));
    if (n > 0)
      return n;
    const int code = SSL_get_error(tls, n);
    if (code == SSL_ERROR_SYSCALL && (errno == EAGAIN || errno == EWOULDBLOCK))
      return -1;
    note_tls_failure();
    return 0;
  }

  bool send(std::span<const std::byte> bytes) {
    while (!bytes.empty()) {
      auto n = write_some(bytes.data(), bytes.size());
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
      auto n = read_some(at, size);
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
    auto done = exchange_hellos([&](const wire::link_hello& theirs) {
      return connector_hello(theirs, token, window, host_id, arena_bytes);
    });
    if (!done || !same_digest(done->auth.proof,
                              link_proof(link_secret(token), true, done->theirs, done->ours)))
      return std::nullopt;
    return done->theirs;
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
  /// A connector's hello answering `listener`'s that claims to be node `who` and proves `key`
  /// (which need not be that node's: a test's impostor) besides `token`.
  static wire::link_hello node_hello(const wire::link_hello& listener, const std::string& token,
                                     const wire::node_identity& who, const node_key& key,
                                     std::uint64_t window = 0) {
    wire::link_hello ours{"raw peer", 0, window, fresh_nonce(), std::nullopt};
    ours.identity = who;
    ours.proof = link_proof(link_secret(token), false, listener, ours);
    ours.node_proof = node_proof(key, false, listener, ours);
    return ours;
  }
  /// The link handshake as an admitted node: claims `who`, proves `token` and `key`, and checks
  /// the listener's proofs of both (a server of the job that holds `key`'s job secret). Returns
  /// the server's hello; nullopt when a step failed: `refusal` then holds the server's answer when
  /// it refused (an error_reply's message), empty when its proofs did not check out.
  std::optional<wire::link_hello> handshake_as(const wire::node_identity& who, const node_key& key,
                                               const std::string& token, std::uint64_t window = 0) {
    auto done = exchange_hellos([&](const wire::link_hello& theirs) {
      return node_hello(theirs, token, who, key, window);
    });
    if (!done || !done->auth.node_proof ||
        !same_digest(done->auth.proof,
                     link_proof(link_secret(token), true, done->theirs, done->ours)) ||
        !same_digest(*done->auth.node_proof, node_proof(key, true, done->theirs, done->ours)))
      return std::nullopt;
    return done->theirs;
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
      const bool buffered = tls != nullptr && SSL_pending(tls) > 0;
      if (!buffered && ::poll(&probe, 1, static_cast<int>(left.count())) <= 0)
        continue;
      std::byte buffer[4096];
      const ssize_t n = read_some(buffer, sizeof buffer);
      if (n == 0 || (n < 0 && !tls))
        return {got, true};
      if (n < 0)
        continue;
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
    return read_some(&byte, 1) == 0;
  }

  int fd = -1;
  bool connected = false;
  /// handshake_as(): the listener's refusal, when it refused.
  std::string refusal;
  std::vector<std::uint64_t> last_body;
  std::uint64_t credited = 0;
  /// TLS, once start_tls() was called; tls_failure: OpenSSL's reason for the last failure
  /// ("tlsv1 alert unknown ca").
  std::shared_ptr<SSL_CTX> tls_context;
  SSL* tls = nullptr;
  std::string tls_failure;

private:
  /// Both hellos of a handshake and the listener's answer.
  struct hellos_exchanged {
    wire::link_hello theirs;
    wire::link_hello ours;
    wire::link_auth auth;
  };
  /// Reads the server's hello, sends the one `ours_for` makes for it and reads the server's
  /// link_auth; nullopt when a step failed (`refusal` then holds the server's error_reply message
  /// if it refused).
  template <class Make>
  std::optional<hellos_exchanged> exchange_hellos(const Make& ours_for) {
    refusal.clear();
    auto theirs = server_hello();
    if (!theirs)
      return std::nullopt;
    const wire::link_hello ours = ours_for(*theirs);
    if (!send(wire::encode(ours).flatten()))
      return std::nullopt;
    auto answer = receive_frame();
    if (answer)
      if (const auto* error = std::get_if<wire::error_reply>(&*answer))
        refusal = error->message;
    const auto* auth = answer ? std::get_if<wire::link_auth>(&*answer) : nullptr;
    if (auth == nullptr)
      return std::nullopt;
    return hellos_exchanged{*theirs, ours, *auth};
  }

  void note_tls_failure() {
    const unsigned long code = ERR_peek_last_error();
    ERR_clear_error();
    if (code == 0)
      return;
    const char* reason = ERR_reason_error_string(code);
    tls_failure = reason != nullptr ? reason : "an unnamed TLS failure";
  }
};

} // namespace troupe::testing
