// Writes the well-formed part of the fuzz targets' seed corpus: one frame of every message kind
// (tests/schema/sample_messages.hpp) for fuzz_frames, and connector hellos with and without a
// proof, with a key share and with a node proof for fuzz_link_hello. scripts/fuzz.sh --seeds runs
// it; the output is committed under tests/fuzz/corpus beside the inputs the fuzzer found, so
// regenerate it when the schema changes.
//
//   fuzz_seeds OUT_DIR      (writes OUT_DIR/fuzz_frames/*, OUT_DIR/fuzz_link_hello/*)

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "actors/logic/link_auth.hpp"
#include "actors/logic/node_identity.hpp"
#include "schema/codec.hpp"
#include "tests/schema/sample_messages.hpp"

namespace {

void write(const std::filesystem::path& path, const troupe::wire::message& msg) {
  const auto bytes = troupe::wire::encode(msg).flatten();
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()),
            static_cast<std::streamsize>(bytes.size()));
}

} // namespace

int main(int argc, char** argv) {
  using namespace troupe;
  if (argc != 2) {
    std::fprintf(stderr, "usage: fuzz_seeds OUT_DIR\n");
    return 2;
  }
  const std::filesystem::path out = argv[1];
  std::filesystem::create_directories(out / "fuzz_frames");
  std::filesystem::create_directories(out / "fuzz_link_hello");
  test::pattern_buffer payload(96);
  int n = 0;
  for (const auto& msg : test::sample_messages(payload.bytes()))
    write(out / "fuzz_frames" /
              ("kind-" + std::to_string(n++) + "-" + std::string(wire::kind_name(msg))),
          msg);
  // The listener's hello of fuzz_link_hello.cpp, and hellos answering it.
  const wire::link_hello listener{"boot-id/host", 0, std::uint64_t{1} << 20,
                                  wire::link_digest{1, 2, 3}, std::nullopt};
  wire::link_hello connector{"boot-id/host", 0, 0, wire::link_digest{9}, std::nullopt};
  write(out / "fuzz_link_hello" / "no-proof", connector);
  connector.proof = link_proof(link_secret("another token"), false, listener, connector);
  write(out / "fuzz_link_hello" / "wrong-proof", connector);
  connector.proof = link_proof(link_secret("fuzzing token"), false, listener, connector);
  write(out / "fuzz_link_hello" / "good-proof", connector);
  // A node's control link: a key share. A worker's data link: its claimed node and the proof of
  // that node's key in fuzz_link_hello.cpp's job.
  connector.key_share = key_exchange{}.share();
  connector.proof = link_proof(link_secret("fuzzing token"), false, listener, connector);
  write(out / "fuzz_link_hello" / "key-share", connector);
  connector.key_share.reset();
  connector.identity = wire::node_identity{wire::role::worker, 1};
  connector.proof = link_proof(link_secret("fuzzing token"), false, listener, connector);
  connector.node_proof =
      node_proof(derive_node_key(link_secret("fuzzing token"),
                                 job_secret{wire::link_digest{4, 5, 6}}, *connector.identity),
                 false, listener, connector);
  write(out / "fuzz_link_hello" / "node-proof", connector);
  return 0;
}
