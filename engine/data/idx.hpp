#pragma once
// Reader of the IDX files MNIST and Fashion-MNIST ship in (http://yann.lecun.com/exdb/mnist/):
// a big-endian header (magic, then one 32-bit extent per axis) followed by the raw uint8 values.
//
//   images: 0x00000803, n, rows, cols, then n*rows*cols pixels, row-major
//   labels: 0x00000801, n, then n labels
//
// Files may be gzip-compressed (the `.gz` the datasets are distributed as) or plain: zlib reads
// both, telling them apart by content rather than by name.
//
// A header is never trusted for an allocation: the payload is read in pieces and the buffer grows
// only with what the (decompressed) stream actually delivers, after a product check against a
// 1 GiB limit. Failures are values: errc::io_error when the file cannot be opened or read (the
// message names the path and the OS reason), errc::corrupt_data when its contents are not what
// the header promises (wrong magic, truncation, extra bytes, absurd extents).

#include <cstdint>
#include <filesystem>
#include <vector>

#include "engine/error.hpp"

namespace troupe::data {

/// Magic numbers of the two IDX kinds MNIST uses (type byte 0x08 = unsigned byte).
inline constexpr std::uint32_t idx_images_magic = 0x00000803;
inline constexpr std::uint32_t idx_labels_magic = 0x00000801;

/// Largest payload (count * rows * cols bytes) a header may announce: far above MNIST's 47 MB,
/// far below what a corrupted header could otherwise make us try to hold.
inline constexpr std::uint64_t idx_max_payload_bytes = std::uint64_t{1} << 30;

/// The content of an IDX image file.
struct idx_images {
  std::int64_t count = 0; ///< number of images
  std::int64_t rows = 0;  ///< pixels per column of an image
  std::int64_t cols = 0;  ///< pixels per row of an image
  /// count * rows * cols pixels: image i's pixel (r, c) is at (i * rows + r) * cols + c.
  std::vector<std::uint8_t> pixels;
};

/// Reads an IDX image file (magic 0x00000803), gzip-compressed or plain. rows and cols must be
/// positive; count may be 0.
result<idx_images> read_idx_images(const std::filesystem::path& path);

/// Reads an IDX label file (magic 0x00000801), gzip-compressed or plain: one byte per sample.
result<std::vector<std::uint8_t>> read_idx_labels(const std::filesystem::path& path);

} // namespace troupe::data
