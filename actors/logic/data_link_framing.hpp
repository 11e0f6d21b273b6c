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
//        │             n <= receive step, or no receive budget: read exactly n bytes into a pooled
//        ├─decode in place─ vector swapped into the scribe's read buffer (no copy: the kernel
//        │                  writes into it directly)
//        │             n > receive step, under a budget: read the body step by step, each step
//        └─decode in place─ into a pooled step buffer and copied onto the end of a body that
//                           grows with the bytes that arrived (one copy more, above the step only)
//
// CAF's scribe reads into a std::vector<char> it owns and hands that vector to the broker's
// handler, which may swap it for another (docs/data-path.md, "Buffers"). So a body up to the
// step is read straight into a pooled vector, swapped out when complete and kept alive by the
// decoded envelope: one copy per byte on the receiving side, the kernel's.
// `receive_policy::exactly(n)` value-initialises the buffer only when it has to grow it, so the
// pool hands out a vector already at least n long and the scribe only shrinks it: a warm buffer
// of the right size is never rewritten. A scribe always reads into its buffer from offset 0, so a
// body read in steps cannot be read in place: the steps land in one pooled step buffer and are
// copied into a vector reserved for the whole body (reserving commits no memory; the copies do,
// as the bytes arrive). Tensors travel in chunks well below the step (1 MiB by default), so only
// frames of other sizes pay the copy.
//
// Receive budget (receive_budget, one per listener): the bytes of frames read or being read that
// nobody has released, over all connections. A read is configured only once its bytes are
// reserved: a body up to the step whole at its prefix, a larger body one step at a time, each
// step when the previous one has arrived. So a connection whose frame is in progress holds at
// most one step (plus its prefix) that has not arrived: a peer that announces big frames and
// sends nothing, or trickles, holds a step per connection, not its frames. Claims that do not
// fit wait in the order they came (their connections are not read: backpressure), a new claim
// waits behind them while anything is held, and the broker gives each its turn, in order, as
// releases make room: waiting connections are served in turn, one step at a time. A body read
// in steps also commits its whole size when it starts (in a queue of its own), and those
// commitments never exceed the budget: the frames in progress can always finish.
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

#include <algorithm>
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
  std::uint64_t limit = 0;     ///< the budget
  std::uint64_t in_use = 0;    ///< reserved by frames being read or not yet released
  std::uint64_t peak = 0;      ///< the most in_use has been
  std::uint64_t waits = 0;     ///< claims that had to wait (a connection stopped reading)
  std::uint64_t committed = 0; ///< whole sizes of the frames being read in steps
  std::uint64_t queued = 0;    ///< readers waiting for a reservation or a commitment
};

/// The receive budget of a whole process end (a data server broker and all its connections): the
/// bytes of frames read or being read that nobody has released yet. A receive window bounds one
/// connection; this bounds their sum, which max_connections windows would not (4096 x 64 MiB).
///
/// A reader reserves the bytes of its next read before the read is configured (a whole body up
/// to the receive step at its prefix, or one step of a larger body: see the file comment); each
/// reservation is released with the last copy of the frame's envelope (or at once when the frame
/// goes no further). A claim that does not fit is not refused: its connection stops reading
/// (backpressure), its reader is queued, and the broker serves the queue in order (in_turn) when
/// on_room says releases made room. While anybody is queued, a new claim waits behind them, so
/// no connection overtakes the waiting ones. A claim always fits when nothing but the claimant's
/// own frame is held (so a frame always goes, whatever its size: a connection never waits for
/// nothing, and a frame larger than the budget goes alone).
///
/// A frame read in steps first commits its whole size: the sum of those frames' sizes stays
/// within the budget (one alone may exceed it), so that frames in progress can always finish:
/// they never hold the whole budget in partial frames that wait for each other. Commitments have
/// a queue of their own, so a frame waiting for one never holds up the reads of other frames.
///
/// Thread-safe: claims run on the broker's thread, releases come from any thread.
class receive_budget : public std::enable_shared_from_this<receive_budget> {
public:
  /// `limit`: bytes that may be reserved at once (at least max_frame_bytes, or a large frame only
  /// ever goes alone).
  explicit receive_budget(std::uint64_t limit) : limit_(limit) {}
  receive_budget(const receive_budget&) = delete;
  receive_budget& operator=(const receive_budget&) = delete;

