#pragma once
// The codec between troupe::wire messages and frames (format: schema/troupe.capnp's file
// comment). Cap'n Proto stays behind this header: callers see plain structs and byte spans.
//
// Sending:   encoded_frame f = encode(msg);  writev(f.pieces())  (or f.flatten() for small ones)
// Receiving: n = read_frame_prefix(first 8 bytes); read n bytes into an 8-byte-aligned buffer;
//            decoded_message d = decode_body(buffer); use d.msg while the buffer lives.
// Tensors above one chunk go through chunker / reassembler (schema/chunking.hpp).
//
// Zero copy, both ways:
// - A tensor with tensor_chunk::shm set travels as that reference only (the data link's same-host
//   fast path put its bytes into a shared-memory arena); decode_body resolves it against the
//   arena it is given.
// - encode() references a tensor payload of 4 KiB or more at an 8-byte-aligned address instead of
//   copying it; smaller or misaligned payloads are copied into the frame.
// - decode() reads the frame in place; a decoded tensor_chunk::data points into the frame buffer
//   (or, only when that buffer was not 8-byte aligned, into an aligned copy owned by the
//   decoded_message).
//
// Errors: everything that can be wrong with bytes from a peer comes back as a decode_error value.
// Decoding never throws on bad input (only std::bad_alloc when memory runs out), never aborts, and
// allocates in proportion to the bytes actually received (at most one aligned copy of the frame,
// plus the strings and lists it copies out), never in proportion to a length field; the frame
// itself is bounded by decode_limits::max_frame_bytes. encode throws std::invalid_argument for
// caller mistakes only. Both are reentrant: no global state.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "schema/messages.hpp"

namespace troupe::wire {

/// Bytes of the length prefix that starts every frame (little-endian uint64 body length).
inline constexpr std::size_t frame_prefix_bytes = 8;

/// Largest tensor payload one message carries: the largest multiple of 8 that one Cap'n Proto
/// Data field holds (2^29-1 bytes). Bigger tensors travel in chunks (schema/chunking.hpp).
inline constexpr std::size_t max_chunk_bytes = (std::size_t{1} << 29) - 8;

/// A frame, or a tensor being reassembled, that must be rejected. A value, never thrown: the
/// receiver answers the peer with error_reply{error_code::bad_frame} and changes nothing.
struct decode_error {
  enum class code : std::uint8_t {
    frame_too_large,    ///< announced or actual size above decode_limits::max_frame_bytes
    truncated,          ///< fewer bytes than the prefix or the segment table announce
    malformed_frame,    ///< size not a multiple of 8, trailing bytes, impossible segment table
    malformed_message,  ///< Cap'n Proto rejected the structure (bad pointer, traversal limit, ...)
    unknown_message,    ///< a union member this version does not know, or `unset`
    missing_field,      ///< a required field is absent or empty
    invalid_enum,       ///< an enum value outside the enumeration (or `unspecified`)
    invalid_tensor,     ///< shape, dtype, sizes and offsets of a tensor chunk disagree
    limit_exceeded,     ///< a list, text, rank or tensor size above decode_limits
    invalid_value,      ///< another inconsistency (key range begin >= end, barrier group 0, ...)
    chunk_mismatch,     ///< reassembly: dtype, shape or total differ from the tensor's
    chunk_out_of_range, ///< reassembly: bytes outside the destination
    chunk_overlap,      ///< reassembly: bytes already received, or a chunk after completion
  };
  code kind;
  /// Names the offending values, for logs and for the error_reply sent back.
  std::string message;
};

std::string_view to_string(decode_error::code kind) noexcept;

/// Either a T or the decode_error that prevented it (std::expected is C++23).
template <class T>
class result {
public:
  result(T value) : state_(std::in_place_index<0>, std::move(value)) {}
  result(decode_error error) : state_(std::in_place_index<1>, std::move(error)) {}

  bool has_value() const noexcept { return state_.index() == 0; }
  explicit operator bool() const noexcept { return has_value(); }

  /// Precondition: has_value() (otherwise std::bad_variant_access: a bug of the caller).
  T& value() & { return std::get<0>(state_); }
  const T& value() const& { return std::get<0>(state_); }
  T&& value() && { return std::get<0>(std::move(state_)); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }

