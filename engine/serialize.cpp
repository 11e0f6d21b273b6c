#include "engine/serialize.hpp"

#include <bit>
#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <limits>
#include <unistd.h>

namespace troupe {

static_assert(std::endian::native == std::endian::little,
              "troupe's file format is little-endian and written by memcpy");

void byte_writer::u64(std::uint64_t value) {
  raw(&value, sizeof value);
}

void byte_writer::f64(double value) {
  raw(&value, sizeof value);
}

void byte_writer::string(std::string_view value) {
  u64(value.size());
  raw(value.data(), value.size());
}

void byte_writer::raw(const void* data, std::size_t size) {
  if (size == 0)
    return;
  auto begin = static_cast<const std::byte*>(data);
  bytes_.insert(bytes_.end(), begin, begin + size);
}

void byte_writer::array(const ndarray& value) {
  u8(static_cast<std::uint8_t>(value.dtype()));
  u64(value.ndim());
  for (auto extent : value.shape())
    i64(extent);
  if (value.ctx().is_cpu()) {
    raw(value.raw_data(), value.nbytes());
  } else {
    auto host = value.copy_to(context::cpu());
    raw(host.raw_data(), host.nbytes());
  }
}

result<std::span<const std::byte>> byte_reader::take(std::size_t count, std::string_view what) {
  if (count > remaining())
    return error{errc::corrupt_data, "truncated input: " + std::string{what} + " needs " +
                                         std::to_string(count) + " bytes, " +
                                         std::to_string(remaining()) + " left"};
  auto piece = bytes_.subspan(position_, count);
  position_ += count;
  return piece;
}

result<std::uint8_t> byte_reader::u8(std::string_view what) {
  auto piece = take(1, what);
  if (!piece)
    return piece.error();
  return static_cast<std::uint8_t>((*piece)[0]);
}

result<std::uint64_t> byte_reader::u64(std::string_view what) {
  auto piece = take(8, what);
  if (!piece)
    return piece.error();
  std::uint64_t value;
  std::memcpy(&value, piece->data(), sizeof value);
  return value;
}

result<std::int64_t> byte_reader::i64(std::string_view what) {
  auto value = u64(what);
  if (!value)
    return value.error();
  return static_cast<std::int64_t>(*value);
}

result<double> byte_reader::f64(std::string_view what) {
  auto piece = take(8, what);
  if (!piece)
    return piece.error();
  double value;
  std::memcpy(&value, piece->data(), sizeof value);
  return value;
}

result<std::string> byte_reader::string(std::string_view what) {
  auto size = u64(what);
  if (!size)
    return size.error();
  auto piece = take(*size, what);
  if (!piece)
    return piece.error();
  return std::string{reinterpret_cast<const char*>(piece->data()), piece->size()};
}

result<ndarray> byte_reader::array(std::string_view what) {
  auto type_code = u8(what);
  if (!type_code)
    return type_code.error();
  if (*type_code > static_cast<std::uint8_t>(dtype::float64))
    return error{errc::corrupt_data,
                 std::string{what} + ": unknown dtype code " + std::to_string(*type_code)};
  auto type = static_cast<dtype>(*type_code);
  auto ndim = u64(what);
  if (!ndim)
    return ndim.error();
  // Each extent takes 8 bytes, so more extents than bytes left is a lie, caught before reserving.
  if (*ndim > remaining() / 8)
    return error{errc::corrupt_data, std::string{what} + ": " + std::to_string(*ndim) +
                                         " dimensions do not fit in the input"};
  shape_vector shape;
  shape.reserve(*ndim);
  std::uint64_t count = 1;
  for (std::uint64_t axis = 0; axis < *ndim; ++axis) {
    auto extent = i64(what);
    if (!extent)
      return extent.error();
    if (*extent < 0)
      return error{errc::corrupt_data,
                   std::string{what} + ": negative extent " + std::to_string(*extent)};
    auto unsigned_extent = static_cast<std::uint64_t>(*extent);
    if (unsigned_extent != 0 && count > std::numeric_limits<std::uint64_t>::max() / unsigned_extent)
      return error{errc::corrupt_data, std::string{what} + ": shape overflows"};
    count *= unsigned_extent;
    shape.push_back(*extent);
  }
  auto element_size = size_of(type);
  if (count > remaining() / element_size)
    return error{errc::corrupt_data, std::string{what} + ": shape " + shape_to_string(shape) +
                                         " needs more bytes than the input holds"};
  auto payload = take(count * element_size, what);
  if (!payload)
    return payload.error();
  ndarray value{shape, context::cpu(), type};
  if (!payload->empty())
    std::memcpy(value.raw_data(), payload->data(), payload->size());
  return value;
}

status write_file(const std::string& path, std::span<const std::byte> bytes) {
  // Written beside the target, synced, and renamed over it, then the directory synced: a crash
  // at any point leaves the old file or the new one whole, never half of one.
  auto temporary = path + ".partial";
  auto failed = [&](const std::string& what, const std::string& file) {
    return error{errc::io_error, "cannot " + what + " " + file + ": " + std::strerror(errno)};
  };
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0)
    return failed("open for writing", temporary);
  std::size_t written = 0;
  while (written < bytes.size()) {
    auto n = ::write(fd, bytes.data() + written, bytes.size() - written);
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0) {
      auto why = failed("write", temporary);
      ::close(fd);
      ::unlink(temporary.c_str());
      return why;
    }
    written += static_cast<std::size_t>(n);
  }
  if (::fsync(fd) != 0) {
    auto why = failed("sync", temporary);
    ::close(fd);
    ::unlink(temporary.c_str());
    return why;
  }
  ::close(fd);
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    auto why = error{errc::io_error,
                     "cannot rename " + temporary + " to " + path + ": " + std::strerror(errno)};
    ::unlink(temporary.c_str());
    return why;
  }
  auto directory = std::filesystem::path{path}.parent_path();
  if (directory.empty())
    directory = ".";
  int dir_fd = ::open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd < 0)
    return failed("open directory", directory.string());
  const bool synced = ::fsync(dir_fd) == 0;
  ::close(dir_fd);
  if (!synced)
    return failed("sync directory", directory.string());
  return ok();
}

result<std::vector<std::byte>> read_file(const std::string& path) {
  std::ifstream in{path, std::ios::binary | std::ios::ate};
  if (!in)
    return error{errc::io_error, "cannot open " + path + ": " + std::strerror(errno)};
  auto size = in.tellg();
  if (size < 0)
    return error{errc::io_error, "cannot size " + path};
  std::vector<std::byte> bytes(static_cast<std::size_t>(size));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(bytes.data()), size);
  if (!in)
    return error{errc::io_error, "cannot read " + path + ": " + std::strerror(errno)};
  return bytes;
}

} // namespace troupe
