#include "engine/data/idx.hpp"

#include <algorithm>
#include <array>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fcntl.h>
#include <memory>
#include <string>
#include <unistd.h>
#include <zlib.h>

namespace troupe::data {

namespace {

/// Bytes asked of zlib per gzread: bounds both the int that gzread returns and how far the
/// buffer can run ahead of what the stream has delivered.
constexpr std::size_t read_piece_bytes = std::size_t{1} << 20;

struct gz_closer {
  void operator()(gzFile_s* file) const noexcept { gzclose(file); }
};
using gz_handle = std::unique_ptr<gzFile_s, gz_closer>;

std::string hex32(std::uint32_t value) {
  std::array<char, 16> text{};
  std::snprintf(text.data(), text.size(), "0x%08x", value);
  return text.data();
}

error io_failure(const std::filesystem::path& path, const char* what, int os_error) {
  return {errc::io_error,
          "cannot " + std::string{what} + " " + path.string() + ": " + std::strerror(os_error)};
}

error corrupt(const std::filesystem::path& path, const std::string& what) {
  return {errc::corrupt_data, path.string() + ": " + what};
}

/// An open IDX file being read front to back.
class idx_stream {
public:
  static result<idx_stream> open(const std::filesystem::path& path) {
    // open(2) first, so that a missing or unreadable file reports errno reliably (gzopen does
    // not promise to leave it set).
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0)
      return io_failure(path, "open", errno);
    gzFile file = gzdopen(fd, "rb");
    if (file == nullptr) {
      const int os_error = errno != 0 ? errno : ENOMEM;
      ::close(fd);
      return io_failure(path, "open", os_error);
    }
    gzbuffer(file, 1u << 17);
    return idx_stream{path, gz_handle{file}};
  }

  /// Reads up to `size` bytes into `out`; returns how many arrived (fewer only at the end of the
  /// stream) or the error that stopped it.
  result<std::size_t> read_some(std::uint8_t* out, std::size_t size) {
    std::size_t done = 0;
    while (done < size) {
      const auto piece = static_cast<unsigned>(std::min(size - done, read_piece_bytes));
      errno = 0;
      const int got = gzread(file_.get(), out + done, piece);
      if (got < 0)
        return stream_error();
      if (got == 0)
        break;
      done += static_cast<std::size_t>(got);
    }
    // A gzip stream cut short ends the reads early and leaves zlib's error set; say so rather
    // than just "truncated", since the compressed framing is what broke.
    int code = Z_OK;
    gzerror(file_.get(), &code);
    if (code != Z_OK)
      return stream_error();
    return done;
  }

  /// Reads the big-endian 32-bit header word `name`; a short read is a truncated header.
  result<std::uint32_t> read_word(const char* name) {
    std::array<std::uint8_t, 4> bytes{};
    auto got = read_some(bytes.data(), bytes.size());
    if (!got)
      return got.error();
    if (*got != bytes.size())
      return corrupt(path_, std::string{"truncated header: the file ends before its "} + name);
    return (std::uint32_t{bytes[0]} << 24) | (std::uint32_t{bytes[1]} << 16) |
           (std::uint32_t{bytes[2]} << 8) | std::uint32_t{bytes[3]};
  }

  /// Reads exactly `size` payload bytes, then checks that nothing follows them. The buffer grows
  /// a piece at a time with what arrives, so a header that lies about the size costs at most one
  /// piece beyond the real content.
  result<std::vector<std::uint8_t>> read_payload(std::uint64_t size, const std::string& header) {
    std::vector<std::uint8_t> payload;
    while (payload.size() < size) {
      const std::size_t filled = payload.size();
      const auto piece =
          static_cast<std::size_t>(std::min<std::uint64_t>(size - filled, read_piece_bytes));
      payload.resize(filled + piece);
      auto got = read_some(payload.data() + filled, piece);
      if (!got)
        return got.error();
      payload.resize(filled + *got);
      if (*got < piece)
        return corrupt(path_, "truncated: the header (" + header + ") announces " +
                                  std::to_string(size) + " bytes of data, the file holds " +
                                  std::to_string(payload.size()));
    }
    std::uint8_t extra = 0;
    auto got = read_some(&extra, 1);
    if (!got)
      return got.error();
    if (*got != 0)
      return corrupt(path_, "the file holds more than the " + std::to_string(size) +
                                " bytes of data its header (" + header + ") announces");
    return payload;
  }

