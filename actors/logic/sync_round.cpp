#include "actors/logic/sync_round.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <utility>

#include "actors/logic/wire_conversions.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/half.hpp"

namespace troupe {
namespace {

template <class T>
void add_elements(std::byte* dst, const std::byte* src, std::size_t bytes) {
  kernels::cpu::add(reinterpret_cast<const T*>(dst), reinterpret_cast<const T*>(src),
                    reinterpret_cast<T*>(dst), bytes / sizeof(T));
}

} // namespace

void accumulate(std::byte* dst, const std::byte* src, std::size_t bytes, wire::dtype type) {
  switch (type) {
  case wire::dtype::float32:
    return add_elements<float>(dst, src, bytes);
  case wire::dtype::float64:
    return add_elements<double>(dst, src, bytes);
  case wire::dtype::int32:
    return add_elements<std::int32_t>(dst, src, bytes);
  case wire::dtype::int64:
    return add_elements<std::int64_t>(dst, src, bytes);
  case wire::dtype::float16: {
    using half = kernels::cpu::half_bits;
    const half* inputs[2] = {reinterpret_cast<const half*>(dst),
                             reinterpret_cast<const half*>(src)};
    kernels::cpu::sum_n_half(inputs, 2, reinterpret_cast<half*>(dst), bytes / sizeof(half));
    return;
  }
  }
}

namespace {

value_layout in_float32(value_layout layout) {
  layout.bytes = layout.bytes / size_of(layout.type) * sizeof(float);
  layout.type = dtype::float32;
  return layout;
}

} // namespace

void round_membership::admit(std::uint32_t worker, std::uint64_t first) {
  if (!first_of(worker))
    joined_.push_back({worker, first});
}

std::optional<std::uint64_t> round_membership::first_of(std::uint32_t worker) const noexcept {
  if (worker < num_workers_)
    return 0;
  for (const auto& came : joined_)
    if (came.worker == worker)
      return came.first;
  return std::nullopt;
}

void round_membership::retire(std::uint32_t worker, std::uint64_t end) {
  if (!end_of(worker))
    left_.push_back({worker, end});
}

std::optional<std::uint64_t> round_membership::end_of(std::uint32_t worker) const noexcept {
  for (const auto& gone : left_)
    if (gone.worker == worker)
      return gone.end;
  return std::nullopt;
}

bool round_membership::counts(std::uint32_t worker, std::uint64_t round) const noexcept {
  auto first = first_of(worker);
  auto end = end_of(worker);
  return first && *first <= round && (!end || round < *end);
}

std::string round_membership::why_not(std::uint32_t worker, std::uint64_t round) const {
  if (auto end = end_of(worker); end && round >= *end)
    return left_the_job(worker, *end);
  if (auto first = first_of(worker))
    return "worker " + std::to_string(worker) + " joined the job at round " +
           std::to_string(*first) + " of the key: round " + std::to_string(round) + " is before it";
  return "worker " + std::to_string(worker) +
         " is not a member of the job (it has not joined, or this server has not heard so yet)";
}

std::uint32_t round_membership::members(std::uint64_t round) const noexcept {
  std::uint32_t in = num_workers_;
  for (const auto& gone : left_)
    if (gone.worker < num_workers_ && gone.end <= round)
      --in;
  for (const auto& came : joined_)
    if (counts(came.worker, round))
      ++in;
  return in;
}

std::uint32_t round_membership::quorum(std::uint64_t round) const noexcept {
  auto in = members(round);
  if (in == 0)
    return 0;
  const auto tolerated = num_workers_ - quorum_;
  return in > tolerated ? in - tolerated : 1;
}

std::string left_the_job(std::uint32_t worker, std::uint64_t end) {
  return "worker " + std::to_string(worker) +
         " left the job: the key's rounds close without it from round " + std::to_string(end) +
         " on";
}

sync_round::sync_round(const ndarray& like, sync_round_options options)
    : options_(options), membership_(options.num_workers, options.quorum),
      round_quorum_(options.quorum), layout_(like), wide_layout_(in_float32(layout_)),
      wire_type_(to_wire(like.dtype())),
      workers_(std::max(options.num_workers, options.max_workers)) {}

std::uint64_t sync_round::admit(std::uint32_t sender) {
  if (auto first = membership_.first_of(sender))
    return *first;
  const auto first =
      std::accumulate(deferred_.begin(), deferred_.end(), completed_ + (collecting() ? 1 : 0),
                      [](std::uint64_t after, const deferred_push& push) {
                        return std::max(after, push.round + 1);
                      });
  membership_.admit(sender, first);
  round_quorum_ = membership_.quorum(completed_);
  return first;
}

std::uint64_t sync_round::retire(std::uint32_t sender) {
  if (auto end = membership_.end_of(sender))
    return *end;
  const auto& worker = workers_[sender];
  // Its push of the round being collected, begun or whole, keeps it in that round.
  const auto end =
      after_last_push(completed_ + (worker.done || worker.bytes > 0 ? 1 : 0), deferred_, sender);
  membership_.retire(sender, end);
  round_quorum_ = membership_.quorum(completed_);
  return end;
}

bool sync_round::collecting() const noexcept {
  return done_ > 0 || std::any_of(workers_.begin(), workers_.end(),
                                  [](const worker_state& worker) { return worker.bytes > 0; });
}

chunk_outcome sync_round::add(const push_chunk& chunk) {
  if (chunk.round > completed_)
    return refuse(wire::error_code::internal, chunk, "a later round's chunk reached add()");
  return chunk.round == completed_ ? add_current(chunk) : add_late(chunk);
}

chunk_outcome sync_round::add_current(const push_chunk& chunk) {
  if (!membership_.counts(chunk.sender, chunk.round))
    return refuse(wire::error_code::invalid_argument, chunk,
                  membership_.why_not(chunk.sender, chunk.round));
  auto& worker = workers_[chunk.sender];
  if (worker.done)
    return refuse(wire::error_code::invalid_argument, chunk, "the worker pushed this round twice");
  if (auto checked = check(chunk, worker.bytes); checked.refused())
    return checked;
  if ((widen_ || widened()) && (chunk.offset % 2 != 0 || chunk.data.size() % 2 != 0))
    return refuse(wire::error_code::invalid_argument, chunk,
                  "a chunk of a float16 tensor must hold whole elements");
  bool whole = chunk.offset == 0 && chunk.data.size() == layout_.bytes;
  if (streaming()) {
    stream(chunk.offset, chunk.data);
  } else if (whole) {
    contribute(chunk.data);
  } else {
    stage_chunk(worker.staging, chunk, layout_);
  }
  worker.bytes += chunk.data.size();
  if (worker.bytes < layout_.bytes)
    return {chunk_fate::taken};
  if (!streaming() && !whole)
    contribute_staged(worker);
  finish_push(worker);
  return {chunk_fate::completed};
}

chunk_outcome sync_round::add_late(const push_chunk& chunk) {
  if (streaming())
    return refuse(wire::error_code::stale_round, chunk,
                  std::to_string(completed_) + " rounds are complete");
  auto& worker = workers_[chunk.sender];
  bool continues = worker.draining && worker.late_round == chunk.round;
  if (auto checked = check(chunk, continues ? worker.late_bytes : 0); checked.refused())
    return checked;
  worker.draining = true;
  worker.late_round = chunk.round;
  worker.late_bytes = chunk.offset + chunk.data.size();
  if (worker.late_bytes < layout_.bytes)
    return {chunk_fate::late};
  worker.draining = false;
  ++dropped_;
  return {chunk_fate::dropped};
}

chunk_outcome sync_round::defer(const push_chunk& chunk, deferred_answer answer) {
  if (chunk.round <= completed_)
    return refuse(wire::error_code::internal, chunk, "a current round's chunk reached defer()");
  if (chunk.round - completed_ > options_.max_rounds_ahead)
    return refuse(
        wire::error_code::invalid_argument, chunk,
        "round " + std::to_string(completed_) + " is being collected and a push may be at most " +
            std::to_string(options_.max_rounds_ahead) + " rounds ahead of it (max_rounds_ahead)");
  if (!membership_.counts(chunk.sender, chunk.round))
    return refuse(wire::error_code::invalid_argument, chunk,
                  membership_.why_not(chunk.sender, chunk.round));
  auto found = std::find_if(deferred_.begin(), deferred_.end(), [&](const deferred_push& push) {
    return push.sender == chunk.sender && push.round == chunk.round;
  });
  if (found != deferred_.end() && found->request_id != chunk.request_id)
    return refuse(wire::error_code::invalid_argument, chunk, "the worker pushed this round twice");
  if (auto checked = check(chunk, found == deferred_.end() ? 0 : found->bytes); checked.refused())
    return checked;
  if (found == deferred_.end()) {
    // Staged before it joins the queue, so that a failed allocation changes nothing.
    deferred_push push{chunk.sender, chunk.round, chunk.request_id, {}, 0, std::move(answer)};
    stage_chunk(push.buffer, chunk, layout_);
    deferred_.push_back(std::move(push));
    found = std::prev(deferred_.end());
  } else {
    stage_chunk(found->buffer, chunk, layout_);
  }
  found->bytes += chunk.data.size();
  return {chunk_fate::deferred};
}

void sync_round::open_merge() {
  if (!merge_open_) {
    make_writable(merge_, widen_ ? wide_layout_ : layout_);
    merge_open_ = true;
  }
}

void accumulate_widened(float* dst, const std::byte* src, std::size_t n, bool first) {
  using half = kernels::cpu::half_bits;
  const auto* in = reinterpret_cast<const half*>(src);
  if (first) {
    kernels::cpu::half_to_float(in, dst, n);
    return;
  }
  // Widened a block at a time into the stack, then added: no buffer of the key's size.
  constexpr std::size_t block = 1024;
  float widened[block];
  for (std::size_t i = 0; i < n; i += block) {
    const auto count = std::min(block, n - i);
    kernels::cpu::half_to_float(in + i, widened, count);
    kernels::cpu::add(dst + i, widened, dst + i, count);
  }
}

void sync_round::widen_into(std::uint64_t offset, std::span<const std::byte> data, bool first) {
  constexpr std::size_t half_size = sizeof(kernels::cpu::half_bits);
  accumulate_widened(reinterpret_cast<float*>(bytes_of(merge_)) + offset / half_size, data.data(),
                     data.size() / half_size, first);
}

void sync_round::merge_bytes(std::uint64_t offset, std::span<const std::byte> data, bool first) {
  if (widened())
    widen_into(offset, data, first);
  else if (first)
    std::memcpy(bytes_of(merge_) + offset, data.data(), data.size());
  else
    accumulate(bytes_of(merge_) + offset, data.data(), data.size(), wire_type_);
}

void sync_round::stream(std::uint64_t offset, std::span<const std::byte> data) {
  open_merge();
  auto end = offset + data.size();
  // [offset, filled) already holds other workers' bytes: add; [filled, end) is new: copy.
  auto added_end = std::min(end, merge_filled_);
  if (added_end > offset)
    merge_bytes(offset, data.first(added_end - offset), false);
  auto copy_begin = std::max(offset, merge_filled_);
  if (end > copy_begin)
    merge_bytes(copy_begin, data.subspan(copy_begin - offset), true);
  merge_filled_ = std::max(merge_filled_, end);
}

void sync_round::contribute(std::span<const std::byte> whole) {
  open_merge();
  if (!whole.empty())
    merge_bytes(0, whole, done_ == 0);
}

void sync_round::contribute_staged(worker_state& worker) {
  if (done_ == 0 && !widen_) {
    // The first push of the round becomes the sum: no copy. The merge buffer it replaces serves
    // as this worker's staging next time (make_writable checks nobody reads it).
    std::swap(merge_, worker.staging);
    merge_open_ = true;
    return;
  }
  contribute({bytes_of(worker.staging), layout_.bytes});
}

void sync_round::finish_push(worker_state& worker) {
  worker.done = true;
  ++done_;
}

void sync_round::close() {
  ++completed_;
  round_quorum_ = membership_.quorum(completed_);
  done_ = 0;
  merge_filled_ = 0;
  merge_open_ = false;
  for (auto& worker : workers_) {
    if (!worker.done && worker.bytes > 0) {
      // Closed without this worker's push: its remaining bytes are late (only with K < N; with
      // K == N every worker is done when the round closes).
      worker.draining = true;
      worker.late_round = completed_ - 1;
      worker.late_bytes = worker.bytes;
    }
    worker.bytes = 0;
    worker.done = false;
  }
}

std::vector<admitted_push> sync_round::admit_deferred() {
  std::vector<admitted_push> answers;
  auto next = deferred_.begin();
  while (!quorum_reached() && next != deferred_.end()) {
    if (next->round > completed_) {
      ++next;
      continue;
    }
    if (next->round == completed_ && streaming())
      open_merge(); // may allocate: before the push leaves the queue
    auto push = std::move(*next);
    next = deferred_.erase(next);
    auto& worker = workers_[push.sender];
    bool whole = push.bytes == layout_.bytes;
    if (push.round < completed_) {
      // Its round closed with a quorum while it waited (K < N only).
      if (whole) {
        ++dropped_;
        answers.push_back({std::move(push.answer), true});
      } else {
        worker.draining = true;
        worker.late_round = push.round;
        worker.late_bytes = push.bytes;
      }
      continue;
    }
    if (streaming()) {
      stream(0, {bytes_of(push.buffer), push.bytes});
    } else {
      std::swap(worker.staging, push.buffer);
      if (whole)
        contribute_staged(worker);
    }
    worker.bytes = push.bytes;
    if (whole) {
      finish_push(worker);
      answers.push_back({std::move(push.answer), false});
    }
  }
  return answers;
}

void sync_round::forget_unfinished(std::uint32_t sender) noexcept {
  auto& worker = workers_[sender];
  if (!streaming() && !worker.done)
    worker.bytes = 0;
  worker.staging = ndarray{};
  worker.draining = false;
  worker.late_bytes = 0;
  std::erase_if(deferred_, [&](const deferred_push& push) {
    return push.sender == sender && push.bytes < layout_.bytes;
  });
}

} // namespace troupe
