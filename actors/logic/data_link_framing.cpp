#include "actors/logic/data_link_framing.hpp"

#include <algorithm>
#include <limits>
#include <new>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>

namespace troupe {

// ================================================================================================
// receive_buffer_pool

struct receive_buffer_pool::core {
  explicit core(std::size_t cap) : max_cached_bytes(cap) {}

  struct cached {
    std::vector<char> buffer;
    std::uint64_t returned_at; ///< value of `clock` when it came back: the oldest goes first
  };

  /// Keeps `buffer` unless the cap says no; frees what falls out after unlocking, so that a
  /// thread releasing an envelope does not hold the lock while memory is unmapped.
  void give_back(std::vector<char>&& buffer) noexcept {
    std::vector<std::vector<char>> freed;
    try {
      std::lock_guard<std::mutex> guard{mutex};
      if (buffer.capacity() > max_cached_bytes) {
        ++stats.evictions;
        freed.push_back(std::move(buffer));
      } else {
        stats.cached_bytes += buffer.capacity();
        buffers.push_back({std::move(buffer), ++clock});
        while (stats.cached_bytes > max_cached_bytes) {
          auto oldest = std::min_element(
              buffers.begin(), buffers.end(),
              [](const cached& a, const cached& b) { return a.returned_at < b.returned_at; });
          stats.cached_bytes -= oldest->buffer.capacity();
          ++stats.evictions;
          freed.push_back(std::move(oldest->buffer));
          *oldest = std::move(buffers.back());
          buffers.pop_back();
        }
      }
      stats.cached_buffers = buffers.size();
    } catch (const std::bad_alloc&) {
      // Bookkeeping ran out of memory: the buffer is simply freed (it is `buffer` or in `freed`).
    }
  }

  std::mutex mutex;
  std::vector<cached> buffers;
  std::uint64_t clock = 0;
  std::size_t max_cached_bytes;
  receive_buffer_pool_stats stats;
};

receive_buffer_pool::receive_buffer_pool(std::size_t max_cached_bytes)
    : core_(std::make_shared<core>(max_cached_bytes)) {}

receive_buffer_pool::~receive_buffer_pool() = default;

std::vector<char> receive_buffer_pool::take(std::size_t bytes) {
  // A cached buffer serves requests down to half its size: more slack would let a few small
  // frames shrink every big buffer (the scribe resizes it to the frame) until none fits again.
  const std::size_t slack = std::max<std::size_t>(bytes, std::size_t{64} << 10);
  const std::size_t limit = bytes > std::numeric_limits<std::size_t>::max() - slack
                                ? std::numeric_limits<std::size_t>::max()
                                : bytes + slack;
  std::vector<char> buffer;
  {
    std::lock_guard<std::mutex> guard{core_->mutex};
    auto& buffers = core_->buffers;
    // Best: already long enough, so the scribe only shrinks it and nothing is written twice.
    auto best = buffers.end();
    for (auto i = buffers.begin(); i != buffers.end(); ++i)
      if (i->buffer.size() >= bytes && i->buffer.size() <= limit &&
          (best == buffers.end() || i->buffer.size() < best->buffer.size()))
        best = i;
    // Next: enough capacity; growing it value-initialises the difference, in warm memory.
    if (best == buffers.end())
      for (auto i = buffers.begin(); i != buffers.end(); ++i)
        if (i->buffer.capacity() >= bytes && i->buffer.capacity() <= limit &&
            (best == buffers.end() || i->buffer.capacity() < best->buffer.capacity()))
          best = i;
    if (best != buffers.end()) {
      ++core_->stats.hits;
      core_->stats.cached_bytes -= best->buffer.capacity();
      buffer = std::move(best->buffer);
      *best = std::move(buffers.back());
      buffers.pop_back();
      core_->stats.cached_buffers = buffers.size();
    } else {
      ++core_->stats.misses;
    }
  }
  if (buffer.size() < bytes)
    buffer.resize(bytes); // a new buffer: value-initialising it pre-faults every page
  return buffer;
}

std::shared_ptr<const std::vector<char>> receive_buffer_pool::keep(std::vector<char> buffer) {
  auto* owned = new std::vector<char>(std::move(buffer));
  // If the control block cannot be allocated, shared_ptr runs the deleter: nothing leaks.
  return std::shared_ptr<const std::vector<char>>(owned, [c = core_](const std::vector<char>* p) {
    auto* mine = const_cast<std::vector<char>*>(p);
    c->give_back(std::move(*mine));
    delete mine;
  });
}

receive_buffer_pool_stats receive_buffer_pool::stats() const {
  std::lock_guard<std::mutex> guard{core_->mutex};
  return core_->stats;
}

// ================================================================================================
// receive_credit

namespace {

/// What receive_credit and receive_budget do on every release, which may come from any thread:
/// `count` updates their counts under `mutex` and says whether the broker is due a wake; when it
/// is and `armed` (nobody woke the broker since it last looked), `wake` is called outside the
/// lock, so that a wake that takes locks of its own never waits on a releasing thread. A wake
/// that cannot be delivered (out of memory) leaves `armed` set: the next release tries again,
/// or the broker would never hear of it.
template <class Count>
void count_release_and_wake(std::mutex& mutex, bool& armed, const std::function<void()>& wake,
                            Count&& count) noexcept {
  std::function<void()> to_call;
  {
    std::lock_guard<std::mutex> guard{mutex};
    if (count() && armed && wake) {
      try {
        to_call = wake;
        armed = false;
      } catch (...) {
        // Out of memory: the next release tries again (the bytes are counted either way).
      }
    }
  }
  if (!to_call)
    return;
  try {
    to_call();
  } catch (...) {
    std::lock_guard<std::mutex> guard{mutex};
    armed = true;
  }
}

} // namespace

/// The keepalive of a forwarded envelope: owns what the tensor views and gives the frame's bytes
/// back when the last copy goes.
struct receive_credit::hold_state {
  hold_state(std::shared_ptr<receive_credit> owner, std::uint64_t n,
             std::shared_ptr<const void> held) noexcept
      : credit(std::move(owner)), bytes(n), inner(std::move(held)) {}
  hold_state(const hold_state&) = delete;
  hold_state& operator=(const hold_state&) = delete;
  ~hold_state() {
    // The buffer goes back to its pool first, so that a credit never outruns its memory.
    inner.reset();
    credit->release(bytes);
  }