  const std::filesystem::path& path() const noexcept { return path_; }

private:
  idx_stream(std::filesystem::path path, gz_handle file)
      : path_(std::move(path)), file_(std::move(file)) {}

  error stream_error() {
    int code = Z_OK;
    const char* message = gzerror(file_.get(), &code);
    if (code == Z_ERRNO)
      return io_failure(path_, "read", errno != 0 ? errno : EIO);
    return corrupt(path_, std::string{"bad gzip stream: "} + (message ? message : "unknown"));
  }

  std::filesystem::path path_;
  gz_handle file_;
};

/// Reads and checks the magic word against `expected`, naming the kind the file turned out to be.
status check_magic(idx_stream& stream, std::uint32_t expected, const char* kind) {
  auto magic = stream.read_word("magic number");
  if (!magic)
    return magic.error();
  if (*magic == expected)
    return ok();
  std::string what = "magic number " + hex32(*magic) + " is not that of an IDX " + kind +
                     " file (" + hex32(expected) + ")";
  if (*magic == idx_images_magic)
    what += "; it is an image file";
  else if (*magic == idx_labels_magic)
    what += "; it is a label file";
  return corrupt(stream.path(), what);
}

} // namespace

result<idx_images> read_idx_images(const std::filesystem::path& path) {
  auto stream = idx_stream::open(path);
  if (!stream)
    return stream.error();
  if (auto magic = check_magic(*stream, idx_images_magic, "image"); !magic)
    return magic.error();
  auto count = stream->read_word("image count");
  if (!count)
    return count.error();
  auto rows = stream->read_word("row count");
  if (!rows)
    return rows.error();
  auto cols = stream->read_word("column count");
  if (!cols)
    return cols.error();
  const std::string header =
      std::to_string(*count) + " x " + std::to_string(*rows) + " x " + std::to_string(*cols);
  if (*rows == 0 || *cols == 0)
    return corrupt(path, "images of zero size (" + header + ")");
  // Each extent is below 2^32, so rows * cols fits in 64 bits; count * per_image is checked by
  // division before it is formed.
  const std::uint64_t per_image = std::uint64_t{*rows} * *cols;
  if (per_image > idx_max_payload_bytes ||
      (*count != 0 && per_image > idx_max_payload_bytes / *count))
    return corrupt(path, "dimensions " + header + " exceed the " +
                             std::to_string(idx_max_payload_bytes) + "-byte limit");
  auto pixels = stream->read_payload(std::uint64_t{*count} * per_image, header);
  if (!pixels)
    return pixels.error();
  idx_images images;
  images.count = *count;
  images.rows = *rows;
  images.cols = *cols;
  images.pixels = std::move(*pixels);
  return images;
}

result<std::vector<std::uint8_t>> read_idx_labels(const std::filesystem::path& path) {
  auto stream = idx_stream::open(path);
  if (!stream)
    return stream.error();
  if (auto magic = check_magic(*stream, idx_labels_magic, "label"); !magic)
    return magic.error();
  auto count = stream->read_word("label count");
  if (!count)
    return count.error();
  if (*count > idx_max_payload_bytes)
    return corrupt(path, "label count " + std::to_string(*count) + " exceeds the " +
                             std::to_string(idx_max_payload_bytes) + "-byte limit");
  return stream->read_payload(*count, std::to_string(*count) + " labels");
}

} // namespace troupe::data
