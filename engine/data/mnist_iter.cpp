#include "engine/data/mnist_iter.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>

#include "engine/data/idx.hpp"
#include "engine/random.hpp"

namespace troupe::data {

namespace {

error bad_option(const std::string& what) {
  return {errc::invalid_argument, "mnist_iter: " + what};
}

} // namespace

std::pair<std::int64_t, std::int64_t> part_range(std::int64_t count, std::int64_t num_parts,
                                                 std::int64_t part_index) {
  const auto bound = [&](std::int64_t k) {
    return static_cast<std::int64_t>(std::llround(
        static_cast<double>(count) * static_cast<double>(k) / static_cast<double>(num_parts)));
  };
  return {bound(part_index), bound(part_index + 1)};
}

result<mnist_iter> mnist_iter::open(mnist_options options) {
  if (options.batch_size <= 0)
    return bad_option("batch_size must be positive, got " + std::to_string(options.batch_size));
  if (options.num_parts <= 0)
    return bad_option("num_parts must be positive, got " + std::to_string(options.num_parts));
  if (options.part_index < 0 || options.part_index >= options.num_parts)
    return bad_option("part_index " + std::to_string(options.part_index) + " is outside [0, " +
                      std::to_string(options.num_parts) + ")");
  auto images = read_idx_images(options.image_path);
  if (!images)
    return images.error();
  auto labels = read_idx_labels(options.label_path);
  if (!labels)
    return labels.error();
  if (static_cast<std::int64_t>(labels->size()) != images->count)
    return error{errc::corrupt_data, options.image_path.string() + " holds " +
                                         std::to_string(images->count) + " images but " +
                                         options.label_path.string() + " holds " +
                                         std::to_string(labels->size()) + " labels"};

  const auto [first, last] = part_range(images->count, options.num_parts, options.part_index);
  const std::int64_t pixels_per_image = images->rows * images->cols;
  mnist_iter iter;
  iter.rows_ = images->rows;
  iter.cols_ = images->cols;
  iter.first_sample_ = first;
  // Keep only this part: a worker of n holds 1/n of the set.
  iter.pixels_.assign(images->pixels.begin() + first * pixels_per_image,
                      images->pixels.begin() + last * pixels_per_image);
  iter.labels_.assign(labels->begin() + first, labels->begin() + last);
  iter.options_ = std::move(options);
  iter.order_epoch();
  return iter;
}

void mnist_iter::reset() {
  ++epoch_;
  order_epoch();
}

void mnist_iter::order_epoch() {
  cursor_ = 0;
  order_.resize(labels_.size());
  std::iota(order_.begin(), order_.end(), std::int64_t{0});
  if (!options_.shuffle)
    return;
  // Fisher-Yates from a generator of (seed + epoch): reproducible per epoch, different across.
  std::mt19937_64 engine{options_.seed + static_cast<std::uint64_t>(epoch_)};
  shuffle_indices(order_, engine);
}

std::int64_t mnist_iter::num_batches() const noexcept {
  const std::int64_t samples = num_samples();
  if (options_.last_batch == last_batch_mode::pad)
    return (samples + options_.batch_size - 1) / options_.batch_size;
  return samples / options_.batch_size;
}

std::optional<batch> mnist_iter::next() {
  const std::int64_t samples = num_samples();
  const std::int64_t size = options_.batch_size;
  const std::int64_t remaining = samples - cursor_;
  if (remaining <= 0)
    return std::nullopt;
  if (remaining < size && options_.last_batch == last_batch_mode::discard) {
    cursor_ = samples;
    return std::nullopt;
  }
  const std::int64_t pixels_per_image = rows_ * cols_;
  shape_vector data_shape =
      options_.flat ? shape_vector{size, pixels_per_image} : shape_vector{size, 1, rows_, cols_};
  batch out{ndarray::empty(std::move(data_shape), context::cpu(), dtype::float32),
            ndarray::empty({size}, context::cpu(), dtype::float32), 0};
  float* data = out.data.data<float>();
  float* label = out.label.data<float>();
  // A division, not a multiplication by 1/255, so that 255 maps to exactly 1.0f.
  const float divisor = options_.scale ? 255.0f : 1.0f;
  for (std::int64_t row = 0; row < size; ++row) {
    // Rows past the end wrap to the start of this epoch's order (modulo, in case the part is
    // smaller than a batch); only reachable in pad mode.
    const std::int64_t sample = order_[static_cast<std::size_t>((cursor_ + row) % samples)];
    const std::uint8_t* source = pixels_.data() + sample * pixels_per_image;
    float* target = data + row * pixels_per_image;
    for (std::int64_t p = 0; p < pixels_per_image; ++p)
      target[p] = static_cast<float>(source[p]) / divisor;
    label[row] = static_cast<float>(labels_[static_cast<std::size_t>(sample)]);
  }
  out.pad = static_cast<int>(std::max<std::int64_t>(0, size - remaining));
  cursor_ = std::min(samples, cursor_ + size);
  return out;
}

} // namespace troupe::data