  std::shared_ptr<receive_credit> credit;
  std::uint64_t bytes;
  std::shared_ptr<const void> inner;
};

bool receive_credit::admits(std::uint64_t bytes) const {
  if (window_ == 0)
    return true;
  std::lock_guard<std::mutex> guard{mutex_};
  return credit_admits(window_, outstanding_, bytes);
}

std::shared_ptr<const void> receive_credit::hold(std::uint64_t bytes,
                                                 std::shared_ptr<const void> inner) {
  if (window_ == 0)
    return inner;
  auto state = std::make_shared<hold_state>(shared_from_this(), bytes, std::move(inner));
  {
    std::lock_guard<std::mutex> guard{mutex_};
    outstanding_ += bytes;
  }
  // Aliasing: the envelope's keepalive still points at what the tensor views (the frame buffer,
  // an arena hold), or at the hold itself for a frame without a tensor; ownership is the hold's.
  const void* target = state->inner ? state->inner.get() : state.get();
  return std::shared_ptr<const void>(std::move(state), target);
}

void receive_credit::received_and_released(std::uint64_t bytes) {
  if (window_ == 0)
    return;
  std::lock_guard<std::mutex> guard{mutex_};
  outstanding_ += bytes;
  uncredited_ += bytes;
}

void receive_credit::release(std::uint64_t bytes) noexcept {
  count_release_and_wake(mutex_, wake_armed_, wake_, [&] {
    uncredited_ += bytes;
    return uncredited_ >= credit_quantum(window_);
  });
}

std::uint64_t receive_credit::take() {
  if (window_ == 0)
    return 0;
  std::lock_guard<std::mutex> guard{mutex_};
  wake_armed_ = true;
  if (uncredited_ < credit_quantum(window_))
    return 0;
  const std::uint64_t bytes = uncredited_;
  outstanding_ -= bytes;
  credited_ += bytes;
  uncredited_ = 0;
  return bytes;
}

void receive_credit::on_release(std::function<void()> wake) {
  std::lock_guard<std::mutex> guard{mutex_};
  wake_ = std::move(wake);
}

receive_credit_stats receive_credit::stats() const {
  std::lock_guard<std::mutex> guard{mutex_};
  return {window_, outstanding_, outstanding_ - uncredited_, uncredited_, credited_};
}

// ================================================================================================
// receive_budget

/// A reservation: gives its bytes back when the last copy goes.
struct receive_budget::ticket {
  ticket(std::shared_ptr<receive_budget> owner, std::uint64_t n) noexcept
      : budget(std::move(owner)), bytes(n) {}
  ticket(const ticket&) = delete;
  ticket& operator=(const ticket&) = delete;
  ~ticket() { budget->release(bytes); }

