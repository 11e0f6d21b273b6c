#include "actors/logic/link_auth.hpp"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdexcept>
#include <string_view>

#include "actors/config/config.hpp"

namespace troupe {

namespace {

/// The bytes the proofs are computed over: every field is length-prefixed or of fixed size, so
/// no two different transcripts share an encoding.
class transcript {
public:
  void text(std::string_view s) {
    number(s.size());
    bytes_.append(s);
  }
  void number(std::uint64_t value) {
    for (int i = 0; i < 8; ++i)
      bytes_.push_back(static_cast<char>(value >> (8 * i)));
  }
  void digest(const wire::link_digest& d) {
    bytes_.append(reinterpret_cast<const char*>(d.data()), d.size());
  }
  void hello(const wire::link_hello& h) {
    text(h.host_id);
    number(h.arena_bytes);
    number(h.window_bytes);
    digest(h.nonce);
  }
  const std::string& bytes() const noexcept { return bytes_; }

private:
  std::string bytes_;
};

} // namespace

wire::link_digest fresh_nonce() {
  wire::link_digest nonce{};
  if (auto filled = fill_random(nonce); !filled)
    throw std::runtime_error("no random bytes for a link nonce: " + filled.error().message());
  return nonce;
}

wire::link_digest link_proof(const link_secret& secret, bool by_listener,
                             const wire::link_hello& listener, const wire::link_hello& connector) {
  transcript t;
  t.text(by_listener ? "troupe link v1 listener" : "troupe link v1 connector");
  t.hello(listener);
  t.hello(connector);
  wire::link_digest proof{};
  unsigned int length = 0;
  // HMAC accepts an empty key (no token): the proof is then computable by anyone.
  static const unsigned char no_key = 0;
  const auto* key =
      secret.key_.empty() ? &no_key : reinterpret_cast<const unsigned char*>(secret.key_.data());
  if (HMAC(EVP_sha256(), key, static_cast<int>(secret.key_.size()),
           reinterpret_cast<const unsigned char*>(t.bytes().data()), t.bytes().size(), proof.data(),
           &length) == nullptr ||
      length != proof.size())
    throw std::runtime_error("HMAC-SHA256 of the link handshake failed");
  return proof;
}

bool same_digest(const wire::link_digest& a, const wire::link_digest& b) noexcept {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

} // namespace troupe