  /// Precondition: !has_value().
  const decode_error& error() const { return std::get<1>(state_); }

private:
  std::variant<T, decode_error> state_;
};

/// What a receiver accepts from a peer. Every field bounds memory or work driven by the peer.
struct decode_limits {
  /// Largest frame body (the length in the prefix). Must exceed the peer's chunk size plus a
  /// little overhead (chunk metadata is well under 1 KiB).
  std::size_t max_frame_bytes = std::size_t{256} << 20;
  /// Largest whole tensor a chunk may announce (total_bytes).
  std::uint64_t max_tensor_bytes = std::uint64_t{64} << 30;
  /// Most axes of a tensor shape.
  std::size_t max_rank = max_tensor_rank;
  /// Most elements of any list (membership nodes and key ranges, optimizer parameters).
  std::size_t max_list_elements = std::size_t{1} << 20;
  /// Longest text or opaque byte string (host, job id, token, names, paths, messages).
  std::size_t max_text_bytes = std::size_t{64} << 10;
  /// Most Cap'n Proto segments in one frame (troupe's encoder writes at most a handful).
  std::size_t max_segments = 64;
};

/// One encoded frame, ready for a vectored write. Move-only. It views the tensor payload it
/// references (see the file comment): the caller's tensor must stay alive and unchanged until
/// the frame has been written (or flattened) and destroyed.
class encoded_frame {
public:
  encoded_frame(encoded_frame&&) noexcept;
  encoded_frame& operator=(encoded_frame&&) noexcept;
  ~encoded_frame();

  /// The frame's bytes in write order: the first piece holds the length prefix and the segment
  /// table, the others the segments (a referenced tensor payload is a piece of its own, viewing
  /// the caller's memory). Valid as long as this object.
  std::span<const std::span<const std::byte>> pieces() const noexcept;
  /// Total bytes over all pieces: frame_prefix_bytes + body length.
  std::size_t size() const noexcept;
  /// Bytes after the prefix (what read_frame_prefix returns on the receiving side).
  std::size_t body_size() const noexcept { return size() - frame_prefix_bytes; }
  /// Copies the pieces into `out`. Precondition: out.size() == size() (std::invalid_argument).
  void flatten_into(std::span<std::byte> out) const;
  /// The pieces in one new buffer (its data is 16-byte aligned, as operator new gives, so the body
  /// at offset 8 is 8-byte aligned and decodes in place). For tests and small messages.
  std::vector<std::byte> flatten() const;

  /// Opaque: the Cap'n Proto builder and the piece list, defined in codec.cpp.
  struct state;

private:
  friend encoded_frame encode(const message& msg);
  explicit encoded_frame(std::unique_ptr<state> s) noexcept;
  std::unique_ptr<state> state_;
};

/// Encodes one message. Throws std::invalid_argument when a field cannot be represented: a tensor
/// payload above max_chunk_bytes (split it with chunker), a list longer than 2^29-1 elements, or a
/// command_kind outside its enumeration. Other enum values are written as given, even out of range
/// (the peer rejects them): encode does not validate content, decode does.
encoded_frame encode(const message& msg);

/// A decoded frame. msg's tensor payload (if any) views the frame buffer passed to decode, or
/// the aligned copy held here when that buffer was misaligned; copies of this object share it.
struct decoded_message {
  message msg;
  /// True when the input was not 8-byte aligned and was copied (msg views the copy).
  bool copied() const noexcept { return aligned_copy_ != nullptr; }

  /// `copy`: the aligned copy `m` views, or null when `m` views the caller's frame buffer.
  decoded_message(message m, std::shared_ptr<const std::uint64_t[]> copy)
      : msg(std::move(m)), aligned_copy_(std::move(copy)) {}

private:
  std::shared_ptr<const std::uint64_t[]> aligned_copy_;
};

/// Reads a frame's 8-byte length prefix (prefix.size() must be >= 8; only 8 bytes are read) and
/// returns the body length after checking it before anything is allocated for it: a multiple of
/// 8, at least 16 (a segment table word and a root pointer), at most limits.max_frame_bytes.
result<std::size_t> read_frame_prefix(std::span<const std::byte> prefix,
                                      const decode_limits& limits = {});

/// Decodes a frame body (the bytes after the prefix). Validates before use: size cap, alignment
/// (copies into an aligned buffer only if misaligned), the segment table against the size,
/// Cap'n Proto's structure with a traversal limit of the body's own word count, then every field
/// (enums, required fields, lists and texts against limits, tensor consistency). `body` must
/// outlive the returned message's tensor view unless copied().
///
/// `arena`: the peer's shared-memory arena as mapped here (actors/logic/shm_arena.hpp), or empty
/// when the connection has none. A tensor with a shm reference (tensor_chunk::shm) is accepted only
/// when the reference lies inside `arena` at an 8-byte-aligned offset, with no inline data; its
/// data then views `arena` (which must outlive that view). Otherwise: invalid_tensor naming the
/// reference.
result<decoded_message> decode_body(std::span<const std::byte> body,
                                    const decode_limits& limits = {},
                                    std::span<const std::byte> arena = {});

/// Decodes a whole frame, prefix included; its size must be exactly prefix + announced body.
result<decoded_message> decode(std::span<const std::byte> frame, const decode_limits& limits = {},
                               std::span<const std::byte> arena = {});

/// The checks decode applies to a tensor chunk (see tensor_chunk), usable on chunks built
/// locally; nullopt when the chunk is consistent.
std::optional<decode_error> validate_tensor(const tensor_chunk& chunk,
                                            const decode_limits& limits = {});

} // namespace troupe::wire