  /// What a reader asks to reserve before it configures a read.
  struct claim {
    /// Bytes to reserve: a whole frame (prefix included) or one step of it.
    std::uint64_t bytes = 0;
    /// Bytes the same frame has reserved already (its earlier steps): the claim fits whenever
    /// only they are held.
    std::uint64_t held = 0;
    /// The reader waited and the broker serves it in its turn: it does not wait behind the queue.
    bool in_turn = false;
  };
  /// Reserves what `c` asks for when it fits (see the class comment): returns the ticket, whose
  /// last copy releases it (keep it with what holds the frame). Null when the claim must wait:
  /// then the claimant is queued (unless it was, in_turn) and the next release calls on_room; a
  /// queued claimant granted in_turn leaves the queue. Throws std::bad_alloc (nothing is
  /// reserved then).
  std::shared_ptr<const void> reserve(const claim& c);
  /// Commits the whole size of a frame read in steps (prefix included), as reserve does, in the
  /// queue of commitments.
  std::shared_ptr<const void> commit(std::uint64_t frame_bytes, bool in_turn);
  /// A queued claimant goes away without its turn (its connection closed): from the queue of
  /// commitments when `commitment`, else from that of reservations.
  void leave_queue(bool commitment) noexcept;
  /// Called (outside the lock, on the releasing thread) by the first release after a claim had
  /// to wait. Set an empty function when nobody listens any more.
  void on_room(std::function<void()> wake);

  receive_budget_stats stats() const;

private:
  struct ticket;
  /// Under the lock: a ticket of `bytes` reserved (or committed) when the claim goes, else null
  /// with the claimant queued; `serve_queue` is set to the wake to call once unlocked when the
  /// claim was refused only to keep the queue's order.
  std::shared_ptr<const void> take(std::uint64_t bytes, bool commitment, bool in_turn, bool alone,
                                   bool room, std::function<void()>& serve_queue);
  /// Calls `serve_queue` if set (outside the lock); when it cannot be delivered, the next
  /// release wakes the broker instead.
  void wake_now(const std::function<void()>& serve_queue) noexcept;
  void release(std::uint64_t bytes, bool commitment) noexcept;

  const std::uint64_t limit_;
  mutable std::mutex mutex_;
  std::uint64_t in_use_ = 0;
  std::uint64_t peak_ = 0;
  std::uint64_t waits_ = 0;
  std::uint64_t committed_ = 0;
  /// Claimants waiting for a reservation, and for a commitment.
  std::uint64_t queued_ = 0;
  std::uint64_t commit_queued_ = 0;
  /// A claim had to wait since the last wake.
  bool waiting_ = false;
  std::function<void()> wake_;
};

/// Body bytes above which a frame is read in steps under a receive budget (see the file
/// comment): 4 MiB, four of the default tensor chunks of 1 MiB.
inline constexpr std::size_t default_receive_step_bytes = std::size_t{4} << 20;

/// What frame_receiver::consume made of the bytes it was given.
struct receive_outcome {
  /// Bytes to read before calling consume again (8 for a prefix, n for a body, a step of a body
  /// read in steps); 0 when the stream cannot be resynchronised and the connection must be
  /// closed after `error` is sent.
  std::size_t next_read = wire::frame_prefix_bytes;
  /// A complete, validated frame; envelope::keepalive owns the buffer its tensor views, and
  /// envelope::connection is 0 (the caller knows the connection).
  std::optional<envelope> frame;
  /// Why the bytes were rejected; the peer is told with an error_reply{bad_frame}.
  std::optional<wire::decode_error> error;
  /// The next read (a body, or the next step of one) does not fit the receive budget: read
  /// nothing from the connection until frame_receiver::resume says so (next_read is 0 then, but
  /// not fatal).
  bool waits_for_budget = false;

  bool fatal() const noexcept { return next_read == 0 && !waits_for_budget; }
};

