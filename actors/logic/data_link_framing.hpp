#pragma once
// The network-free half of actors/data_link: how frames are cut from a byte stream into reusable
// buffers, how outgoing frames are fed to a connection's write buffer in bounded steps, and the
// receive credit that bounds the bytes in flight on a connection. The brokers of data_link.cpp
// only move bytes between these classes and CAF's scribes, so everything here is testable without
// a socket (tests/actors/data_link_test.cpp).
//
// Receiving, per connection (frame_receiver):
//
//     header: read exactly 8 bytes ──read_frame_prefix──> bad length: error, close the connection
//        ^                                  │ ok (length n checked against the cap and the
//        │                                  │     receive window first)
//        │                                  v
//        └──decode in place── body: read exactly n bytes into a pooled vector swapped into the
//                             scribe's read buffer (no copy: the kernel writes into it directly)
//
// CAF's scribe reads into a std::vector<char> it owns and hands that vector to the broker's
// handler, which may swap it for another (docs/data-path.md, "Buffers"). So the body is read
// straight into a pooled vector, swapped out when complete and kept alive by the decoded envelope:
// one copy per byte on the receiving side, the kernel's. `receive_policy::exactly(n)`
// value-initialises the buffer only when it has to grow it, so the pool hands out a vector already
// at least n long and the scribe only shrinks it: a warm buffer of the right size is never
// rewritten.
//
// Receive credit (receive_credit at the receiver, frame_send_queue at the sender): each end
// announces a receive window W in its link hello. A frame's bytes (prefix included) count from
// the moment the sender hands it out until the receiver has released it (the last copy of its
// envelope is gone, on whatever thread) and said so in a link_credit. The receiver returns
// released bytes in batches of at least one quantum Q = max(W / 8, 1); so the sender may send a
// frame when outstanding + frame <= W, or when less than Q is outstanding (then the receiver
// holds back nothing it could return, and a frame larger than the window goes as good as alone).
// This needs no timer and no credit per frame: once every received frame is released, less than
// Q is uncredited, so a blocked sender always gets going again. Link-control frames (hello,
// credit, arena_*) are never counted: credit can always flow, whatever the window.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "actors/logic/envelope.hpp"
#include "actors/logic/shm_arena.hpp"
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
/// returned buffers are kept, up to a cap of cached bytes, and handed out again warm (on small
/// VMs first-touch memory runs at a few hundred MB/s, warm memory at several GB/s).
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

/// The credit quantum of a window of `window` bytes (see the file comment): a receiver returns
/// released bytes once they reach it, and a sender with less than it outstanding may send any
/// frame.
constexpr std::uint64_t credit_quantum(std::uint64_t window) noexcept {
  return window / 8 > 0 ? window / 8 : 1;
}

/// The one admission rule both ends apply, so that a sender that keeps it is never refused: a
/// frame of `bytes` may go when less than a quantum is outstanding, or when it fits the window
/// beside what is.
constexpr bool credit_admits(std::uint64_t window, std::uint64_t outstanding,
                             std::uint64_t bytes) noexcept {
  return outstanding < credit_quantum(window) || (bytes <= window && outstanding <= window - bytes);
}

/// Largest link-control frame (prefix included) a receiver reads while the sender is beyond its
/// window: control frames need no credit, but what a frame is shows only once it is decoded.
/// Bigger frames beyond the window are refused from their prefix, before anything is allocated.
/// A broker's own control frames stay far below it (arena releases are split to fit).
inline constexpr std::size_t max_link_control_frame_bytes = std::size_t{64} << 10;

/// Largest frame (body) a connection reads before its peer has proven the job token: the link
/// hellos and link_auth are a few hundred bytes, so an unauthenticated peer can make a broker
/// allocate no more than this per connection.
inline constexpr std::size_t max_handshake_frame_bytes = std::size_t{4} << 10;

/// Counters of one receive_credit, a consistent snapshot (bytes, prefixes included).
struct receive_credit_stats {
  std::uint64_t window = 0;      ///< the window announced to the peer; 0: no flow control
  std::uint64_t outstanding = 0; ///< received and not yet credited back
  std::uint64_t unreleased = 0;  ///< received, and some copy of the envelope is still alive
  std::uint64_t uncredited = 0;  ///< released, not yet credited back (outstanding - unreleased)
  std::uint64_t credited = 0;    ///< credited back in total
};