  std::shared_ptr<receive_budget> budget;
  std::uint64_t bytes;
};

std::shared_ptr<const void> receive_budget::reserve(std::uint64_t bytes) {
  // Made before counting, so that an allocation failure leaves nothing reserved.
  auto made = std::make_shared<ticket>(shared_from_this(), 0);
  std::lock_guard<std::mutex> guard{mutex_};
  if (in_use_ != 0 && (bytes > limit_ || in_use_ > limit_ - bytes)) {
    waiting_ = true;
    ++waits_;
    return nullptr;
  }
  in_use_ += bytes;
  peak_ = std::max(peak_, in_use_);
  made->bytes = bytes;
  return made;
}

void receive_budget::release(std::uint64_t bytes) noexcept {
  if (bytes == 0)
    return; // a refused reservation's ticket: nothing was counted
  count_release_and_wake(mutex_, waiting_, wake_, [&] {
    in_use_ -= bytes;
    return true;
  });
}

void receive_budget::on_room(std::function<void()> wake) {
  std::lock_guard<std::mutex> guard{mutex_};
  wake_ = std::move(wake);
}

receive_budget_stats receive_budget::stats() const {
  std::lock_guard<std::mutex> guard{mutex_};
  return {limit_, in_use_, peak_, waits_};
}

// ================================================================================================
// frame_receiver

namespace {

std::span<const std::byte> bytes_of(const std::vector<char>& buffer) noexcept {
  return {reinterpret_cast<const std::byte*>(buffer.data()), buffer.size()};
}

/// Owns a frame's keepalive and its budget ticket: the keepalive goes first (the buffer back to
/// its pool, the window's credit), then the ticket releases the budget.
struct ticketed {
  std::shared_ptr<const void> ticket;
  std::shared_ptr<const void> inner;
  ~ticketed() { inner.reset(); }
};

/// `keepalive` (may be null) extended to hold `ticket` too, still pointing where it pointed (or
/// at the wrapper when it was null). Throws std::bad_alloc, leaving both arguments untouched.
std::shared_ptr<const void> with_ticket(std::shared_ptr<const void>&& keepalive,
                                        std::shared_ptr<const void>&& ticket) {
  auto both = std::make_shared<ticketed>();
  both->ticket = std::move(ticket);
  both->inner = std::move(keepalive);
  const void* target = both->inner ? both->inner.get() : both.get();
  return std::shared_ptr<const void>(std::move(both), target);
}

/// Decode failures after which the byte stream cannot be trusted to be at a frame boundary: the
/// prefix announced a length that the segment table contradicts, so the prefix lied.
bool loses_framing(wire::decode_error::code kind) noexcept {
  using c = wire::decode_error::code;
  return kind == c::frame_too_large || kind == c::truncated || kind == c::malformed_frame;
}

} // namespace

frame_receiver::frame_receiver(std::shared_ptr<receive_buffer_pool> pool,
                               wire::decode_limits limits, std::shared_ptr<receive_credit> credit)
    : pool_(std::move(pool)), limits_(limits), credit_(std::move(credit)) {}

wire::decode_error frame_receiver::beyond_window(std::uint64_t bytes) const {
  const auto now = credit_->stats();
  return {wire::decode_error::code::limit_exceeded,
          "a frame of " + std::to_string(bytes) + " bytes arrived beyond the receive window of " +
              std::to_string(now.window) + " bytes (" + std::to_string(now.outstanding) +
              " bytes outstanding)"};
}

receive_outcome frame_receiver::consume(std::vector<char>& buffer) {
  if (in_body_)
    return finish_body(buffer);
  if (buffer.size() != wire::frame_prefix_bytes)
    throw std::logic_error("frame_receiver: a prefix read delivered " +
                           std::to_string(buffer.size()) + " bytes, not 8");
  auto length = wire::read_frame_prefix(bytes_of(buffer), limits_);
  if (!length)
    return {0, std::nullopt, length.error()};
  const std::uint64_t frame_bytes = wire::frame_prefix_bytes + *length;
  beyond_window_ = credit_ && !credit_->admits(frame_bytes);
  // Only a frame small enough to be link control (which needs no credit) is read beyond the
  // window; anything bigger is refused before its body is allocated.
  if (beyond_window_ && frame_bytes > max_link_control_frame_bytes)
    return {0, std::nullopt, beyond_window(frame_bytes)};
  return start_body(static_cast<std::size_t>(*length), &buffer);
}

receive_outcome frame_receiver::resume(std::vector<char>* buffer) {
  if (!waiting_)
    throw std::logic_error("frame_receiver: resume without a frame waiting for the budget");
  return start_body(*waiting_, buffer);
}

receive_outcome frame_receiver::start_body(std::size_t length, std::vector<char>* buffer) {
  auto no_memory = [length] {
    return receive_outcome{
        0, std::nullopt,
        wire::decode_error{wire::decode_error::code::limit_exceeded,
                           "no memory for a frame body of " + std::to_string(length) + " bytes"}};
  };
  if (budget_) {
    try {
      ticket_ = budget_->reserve(wire::frame_prefix_bytes + length);
    } catch (const std::bad_alloc&) {
      return no_memory();
    }
    if (!ticket_) {
      waiting_ = length;
      receive_outcome wait{0, std::nullopt, std::nullopt};
      wait.waits_for_budget = true;
      return wait;
    }
  }
  waiting_.reset();
  if (buffer != nullptr) {
    std::vector<char> body;
    try {
      body = pool_->take(length);
    } catch (const std::bad_alloc&) {
      ticket_.reset();
      return no_memory();
    }
    // The scribe reads the body straight into the pooled vector; the prefix vector waits here.
    prefix_buffer_ = std::move(*buffer);
    *buffer = std::move(body);
  }
  body_bytes_ = length;
  in_body_ = true;
  return {body_bytes_, std::nullopt, std::nullopt};
}

receive_outcome frame_receiver::finish_body(std::vector<char>& buffer) {
  if (buffer.size() != body_bytes_)
    throw std::logic_error("frame_receiver: a body read delivered " +
                           std::to_string(buffer.size()) + " bytes, not the announced " +
                           std::to_string(body_bytes_));
  const std::uint64_t frame_bytes = wire::frame_prefix_bytes + body_bytes_;
  in_body_ = false;
  body_bytes_ = 0;
  // The frame's reservation: released when this returns, unless the envelope takes it along.
  auto ticket = std::move(ticket_);
  std::vector<char> body = std::move(buffer);
  buffer = std::move(prefix_buffer_);
  auto owner = pool_->keep(std::move(body));
  auto decoded = wire::decode_body(bytes_of(*owner), limits_,
                                   arena_ ? arena_->bytes() : std::span<const std::byte>{});
  const bool control = decoded && wire::is_link_control(decoded->msg);
  if (beyond_window_ && !control)
    return {0, std::nullopt, beyond_window(frame_bytes)};
  if (!decoded) {
    const bool fatal = loses_framing(decoded.error().kind);
    // The sender counted it: it is released at once, and credited like any other.
    if (credit_ && !fatal)
      credit_->received_and_released(frame_bytes);
    return {fatal ? 0 : wire::frame_prefix_bytes, std::nullopt, decoded.error()};
  }
  envelope env;
  env.msg = std::move(decoded->msg);
  if (const auto* tensor = wire::tensor_of(env.msg); tensor != nullptr && tensor->shm) {
    // The bytes are in the peer's arena (decode checked the bounds); the frame buffer goes back
    // to the pool right here, and the region goes back to the peer with the last envelope copy.
    env.keepalive = arena_->hold(tensor->shm->offset);
  } else if (tensor != nullptr) {
    // operator new aligns vectors to 16 bytes, so decode reads in place and the tensor views the
    // pooled buffer; were it ever copied, the aligned copy lives in the decoded_message instead.
    if (decoded->copied())
      env.keepalive = std::make_shared<wire::decoded_message>(std::move(*decoded));
    else
      env.keepalive = std::move(owner);
  }
  // Without a tensor nothing views the buffer: `owner` returns it to the pool right here. Link
  // control is handled by the broker at once and needs no credit.
  if (credit_ && !control) {
    try {
      env.keepalive = credit_->hold(frame_bytes, std::move(env.keepalive));
    } catch (const std::bad_alloc&) {
      credit_->received_and_released(frame_bytes);
      return {wire::frame_prefix_bytes, std::nullopt,
              wire::decode_error{wire::decode_error::code::limit_exceeded,
                                 "no memory to hold a frame of " + std::to_string(frame_bytes) +
                                     " bytes"}};
    }
  }
  if (ticket) {
    try {
      env.keepalive = with_ticket(std::move(env.keepalive), std::move(ticket));
    } catch (const std::bad_alloc&) {
      // env.keepalive is intact (the wrapper is made before anything moves): drop the frame.
      return {wire::frame_prefix_bytes, std::nullopt,
              wire::decode_error{wire::decode_error::code::limit_exceeded,
                                 "no memory to hold a frame of " + std::to_string(frame_bytes) +
                                     " bytes"}};
    }
  }
  return {wire::frame_prefix_bytes, std::move(env), std::nullopt};
}

// ================================================================================================
// frame_send_queue

void frame_send_queue::push(wire::encoded_frame frame, std::shared_ptr<const void> keepalive) {
  queued_bytes_ += frame.size();
  waiting_bytes_ += frame.size();
  waiting_.push_back(entry{std::move(frame), std::move(keepalive)});
  admit();
}

void frame_send_queue::push_unmetered(wire::encoded_frame frame) {
  queued_bytes_ += frame.size();
  admitted_.push_back(entry{std::move(frame), nullptr});
}

void frame_send_queue::open(std::uint64_t peer_window) {
  open_ = true;
  peer_window_ = peer_window;
  admit();
}

std::optional<std::string> frame_send_queue::credit(std::uint64_t bytes) {
  if (bytes == 0 || bytes > outstanding_)
    return "a link credit of " + std::to_string(bytes) + " bytes, with " +
           std::to_string(outstanding_) + " bytes outstanding (window " +
           std::to_string(peer_window_) + " bytes)";
  outstanding_ -= bytes;
  credited_ += bytes;
  admit();
  return std::nullopt;
}

void frame_send_queue::drop_waiting() {
  queued_bytes_ -= waiting_bytes_;
  waiting_bytes_ = 0;
  waiting_.clear();
}

void frame_send_queue::admit() {
  if (!open_)
    return;
  while (!waiting_.empty()) {
    const std::uint64_t bytes = waiting_.front().frame.size();
    if (peer_window_ != 0) {
      if (!credit_admits(peer_window_, outstanding_, bytes))
        return;
      outstanding_ += bytes;
    }
    waiting_bytes_ -= bytes;
    admitted_.push_back(std::move(waiting_.front()));
    waiting_.pop_front();
  }
}

std::size_t frame_send_queue::append_to(std::vector<char>& out, std::size_t max_bytes) {
  return write_to(
      [&out](std::span<const char> bytes) { out.insert(out.end(), bytes.begin(), bytes.end()); },
      max_bytes);
}

std::size_t frame_send_queue::write_to(const std::function<void(std::span<const char>)>& write,
                                       std::size_t max_bytes) {
  std::size_t appended = 0;
  while (!admitted_.empty() && appended < max_bytes) {
    auto& e = admitted_.front();
    const auto pieces = e.frame.pieces();
    while (e.piece < pieces.size() && appended < max_bytes) {
      const auto piece = pieces[e.piece];
      const std::size_t n = std::min(piece.size() - e.offset, max_bytes - appended);
      write({reinterpret_cast<const char*>(piece.data()) + e.offset, n});
      e.offset += n;
      appended += n;
      if (e.offset == piece.size()) {
        ++e.piece;
        e.offset = 0;
      }
    }
    if (e.piece < pieces.size())
      break;
    // Every byte is written now: the frame and the tensor it referenced may go.
    admitted_.pop_front();
  }
  queued_bytes_ -= appended;
  return appended;
}

} // namespace troupe
