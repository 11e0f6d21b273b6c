// libFuzzer target: the TLS sessions of troupe's links (actors/logic/link_tls.hpp), fed what a
// hostile peer or a tampering wire can give them. The first input byte picks the case:
//  - even: the bytes are what a stranger sends a listener (a data port, the scheduler's port), in
//    pieces whose sizes the next bytes choose; whatever it answers, the listener must never be
//    established, since nobody without a key of the job's CA can finish a handshake.
//  - odd: a connector and a listener of the job finish an honest handshake in memory, the
//    connector seals a known message, and the rest of the input edits the records (XOR a byte at
//    an offset, or cut them short) before the listener reads them in pieces. Whatever arrives
//    must be a prefix of the message: an altered record ends the session, never yields other
//    bytes (the broker's in-place reads of the socket buffer rely on it).
// The job's certificates come from scripts/make-tls-certs.sh into the directory named by
// TROUPE_FUZZ_TLS_CERTS (scripts/fuzz.sh makes them).

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "actors/config/tls_credentials.hpp"
#include "actors/logic/link_tls.hpp"

namespace {

using namespace troupe;

struct job_tls {
  link_tls listener;
  link_tls connector;
};

std::shared_ptr<const tls_credentials> load_role(const std::string& dir, node_role role) {
  const std::string name(to_string(role));
  auto loaded = tls_credentials::load(dir + "/ca.crt", dir + "/" + name + ".crt",
                                      dir + "/" + name + ".key", role);
  if (!loaded) {
    std::fprintf(stderr, "fuzz_tls: %s\n", loaded.error().message().c_str());
    std::abort();
  }
  return *loaded;
}

const job_tls& job() {
  static const job_tls tls = [] {
    const char* dir = std::getenv("TROUPE_FUZZ_TLS_CERTS");
    if (dir == nullptr) {
      std::fprintf(stderr, "fuzz_tls: set TROUPE_FUZZ_TLS_CERTS to a directory made by "
                           "scripts/make-tls-certs.sh\n");
      std::abort();
    }
    return job_tls{{load_role(dir, node_role::server), {node_role::worker}},
                   {load_role(dir, node_role::worker), {node_role::server}}};
  }();
  return tls;
}

/// Reads the input from its front.
struct input {
  std::span<const std::uint8_t> bytes;

  bool empty() const { return bytes.empty(); }
  std::uint8_t byte() {
    if (bytes.empty())
      return 0;
    const auto b = bytes.front();
    bytes = bytes.subspan(1);
    return b;
  }
  std::size_t u16() { return std::size_t{byte()} << 8 | byte(); }
};

/// Hands `bytes` to `to` in pieces of 1..256 bytes as the input chooses (a broker's socket reads
/// come in any size) and, once established, reads plaintext after each piece into buffers of
/// 1..64 bytes as the input chooses, as a frame receiver asks for a prefix and then a body (a
/// buffer is filled across calls until full). Returns false when the session ended; `plain` gets
/// the buffers that were filled.
bool deliver(tls_session& to, std::span<const char> bytes, input& in, std::vector<char>& plain) {
  std::vector<char> scratch;
  std::vector<char> buffer(std::size_t{in.byte()} % 64 + 1);
  while (!bytes.empty()) {
    const std::size_t piece = std::min(bytes.size(), std::size_t{in.byte()} + 1);
    // take() reads this piece in place until fill() has used it up, as a broker's read buffer.
    std::vector<char> read(bytes.begin(), bytes.begin() + static_cast<std::ptrdiff_t>(piece));
    bytes = bytes.subspan(piece);
    if (to.take(read))
      return false;
    to.drain(scratch);
    if (!to.established())
      continue;
    for (;;) {
      auto full = to.fill(buffer);
      if (!full)
        return false;
      if (!*full)
        break;
      plain.insert(plain.end(), buffer.begin(), buffer.end());
      buffer.assign(std::size_t{in.byte()} % 64 + 1, 0);
    }
  }
  return true;
}

/// A stranger's bytes at a listener.
void stranger(input in) {
  tls_session listener(job().listener, true);
  std::vector<char> answer;
  listener.drain(answer);
  // The same bytes choose the pieces they arrive in: the fuzzer controls both anyway.
  const std::vector<char> bytes(in.bytes.begin(), in.bytes.end());
  std::vector<char> plain;
  (void)deliver(listener, bytes, in, plain);
  if (listener.established() || !plain.empty())
    std::abort(); // a handshake without the CA's key went through
}

/// Moves handshake messages between two sessions until neither has anything to send.
bool handshake(tls_session& connector, tls_session& listener) {
  for (int round = 0; round < 16; ++round) {
    std::vector<char> to_listener, to_connector;
    connector.drain(to_listener);
    listener.drain(to_connector);
    if (to_listener.empty() && to_connector.empty())
      return connector.established() && listener.established();
    if (!to_listener.empty() && listener.take(to_listener))
      return false;
    if (!to_connector.empty() && connector.take(to_connector))
      return false;
    // An established end reads what came (the server's session tickets are off, but the records
    // after a TLS 1.3 handshake must be consumed as a broker does).
    std::vector<char> none(1);
    for (tls_session* end : {&connector, &listener})
      if (end->established() && !end->fill(none))
        return false;
  }
  return false;
}

/// An honest link whose records the input edits on the way.
void tampered(input in) {
  tls_session connector(job().connector, false);
  tls_session listener(job().listener, true);
  if (!handshake(connector, listener))
    std::abort(); // two ends of the job must agree
  std::vector<char> message(2 + in.u16() % 40'000);
  for (std::size_t i = 0; i < message.size(); ++i)
    message[i] = static_cast<char>(i * 7 % 251);
  std::vector<char> wire;
  if (connector.seal(message, wire))
    std::abort();
  // Edits: up to 8 of (offset, XOR byte), then maybe a cut.
  for (int edits = in.byte() % 9; edits > 0 && !in.empty(); --edits) {
    const std::size_t at = in.u16() % wire.size();
    wire[at] = static_cast<char>(wire[at] ^ in.byte());
  }
  if (in.byte() % 4 == 0)
    wire.resize(in.u16() % (wire.size() + 1));
  std::vector<char> plain;
  (void)deliver(listener, wire, in, plain);
  if (plain.size() > message.size() || !std::equal(plain.begin(), plain.end(), message.begin()))
    std::abort(); // bytes arrived that the connector never sent
}

} // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  input in{std::span(data, size)};
  if (in.empty())
    return 0;
  if (in.byte() % 2 == 0)
    stranger(in);
  else
    tampered(in);
  return 0;
}
