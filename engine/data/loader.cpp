#include "engine/data/loader.hpp"

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include "engine/random.hpp"

namespace troupe::data {

namespace {

error bad_argument(const std::string& what) {
  return {errc::invalid_argument, what};
}

/// Fisher-Yates over `indices` with a generator of (seed, epoch). Mixing both keeps neighbouring
/// pairs apart (seed + epoch would make seed 1's epoch 0 equal seed 0's epoch 1).
void permute(std::vector<std::int64_t>& indices, std::uint64_t seed, std::int64_t epoch) {
  std::mt19937_64 engine{mix_bits(seed ^ mix_bits(static_cast<std::uint64_t>(epoch)))};
  shuffle_indices(indices, engine);
}

/// first, first + 1, ..., first + length - 1, then permuted when `shuffle`.
class range_sampler final : public sampler {
public:
  range_sampler(std::int64_t first, std::int64_t length, bool shuffle, std::uint64_t seed)
      : first_(first), length_(length), shuffle_(shuffle), seed_(seed) {}

  std::int64_t size() const noexcept override { return length_; }

  std::vector<std::int64_t> order(std::int64_t epoch) const override {
    std::vector<std::int64_t> indices(static_cast<std::size_t>(length_));
    std::iota(indices.begin(), indices.end(), first_);
    if (shuffle_)
      permute(indices, seed_, epoch);
    return indices;
  }

private:
  std::int64_t first_;
  std::int64_t length_;
  bool shuffle_;
  std::uint64_t seed_;
};

/// Batches a part of `n` samples yields per epoch under `rule` (rollover: its first epoch).
std::int64_t batches_of(std::int64_t n, std::int64_t batch_size, last_batch rule) noexcept {
  return rule == last_batch::keep ? (n + batch_size - 1) / batch_size : n / batch_size;
}

} // namespace

const char* to_string(last_batch rule) noexcept {
  switch (rule) {
  case last_batch::keep:
    return "keep";
  case last_batch::discard:
    return "discard";
  case last_batch::rollover:
    return "rollover";
  }
  return "unknown";
}

result<in_memory_dataset> in_memory_dataset::create(ndarray data, ndarray label) {
  for (const auto* array : {&data, &label}) {
    const char* what = array == &data ? "data" : "label";
    if (array->is_none() || array->ndim() == 0)
      return bad_argument(std::string("in_memory_dataset: ") + what +
                          " must have a first (sample) axis, got " +
                          (array->is_none() ? std::string("the none array")
                                            : "shape " + shape_to_string(array->shape())));
    if (!array->ctx().is_cpu())
      return bad_argument(std::string("in_memory_dataset: ") + what + " lives on " +
                          array->ctx().to_string() + "; keep the set on a cpu context");
  }
  if (data.shape()[0] != label.shape()[0])
    return bad_argument("in_memory_dataset: data " + shape_to_string(data.shape()) + " and label " +
                        shape_to_string(label.shape()) + " hold different numbers of samples");
  return in_memory_dataset{std::move(data), std::move(label)};
}

result<std::shared_ptr<const sampler>> make_sequential_sampler(std::int64_t length,
                                                               std::int64_t start) {
  if (length < 0)
    return bad_argument("sequential sampler: length must be >= 0, got " + std::to_string(length));
  if (start < 0)
    return bad_argument("sequential sampler: start must be >= 0, got " + std::to_string(start));
  return std::shared_ptr<const sampler>{std::make_shared<range_sampler>(start, length, false, 0)};
}

result<std::shared_ptr<const sampler>> make_random_sampler(std::int64_t length,
                                                           std::uint64_t seed) {
  if (length < 0)
    return bad_argument("random sampler: length must be >= 0, got " + std::to_string(length));
  return std::shared_ptr<const sampler>{std::make_shared<range_sampler>(0, length, true, seed)};
}

result<std::shared_ptr<const sampler>> make_sharded_sampler(std::int64_t count,
                                                            std::int64_t num_parts,
                                                            std::int64_t part_index, bool shuffle,
                                                            std::uint64_t seed) {
  if (count < 0)
    return bad_argument("sharded sampler: count must be >= 0, got " + std::to_string(count));
  if (num_parts <= 0)
    return bad_argument("sharded sampler: num_parts must be positive, got " +
                        std::to_string(num_parts));
  if (part_index < 0 || part_index >= num_parts)
    return bad_argument("sharded sampler: part_index " + std::to_string(part_index) +
                        " is outside [0, " + std::to_string(num_parts) + ")");
  const auto [first, last] = part_range(count, num_parts, part_index);
  return std::shared_ptr<const sampler>{
      std::make_shared<range_sampler>(first, last - first, shuffle, seed)};
}

result<batch_sampler> batch_sampler::create(std::shared_ptr<const sampler> indices,
                                            std::int64_t batch_size, last_batch rule) {
  if (!indices)
    return bad_argument("batch_sampler: no sampler");
  if (batch_size <= 0)
    return bad_argument("batch_sampler: batch_size must be positive, got " +
                        std::to_string(batch_size));
  return batch_sampler{std::move(indices), batch_size, rule};
}

std::int64_t batch_sampler::size() const noexcept {
  const std::int64_t n = sampler_->size();
  if (rule_ == last_batch::rollover)
    return (static_cast<std::int64_t>(carried_.size()) + n) / batch_size_;
  return batches_of(n, batch_size_, rule_);
}

std::vector<std::vector<std::int64_t>> batch_sampler::next_epoch() {
  // gluon: batch, self._prev = self._prev, []; then fill batches in the sampler's order.
  std::vector<std::int64_t> pending = std::move(carried_);
  carried_.clear();
  const auto order = sampler_->order(epoch_++);
  std::vector<std::vector<std::int64_t>> batches;
  batches.reserve(static_cast<std::size_t>(size()) + 1);
  pending.reserve(static_cast<std::size_t>(batch_size_));
  for (auto index : order) {
    pending.push_back(index);
    if (static_cast<std::int64_t>(pending.size()) == batch_size_) {
      batches.push_back(std::move(pending));
      pending.clear();
      pending.reserve(static_cast<std::size_t>(batch_size_));
    }
  }
  if (!pending.empty()) {
    if (rule_ == last_batch::keep)
      batches.push_back(std::move(pending));
    else if (rule_ == last_batch::rollover)
      carried_ = std::move(pending);
  }
  return batches;
}

result<data_loader> data_loader::create(in_memory_dataset dataset,
                                        std::shared_ptr<const sampler> indices,
                                        std::int64_t batch_size, last_batch rule) {
  auto batches = batch_sampler::create(std::move(indices), batch_size, rule);
  if (!batches)
    return batches.error();
  // Every sampler here draws from one fixed range, so the first epoch's order tells whether it
  // fits the set; checking here turns a later exception in next() into an error value now.
  const auto order = batches->indices().order(0);
  if (!order.empty()) {
    const auto [low, high] = std::minmax_element(order.begin(), order.end());
    if (*low < 0 || *high >= dataset.size())
      return bad_argument("data_loader: the sampler serves index " +
                          std::to_string(*low < 0 ? *low : *high) + " but the data set holds " +
                          std::to_string(dataset.size()) + " samples");
  }
  data_loader loader{std::move(dataset), std::move(*batches)};
  loader.batches_ = loader.sampler_.next_epoch();
  return loader;
}

std::optional<batch> data_loader::next() {
  if (cursor_ >= batches_.size())
    return std::nullopt;
  const auto& indices = batches_[cursor_++];
  return batch{gather_rows(dataset_.data(), indices), gather_rows(dataset_.label(), indices), 0};
}

void data_loader::reset() {
  batches_ = sampler_.next_epoch();
  cursor_ = 0;
  ++epoch_;
}

ndarray gather_rows(const ndarray& source, std::span<const std::int64_t> indices) {
  if (source.is_none() || source.ndim() == 0)
    throw exception(errc::invalid_argument, "gather_rows: the source has no row axis");
  if (!source.ctx().is_cpu())
    throw exception(errc::invalid_argument, "gather_rows: the source lives on " +
                                                source.ctx().to_string() +
                                                "; only cpu contexts are gathered");
  const std::int64_t rows = source.shape()[0];
  shape_vector shape = source.shape();
  shape[0] = static_cast<std::int64_t>(indices.size());
  ndarray out{shape, source.ctx(), source.dtype()};
  // A row is contiguous in a row-major array, so each one is a single memcpy.
  const std::size_t row_bytes = rows == 0 ? 0 : source.nbytes() / static_cast<std::size_t>(rows);
  const auto* from = static_cast<const std::byte*>(source.raw_data());
  auto* to = static_cast<std::byte*>(out.raw_data());
  for (std::size_t i = 0; i < indices.size(); ++i) {
    const std::int64_t row = indices[i];
    if (row < 0 || row >= rows)
      throw exception(errc::invalid_argument, "gather_rows: row " + std::to_string(row) +
                                                  " is outside [0, " + std::to_string(rows) + ")");
    std::memcpy(to + i * row_bytes, from + static_cast<std::size_t>(row) * row_bytes, row_bytes);
  }
  return out;
}

std::int64_t common_batch_count(std::int64_t count, std::int64_t num_parts, std::int64_t batch_size,
                                last_batch rule) {
  if (count < 0 || num_parts <= 0 || batch_size <= 0)
    throw exception(errc::invalid_argument,
                    "common_batch_count: needs count >= 0, num_parts > 0 and batch_size > 0, got " +
                        std::to_string(count) + ", " + std::to_string(num_parts) + " and " +
                        std::to_string(batch_size));
  // part_range's parts differ by at most one sample, but which parts are the short ones depends
  // on the rounding; taking the minimum over all of them needs no argument about that.
  std::int64_t fewest = batches_of(count, batch_size, rule);
  for (std::int64_t part = 0; part < num_parts; ++part) {
    const auto [first, last] = part_range(count, num_parts, part);
    fewest = std::min(fewest, batches_of(last - first, batch_size, rule));
  }
  return fewest;
}

} // namespace troupe::data
