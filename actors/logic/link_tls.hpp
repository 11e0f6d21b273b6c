#pragma once
// TLS on one framed link (actors/data_link.cpp), without a socket: the broker hands the
// ciphertext it reads to take(), gets the plaintext back from fill() in exactly the reads its
// frame_receiver asks for, hands what it would write to seal(), and writes what drain() and
// seal() give it. So the framing, the receive credit and the link handshake of the job token run
// unchanged inside TLS, and everything here is testable with two sessions and no network.
//
// Why inside troupe's brokers and not CAF's openssl module: that module wraps CAF's remote-actor
// publish/connect (BASP), which no troupe port speaks; brokers read and write plain bytes. So each
// connection has an OpenSSL SSL object with BIOs of its own: the read side reads the broker's
// socket read in place, the write side appends records straight to the broker's write buffer.
// (OpenSSL's memory BIOs would add a copy and a clearing per byte each way: measured, copies
// were a quarter of the time of a TLS push.)
//
// The session: TLS 1.3 only, certificates required both ways, each checked against the job's CA
// (tls_credentials, actors/config/tls_credentials.hpp) and for the role it names: a peer whose
// certificate names a role this end does not take on the connection fails the handshake, with a
// TLS alert to the peer and a reason here naming the role. The listener is the TLS server.
//
// What an unauthenticated peer can cost: the ciphertext of one socket read (the broker reads at
// most handshake_read_bytes per read until the link is authenticated) plus OpenSSL's handshake
// state and buffers, a few tens of KiB; a peer's certificate chain is capped at 32 KiB.

#include <cstddef>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "actors/config/tls_credentials.hpp"
#include "engine/error.hpp"

namespace troupe {

/// TLS on the connections of one broker: this node's identity and the roles a peer's
/// certificate may name on them. Without credentials, the links run in plaintext.
struct link_tls {
  std::shared_ptr<const tls_credentials> credentials;
  /// The roles a peer may act in here: a data port's peers are workers, a worker's link expects a
  /// server, the scheduler's port takes servers and workers, a control link expects the scheduler.
  std::vector<node_role> peer_roles;

  bool enabled() const noexcept { return credentials != nullptr; }
};

/// What the broker reads per socket read under TLS: before the link is authenticated, about one
/// TLS record; then larger reads, fewer wake-ups.
inline constexpr std::size_t handshake_read_bytes = std::size_t{16} << 10;
inline constexpr std::size_t tls_read_bytes = std::size_t{256} << 10;

/// One connection's TLS session. Not thread-safe: one per connection, on its broker's thread.
class tls_session {
public:
  /// `listener`: this end accepted the connection and is the TLS server; a connector's session
  /// has its ClientHello ready to drain at once. Throws std::runtime_error when OpenSSL cannot
  /// make a session (out of memory). Precondition: tls.enabled().
  tls_session(const link_tls& tls, bool listener);
  ~tls_session();
  tls_session(const tls_session&) = delete;
  tls_session& operator=(const tls_session&) = delete;

  /// Ciphertext from the socket, read in place: `cipher` must stay valid until fill() returns
  /// false (the broker's read buffer does, for the handler that got it). Runs the handshake as
  /// far as it goes. Returns why the connection must close when the handshake failed: the peer's
  /// certificate is missing, not from the CA or names a role not taken here; the peer refused
  /// ours (its alert); the bytes are not TLS. The alert for the peer is then ready to drain.
  std::optional<std::string> take(std::span<const char> cipher);

  /// Decrypts into `buffer`, from where the previous call stopped up to buffer.size(): true when
  /// it is full (the next call starts a new buffer, at 0), false when the ciphertext taken so far
  /// is used up. An error (why the connection must close) when a record fails to decrypt or the
  /// peer ended the session. Precondition: established().
  result<bool> fill(std::vector<char>& buffer);

  /// The caller stops decrypting before fill() returned false (its reader waits): copies what is
  /// left of the ciphertext taken, so that fill() can go on from it after the caller's buffer is
  /// gone. Throws std::bad_alloc.
  void keep_unread();

  /// Part of a record, or of the buffer fill() fills, has arrived and waits for the rest.
  bool mid_record() const noexcept;

  /// Encrypts `plain` into records appended to `out`, the broker's write buffer. Returns why the
  /// session cannot send any more (it failed before). Precondition: established().
  std::optional<std::string> seal(std::span<const char> plain, std::vector<char>& out);

  /// Appends the ciphertext the session produced on its own (handshake messages, an alert) to
  /// `out`; returns how many bytes.
  std::size_t drain(std::vector<char>& out);

  /// The handshake is done: both certificates checked out, records may flow.
  bool established() const noexcept;
  /// The role the peer's certificate names, once established().
  std::optional<node_role> peer_role() const noexcept;

  struct impl;

private:
  std::unique_ptr<impl> impl_;
};

} // namespace troupe
