// libFuzzer target: bytes from the network as a connection's broker takes them. The input is cut
// into a frame stream by a frame_receiver (the length prefix checked against the cap, the receive
// window counted, bodies decoded in place) exactly as a scribe would deliver it, under the
// handshake's 4 KiB cap or a job's frame cap; each whole input is also decoded as one frame and
// as one body against a small shared-memory arena. Every decoded message is encoded again.
// Nothing may crash, leak or trip ASan/UBSan; a refusal is a normal outcome.
//
//   scripts/fuzz.sh                       # every target, with the committed corpus
//   build-fuzz/tests/fuzz/fuzz_frames tests/fuzz/corpus/fuzz_frames

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>
#include <vector>

#include "actors/logic/data_link_framing.hpp"
#include "schema/codec.hpp"

namespace {

using namespace troupe;

void reencode(const wire::message& msg) {
  try {
    (void)wire::encode(msg).flatten();
  } catch (const std::exception&) {
    // A decoded message the encoder refuses (a tensor viewing an arena): a refusal, not a bug.
  }
}

/// Feeds `bytes` to a receiver as a scribe would: exactly the announced reads, into the buffer
/// the receiver leaves in place, until it refuses the stream or the bytes run out.
void cut_stream(std::span<const std::byte> bytes, std::size_t frame_cap, std::uint64_t window) {
  wire::decode_limits limits;
  limits.max_frame_bytes = frame_cap;
  auto pool = std::make_shared<receive_buffer_pool>(std::size_t{1} << 20);
  auto credit = std::make_shared<receive_credit>(window);
  frame_receiver receiver(pool, limits, credit);
  std::vector<char> scribe;
  std::size_t next = frame_receiver::first_read;
  std::vector<envelope> kept; // a few frames stay alive, as a slow actor's would
  while (next != 0 && next <= bytes.size()) {
    scribe.resize(next);
    std::memcpy(scribe.data(), bytes.data(), next);
    bytes = bytes.subspan(next);
    auto out = receiver.consume(scribe);
    if (out.frame) {
      reencode(out.frame->msg);
      if (kept.size() < 4)
        kept.push_back(std::move(*out.frame));
    }
    (void)credit->take();
    next = out.next_read;
  }
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  // The handshake's cap, then a job's (small enough that the fuzzer can fill a frame).
  cut_stream(bytes, max_handshake_frame_bytes, 0);
  cut_stream(bytes, std::size_t{1} << 16, std::uint64_t{1} << 12);

  if (auto decoded = wire::decode(bytes))
    reencode(decoded->msg);
  // 8-byte aligned, as a pooled buffer is; the arena is where shm references may point.
  std::vector<std::uint64_t> body((size + 7) / 8 + 1);
  if (size != 0)
    std::memcpy(body.data(), data, size);
  std::vector<std::uint64_t> arena(512, 0x5a5a5a5a5a5a5a5aULL);
  if (auto decoded = wire::decode_body(std::as_bytes(std::span(body)).first(size),
                                       wire::decode_limits{}, std::as_bytes(std::span(arena))))
    reencode(decoded->msg);
  return 0;
}
