#include "actors/logic/link_auth.hpp"

#include <memory>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdexcept>
#include <string_view>

#include "actors/config/config.hpp"

namespace troupe {

wire::link_digest hmac_sha256(std::string_view key, std::string_view bytes) {
  wire::link_digest mac{};
  unsigned int length = 0;
  // HMAC accepts an empty key (no token): the proof is then computable by anyone.
  static const unsigned char no_key = 0;
  const auto* key_bytes =
      key.empty() ? &no_key : reinterpret_cast<const unsigned char*>(key.data());
  if (HMAC(EVP_sha256(), key_bytes, static_cast<int>(key.size()),
           reinterpret_cast<const unsigned char*>(bytes.data()), bytes.size(), mac.data(),
           &length) == nullptr ||
      length != mac.size())
    throw std::runtime_error("HMAC-SHA256 of the link handshake failed");
  return mac;
}

void auth_transcript::text(std::string_view s) {
  number(s.size());
  bytes_.append(s);
}

void auth_transcript::number(std::uint64_t value) {
  for (int i = 0; i < 8; ++i)
    bytes_.push_back(static_cast<char>(value >> (8 * i)));
}

void auth_transcript::digest(const wire::link_digest& d) {
  bytes_.append(reinterpret_cast<const char*>(d.data()), d.size());
}

void auth_transcript::digest(const std::optional<wire::link_digest>& d) {
  number(d ? 1 : 0);
  if (d)
    digest(*d);
}

void auth_transcript::hello(const wire::link_hello& h) {
  text(h.host_id);
  number(h.arena_bytes);
  number(h.window_bytes);
  digest(h.nonce);
  digest(h.key_share);
  number(h.identity ? 1 : 0);
  if (h.identity) {
    number(static_cast<std::uint64_t>(h.identity->node_role));
    number(h.identity->rank);
  }
}

namespace {

/// The transcript of one connection's hellos under `label`.
auth_transcript hellos(std::string_view label, const wire::link_hello& listener,
                       const wire::link_hello& connector) {
  auth_transcript t;
  t.text(label);
  t.hello(listener);
  t.hello(connector);
  return t;
}

struct pkey_free {
  void operator()(EVP_PKEY* key) const noexcept { EVP_PKEY_free(key); }
};
struct pkey_ctx_free {
  void operator()(EVP_PKEY_CTX* context) const noexcept { EVP_PKEY_CTX_free(context); }
};

} // namespace

wire::link_digest fresh_nonce() {
  wire::link_digest nonce{};
  if (auto filled = fill_random(nonce); !filled)
    throw std::runtime_error("no random bytes for a link nonce: " + filled.error().message());
  return nonce;
}

wire::link_digest link_proof(const link_secret& secret, bool by_listener,
                             const wire::link_hello& listener, const wire::link_hello& connector,
                             const std::optional<wire::link_digest>& listener_share) {
  auto t = hellos(by_listener ? "troupe link v1 listener" : "troupe link v1 connector", listener,
                  connector);
  if (by_listener)
    t.digest(listener_share);
  return secret.mac(t.bytes());
}

wire::link_digest node_proof(const node_key& key, bool by_listener,
                             const wire::link_hello& listener, const wire::link_hello& connector) {
  return key.mac(
      hellos(by_listener ? "troupe link v1 node listener" : "troupe link v1 node connector",
             listener, connector)
          .bytes());
}

key_exchange::key_exchange() {
  std::unique_ptr<EVP_PKEY, pkey_free> key{EVP_PKEY_Q_keygen(nullptr, nullptr, "X25519")};
  std::size_t length = share_.size();
  if (!key || EVP_PKEY_get_raw_public_key(key.get(), share_.data(), &length) != 1 ||
      length != share_.size())
    throw std::runtime_error("cannot make an X25519 key for the link's key exchange");
  key_ = key.release();
}

key_exchange::~key_exchange() {
  EVP_PKEY_free(static_cast<EVP_PKEY*>(key_));
}

std::optional<wire::link_digest> key_exchange::agree(const wire::link_digest& peer_share) const {
  std::unique_ptr<EVP_PKEY, pkey_free> peer{
      EVP_PKEY_new_raw_public_key(EVP_PKEY_X25519, nullptr, peer_share.data(), peer_share.size())};
  std::unique_ptr<EVP_PKEY_CTX, pkey_ctx_free> context{
      EVP_PKEY_CTX_new(static_cast<EVP_PKEY*>(key_), nullptr)};
  wire::link_digest shared{};
  std::size_t length = shared.size();
  // OpenSSL refuses a peer key of small order, whose secret would be all zeros.
  if (!peer || !context || EVP_PKEY_derive_init(context.get()) != 1 ||
      EVP_PKEY_derive_set_peer(context.get(), peer.get()) != 1 ||
      EVP_PKEY_derive(context.get(), shared.data(), &length) != 1 || length != shared.size())
    return std::nullopt;
  static const wire::link_digest zeros{};
  if (same_digest(shared, zeros))
    return std::nullopt;
  return shared;
}

session_key link_session_key(const link_secret& secret, const wire::link_hello& listener,
                             const wire::link_hello& connector,
                             const wire::link_digest& listener_share,
                             const wire::link_digest& shared) {
  auto t = hellos("troupe link v1 session", listener, connector);
  t.digest(listener_share);
  t.digest(shared);
  return session_key{secret.mac(t.bytes())};
}

bool same_digest(const wire::link_digest& a, const wire::link_digest& b) noexcept {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

} // namespace troupe
