#pragma once
// mnist_iter: MXNet's MNISTIter (src/io/iter_mnist.cc) over IDX files, for the training jobs.
//
// It loads one part of the data set into memory (the whole set is 47 MB of uint8), and hands out
// batches of float32 pixels and float32 labels in a per-epoch order:
//
//   auto it = mnist_iter::open({.image_path = ..., .label_path = ..., .batch_size = 64}).value();
//   for (int epoch = 0; epoch < 10; ++epoch) {
//     it.reset();                       // a new, seeded order when shuffling
//     while (auto b = it.next()) ...    // b->data [64, 1, 28, 28], b->label [64], b->pad
//   }
//
// Distributed training splits the set as MXNet does: part k of n holds samples
// [round(count * k / n), round(count * (k + 1) / n)), so the parts tile the set exactly.
// Shuffling permutes the samples of the part only; the order of epoch e depends on (seed, e)
// alone, so a run can be reproduced and epochs still differ.
//
// Not thread-safe: one iterator per worker thread.

#include <cstdint>
#include <filesystem>
#include <optional>
#include <utility>
#include <vector>

#include "engine/error.hpp"
#include "engine/ndarray.hpp"

namespace troupe::data {

/// What to do with the samples left over when a part's size is not a multiple of the batch size.
enum class last_batch_mode : std::uint8_t {
  discard, ///< drop them (PyTorch's drop_last=True, BENCHMARKS.md's recipe)
  pad,     ///< fill the last batch by wrapping around to the start of the epoch; batch::pad says
           ///< how many rows are filler (MXNet's round_batch)
};

/// Options of mnist_iter; defaults are MXNet's MNISTIter defaults where it has the option.
struct mnist_options {
  std::filesystem::path image_path; ///< IDX images (0x00000803), gzip-compressed or plain
  std::filesystem::path label_path; ///< IDX labels (0x00000801), as many as images
  std::int64_t batch_size = 128;    ///< samples per batch; > 0
  bool shuffle = true;              ///< permute the part's samples each epoch
  std::uint64_t seed = 0;           ///< the order of epoch e is a function of (seed, e)
  bool flat = false;                ///< data [batch, rows*cols] instead of [batch, 1, rows, cols]
  std::int64_t num_parts = 1;       ///< how many parts the set is split into; > 0
  std::int64_t part_index = 0;      ///< which part this iterator reads; in [0, num_parts)
  bool scale = true;                ///< pixels / 255 in [0, 1]; raw 0..255 as float otherwise
  last_batch_mode last_batch = last_batch_mode::discard;
};

/// One batch: float32 data, float32 labels, and the number of filler rows at its end.
struct batch {
  ndarray data;  ///< [batch_size, rows*cols] or [batch_size, 1, rows, cols], float32, cpu(0)
  ndarray label; ///< [batch_size], float32, cpu(0)
  int pad = 0;   ///< trailing rows that repeat earlier samples (last_batch_mode::pad only)
};

/// Samples [first, second) of a set of `count` that part `part_index` of `num_parts` holds:
/// [llround(count * k / n), llround(count * (k + 1) / n)). Preconditions: count >= 0,
/// num_parts > 0, 0 <= part_index < num_parts.
std::pair<std::int64_t, std::int64_t> part_range(std::int64_t count, std::int64_t num_parts,
                                                 std::int64_t part_index);

class mnist_iter {
public:
  /// Reads the two files and keeps this part's samples. Errors: errc::invalid_argument for
  /// options out of range; errc::io_error / errc::corrupt_data from the reader; corrupt_data when
  /// the files hold different numbers of samples. Starts at epoch 0, ready for next().
  static result<mnist_iter> open(mnist_options options);

  /// Starts the next epoch: the cursor goes back to the first sample and, when shuffling, the
  /// order becomes the permutation of (seed, epoch).
  void reset();

  /// The next batch of this epoch, or nullopt once the epoch is exhausted (until reset()).
  std::optional<batch> next();

  /// Samples in this part.
  std::int64_t num_samples() const noexcept { return static_cast<std::int64_t>(labels_.size()); }
  /// Batches next() yields per epoch: floor (discard) or ceiling (pad) of samples / batch size.
  std::int64_t num_batches() const noexcept;
  /// The epoch next() is serving; 0 after open(), +1 per reset().
  std::int64_t epoch() const noexcept { return epoch_; }
  /// Index within the whole file of this part's first sample.
  std::int64_t first_sample() const noexcept { return first_sample_; }
  std::int64_t rows() const noexcept { return rows_; }
  std::int64_t cols() const noexcept { return cols_; }
  const mnist_options& options() const noexcept { return options_; }

private:
  mnist_iter() = default;
  void order_epoch();

  mnist_options options_;
  std::int64_t rows_ = 0;
  std::int64_t cols_ = 0;
  std::int64_t first_sample_ = 0;
  std::vector<std::uint8_t> pixels_; ///< this part's images, rows_ * cols_ bytes each
  std::vector<std::uint8_t> labels_; ///< this part's labels
  std::vector<std::int64_t> order_;  ///< sample indices (within the part) of this epoch
  std::int64_t epoch_ = 0;
  std::int64_t cursor_ = 0; ///< position in order_ of the next batch's first sample
};

} // namespace troupe::data
