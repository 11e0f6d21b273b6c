#pragma once
// An in-memory data set, gluon's samplers and batch sampler, and a loader that gathers each batch
// into contiguous arrays (python/mxnet/gluon/data/{dataset,sampler,dataloader}.py, MXNet 1.x).
//
//   auto set = in_memory_dataset::create(images, labels).value();      // [N, ...] and [N]
//   auto order = make_sharded_sampler(set.size(), kv.num_workers(), kv.rank(), true, 7).value();
//   auto loader = data_loader::create(set, order, 64, last_batch::discard).value();
//   const auto steps = common_batch_count(set.size(), kv.num_workers(), 64, last_batch::discard);
//   for (int epoch = 0; epoch < 10; ++epoch, loader.reset())
//     for (std::int64_t step = 0; step < steps; ++step) {
//       auto b = loader.next();                                       // b->data, b->label
//       ...
//     }
//
// Why common_batch_count: with dist_sync every worker must push every key the same number of
// times. Parts of a set that does not divide evenly differ by one sample, which can give one part
// one batch more than another; the worker with the extra batch then waits forever in a sync round
// no other worker joins (apache/mxnet#7888). Running common_batch_count steps per epoch on every
// worker avoids it.
//
// Orders are reproducible: the order of epoch e is a function of (seed, e) alone, computed with
// std::mt19937_64 (whose output the standard fixes) and a rejection draw, not with the standard
// library's distributions (which differ between libraries).
//
// Not thread-safe: one loader per worker thread. Samplers are immutable and can be shared.

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "engine/data/mnist_iter.hpp"
#include "engine/error.hpp"
#include "engine/ndarray.hpp"

namespace troupe::data {

/// What a batch sampler does with the samples left over when an epoch's length is not a multiple
/// of the batch size (gluon's last_batch argument).
enum class last_batch : std::uint8_t {
  keep,     ///< serve them as a smaller last batch
  discard,  ///< drop them
  rollover, ///< carry them to the front of the next epoch's first batch
};

/// "keep", "discard", "rollover".
const char* to_string(last_batch rule) noexcept;

/// gluon's ArrayDataset of two arrays: sample i is (data[i], label[i]). Both arrays live on a cpu
/// context and share their first extent; the handles share storage with the caller's arrays.
class in_memory_dataset {
public:
  /// Errors (errc::invalid_argument, naming the shapes or context): a none or 0-d array, first
  /// extents that differ, an array not on a cpu context.
  static result<in_memory_dataset> create(ndarray data, ndarray label);

  std::int64_t size() const noexcept { return data_.shape()[0]; }
  const ndarray& data() const noexcept { return data_; }
  const ndarray& label() const noexcept { return label_; }

private:
  in_memory_dataset(ndarray data, ndarray label)
      : data_(std::move(data)), label_(std::move(label)) {}

  ndarray data_;
  ndarray label_;
};

/// The sample indices of each epoch (gluon's Sampler). Immutable: order(e) is the same whenever
/// it is asked.
class sampler {
public:
  virtual ~sampler() = default;
  /// Indices per epoch (gluon's len(sampler)).
  virtual std::int64_t size() const noexcept = 0;
  /// The indices of epoch `epoch`, in the order they are served.
  virtual std::vector<std::int64_t> order(std::int64_t epoch) const = 0;
};

/// gluon's SequentialSampler: start, start + 1, ..., start + length - 1 every epoch.
/// Errors: length < 0 or start < 0 (errc::invalid_argument).
result<std::shared_ptr<const sampler>> make_sequential_sampler(std::int64_t length,
                                                               std::int64_t start = 0);

/// gluon's RandomSampler: a permutation of 0..length-1 that is a function of (seed, epoch).
/// Errors: length < 0 (errc::invalid_argument).
result<std::shared_ptr<const sampler>> make_random_sampler(std::int64_t length,
                                                           std::uint64_t seed = 0);

/// Part `part_index` of `num_parts` of a set of `count` samples: the indices part_range(count,
/// num_parts, part_index) gives (MXNet's rule, engine/data/mnist_iter.hpp), permuted within the
/// part by (seed, epoch) when `shuffle`, else in order. The parts tile the set: every sample is
/// served by exactly one part each epoch. Errors (errc::invalid_argument, naming the value):
/// count < 0, num_parts <= 0, part_index outside [0, num_parts).
result<std::shared_ptr<const sampler>>
make_sharded_sampler(std::int64_t count, std::int64_t num_parts, std::int64_t part_index,
                     bool shuffle = true, std::uint64_t seed = 0);

/// gluon's BatchSampler: cuts each epoch of a sampler into batches of batch_size indices, the
/// leftover handled as `rule` says. Stateful for rollover, as gluon's is: the leftover of an
/// epoch starts the next one's first batch (it is carried when next_epoch() returns, whether or
/// not the caller uses every batch).
class batch_sampler {
public:
  /// Errors (errc::invalid_argument): no sampler, batch_size <= 0.
  static result<batch_sampler> create(std::shared_ptr<const sampler> indices,
                                      std::int64_t batch_size, last_batch rule = last_batch::keep);

