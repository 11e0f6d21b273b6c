#pragma once
// The network-free half of actors/data_link: how frames are cut from a byte stream into reusable
// buffers, and how outgoing frames are fed to a connection's write buffer in bounded steps. The
// brokers of data_link.cpp only move bytes between these classes and CAF's scribes, so everything
// here is testable without a socket (tests/actors/data_link_test.cpp).
//
// Receiving, per connection (frame_receiver):
//
//     header: read exactly 8 bytes ──read_frame_prefix──> bad length: error, close the connection
//        ^                                  │ ok (length n checked against the cap first)
//        │                                  v
//        └──decode in place── body: read exactly n bytes into a pooled vector swapped into the
//                             scribe's read buffer (no copy: the kernel writes into it directly)
//
// CAF's scribe reads into a std::vector<char> it owns and hands that vector to the broker's
// handler, which may swap it for another (STACK.md §10). So the body is read straight into a
// pooled vector, swapped out when complete and kept alive by the decoded envelope: one copy per
// byte on the receiving side, the kernel's. `receive_policy::exactly(n)` value-initialises the
// buffer only when it has to grow it, so the pool hands out a vector already at least n long
// and the scribe only shrinks it: a warm buffer of the right size is never rewritten.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "actors/protocols.hpp"
#include "actors/shm_arena.hpp"
#include "schema/codec.hpp"

namespace troupe {

/// Counters of one receive_buffer_pool, a consistent snapshot.
struct receive_buffer_pool_stats {
  std::uint64_t hits = 0;       ///< buffers handed out from the cache
  std::uint64_t misses = 0;     ///< buffers that needed fresh memory
  std::uint64_t evictions = 0;  ///< returned buffers freed because the cache was full
  std::size_t cached_bytes = 0; ///< capacity of the buffers kept for reuse
  std::size_t cached_buffers = 0;
};

/// Frame buffers for the receiving side: std::vector<char>, because that is what a CAF scribe
/// reads into. New buffers are value-initialised, which touches (pre-faults) every page once;
/// returned buffers are kept, up to a cap of cached bytes, and handed out again warm (STACK.md
/// §8: first-touch memory runs at a few hundred MB/s here, warm memory at several GB/s).
///
/// Thread-safe: buffers are taken on a broker's thread and come back from whichever thread drops
/// the last envelope that views them. The cache outlives this object while buffers are out.
class receive_buffer_pool {
public:
  /// `max_cached_bytes`: capacity kept for reuse; beyond it the oldest returned buffers are freed.
  explicit receive_buffer_pool(std::size_t max_cached_bytes);
  receive_buffer_pool(const receive_buffer_pool&) = delete;
  receive_buffer_pool& operator=(const receive_buffer_pool&) = delete;
  ~receive_buffer_pool();

  /// A buffer with size() >= bytes, so that resizing it to `bytes` never writes to it. A cached
  /// buffer is used only when it is not much larger than asked (twice, or 64 KiB more), so a big
  /// buffer is not worn down by small frames. Throws std::bad_alloc when memory runs out.
  std::vector<char> take(std::size_t bytes);
  /// Wraps `buffer` in an owner that returns it to this pool's cache when the last copy goes.
  std::shared_ptr<const std::vector<char>> keep(std::vector<char> buffer);

  receive_buffer_pool_stats stats() const;

  /// The shared cache (opaque; defined in data_link_framing.cpp).
  struct core;

private:
  std::shared_ptr<core> core_;
};

/// What frame_receiver::consume made of the bytes it was given.
struct receive_outcome {
  /// Bytes to read before calling consume again (8 for a prefix, n for a body); 0 when the
  /// stream cannot be resynchronised and the connection must be closed after `error` is sent.
  std::size_t next_read = wire::frame_prefix_bytes;
  /// A complete, validated frame; envelope::keepalive owns the buffer its tensor views, and
  /// envelope::connection is 0 (the caller knows the connection).
  std::optional<envelope> frame;
  /// Why the bytes were rejected; the peer is told with an error_reply{bad_frame}.
  std::optional<wire::decode_error> error;

  bool fatal() const noexcept { return next_read == 0; }
};

/// Cuts one connection's byte stream into frames (see the file comment for the two phases).
/// Not thread-safe: one per connection, used on its broker's thread.
class frame_receiver {
public:
  /// `pool` supplies the body buffers; `limits` bounds every frame (max_frame_bytes is checked on
  /// the prefix, before anything is allocated).
  frame_receiver(std::shared_ptr<receive_buffer_pool> pool, wire::decode_limits limits);

  /// How many bytes the first read must deliver: a prefix.
  static constexpr std::size_t first_read = wire::frame_prefix_bytes;

  /// Takes the bytes of the read just completed, `buffer` being the scribe's read buffer
  /// (new_data_msg::buf): exactly the next_read bytes announced by the previous call (8 at
  /// first). May swap `buffer` for another vector, which the scribe then reads into next.
  /// Precondition: buffer.size() equals the announced read (else std::logic_error: a bug).
  receive_outcome consume(std::vector<char>& buffer);

  /// From now on, tensors may reference `arena` (the peer's, mapped here): decode checks the
  /// references against it, the decoded tensor views it, and envelope::keepalive is a hold on
  /// the region (released to the peer when the last copy goes). Null: no arena.
  void set_peer_arena(std::shared_ptr<shm_peer_arena> arena) { arena_ = std::move(arena); }

  /// Bytes of the body being read, or 0 between frames.
  std::size_t body_bytes() const noexcept { return in_body_ ? body_bytes_ : 0; }

private:
  receive_outcome finish_body(std::vector<char>& buffer);

  std::shared_ptr<receive_buffer_pool> pool_;
  wire::decode_limits limits_;
  std::shared_ptr<shm_peer_arena> arena_;
  /// The small vector the prefixes are read into, parked here while a body is read.
  std::vector<char> prefix_buffer_;
  std::size_t body_bytes_ = 0;
  bool in_body_ = false;
};

/// The outgoing frames of one connection, in order, and how far each has been handed to the
/// connection's write buffer. A frame and the keepalive of the memory its pieces view (the
/// tensor it references) are released as soon as their last byte has been appended: from then
/// on the write buffer holds the bytes. Not thread-safe: one per connection.
class frame_send_queue {
public:
  /// Queues a frame; `keepalive` owns what the frame's pieces view (may be null).
  void push(wire::encoded_frame frame, std::shared_ptr<const void> keepalive);

  /// Appends at most `max_bytes` of the queued frames, in order, to `out`; returns the bytes
  /// appended (0 only when empty() or max_bytes is 0). Frames may be split anywhere: the bytes
  /// form one stream.
  std::size_t append_to(std::vector<char>& out, std::size_t max_bytes);

  bool empty() const noexcept { return entries_.empty(); }
  /// Frames with bytes not yet appended.
  std::size_t frames() const noexcept { return entries_.size(); }
  /// Bytes not yet appended, over all frames.
  std::size_t queued_bytes() const noexcept { return queued_bytes_; }

private:
  struct entry {
    wire::encoded_frame frame;
    std::shared_ptr<const void> keepalive;
    std::size_t piece = 0;  ///< index into frame.pieces() of the next byte
    std::size_t offset = 0; ///< offset of the next byte within that piece
  };
  std::deque<entry> entries_;
  std::size_t queued_bytes_ = 0;
};

} // namespace troupe