/// Cuts one connection's byte stream into frames (see the file comment for the phases).
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
  frame_receiver(const frame_receiver&) = delete;
  frame_receiver& operator=(const frame_receiver&) = delete;
  /// A reader still queued for the budget leaves the queue.
  ~frame_receiver();

  /// How many bytes the first read must deliver: a prefix.
  static constexpr std::size_t first_read = wire::frame_prefix_bytes;

  /// Takes the bytes of the read just completed, `buffer` being the scribe's read buffer
  /// (new_data_msg::buf): exactly the next_read bytes announced by the previous call (8 at
  /// first). May swap `buffer` for another vector, which the scribe then reads into next.
  /// Precondition: buffer.size() equals the announced read (else std::logic_error: a bug).
  receive_outcome consume(std::vector<char>& buffer);

  /// After an outcome that waits_for_budget: claims the budget again, in turn (the broker serves
  /// its waiting connections in order). Still no room: the same outcome. Room: the read is next
  /// (next_read is its size); when `buffer` is given (the vector the next read fills) a pooled
  /// buffer is swapped into it, else the caller's reader allocates it. Precondition: the last
  /// outcome waited for the budget.
  receive_outcome resume(std::vector<char>* buffer);

  /// From now on, every read of a body claims its bytes in `budget` first (null: no budget), and
  /// bodies above the receive step are read in steps.
  void set_budget(std::shared_ptr<receive_budget> budget) { budget_ = std::move(budget); }
  /// Bodies above `bytes` are read in steps of `bytes` under a budget (at least 8; the default
  /// is default_receive_step_bytes). Takes effect at the next frame.
  void set_receive_step(std::size_t bytes) noexcept {
    step_ = std::max(bytes, wire::frame_prefix_bytes);
  }

  /// Whether the next read waits for the receive budget, and whether for the commitment of a
  /// body read in steps (in the budget's queue of commitments, not that of reservations).
  bool waits_for_budget() const noexcept { return wait_ != budget_wait::none; }
  bool waits_for_commitment() const noexcept { return wait_ == budget_wait::commitment; }

  /// From now on, tensors may reference `arena` (the peer's, mapped here): decode checks the
  /// references against it, the decoded tensor views it, and envelope::keepalive is a hold on
  /// the region (released to the peer when the last copy goes). Null: no arena.
  void set_peer_arena(std::shared_ptr<shm_peer_arena> arena) { arena_ = std::move(arena); }

  /// Caps the frames read from now on (the prefix is checked against it): a connection reads at
  /// most max_handshake_frame_bytes until its peer is authenticated, then limits.max_frame_bytes.
  void set_max_frame_bytes(std::size_t bytes) noexcept { limits_.max_frame_bytes = bytes; }

  /// Bytes of the body being read (or waiting for its next step), or 0 between frames.
  std::size_t body_bytes() const noexcept { return in_body_ ? body_bytes_ : 0; }
  /// Bytes of the body read in steps that have arrived so far (0 for a body read whole).
  std::size_t body_bytes_arrived() const noexcept { return body_.size(); }
  /// Frames whose body was read to the end (whatever decoding made of them), for a caller that
  /// must tell one frame in progress from the next.
  std::uint64_t frames_read() const noexcept { return frames_read_; }

private:
  /// What the next read waits for in the budget: the commitment of a body read in steps, the
  /// reservation of a body (or of the first step), or that of a later step.
  enum class budget_wait { none, commitment, body, step };

  receive_outcome finish_body(std::vector<char>& buffer);
  /// A step of a body read in steps arrived in `buffer`: keep it, and claim the next step or
  /// decode the body.
  receive_outcome take_step(std::vector<char>& buffer);
  /// The prefix announced `length` body bytes and passed every check: claim the budget for the
  /// body (or its first step) and allocate it (swapped into `buffer` when given), or wait.
  receive_outcome start_body(std::size_t length, std::vector<char>* buffer, bool in_turn);
  /// Claims the next step of the body read in steps, or waits.
  receive_outcome next_step(bool in_turn);
  /// Reserves `c` in the budget: true with the ticket kept, false when the read must wait for
  /// `why`.
  bool reserve(const receive_budget::claim& c, budget_wait why);
  /// The budget's answer to a claim made for `why`: keeps track of this reader's place in the
  /// budget's queues. Returns whether it was granted.
  bool answered(bool granted, bool in_turn, budget_wait why);
  /// The decoded frame of `frame_bytes` (prefix included) whose body `owner` holds.
  receive_outcome deliver(std::shared_ptr<const std::vector<char>> owner,
                          std::uint64_t frame_bytes);

  /// The fatal error for a frame of `bytes` that the window does not admit.
  wire::decode_error beyond_window(std::uint64_t bytes) const;

  std::shared_ptr<receive_buffer_pool> pool_;
  wire::decode_limits limits_;
  std::shared_ptr<receive_credit> credit_;
  std::shared_ptr<shm_peer_arena> arena_;
  std::shared_ptr<receive_budget> budget_;
  std::size_t step_ = default_receive_step_bytes;
  /// The budget's tickets for the frame being read (none without a budget): a reservation per
  /// read, and the commitment of a body read in steps (dropped once the body is read).
  std::vector<std::shared_ptr<const void>> tickets_;
  std::uint64_t reserved_ = 0;
  std::shared_ptr<const void> commitment_;
  /// What the next read waits for, and the budget queue this reader is in (none, or the
  /// commitments' when wait_ is commitment, else the reservations').
  budget_wait wait_ = budget_wait::none;
  bool queued_ = false;
  /// The small vector the prefixes are read into, parked here while a body is read.
  std::vector<char> prefix_buffer_;
  std::size_t body_bytes_ = 0;
  bool in_body_ = false;
  /// The body is read in steps: `body_` holds what arrived, `step_read_` is the read configured.
  bool stepped_ = false;
  std::vector<char> body_;
  std::size_t step_read_ = 0;
  std::uint64_t frames_read_ = 0;
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
