#pragma once
// What the per-key push logic of a server shard (actors/logic/sync_round.hpp,
// actors/logic/async_pushes.hpp) shares: a push chunk as the logic sees it, what became of it, and
// the checks every chunk passes before it touches a buffer.
//
// A push's chunks come in order, each once: they are the chunker's consecutive slices
// (schema/chunking.hpp) and every link delivers one worker's frames in the order sent. So one
// counter per push tells a duplicate, a gap or an overlap from an honest chunk, whatever a peer
// sends.

#include <cstdint>
#include <span>
#include <string>
#include <utility>

#include "engine/ndarray.hpp"
#include "schema/messages.hpp"

namespace troupe {

/// One chunk of a push. `data` is read only during the call that takes it.
struct push_chunk {
  std::uint64_t request_id = 0;
  /// < num_workers (the shard checks it before).
  std::uint32_t sender = 0;
  std::uint64_t round = 0;
  std::uint64_t offset = 0;
  std::span<const std::byte> data;
};

/// What became of one chunk.
enum class chunk_fate : std::uint8_t {
  taken,     ///< joined the push being received; the push still misses bytes
  completed, ///< its push now has every byte (dist_sync: in the round being collected)
  deferred,  ///< dist_sync: copied for a later round; answered when that round takes the push
  late,      ///< dist_sync: of a round that closed without it; the push still misses bytes
  dropped,   ///< dist_sync: the last bytes of a late push, which is not applied
  refused,   ///< invalid; nothing changed (code and problem say why)
};

struct chunk_outcome {
  chunk_outcome(chunk_fate what = chunk_fate::taken) noexcept : fate(what) {}
  chunk_outcome(chunk_fate what, wire::error_code why, std::string text)
      : fate(what), code(why), problem(std::move(text)) {}

  chunk_fate fate;
  wire::error_code code = wire::error_code::invalid_argument;
  /// For a refused chunk: a sentence naming the key, the round, the worker and the values.
  std::string problem;

  bool refused() const noexcept { return fate == chunk_fate::refused; }
};

/// "push of key <key> for round <r> from worker <w>: <why>", refused with `code`.
chunk_outcome refuse_chunk(std::uint64_t key, wire::error_code code, const push_chunk& chunk,
                           const std::string& why);

/// Accepts (fate taken) a chunk that continues a push of `total` bytes of which `received` have
/// arrived: it starts at byte `received` and does not run past `total`. Refuses it otherwise.
chunk_outcome check_order(std::uint64_t key, const push_chunk& chunk, std::uint64_t received,
                          std::uint64_t total);

/// A key's value as the push logic sees it: what a buffer for it looks like.
struct value_layout {
  explicit value_layout(const ndarray& like)
      : shape(like.shape()), type(like.dtype()), bytes(like.nbytes()) {}

  shape_vector shape;
  troupe::dtype type;
  std::uint64_t bytes;
};

/// Makes `buffer` an array of `layout` that nobody else reads: itself when it is unshared and
/// fits, else a fresh one from the pool. Values are read by replies on other threads, so a buffer
/// a reply still holds is never written (copy-on-write).
void make_writable(ndarray& buffer, const value_layout& layout);

/// Copies a chunk that check_order accepted into `buffer` at its offset; the push's first chunk
/// (offset 0) makes the buffer writable first.
void stage_chunk(ndarray& buffer, const push_chunk& chunk, const value_layout& layout);

/// The array's bytes, for writing.
inline std::byte* bytes_of(ndarray& array) {
  return static_cast<std::byte*>(array.raw_data());
}

} // namespace troupe
