#include "actors/logic/sparse_round.hpp"

#include <algorithm>
#include <cstring>
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
    : options_(options), shape_(like.shape()), type_(like.dtype()), merge_type_(like.dtype()),
      pushed_(options.num_workers, 0) {
  rows_ = shape_.empty() ? 0 : shape_[0];
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

chunk_outcome sparse_round::add(const sparse_push& push, deferred_answer answer) {
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
    merge(push.row_ids, push.values);
    finish_push(push.sender);
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
  deferred_row_push waiting{push.sender,
                            push.round,
                            {push.row_ids.begin(), push.row_ids.end()},
                            {push.values.begin(), push.values.end()},
                            std::move(answer)};
  deferred_.push_back(std::move(waiting));
  return {chunk_fate::deferred};
}

void sparse_round::merge(std::span<const std::byte> row_ids, std::span<const std::byte> values) {
  if (done_ == 0 && touched_rows_.empty())
    merge_type_ = widen_ ? dtype::float32 : type_;
  if (merge_.is_none() || merge_.dtype() != merge_type_) {
    merge_ = ndarray::empty(shape_, context::cpu(), merge_type_);
    touched_.assign(static_cast<std::size_t>(rows_), 0);
  }
  const auto count = row_ids.size() / sizeof(std::int64_t);
  const auto in_row = row_elements_ * size_of(type_);
  const auto out_row = row_elements_ * size_of(merge_type_);
  auto* base = static_cast<std::byte*>(merge_.raw_data());
  const bool widened = merge_type_ != type_;
  const auto wire_type = to_wire(merge_type_);
  for (std::size_t i = 0; i < count; ++i) {
    const auto row = row_id_at(row_ids, i);
    const auto* in = values.data() + i * in_row;
    auto* out = base + static_cast<std::size_t>(row) * out_row;
    auto& touched = touched_[static_cast<std::size_t>(row)];
    const bool first = touched == 0;
    if (first) {
      touched = 1;
      touched_rows_.push_back(row);
    }
    if (!widened) {
      if (first)
        std::memcpy(out, in, in_row);
      else
        accumulate(out, in, in_row, wire_type);
    } else {
      accumulate_widened(reinterpret_cast<float*>(out), in, row_elements_, first);
    }
  }
}

void sparse_round::finish_push(std::uint32_t sender) {
  pushed_[sender] = 1;
  ++done_;
}

row_sparse_array sparse_round::sum(double scale) const {
  auto rows = touched_rows_;
  std::sort(rows.begin(), rows.end());
  auto shape = shape_;
  shape[0] = static_cast<std::int64_t>(rows.size());
  auto data = ndarray::empty(shape, context::cpu(), merge_type_);
  const auto row_bytes = row_elements_ * size_of(merge_type_);
  auto* out = static_cast<std::byte*>(data.raw_data());
  const auto* in = static_cast<const std::byte*>(merge_.is_none() ? nullptr : merge_.raw_data());
  for (std::size_t i = 0; i < rows.size() && row_bytes > 0; ++i)
    std::memcpy(out + i * row_bytes, in + static_cast<std::size_t>(rows[i]) * row_bytes, row_bytes);
  if (scale != 1.0 && !rows.empty())
    data *= scale;
  return row_sparse_array::from_rows(data, rows, shape_).value();
}

void sparse_round::close() {
  for (auto row : touched_rows_)
    touched_[static_cast<std::size_t>(row)] = 0;
  touched_rows_.clear();
  std::fill(pushed_.begin(), pushed_.end(), 0);
  done_ = 0;
  ++completed_;
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
    merge(push.row_ids, push.values);
    finish_push(push.sender);
    answers.push_back({std::move(push.answer), false});
  }
  return answers;
}

} // namespace troupe
