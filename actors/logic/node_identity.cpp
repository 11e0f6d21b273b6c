#include "actors/logic/node_identity.hpp"

#include <memory>
#include <openssl/evp.h>
#include <stdexcept>
#include <string>

#include "actors/config/config.hpp"

namespace troupe {

namespace {

constexpr std::size_t nonce_bytes = 12;
constexpr std::size_t tag_bytes = 16;
static_assert(std::tuple_size_v<wire::sealed_secret> ==
              nonce_bytes + std::tuple_size_v<wire::link_digest> + tag_bytes);

/// What a sealed secret is bound to.
auth_transcript sealed_for(const wire::node_identity& who, std::uint32_t node_id) {
  auth_transcript t;
  t.text("troupe admission v1");
  t.number(static_cast<std::uint64_t>(who.node_role));
  t.number(who.rank);
  t.number(node_id);
  return t;
}

/// The cipher's key: the session key is kept for this one use, and still not used raw.
wire::link_digest cipher_key(const session_key& key) {
  return key.mac("troupe admission v1 cipher key");
}

struct cipher_free {
  void operator()(EVP_CIPHER_CTX* context) const noexcept { EVP_CIPHER_CTX_free(context); }
};
using cipher_context = std::unique_ptr<EVP_CIPHER_CTX, cipher_free>;

/// AES-256-GCM set up for one message: key, nonce, additional data.
cipher_context start_cipher(bool encrypt, const wire::link_digest& key, const std::uint8_t* nonce,
                            const std::string& associated) {
  cipher_context context{EVP_CIPHER_CTX_new()};
  int length = 0;
  if (!context ||
      EVP_CipherInit_ex(context.get(), EVP_aes_256_gcm(), nullptr, nullptr, nullptr,
                        encrypt ? 1 : 0) != 1 ||
      EVP_CIPHER_CTX_ctrl(context.get(), EVP_CTRL_GCM_SET_IVLEN, static_cast<int>(nonce_bytes),
                          nullptr) != 1 ||
      EVP_CipherInit_ex(context.get(), nullptr, nullptr, key.data(), nonce, encrypt ? 1 : 0) != 1 ||
      EVP_CipherUpdate(context.get(), nullptr, &length,
                       reinterpret_cast<const unsigned char*>(associated.data()),
                       static_cast<int>(associated.size())) != 1)
    return nullptr;
  return context;
}

bool is_sender_ranked(const wire::message& msg) {
  return std::holds_alternative<wire::push>(msg) || std::holds_alternative<wire::pushpull>(msg) ||
         std::holds_alternative<wire::pull_request>(msg);
}

std::uint32_t sender_rank_of(const wire::message& msg) {
  if (const auto* push = std::get_if<wire::push>(&msg))
    return push->sender_rank;
  if (const auto* pushpull = std::get_if<wire::pushpull>(&msg))
    return pushpull->sender_rank;
  return std::get<wire::pull_request>(msg).sender_rank;
}

/// The requests that act for the whole job, which only worker rank 0 sends.
bool is_for_rank_zero(const wire::message& msg) {
  return std::holds_alternative<wire::init>(msg) ||
         std::holds_alternative<wire::set_optimizer>(msg) ||
         std::holds_alternative<wire::set_gradient_compression>(msg) ||
         std::holds_alternative<wire::sync_settings>(msg) ||
         std::holds_alternative<wire::command>(msg);
}

} // namespace

job_secret fresh_job_secret() {
  return job_secret{fresh_nonce()};
}

node_key derive_node_key(const link_secret& token, const job_secret& secret,
                         const wire::node_identity& who) {
  auth_transcript t;
  t.text("troupe node key v1");
  t.digest(secret.reveal());
  t.number(static_cast<std::uint64_t>(who.node_role));
  t.number(who.rank);
  return node_key{token.mac(t.bytes())};
}

wire::sealed_secret seal_secret(const session_key& key, const wire::link_digest& secret,
                                const wire::node_identity& who, std::uint32_t node_id) {
  wire::sealed_secret sealed{};
  if (auto filled = fill_random(std::span(sealed).first(nonce_bytes)); !filled)
    throw std::runtime_error("no random bytes to seal a node's secret: " +
                             filled.error().message());
  auto context =
      start_cipher(true, cipher_key(key), sealed.data(), sealed_for(who, node_id).bytes());
  auto* cipher_text = sealed.data() + nonce_bytes;
  int length = 0;
  int final_length = 0;
  if (!context ||
      EVP_EncryptUpdate(context.get(), cipher_text, &length, secret.data(),
                        static_cast<int>(secret.size())) != 1 ||
      EVP_EncryptFinal_ex(context.get(), cipher_text + length, &final_length) != 1 ||
      static_cast<std::size_t>(length + final_length) != secret.size() ||
      EVP_CIPHER_CTX_ctrl(context.get(), EVP_CTRL_GCM_GET_TAG, static_cast<int>(tag_bytes),
                          cipher_text + secret.size()) != 1)
    throw std::runtime_error("AES-256-GCM failed to seal a node's secret");
  return sealed;
}

std::optional<wire::link_digest> unseal_secret(const session_key& key,
                                               const wire::sealed_secret& sealed,
                                               const wire::node_identity& who,
                                               std::uint32_t node_id) {
  auto context =
      start_cipher(false, cipher_key(key), sealed.data(), sealed_for(who, node_id).bytes());
  wire::link_digest secret{};
  const auto* cipher_text = sealed.data() + nonce_bytes;
  // The tag is an input here; OpenSSL's interface takes it through a non-const pointer.
  auto tag = std::array<std::uint8_t, tag_bytes>{};
  std::copy_n(cipher_text + secret.size(), tag_bytes, tag.begin());
  int length = 0;
  int final_length = 0;
  if (!context ||
      EVP_DecryptUpdate(context.get(), secret.data(), &length, cipher_text,
                        static_cast<int>(secret.size())) != 1 ||
      EVP_CIPHER_CTX_ctrl(context.get(), EVP_CTRL_GCM_SET_TAG, static_cast<int>(tag_bytes),
                          tag.data()) != 1 ||
      EVP_DecryptFinal_ex(context.get(), secret.data() + length, &final_length) != 1 ||
      static_cast<std::size_t>(length + final_length) != secret.size())
    return std::nullopt;
  return secret;
}

std::optional<wire::error_reply> request_refusal(const wire::message& request,
                                                 const wire::node_identity& proven) {
  const bool is_worker = proven.node_role == wire::role::worker;
  // Another server of the job hands key ranges over, and sends nothing else; no worker does.
  if (const bool hands_over = std::holds_alternative<wire::range_data>(request);
      hands_over == is_worker || (!is_worker && proven.node_role != wire::role::server))
    return wire::error_reply{wire::request_id_of(request), wire::key_of(request),
                             wire::error_code::not_permitted,
                             std::string(wire::kind_name(request)) +
                                 " on a connection that proved " + wire::describe(proven) +
                                 ": only the job's servers send range_data, and nothing else, "
                                 "to a server"};
  if (is_sender_ranked(request)) {
    const std::uint32_t claimed = sender_rank_of(request);
    if (is_worker && claimed == proven.rank)
      return std::nullopt;
    return wire::error_reply{
        wire::request_id_of(request), wire::key_of(request), wire::error_code::not_permitted,
        std::string(wire::kind_name(request)) + " of key " +
            std::to_string(wire::key_of(request).value_or(0)) + " as worker " +
            std::to_string(claimed) + " on a connection that proved " + wire::describe(proven) +
            ": a connection pushes, pulls and pushpulls only as the worker whose key it proved"};
  }
  if (is_for_rank_zero(request) && !(is_worker && proven.rank == 0))
    return wire::error_reply{wire::request_id_of(request), wire::key_of(request),
                             wire::error_code::not_permitted,
                             std::string(wire::kind_name(request)) +
                                 " on a connection that proved " + wire::describe(proven) +
                                 ": only worker rank 0 sends init, set_optimizer, "
                                 "set_gradient_compression, sync_settings "
                                 "and commands to the "
                                 "servers"};
  return std::nullopt;
}

} // namespace troupe
