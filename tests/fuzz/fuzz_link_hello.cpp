// libFuzzer target: a connector's first frame as a listener checks it. The input is decoded as a
// frame under the handshake's 4 KiB cap; a link_hello is then checked as the listener does (a
// proof must be there and match HMAC-SHA256 of the job token over both hellos; a claimed node's
// proof must match HMAC-SHA256 of that node's key), and the listener's answer is made, with a key
// agreement when the hello carries a key share. A proof the fuzzer did not compute from the token
// or the key must never pass, and no key share may crash the agreement.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "actors/logic/data_link_framing.hpp"
#include "actors/logic/link_auth.hpp"
#include "actors/logic/node_identity.hpp"
#include "schema/codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace troupe;
  static const link_secret secret{"fuzzing token"};
  static const job_secret job{wire::link_digest{4, 5, 6}};
  static const key_exchange ours;
  static const wire::link_hello listener{"boot-id/host", 0, std::uint64_t{1} << 20,
                                         wire::link_digest{1, 2, 3}, std::nullopt};
  wire::decode_limits limits;
  limits.max_frame_bytes = max_handshake_frame_bytes;
  auto decoded = wire::decode(std::as_bytes(std::span(data, size)), limits);
  if (!decoded)
    return 0;
  const auto* hello = std::get_if<wire::link_hello>(&decoded->msg);
  if (hello == nullptr || !hello->proof)
    return 0;
  const auto expected = link_proof(secret, false, listener, *hello);
  if (same_digest(*hello->proof, expected)) {
    // Only a hello made with the token gets here; the fuzzer cannot forge one.
    if (*hello->proof != expected)
      std::abort();
    wire::link_auth auth;
    if (hello->key_share)
      if (auto shared = ours.agree(*hello->key_share)) {
        auth.key_share = ours.share();
        (void)link_session_key(secret, listener, *hello, ours.share(), *shared);
      }
    auth.proof = link_proof(secret, true, listener, *hello, auth.key_share);
    (void)wire::encode(auth).flatten();
  }
  if (hello->identity && hello->node_proof) {
    const auto key = derive_node_key(secret, job, *hello->identity);
    const auto node_expected = node_proof(key, false, listener, *hello);
    if (same_digest(*hello->node_proof, node_expected) && *hello->node_proof != node_expected)
      std::abort();
  }
  // The proofs must not depend on anything the transcript leaves out.
  auto without_proofs = *hello;
  without_proofs.proof.reset();
  without_proofs.node_proof.reset();
  if (link_proof(secret, false, listener, without_proofs) != expected)
    std::abort();
  return 0;
}