/// The receiving half of one connection's credit: counts received frames against the window
/// this end announced, collects their releases from whichever thread drops the last envelope,
/// and says when to send a link_credit (once the released bytes reach the quantum).
///
/// Thread-safe. admits / received_and_released / hold / take run on the broker's thread;
/// releases come from anywhere, and wake the broker (on_release) when a credit becomes due.
/// Outlives the connection while envelopes hold it.
class receive_credit : public std::enable_shared_from_this<receive_credit> {
public:
  /// `window`: bytes the peer may have outstanding; 0 counts nothing and never credits.
  explicit receive_credit(std::uint64_t window) : window_(window) {}
  receive_credit(const receive_credit&) = delete;
  receive_credit& operator=(const receive_credit&) = delete;

  std::uint64_t window() const noexcept { return window_; }
  /// Whether the peer may send a frame of `bytes` now: outstanding + bytes <= window, or less
  /// than credit_quantum(window) outstanding (always true without a window). A peer's own view
  /// of what is outstanding is never smaller (credits may still be on their way), so a sender
  /// that keeps the rule is never refused.
  bool admits(std::uint64_t bytes) const;
  /// A received frame of `bytes` that goes on to an actor: returns the envelope's keepalive,
  /// which owns `inner` (may be null) and releases the bytes when its last copy goes. Without a
  /// window, `inner` itself. Throws std::bad_alloc.
  std::shared_ptr<const void> hold(std::uint64_t bytes, std::shared_ptr<const void> inner);
  /// A received frame of `bytes` that goes no further (it failed to decode): released at once.
  void received_and_released(std::uint64_t bytes);
  /// The bytes to return in a link_credit now: everything released, once it reaches the quantum;
  /// else 0. What it returns counts as credited.
  std::uint64_t take();
  /// Called (outside the lock) when a release makes a credit due and the broker has not been
  /// told since its last take(). Set before any hold(); set to an empty function when the
  /// connection is gone (releases then only count).
  void on_release(std::function<void()> wake);

  receive_credit_stats stats() const;

private:
  struct hold_state;
  void release(std::uint64_t bytes) noexcept;

  const std::uint64_t window_;
  mutable std::mutex mutex_;
  std::uint64_t outstanding_ = 0;
  std::uint64_t uncredited_ = 0;
  std::uint64_t credited_ = 0;
  /// The broker may be woken: it has taken the credit since it was last woken.
  bool wake_armed_ = true;
  std::function<void()> wake_;
};

/// Counters of one receive_budget, a consistent snapshot (bytes, prefixes included).
struct receive_budget_stats {
  std::uint64_t limit = 0;  ///< the budget
  std::uint64_t in_use = 0; ///< reserved by frames being read or not yet released
  std::uint64_t peak = 0;   ///< the most in_use has been
  std::uint64_t waits = 0;  ///< frames that had to wait for room (a connection stopped reading)
};

/// The receive budget of a whole process end (a data server broker and all its connections): the
/// bytes of frames read or being read that nobody has released yet. A receive window bounds one
/// connection; this bounds their sum, which max_connections windows would not (4096 x 64 MiB).
///
/// A connection reserves a frame's bytes when it has read the frame's prefix, before its body is
/// allocated; the reservation is released with the last copy of the frame's envelope (or at once
/// when the frame goes no further). A frame that does not fit is not refused: its connection
/// stops reading (backpressure) and tries again when on_room says releases made room. A frame
/// fits when it does beside what is reserved, or when nothing is (so one frame always goes,
/// whatever its size: a connection never waits for nothing).
///
/// Thread-safe: reserve runs on the broker's thread, releases come from any thread.
class receive_budget : public std::enable_shared_from_this<receive_budget> {
public:
  /// `limit`: bytes that may be reserved at once (at least max_frame_bytes, or a large frame only
  /// ever goes alone).
  explicit receive_budget(std::uint64_t limit) : limit_(limit) {}
  receive_budget(const receive_budget&) = delete;
  receive_budget& operator=(const receive_budget&) = delete;

  /// Reserves `bytes` when they fit: returns the ticket, whose last copy releases them (keep it
  /// with what holds the frame). Null when they do not fit: then the next release calls on_room.
  /// Throws std::bad_alloc (nothing is reserved then).
  std::shared_ptr<const void> reserve(std::uint64_t bytes);
  /// Called (outside the lock, on the releasing thread) by the first release after a reserve was
  /// refused. Set an empty function when nobody listens any more.
  void on_room(std::function<void()> wake);