  /// The batches of epoch epoch(), then moves to the next epoch.
  std::vector<std::vector<std::int64_t>> next_epoch();
  /// How many batches next_epoch() returns (gluon's len(batch_sampler)): ceil(n / b) for keep,
  /// floor(n / b) for discard, floor((carried + n) / b) for rollover.
  std::int64_t size() const noexcept;
  /// The epoch next_epoch() serves next; 0 after create().
  std::int64_t epoch() const noexcept { return epoch_; }
  std::int64_t batch_size() const noexcept { return batch_size_; }
  last_batch rule() const noexcept { return rule_; }
  const sampler& indices() const noexcept { return *sampler_; }

private:
  batch_sampler(std::shared_ptr<const sampler> indices, std::int64_t batch_size, last_batch rule)
      : sampler_(std::move(indices)), batch_size_(batch_size), rule_(rule) {}

  std::shared_ptr<const sampler> sampler_;
  std::int64_t batch_size_;
  last_batch rule_;
  std::int64_t epoch_ = 0;
  std::vector<std::int64_t> carried_; ///< rollover's leftover from the previous epoch
};

/// gluon's DataLoader over an in_memory_dataset, without worker threads: each batch's data and
/// labels are gathered into new contiguous arrays of the data set's dtypes, on its context
/// ([rows, ...] and [rows, ...]; rows < batch_size only for last_batch::keep's last batch). The
/// returned `batch` is mnist_iter's, with pad always 0.
class data_loader {
public:
  /// Errors (errc::invalid_argument): those of batch_sampler::create, and a sampler whose indices
  /// reach outside the data set (checked on the first epoch's order against the set's size).
  static result<data_loader> create(in_memory_dataset dataset,
                                    std::shared_ptr<const sampler> indices, std::int64_t batch_size,
                                    last_batch rule = last_batch::keep);

  /// The next batch of this epoch, or nullopt once the epoch is exhausted (until reset()).
  std::optional<batch> next();
  /// Starts the next epoch (the sampler's order for it, and rollover's carried samples).
  void reset();
  /// Batches of the current epoch.
  std::int64_t num_batches() const noexcept { return static_cast<std::int64_t>(batches_.size()); }
  /// The epoch next() is serving; 0 after create(), +1 per reset().
  std::int64_t epoch() const noexcept { return epoch_; }
  const in_memory_dataset& dataset() const noexcept { return dataset_; }

private:
  data_loader(in_memory_dataset dataset, batch_sampler batches)
      : dataset_(std::move(dataset)), sampler_(std::move(batches)) {}

  in_memory_dataset dataset_;
  batch_sampler sampler_;
  std::vector<std::vector<std::int64_t>> batches_; ///< the current epoch's
  std::size_t cursor_ = 0;
  std::int64_t epoch_ = 0;
};

/// Copies rows `indices` of `source` (axis 0) into a new contiguous array [indices.size(), ...]
/// of the same dtype on the same (cpu) context. Throws troupe::exception (invalid_argument) for an
/// index outside [0, source.shape()[0]) or a non-cpu source.
ndarray gather_rows(const ndarray& source, std::span<const std::int64_t> indices);

/// The number of batches every part of a `count`-sample set split into `num_parts` by
/// part_range can serve in every epoch: the minimum over parts of ceil(n / batch_size) for keep
/// and floor(n / batch_size) for discard and rollover (rollover serves floor(n / b) in its first
/// epoch and at least that later). Distributed workers run this many steps per epoch so that none
/// waits forever in a last sync round the others never join (apache/mxnet#7888). Throws
/// troupe::exception (invalid_argument) for count < 0, num_parts <= 0 or batch_size <= 0.
std::int64_t common_batch_count(std::int64_t count, std::int64_t num_parts, std::int64_t batch_size,
                                last_batch rule);

} // namespace troupe::data
