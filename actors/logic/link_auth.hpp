#pragma once
// The link handshake's proofs (docs/protocol.md, "The link protocol").
//
// Every connection, control or data, opens with the listener's link_hello, which carries a fresh
// nonce. The connector answers with its own hello carrying its nonce and
// proof = HMAC-SHA256(token, transcript("troupe link v1 connector")); the listener checks it and
// answers with link_auth{HMAC-SHA256(token, transcript("troupe link v1 listener"))}, which the
// connector checks. The transcript covers both hellos (host identity, arena size, window, nonce,
// key share, claimed node), so a proof is good for one connection only: replayed on another, it
// meets another listener nonce; reflected, it carries the other side's label. The token itself
// never travels.
//
// Two more things ride on the same transcript:
// - Key exchange (control connections): the connector's hello carries an X25519 key share, the
//   listener's link_auth its own (made only after the connector proved the token, and covered by
//   the listener's proof). Both ends derive the connection's session key,
//   HMAC-SHA256(token, transcript("troupe link v1 session"), listener's share, X25519 secret),
//   which a token holder who only reads the connection cannot compute. The scheduler seals a
//   node's own secret under it (actors/logic/node_identity.hpp).
// - Node proofs (data connections): a worker's hello names the node it claims to be and proves
//   that node's key, HMAC-SHA256(K, transcript("troupe link v1 node connector")); the server
//   derives K from the job secret and answers with the proof labelled "node listener", which
//   shows the worker it reached a server of its own job.
//
// Without a token (an empty link_secret) the handshake runs the same, keyed with nothing: both
// ends still agree, but anyone can compute the token proofs, so they authenticate nobody.

#include <optional>
#include <string>
#include <string_view>

#include "schema/messages.hpp"

namespace troupe {

/// HMAC-SHA256 of `bytes` keyed with `key` (an empty key is allowed). Throws std::runtime_error
/// when OpenSSL fails.
wire::link_digest hmac_sha256(std::string_view key, std::string_view bytes);

/// The job token as the links hold it: the key of the handshake's HMAC. It has no way to be
/// printed or compared outside the proofs, so it cannot end up in a log by accident.
class link_secret {
public:
  /// No token: the handshake proves nothing (see the file comment).
  link_secret() = default;
  explicit link_secret(std::string token) : key_(std::move(token)) {}

  bool empty() const noexcept { return key_.empty(); }
  /// HMAC-SHA256 keyed with the token over `bytes`: the proofs and the keys derived from it.
  wire::link_digest mac(std::string_view bytes) const { return hmac_sha256(key_, bytes); }

private:
  std::string key_;
};

/// 32 secret bytes of one kind (Tag: job_secret, node_key, session_key below), held like the
/// token: no way to print them, compared only through the MACs keyed with them.
template <class Tag>
class secret_bytes {
public:
  /// None.
  secret_bytes() = default;
  explicit secret_bytes(const wire::link_digest& bytes) : bytes_(bytes) {}

  bool empty() const noexcept { return !bytes_.has_value(); }
  /// HMAC-SHA256 keyed with these bytes. Precondition: !empty().
  wire::link_digest mac(std::string_view bytes) const {
    return hmac_sha256(std::string_view(reinterpret_cast<const char*>(bytes_->data()), 32), bytes);
  }
  /// The bytes themselves, for the cipher keyed with them or to seal them for their owner; never
  /// for a message. Precondition: !empty().
  const wire::link_digest& reveal() const { return *bytes_; }

private:
  std::optional<wire::link_digest> bytes_;
};

/// The job secret M: 32 random bytes the scheduler draws when it starts and gives its servers
/// (actors/logic/node_identity.hpp).
using job_secret = secret_bytes<struct job_secret_tag>;
/// A node's own key K(role, rank), derived from the token and the job secret.
using node_key = secret_bytes<struct node_key_tag>;
/// A connection's session key, agreed by the key exchange of its handshake.
using session_key = secret_bytes<struct session_key_tag>;

/// The bytes proofs and derived keys are computed over: every field is length-prefixed or of
/// fixed size, so no two different transcripts share an encoding.
class auth_transcript {
public:
  void text(std::string_view s);
  void number(std::uint64_t value);
  void digest(const wire::link_digest& d);
  /// Present or not, then the digest: absent and present never share an encoding.
  void digest(const std::optional<wire::link_digest>& d);
  /// Every field of a hello except its proofs.
  void hello(const wire::link_hello& h);
  const std::string& bytes() const noexcept { return bytes_; }

private:
  std::string bytes_;
};

/// 32 random bytes from the kernel (getrandom). Throws std::runtime_error if it has none to give.
wire::link_digest fresh_nonce();

/// The proof that the listener (`by_listener`) or the connector of the connection whose hellos
/// are `listener` and `connector` knows `secret`: HMAC-SHA256 over the transcript of both hellos
/// (their proof fields left out), labelled by side; the listener's also covers the key share of
/// its link_auth (`listener_share`).
wire::link_digest link_proof(const link_secret& secret, bool by_listener,
                             const wire::link_hello& listener, const wire::link_hello& connector,
                             const std::optional<wire::link_digest>& listener_share = std::nullopt);

/// The proof that the connector (or, `by_listener`, the listener) knows the key of the node the
/// connector's hello claims: HMAC-SHA256 keyed with `key` over the same transcript, labelled
/// "troupe link v1 node connector" / "... node listener". Precondition: !key.empty().
wire::link_digest node_proof(const node_key& key, bool by_listener,
                             const wire::link_hello& listener, const wire::link_hello& connector);

/// One end's ephemeral X25519 key pair for one connection's key exchange.
class key_exchange {
public:
  /// A fresh key pair. Throws std::runtime_error when OpenSSL cannot make one.
  key_exchange();
  ~key_exchange();
  key_exchange(const key_exchange&) = delete;
  key_exchange& operator=(const key_exchange&) = delete;

  /// The public key, as the hello or link_auth carries it.
  const wire::link_digest& share() const noexcept { return share_; }
  /// The X25519 shared secret with the peer's public key; nullopt when the peer's key is not a
  /// usable one (a small-order point, which would give the all-zero secret).
  std::optional<wire::link_digest> agree(const wire::link_digest& peer_share) const;

private:
  void* key_ = nullptr; // EVP_PKEY
  wire::link_digest share_{};
};

/// The session key of a connection whose handshake exchanged keys: HMAC-SHA256 keyed with the
/// token over the transcript labelled "troupe link v1 session", the listener's share and the
/// X25519 secret `shared`. Both ends compute the same; one who knows the token but only read the
/// connection cannot.
session_key link_session_key(const link_secret& secret, const wire::link_hello& listener,
                             const wire::link_hello& connector,
                             const wire::link_digest& listener_share,
                             const wire::link_digest& shared);

/// Equality in time independent of where the digests differ.
bool same_digest(const wire::link_digest& a, const wire::link_digest& b) noexcept;

} // namespace troupe