  receive_budget_stats stats() const;

private:
  struct ticket;
  void release(std::uint64_t bytes) noexcept;

  const std::uint64_t limit_;
  mutable std::mutex mutex_;
  std::uint64_t in_use_ = 0;
  std::uint64_t peak_ = 0;
  std::uint64_t waits_ = 0;
  /// A reserve was refused since the last wake.
  bool waiting_ = false;
  std::function<void()> wake_;
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
  /// A prefix was read but the frame does not fit the receive budget: read nothing from the
  /// connection until frame_receiver::resume says so (next_read is 0 then, but not fatal).
  bool waits_for_budget = false;

  bool fatal() const noexcept { return next_read == 0 && !waits_for_budget; }
};

/// Cuts one connection's byte stream into frames (see the file comment for the two phases).
/// Not thread-safe: one per connection, used on its broker's thread.
class frame_receiver {
public:
  /// `pool` supplies the body buffers; `limits` bounds every frame (max_frame_bytes is checked on
  /// the prefix, before anything is allocated). `credit`, when given, is this connection's
  /// receive window: a frame beyond it is fatal (checked on the prefix, except for a frame small
  /// enough to be link control, which is checked once decoded), every other frame except link
  /// control is counted, and a forwarded envelope's keepalive releases its bytes.
  frame_receiver(std::shared_ptr<receive_buffer_pool> pool, wire::decode_limits limits,
                 std::shared_ptr<receive_credit> credit = nullptr);

  /// How many bytes the first read must deliver: a prefix.
  static constexpr std::size_t first_read = wire::frame_prefix_bytes;

  /// Takes the bytes of the read just completed, `buffer` being the scribe's read buffer
  /// (new_data_msg::buf): exactly the next_read bytes announced by the previous call (8 at
  /// first). May swap `buffer` for another vector, which the scribe then reads into next.
  /// Precondition: buffer.size() equals the announced read (else std::logic_error: a bug).
  receive_outcome consume(std::vector<char>& buffer);

  /// After an outcome that waits_for_budget: tries the budget again. Still no room: the same
  /// outcome. Room: the body is next (next_read is its size); when `buffer` is given (the vector
  /// the next read fills) a pooled body buffer is swapped into it, else the caller's reader
  /// allocates it. Precondition: the last outcome waited for the budget.
  receive_outcome resume(std::vector<char>* buffer);

  /// From now on, every frame read reserves its bytes in `budget` first (null: no budget).
  void set_budget(std::shared_ptr<receive_budget> budget) { budget_ = std::move(budget); }

  /// Whether the last prefix read waits for the receive budget.
  bool waits_for_budget() const noexcept { return waiting_.has_value(); }

  /// From now on, tensors may reference `arena` (the peer's, mapped here): decode checks the
  /// references against it, the decoded tensor views it, and envelope::keepalive is a hold on
  /// the region (released to the peer when the last copy goes). Null: no arena.
  void set_peer_arena(std::shared_ptr<shm_peer_arena> arena) { arena_ = std::move(arena); }

  /// Caps the frames read from now on (the prefix is checked against it): a connection reads at
  /// most max_handshake_frame_bytes until its peer is authenticated, then limits.max_frame_bytes.
  void set_max_frame_bytes(std::size_t bytes) noexcept { limits_.max_frame_bytes = bytes; }

  /// Bytes of the body being read, or 0 between frames.
  std::size_t body_bytes() const noexcept { return in_body_ ? body_bytes_ : 0; }

private:
  receive_outcome finish_body(std::vector<char>& buffer);
  /// The prefix announced `length` body bytes and passed every check: reserve them in the budget
  /// and allocate the body (swapped into `buffer` when given), or wait.
  receive_outcome start_body(std::size_t length, std::vector<char>* buffer);

  /// The fatal error for a frame of `bytes` that the window does not admit.
  wire::decode_error beyond_window(std::uint64_t bytes) const;

  std::shared_ptr<receive_buffer_pool> pool_;
  wire::decode_limits limits_;
  std::shared_ptr<receive_credit> credit_;
  std::shared_ptr<shm_peer_arena> arena_;
  std::shared_ptr<receive_budget> budget_;
  /// The budget's ticket for the frame being read (null without a budget).
  std::shared_ptr<const void> ticket_;
  /// Body bytes of a frame whose prefix waits for the budget.
  std::optional<std::size_t> waiting_;
  /// The small vector the prefixes are read into, parked here while a body is read.
  std::vector<char> prefix_buffer_;
  std::size_t body_bytes_ = 0;
  bool in_body_ = false;
  /// The body being read arrived beyond the window: fatal unless it is link control.
  bool beyond_window_ = false;
};

