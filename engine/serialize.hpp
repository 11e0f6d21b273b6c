#pragma once
// A small versioned binary format for troupe's own files (optimizer states, parameters):
// little-endian integers, length-prefixed strings and ndarrays written as dtype, shape, raw
// bytes. The reader checks every length against what is left, so truncated or lying input is a
// corrupt_data error, never a crash or an allocation sized by the input.

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/error.hpp"
#include "engine/ndarray.hpp"

namespace troupe {

class byte_writer {
public:
  void u8(std::uint8_t value) { bytes_.push_back(static_cast<std::byte>(value)); }
  void u64(std::uint64_t value);
  void i64(std::int64_t value) { u64(static_cast<std::uint64_t>(value)); }
  void f64(double value);
  void string(std::string_view value);
  void raw(const void* data, std::size_t size);
  /// dtype, ndim, extents, then the values (copied to the host when the array lives elsewhere).
  void array(const ndarray& value);

  /// Makes room for `more` bytes beyond what is written, so that a big file is one allocation.
  void reserve(std::size_t more) { bytes_.reserve(bytes_.size() + more); }
  const std::vector<std::byte>& bytes() const noexcept { return bytes_; }
  std::vector<std::byte> take() noexcept { return std::move(bytes_); }

private:
  std::vector<std::byte> bytes_;
};

/// Reads what byte_writer wrote. Every call returns an error naming `what` when the input ends
/// early or holds an impossible value.
class byte_reader {
public:
  explicit byte_reader(std::span<const std::byte> bytes) : bytes_(bytes) {}

  result<std::uint8_t> u8(std::string_view what);
  result<std::uint64_t> u64(std::string_view what);
  result<std::int64_t> i64(std::string_view what);
  result<double> f64(std::string_view what);
  result<std::string> string(std::string_view what);
  /// An array on cpu(0).
  result<ndarray> array(std::string_view what);
  /// The next `count` bytes as they are (a view into the input).
  result<std::span<const std::byte>> raw(std::size_t count, std::string_view what) {
    return take(count, what);
  }

  std::size_t remaining() const noexcept { return bytes_.size() - position_; }

private:
  result<std::span<const std::byte>> take(std::size_t count, std::string_view what);

  std::span<const std::byte> bytes_;
  std::size_t position_ = 0;
};

/// Whole-file helpers; errors name the path and the system's reason. write_file is atomic and
/// durable: a temporary file beside `path`, fsync, rename over it, fsync of the directory.
status write_file(const std::string& path, std::span<const std::byte> bytes);
result<std::vector<std::byte>> read_file(const std::string& path);

} // namespace troupe
