#include "actors/logic/sparse_round.hpp"

#include <algorithm>
#include <cstring>
#include <functional>
#include <queue>
#include <utility>

#include "actors/logic/wire_conversions.hpp"

namespace troupe {

std::int64_t row_id_at(std::span<const std::byte> row_ids, std::size_t index) noexcept {
  std::int64_t id = 0;
  std::memcpy(&id, row_ids.data() + index * sizeof id, sizeof id);
  return id;
}

std::optional<std::string> check_row_ids(std::span<const std::byte> row_ids, std::int64_t rows) {
  if (row_ids.size() % sizeof(std::int64_t) != 0)
    return "row ids of " + std::to_string(row_ids.size()) + " bytes, not a whole number of int64";
  const auto count = row_ids.size() / sizeof(std::int64_t);
  std::int64_t previous = -1;
  for (std::size_t i = 0; i < count; ++i) {
    const auto id = row_id_at(row_ids, i);
    if (id < 0 || id >= rows)
      return "row id " + std::to_string(id) + " (at position " + std::to_string(i) +
             ") is outside [0, " + std::to_string(rows) + ")";
    if (id <= previous)
      return "row id " + std::to_string(id) + " (at position " + std::to_string(i) +
             ") does not follow " + std::to_string(previous) + " (ids are strictly increasing)";
    previous = id;
  }
  return std::nullopt;
}

sparse_round::sparse_round(const ndarray& like, sync_round_options options)
    : options_(options), membership_(options.num_workers, options.quorum),
      round_quorum_(options.quorum), shape_(like.shape()), type_(like.dtype()),
      merge_type_(like.dtype()), pushed_(std::max(options.num_workers, options.max_workers), 0) {
  row_elements_ = 1;
  for (std::size_t axis = 1; axis < shape_.size(); ++axis)
    row_elements_ *= static_cast<std::size_t>(shape_[axis]);
}

void sparse_round::merge_in_float32(bool on) noexcept {
  widen_ = on && type_ == dtype::float16;
}

chunk_outcome sparse_round::refuse(wire::error_code code, const sparse_push& push,
                                   const std::string& why) const {
  return refuse_chunk(options_.key, code,
                      push_chunk{push.request_id, push.sender, push.round, 0, {}}, why);
}

std::uint64_t sparse_round::retire(std::uint32_t sender) {
  if (auto end = membership_.end_of(sender))
    return *end;
  const auto end = after_last_push(completed_ + pushed_[sender], deferred_, sender);
  membership_.retire(sender, end);
  round_quorum_ = membership_.quorum(completed_);
  return end;
}

std::uint64_t sparse_round::admit(std::uint32_t sender) {
  if (auto first = membership_.first_of(sender))
    return *first;
  std::uint64_t first = completed_ + (collecting() ? 1 : 0);
  for (const auto& push : deferred_)
    first = std::max(first, push.round + 1);
  membership_.admit(sender, first);
  round_quorum_ = membership_.quorum(completed_);
  return first;
}

chunk_outcome sparse_round::add(const sparse_push& push, deferred_answer answer) {
  if (push.round >= completed_ && !membership_.counts(push.sender, push.round))
    return refuse(wire::error_code::invalid_argument, push,
                  membership_.why_not(push.sender, push.round));
  if (push.round < completed_) {
    if (options_.quorum == options_.num_workers)
      return refuse(wire::error_code::stale_round, push,
                    "round " + std::to_string(completed_) +
                        " is being collected and every worker's push closes a round, so a push "
                        "of an earlier one cannot be honest");
    ++dropped_;
    return {chunk_fate::dropped};
  }
  if (push.round == completed_) {
    if (pushed_[push.sender] != 0)
      return refuse(wire::error_code::invalid_argument, push, "the worker pushed this round twice");
    enter(push.sender, copied(push));
    return {chunk_fate::completed};
  }
  if (push.round - completed_ > options_.max_rounds_ahead)
    return refuse(
        wire::error_code::invalid_argument, push,
        "round " + std::to_string(completed_) + " is being collected and a push may be at most " +
            std::to_string(options_.max_rounds_ahead) + " rounds ahead of it (max_rounds_ahead)");
  if (std::any_of(deferred_.begin(), deferred_.end(), [&](const deferred_row_push& waiting) {
        return waiting.sender == push.sender && waiting.round == push.round;
      }))
    return refuse(wire::error_code::invalid_argument, push, "the worker pushed this round twice");
  // Copied before it joins the queue, so that a failed allocation changes nothing.
  deferred_row_push waiting{push.sender, push.round, copied(push), std::move(answer)};
  deferred_.push_back(std::move(waiting));
  return {chunk_fate::deferred};
}

sparse_round::staged_rows sparse_round::copied(const sparse_push& push) {
  staged_rows rows;
  if (!spare_.empty()) {
    rows = std::move(spare_.back());
    spare_.pop_back();
  }
  rows.ids.assign(push.row_ids.begin(), push.row_ids.end());
  rows.values.assign(push.values.begin(), push.values.end());
  return rows;
}

void sparse_round::enter(std::uint32_t sender, staged_rows rows) {
  if (done_ == 0)
    merge_type_ = widen_ ? dtype::float32 : type_;
  round_.push_back(std::move(rows));
  pushed_[sender] = 1;
  ++done_;
}

row_sparse_array sparse_round::sum(double scale) {
  // A merge of the pushes' sorted rows, in push order where they share a row (the order of the
  // additions, as they arrived), into the rows of the sum: one pass over each push's bytes.
  const auto in_row = row_elements_ * size_of(type_);
  const auto out_row = row_elements_ * size_of(merge_type_);
  const bool widened = merge_type_ != type_;
  const auto wire_type = to_wire(merge_type_);
  std::size_t total = 0;
  for (const auto& push : round_)
    total += push.ids.size() / sizeof(std::int64_t);
  std::vector<std::int64_t> rows;
  rows.reserve(total);
  // Room for every row pushed; the rows the pushes share make the sum shorter (a view of it).
  auto shape = shape_;
  shape[0] = static_cast<std::int64_t>(total);
  auto data = ndarray::empty(shape, context::cpu(), merge_type_);
  auto* summed = static_cast<std::byte*>(data.raw_data());
  using cursor = std::pair<std::int64_t, std::size_t>; // (row id, push)
  std::priority_queue<cursor, std::vector<cursor>, std::greater<>> next;
  std::vector<std::size_t> at(round_.size(), 0);
  for (std::size_t p = 0; p < round_.size(); ++p)
    if (!round_[p].ids.empty())
      next.emplace(row_id_at(round_[p].ids, 0), p);
  while (!next.empty()) {
    const auto [row, p] = next.top();
    next.pop();
    const auto i = at[p]++;
    const auto* in = round_[p].values.data() + i * in_row;
    const bool first = rows.empty() || rows.back() != row;
    if (first)
      rows.push_back(row);
    auto* out = summed + (rows.size() - 1) * out_row;
    if (widened)
      accumulate_widened(reinterpret_cast<float*>(out), in, row_elements_, first);
    else if (first)
      std::memcpy(out, in, in_row);
    else
      accumulate(out, in, in_row, wire_type);
    if (at[p] < round_[p].ids.size() / sizeof(std::int64_t))
      next.emplace(row_id_at(round_[p].ids, at[p]), p);
  }
  if (rows.size() < total)
    data = data.slice(0, static_cast<std::int64_t>(rows.size()));
  if (scale != 1.0 && !rows.empty())
    data *= scale;
  return row_sparse_array::from_rows(data, rows, shape_).value();
}

void sparse_round::close() {
  // The pushes' buffers serve the next rounds' pushes (at most one a worker is kept).
  for (auto& push : round_) {
    if (spare_.size() >= options_.num_workers)
      break;
    push.ids.clear();
    push.values.clear();
    spare_.push_back(std::move(push));
  }
  round_.clear();
  std::fill(pushed_.begin(), pushed_.end(), 0);
  done_ = 0;
  ++completed_;
  round_quorum_ = membership_.quorum(completed_);
}

std::vector<admitted_push> sparse_round::admit_deferred() {
  std::vector<admitted_push> answers;
  auto next = deferred_.begin();
  while (!quorum_reached() && next != deferred_.end()) {
    if (next->round > completed_) {
      ++next;
      continue;
    }
    auto push = std::move(*next);
    next = deferred_.erase(next);
    if (push.round < completed_ || pushed_[push.sender] != 0) {
      // Its round closed with a quorum while it waited (K < N only).
      ++dropped_;
      answers.push_back({std::move(push.answer), true});
      continue;
    }
    enter(push.sender, std::move(push.rows));
    answers.push_back({std::move(push.answer), false});
  }
  return answers;
}

} // namespace troupe