/// The outgoing frames of one connection, in order, how far each has been handed to the
/// connection's write buffer, and the sending half of the receive credit (see the file comment).
/// A frame and the keepalive of the memory its pieces view (the tensor it references) are
/// released as soon as their last byte has been appended: from then on the write buffer holds the
/// bytes. Not thread-safe: one per connection.
///
/// Frames pass two stages: *waiting* for credit (until the peer's window is known, open(), and
/// has room for them), then *admitted*, counted as outstanding and appended in order. Frames
/// without credit (push_unmetered: link control, and the last words of a connection that closes)
/// are admitted at once, so they overtake frames waiting for credit, but never enter the middle
/// of a frame. Admitted frames never interleave.
class frame_send_queue {
public:
  /// Queues a frame that needs credit; `keepalive` owns what the frame's pieces view (may be
  /// null). It waits, still viewing that memory (no copy), until the window admits it.
  void push(wire::encoded_frame frame, std::shared_ptr<const void> keepalive);
  /// Queues a frame that needs no credit (link control; the error reply a closing connection
  /// sends last): admitted at once, behind the frames already admitted.
  void push_unmetered(wire::encoded_frame frame);

  /// The peer's link hello announced `peer_window` bytes (0: no flow control): frames waiting
  /// for it are admitted as far as the window allows. Precondition: called once.
  void open(std::uint64_t peer_window);
  /// A link_credit from the peer: `bytes` are no longer outstanding, and waiting frames are
  /// admitted as far as the window allows. An error (and nothing changes) when `bytes` is 0 or
  /// more than is outstanding: the peer breaks the protocol.
  std::optional<std::string> credit(std::uint64_t bytes);
  /// Drops the frames still waiting for credit (a connection that closes sends no more of them).
  void drop_waiting();

  /// Appends at most `max_bytes` of the admitted frames, in order, to `out`; returns the bytes
  /// appended (0 only when !ready() or max_bytes is 0). Frames may be split anywhere: the bytes
  /// form one stream.
  std::size_t append_to(std::vector<char>& out, std::size_t max_bytes);
  /// As append_to, handing the bytes to `write` piece by piece (views of the frames' memory,
  /// valid during the call) instead of copying them: a TLS session encrypts straight from them.
  std::size_t write_to(const std::function<void(std::span<const char>)>& write,
                       std::size_t max_bytes);

  /// Admitted bytes remain to be appended.
  bool ready() const noexcept { return !admitted_.empty(); }
  /// No frame left, admitted or waiting.
  bool empty() const noexcept { return admitted_.empty() && waiting_.empty(); }
  /// Frames with bytes not yet appended, admitted or waiting.
  std::size_t frames() const noexcept { return admitted_.size() + waiting_.size(); }
  /// Bytes not yet appended, over all frames.
  std::size_t queued_bytes() const noexcept { return queued_bytes_; }
  /// Frames waiting for credit, and their bytes.
  std::size_t waiting_frames() const noexcept { return waiting_.size(); }
  std::size_t waiting_bytes() const noexcept { return waiting_bytes_; }
  /// Whether the peer's window is known (open() was called), and what it is.
  bool is_open() const noexcept { return open_; }
  std::uint64_t peer_window() const noexcept { return peer_window_; }
  /// Bytes admitted and not yet credited back (0 without flow control).
  std::uint64_t outstanding() const noexcept { return outstanding_; }
  /// Bytes the peer credited back in total.
  std::uint64_t credited() const noexcept { return credited_; }

private:
  struct entry {
    wire::encoded_frame frame;
    std::shared_ptr<const void> keepalive;
    std::size_t piece = 0;  ///< index into frame.pieces() of the next byte
    std::size_t offset = 0; ///< offset of the next byte within that piece
  };
  /// Moves waiting frames to the admitted ones, in order, while the window has room.
  void admit();

  std::deque<entry> admitted_;
  std::deque<entry> waiting_;
  std::size_t queued_bytes_ = 0;
  std::size_t waiting_bytes_ = 0;
  bool open_ = false;
  std::uint64_t peer_window_ = 0;
  std::uint64_t outstanding_ = 0;
  std::uint64_t credited_ = 0;
};

} // namespace troupe
