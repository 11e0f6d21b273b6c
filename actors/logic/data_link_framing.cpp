#include "actors/logic/data_link_framing.hpp"

#include <algorithm>
#include <limits>
#include <new>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <utility>
#include <variant>

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

/// A reservation or a commitment: gives its bytes back when the last copy goes.
struct receive_budget::ticket {
  ticket(std::shared_ptr<receive_budget> owner, bool commits) noexcept
      : budget(std::move(owner)), commitment(commits) {}
  ticket(const ticket&) = delete;
  ticket& operator=(const ticket&) = delete;
  ~ticket() { budget->release(bytes, commitment); }

  std::shared_ptr<receive_budget> budget;
  std::uint64_t bytes = 0; ///< 0 until counted: a ticket made for a refused claim releases nothing
  bool commitment;
};

std::shared_ptr<const void> receive_budget::reserve(const claim& c) {
  std::function<void()> serve_queue;
  std::shared_ptr<const void> got;
  {
    std::lock_guard<std::mutex> guard{mutex_};
    // Only the claimant's own frame is held: it goes, whatever its size (nothing else will be
    // released to make room for it).
    const bool alone = in_use_ == c.held;
    const bool room = c.bytes <= limit_ && in_use_ <= limit_ - c.bytes;
    got = take(c.bytes, false, c.in_turn, alone, room, serve_queue);
  }
  wake_now(serve_queue);
  return got;
}

std::shared_ptr<const void> receive_budget::commit(std::uint64_t frame_bytes, bool in_turn) {
  std::function<void()> serve_queue;
  std::shared_ptr<const void> got;
  {
    std::lock_guard<std::mutex> guard{mutex_};
    const bool alone = committed_ == 0;
    const bool room = frame_bytes <= limit_ && committed_ <= limit_ - frame_bytes;
    got = take(frame_bytes, true, in_turn, alone, room, serve_queue);
  }
  wake_now(serve_queue);
  return got;
}

std::shared_ptr<const void> receive_budget::take(std::uint64_t bytes, bool commitment, bool in_turn,
                                                 bool alone, bool room,
                                                 std::function<void()>& serve_queue) {
  auto& queue = commitment ? commit_queued_ : queued_;
  if (!alone && !(room && (queue == 0 || in_turn))) {
    if (!in_turn) {
      ++waits_;
      ++queue;
    }
    waiting_ = true;
    // Refused only to keep the order: there is room, so those queued ahead may go now, and no
    // release may come to say so (what is held may be theirs, waiting). The broker is told at
    // once, unless it has been since it last looked.
    if (room && wake_) {
      serve_queue = wake_;
      waiting_ = false;
    }
    return nullptr;
  }
  // Made before counting, so that an allocation failure leaves nothing reserved.
  auto made = std::make_shared<ticket>(shared_from_this(), commitment);
  if (in_turn && queue != 0)
    --queue;
  auto& count = commitment ? committed_ : in_use_;
  count += bytes;
  if (!commitment)
    peak_ = std::max(peak_, in_use_);
  made->bytes = bytes;
  return made;
}

void receive_budget::wake_now(const std::function<void()>& serve_queue) noexcept {
  if (!serve_queue)
    return;
  try {
    serve_queue();
  } catch (...) {
    // Out of memory: the next release wakes the broker instead.
    std::lock_guard<std::mutex> guard{mutex_};
    waiting_ = true;
  }
}

void receive_budget::leave_queue(bool commitment) noexcept {
  std::lock_guard<std::mutex> guard{mutex_};
  auto& queue = commitment ? commit_queued_ : queued_;
  if (queue != 0)
    --queue;
}

void receive_budget::release(std::uint64_t bytes, bool commitment) noexcept {
  if (bytes == 0)
    return; // a refused claim's ticket: nothing was counted
  count_release_and_wake(mutex_, waiting_, wake_, [&] {
    (commitment ? committed_ : in_use_) -= bytes;
    return true;
  });
}

void receive_budget::on_room(std::function<void()> wake) {
  std::lock_guard<std::mutex> guard{mutex_};
  wake_ = std::move(wake);
}

