#pragma once
// Tensors larger than one frame: chunker splits a message's tensor over several frames,
// reassembler puts the chunks of a received tensor together in a caller-provided buffer.
//
// Chunk size: one Cap'n Proto Data field holds at most 2^29-1 bytes and the receiver caps frames
// (decode_limits::max_frame_bytes, 256 MiB by default), so a chunk must stay below both. The
// default of 1 MiB lets a tensor travel as many frames, so the server sums one chunk while the
// next is on the wire and the worker copies one reply chunk while the next arrives. Measured
// push+pull medians (BENCHMARKS.md): at 16 MiB 16 MiB chunks gave 0.39-0.64x raw TCP, 4 MiB ones
// 0.64-0.84x and 1 MiB ones 0.78-0.91x; at 128 MiB 1 MiB chunks beat 4 MiB ones by 5-20 %.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <span>
#include <vector>

#include "schema/codec.hpp"
#include "schema/messages.hpp"

namespace troupe::wire {

/// Chunk payload size used unless the caller picks another.
inline constexpr std::size_t default_chunk_bytes = std::size_t{1} << 20;

/// Whether chunker accepts `chunk_bytes`: a multiple of 8 in [8, max_chunk_bytes], so that chunks
/// start at multiples of every element size and a payload aligned to 8 bytes stays aligned in
/// every chunk. The cluster configuration checks data.chunk_bytes with it, so that a size the
/// chunker would refuse is refused when the configuration is read.
constexpr bool valid_chunk_bytes(std::size_t chunk_bytes) noexcept {
  return chunk_bytes != 0 && chunk_bytes % 8 == 0 && chunk_bytes <= max_chunk_bytes;
}

/// Splits a message carrying a whole tensor (init, push, pushpull, pull_reply) into messages of
/// one chunk each: the same fields, the same dtype, shape and total_bytes, and consecutive
/// [offset, offset + size) slices of the payload, every one chunk_bytes long except the last.
/// A message without a tensor, or with an empty one, is a single chunk: itself. A packed tensor
/// (tensor_chunk::compression) is split the same way by its packed bytes, each chunk whole words
/// that cover the elements they hold (offset and compression.elements say which). A row-sparse
/// tensor (tensor_chunk::row_sparse) is never split: it is the single chunk.
///
/// The chunker copies the message's fields but not the payload: the tensor's memory must stay
/// alive and unchanged until every chunk message and frame made from it is gone.
class chunker {
public:
  /// Preconditions (std::invalid_argument otherwise): valid_chunk_bytes(chunk_bytes); the tensor
  /// is whole (offset 0, dense_bytes() == total_bytes) and consistent (validate_tensor).
  explicit chunker(message whole, std::size_t chunk_bytes = default_chunk_bytes);

  /// At least 1.
  std::size_t chunk_count() const noexcept { return count_; }
  std::size_t chunk_bytes() const noexcept { return chunk_bytes_; }

  /// The message of chunk `index` (< chunk_count(), else std::out_of_range); its payload views
  /// the whole tensor's memory.
  message chunk(std::size_t index) const;
  /// encode(chunk(index)): the frame references the payload slice (no copy when aligned).
  encoded_frame encode_chunk(std::size_t index) const;

private:
  message whole_;
  std::size_t chunk_bytes_;
  std::size_t count_;
};

/// Writes the chunks of one received tensor into a destination buffer the caller owns (e.g. a
/// pooled, pre-faulted buffer, or the key's storage) and says when every byte has arrived. Chunks
/// may come in any order; each is checked before any byte is written, and a rejected chunk
/// changes nothing. Not thread-safe: one reassembler per tensor being received.
class reassembler {
public:
  /// The first chunk fixes dtype and shape; every chunk's total_bytes must equal
  /// destination.size(). `max_ranges` bounds the disjoint received byte ranges kept while chunks
  /// arrive out of order (in-order arrival keeps one), so a peer cannot grow this object without
  /// bound; a chunk that would exceed it is rejected with limit_exceeded.
  explicit reassembler(std::span<std::byte> destination, std::size_t max_ranges = 64);
  /// As above, with the dtype and shape every chunk must have (the key's declaration).
  /// Precondition: destination.size() == product(shape) * size_of(type) (std::invalid_argument).
  reassembler(std::span<std::byte> destination, dtype type, tensor_shape shape,
              std::size_t max_ranges = 64);

  /// Writes a packed chunk's `compression.elements` dense values to `out` (the destination at the
  /// chunk's offset): the receiver's dequantizer (the schema knows no arithmetic).
  using unpacker = std::function<void(const tensor_chunk& chunk, std::byte* out)>;
  /// From now on packed chunks (compressed pulls) are taken through `unpack`; without one they
  /// are refused (invalid_tensor).
  void accept_packed(unpacker unpack) { unpack_ = std::move(unpack); }

  /// Copies chunk.data to destination[chunk.offset, ...) (a packed chunk: unpacks its elements
  /// there). Returns true when the tensor is complete
  /// after this chunk, false while bytes are missing, or the error: chunk_mismatch (dtype, shape
  /// or total differ), chunk_out_of_range, chunk_overlap (bytes already received, or any chunk
  /// once complete), invalid_tensor (an inconsistent chunk), limit_exceeded (max_ranges).
  result<bool> add(const tensor_chunk& chunk);

  /// Every byte of the destination has arrived (for an empty tensor: one chunk has).
  bool complete() const noexcept;
  std::uint64_t bytes_received() const noexcept { return received_; }
  std::span<std::byte> destination() const noexcept { return destination_; }
  /// The tensor's dtype and shape: given at construction or taken from the first chunk.
  std::optional<dtype> type() const noexcept { return type_; }
  const tensor_shape& shape() const noexcept { return shape_; }

private:
  void write(const tensor_chunk& chunk, std::byte* out) const;

  std::span<std::byte> destination_;
  std::optional<dtype> type_;
  tensor_shape shape_;
  std::size_t max_ranges_;
  /// Disjoint received byte ranges, begin -> end, merged when adjacent.
  std::map<std::uint64_t, std::uint64_t> ranges_;
  std::uint64_t received_ = 0;
  bool any_chunk_ = false;
  unpacker unpack_;
};

} // namespace troupe::wire
