// libFuzzer target: a connector's first frame as a listener checks it. The input is decoded as a
// frame under the handshake's 4 KiB cap; a link_hello is then checked as the listener does (a
// proof must be there and match HMAC-SHA256 of the job token over both hellos), and the
// listener's answer is made. A proof the fuzzer did not compute from the token must never pass.

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>

#include "actors/logic/data_link_framing.hpp"
#include "actors/logic/link_auth.hpp"
#include "schema/codec.hpp"

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  using namespace troupe;
  static const link_secret secret{"fuzzing token"};
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
    (void)wire::encode(wire::link_auth{link_proof(secret, true, listener, *hello)}).flatten();
  }
  // The proof must not depend on anything the transcript leaves out.
  auto without_proof = *hello;
  without_proof.proof.reset();
  if (link_proof(secret, false, listener, without_proof) != expected)
    std::abort();
  return 0;
}