receive_budget_stats receive_budget::stats() const {
  std::lock_guard<std::mutex> guard{mutex_};
  return {limit_, in_use_, peak_, waits_, committed_, queued_ + commit_queued_};
}

// ================================================================================================
// frame_receiver

namespace {

std::span<const std::byte> bytes_of(const std::vector<char>& buffer) noexcept {
  return {reinterpret_cast<const std::byte*>(buffer.data()), buffer.size()};
}

/// Owns a frame's keepalive and its budget tickets: the keepalive goes first (the buffer back to
/// its pool, the window's credit), then the tickets release the budget.
struct ticketed {
  std::vector<std::shared_ptr<const void>> tickets;
  std::shared_ptr<const void> inner;
  ~ticketed() { inner.reset(); }
};

/// `keepalive` (may be null) extended to hold `tickets` too, still pointing where it pointed (or
/// at the wrapper when it was null). Throws std::bad_alloc, leaving both arguments untouched.
std::shared_ptr<const void> with_tickets(std::shared_ptr<const void>&& keepalive,
                                         std::vector<std::shared_ptr<const void>>&& tickets) {
  auto both = std::make_shared<ticketed>();
  both->tickets = std::move(tickets);
  both->inner = std::move(keepalive);
  const void* target = both->inner ? both->inner.get() : both.get();
  return std::shared_ptr<const void>(std::move(both), target);
}

/// The outcome of a read that must wait for the budget.
receive_outcome waiting_outcome() {
  receive_outcome wait{0, std::nullopt, std::nullopt};
  wait.waits_for_budget = true;
  return wait;
}

/// The fatal outcome of a body or a step that no memory can be found for.
receive_outcome no_memory_for(std::size_t bytes) {
  return {0, std::nullopt,
          wire::decode_error{wire::decode_error::code::limit_exceeded,
                             "no memory for a frame body of " + std::to_string(bytes) + " bytes"}};
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

frame_receiver::~frame_receiver() {
  if (queued_)
    budget_->leave_queue(wait_ == budget_wait::commitment);
}

wire::decode_error frame_receiver::beyond_window(std::uint64_t bytes) const {
  const auto now = credit_->stats();
  return {wire::decode_error::code::limit_exceeded,
          "a frame of " + std::to_string(bytes) + " bytes arrived beyond the receive window of " +
              std::to_string(now.window) + " bytes (" + std::to_string(now.outstanding) +
              " bytes outstanding)"};
}

receive_outcome frame_receiver::consume(std::vector<char>& buffer) {
  if (in_body_)
    return stepped_ ? take_step(buffer) : finish_body(buffer);
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
  return start_body(static_cast<std::size_t>(*length), &buffer, false);
}

receive_outcome frame_receiver::resume(std::vector<char>* buffer) {
  switch (wait_) {
  case budget_wait::commitment:
  case budget_wait::body:
    return start_body(body_bytes_, buffer, true);
  case budget_wait::step:
    return next_step(true);
  case budget_wait::none:
    break;
  }
  throw std::logic_error("frame_receiver: resume without a read waiting for the budget");
}

bool frame_receiver::answered(bool granted, bool in_turn, budget_wait why) {
  // A claim in turn that is refused keeps its place; one granted leaves the queue, in the
  // budget's count as here. A new claim that is refused joins the queue.
  if (granted) {
    if (in_turn)
      queued_ = false;
    wait_ = budget_wait::none;
    return true;
  }
  if (!in_turn)
    queued_ = true;
  wait_ = why;
  return false;
}

bool frame_receiver::reserve(const receive_budget::claim& c, budget_wait why) {
  auto ticket = budget_->reserve(c);
  if (!answered(ticket != nullptr, c.in_turn, why))
    return false;
  tickets_.push_back(std::move(ticket));
  reserved_ += c.bytes;
  return true;
}

receive_outcome frame_receiver::start_body(std::size_t length, std::vector<char>* buffer,
                                           bool in_turn) {
  const bool stepped = budget_ && length > step_;
  const std::uint64_t frame_bytes = wire::frame_prefix_bytes + length;
  body_bytes_ = length;
  if (budget_) {
    try {
      // A body up to the step is reserved whole; a larger one first commits its whole size
      // (in the queue of commitments), then reserves its prefix and first step like any read
      // (in the queue of reservations, where it joins the end).
      if (stepped && !commitment_) {
        auto ticket = budget_->commit(frame_bytes, in_turn);
        if (!answered(ticket != nullptr, in_turn, budget_wait::commitment))
          return waiting_outcome();
        commitment_ = std::move(ticket);
        in_turn = false;
      }
      receive_budget::claim c;
      c.bytes = stepped ? wire::frame_prefix_bytes + step_ : frame_bytes;
      c.in_turn = in_turn;
      if (!reserve(c, budget_wait::body))
        return waiting_outcome();
    } catch (const std::bad_alloc&) {
      return no_memory_for(length);
    }
  }
  auto give_up = [this, length] {
    tickets_.clear();
    reserved_ = 0;
    commitment_.reset();
    body_ = {};
    return no_memory_for(length);
  };
  std::vector<char> read_into;
  try {
    if (stepped)
      body_.reserve(length); // address space only: pages are committed as the steps arrive
    if (buffer != nullptr)
      read_into = pool_->take(stepped ? step_ : length);
  } catch (const std::bad_alloc&) {
    return give_up();
  }
  if (buffer != nullptr) {
    // The scribe reads the body (or its steps) straight into the pooled vector; the prefix
    // vector waits here.
    prefix_buffer_ = std::move(*buffer);
    *buffer = std::move(read_into);
  }
  in_body_ = true;
  stepped_ = stepped;
  step_read_ = stepped ? step_ : length;
  return {step_read_, std::nullopt, std::nullopt};
}

receive_outcome frame_receiver::next_step(bool in_turn) {
  receive_budget::claim c;
  c.bytes = std::min(step_, body_bytes_ - body_.size());
  c.held = reserved_;
  c.in_turn = in_turn;
  try {
    if (!reserve(c, budget_wait::step))
      return waiting_outcome();
  } catch (const std::bad_alloc&) {
    return no_memory_for(body_bytes_);
  }
  step_read_ = static_cast<std::size_t>(c.bytes);
  return {step_read_, std::nullopt, std::nullopt};
}

receive_outcome frame_receiver::take_step(std::vector<char>& buffer) {
  if (buffer.size() != step_read_)
    throw std::logic_error("frame_receiver: a step read delivered " +
                           std::to_string(buffer.size()) + " bytes, not the announced " +
                           std::to_string(step_read_));
  // Within the capacity reserved at the prefix: no reallocation, no value-initialisation.
  body_.insert(body_.end(), buffer.begin(), buffer.end());
  if (body_.size() < body_bytes_)
    return next_step(false);
  const std::uint64_t frame_bytes = wire::frame_prefix_bytes + body_bytes_;
  in_body_ = false;
  stepped_ = false;
  body_bytes_ = 0;
  ++frames_read_;
  // Every byte is reserved now: the commitment has done its work.
  commitment_.reset();
  // The step buffer goes back to the pool, the prefix vector back to the scribe.
  pool_->keep(std::move(buffer));
  buffer = std::move(prefix_buffer_);
  // The body is not pooled: it was grown for one frame, and a cache of such sizes would keep
  // memory nobody asked for.
  auto owner = std::make_shared<const std::vector<char>>(std::move(body_));
  body_ = {};
  return deliver(std::move(owner), frame_bytes);
}

receive_outcome frame_receiver::finish_body(std::vector<char>& buffer) {
  if (buffer.size() != body_bytes_)
    throw std::logic_error("frame_receiver: a body read delivered " +
                           std::to_string(buffer.size()) + " bytes, not the announced " +
                           std::to_string(body_bytes_));
  const std::uint64_t frame_bytes = wire::frame_prefix_bytes + body_bytes_;
  in_body_ = false;
  body_bytes_ = 0;
  ++frames_read_;
  std::vector<char> body = std::move(buffer);
  buffer = std::move(prefix_buffer_);
  return deliver(pool_->keep(std::move(body)), frame_bytes);
}

namespace {

/// What a message with bytes both in the peer's arena and in its frame keeps (a batch with
/// tensors there, a row-sparse push): the region's hold and the frame.
struct region_and_frame {
  std::shared_ptr<const void> region;
  std::shared_ptr<const void> frame;
  region_and_frame(std::shared_ptr<const void> region_hold, std::shared_ptr<const void> frame_hold)
      : region(std::move(region_hold)), frame(std::move(frame_hold)) {}
};

/// The arena offset of the first tensor of `fused` that lies in the arena, if any.
std::optional<std::uint64_t> first_arena_offset(const wire::batch& fused) {
  for (const auto& one : fused.messages)
    if (const auto* t = wire::tensor_of(one); t != nullptr && t->shm)
      return t->shm->offset;
  return std::nullopt;
}

} // namespace

receive_outcome frame_receiver::deliver(std::shared_ptr<const std::vector<char>> owner,
                                        std::uint64_t frame_bytes) {
  // The frame's reservations: released when this returns, unless the envelope takes them along.
  auto tickets = std::move(tickets_);
  tickets_.clear();
  reserved_ = 0;
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
  const auto* fused = std::get_if<wire::batch>(&env.msg);
  const auto batch_region = fused != nullptr ? first_arena_offset(*fused) : std::nullopt;
  // A row-sparse request's row ids stay in the frame whatever its tensor does.
  const auto* pull = std::get_if<wire::pull_request>(&env.msg);
  const auto* tensor = wire::tensor_of(env.msg);
  const bool ids_in_frame = (pull != nullptr && !pull->row_ids.empty()) ||
                            (tensor != nullptr && !tensor->row_ids.empty());
  auto frame_hold = [&]() -> std::shared_ptr<const void> {
    if (decoded->copied())
      return std::make_shared<wire::decoded_message>(std::move(*decoded));
    return std::move(owner);
  };
  if (tensor != nullptr && tensor->shm) {
    // The bytes are in the peer's arena (decode checked the bounds); the frame buffer goes back
    // to the pool right here (unless row ids view it), and the region goes back to the peer
    // with the last envelope copy.
    env.keepalive = arena_->hold(tensor->shm->offset);
    if (ids_in_frame)
      env.keepalive = std::make_shared<region_and_frame>(std::move(env.keepalive), frame_hold());
  } else if (batch_region) {
    // A batch's tensors in the arena share one region, which starts at the first of them
    // (data_link.cpp, batch_into_arena): one hold for all, and the frame for any inline one.
    env.keepalive = std::make_shared<region_and_frame>(arena_->hold(*batch_region), frame_hold());
  } else if (tensor != nullptr || fused != nullptr || ids_in_frame) {
    // (A batch's tensors view it too, and row ids.) operator new aligns vectors to 16 bytes, so
    // decode reads in place and the tensor views the frame buffer; were it ever copied, the
    // aligned copy lives in the decoded_message instead.
    env.keepalive = frame_hold();
  }
  // Without a tensor, a batch or row ids nothing views the buffer: `owner` returns it to the pool
  // right here. Link control is handled by the broker at once and needs no credit.
  auto no_memory_to_hold = [frame_bytes] {
    return receive_outcome{wire::frame_prefix_bytes, std::nullopt,
                           wire::decode_error{wire::decode_error::code::limit_exceeded,
                                              "no memory to hold a frame of " +
                                                  std::to_string(frame_bytes) + " bytes"}};
  };
  if (credit_ && !control) {
    try {
      env.keepalive = credit_->hold(frame_bytes, std::move(env.keepalive));
    } catch (const std::bad_alloc&) {
      credit_->received_and_released(frame_bytes);
      return no_memory_to_hold();
    }
  }
  if (!tickets.empty()) {
    try {
      env.keepalive = with_tickets(std::move(env.keepalive), std::move(tickets));
    } catch (const std::bad_alloc&) {
      // env.keepalive is intact (the wrapper is made before anything moves): drop the frame.
      return no_memory_to_hold();
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
