#pragma once
// The link handshake's proof of the job token (docs/protocol.md, "The link protocol").
//
// Every connection, control or data, opens with the listener's link_hello, which carries a fresh
// nonce. The connector answers with its own hello carrying its nonce and
// proof = HMAC-SHA256(token, transcript("troupe link v1 connector")); the listener checks it and
// answers with link_auth{HMAC-SHA256(token, transcript("troupe link v1 listener"))}, which the
// connector checks. The transcript covers both hellos (host identity, arena size, window, nonce),
// so a proof is good for one connection only: replayed on another, it meets another listener
// nonce; reflected, it carries the other side's label. The token itself never travels.
//
// Without a token (an empty link_secret) the handshake runs the same, keyed with nothing: both
// ends still agree, but anyone can compute the proofs, so it authenticates nobody.

#include <string>

#include "schema/messages.hpp"

namespace troupe {

/// The job token as the links hold it: the key of the handshake's HMAC. It has no way to be
/// printed or compared outside the proofs, so it cannot end up in a log by accident.
class link_secret {
public:
  /// No token: the handshake proves nothing (see the file comment).
  link_secret() = default;
  explicit link_secret(std::string token) : key_(std::move(token)) {}

  bool empty() const noexcept { return key_.empty(); }

private:
  friend wire::link_digest link_proof(const link_secret&, bool, const wire::link_hello&,
                                      const wire::link_hello&);
  std::string key_;
};

/// 32 random bytes from the kernel (getrandom). Throws std::runtime_error if it has none to give.
wire::link_digest fresh_nonce();

/// The proof that the listener (`by_listener`) or the connector of the connection whose hellos
/// are `listener` and `connector` knows `secret`: HMAC-SHA256 over the transcript of both hellos
/// (their proof fields left out), labelled by side.
wire::link_digest link_proof(const link_secret& secret, bool by_listener,
                             const wire::link_hello& listener, const wire::link_hello& connector);

/// Equality in time independent of where the digests differ.
bool same_digest(const wire::link_digest& a, const wire::link_digest& b) noexcept;

} // namespace troupe
