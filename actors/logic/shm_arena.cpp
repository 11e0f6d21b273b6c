#include "actors/logic/shm_arena.hpp"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <fstream>
#include <optional>
#include <string_view>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/utsname.h>
#include <unistd.h>
#include <utility>

namespace troupe {

namespace {

constexpr std::size_t region_alignment = 64;

std::string errno_text(int code) {
  return std::string(std::strerror(code));
}

constexpr std::string_view proc_prefix = "/proc/";
constexpr std::string_view fd_infix = "/fd/";
constexpr std::size_t max_number_digits = 9;
/// boot_id is a UUID of 36 characters; anything longer is not one.
constexpr std::size_t max_boot_id_bytes = 36;
/// A namespace's inode is an unsigned 64-bit number: at most 20 decimal digits.
constexpr std::size_t max_inode_digits = 20;

/// A decimal number of 1..9 digits without a leading zero, at the start of `text`; the rest.
std::optional<std::string_view> skip_number(std::string_view text) {
  std::size_t digits = 0;
  while (digits < text.size() && text[digits] >= '0' && text[digits] <= '9')
    ++digits;
  if (digits == 0 || digits > max_number_digits || (digits > 1 && text[0] == '0'))
    return std::nullopt;
  return text.substr(digits);
}

/// The inode of this process's namespace of `kind` ("net", "pid"), from the link
/// /proc/self/ns/<kind>, which reads "<kind>:[<inode>]": its decimal digits, or nullopt when the
/// link cannot be read or reads otherwise.
std::optional<std::string> namespace_inode(std::string_view kind) {
  const std::string path = "/proc/self/ns/" + std::string(kind);
  char target[64];
  const ssize_t n = ::readlink(path.c_str(), target, sizeof target);
  if (n <= 0 || static_cast<std::size_t>(n) >= sizeof target)
    return std::nullopt;
  std::string_view text(target, static_cast<std::size_t>(n));
  const std::string prefix = std::string(kind) + ":[";
  if (!text.starts_with(prefix) || !text.ends_with(']'))
    return std::nullopt;
  text = text.substr(prefix.size(), text.size() - prefix.size() - 1);
  if (text.empty() || text.size() > max_inode_digits ||
      text.find_first_not_of("0123456789") != std::string_view::npos)
    return std::nullopt;
  return std::string(text);
}

} // namespace

std::string compute_host_identity() {
  std::string boot_id;
  std::ifstream in("/proc/sys/kernel/random/boot_id");
  std::getline(in, boot_id);
  if (boot_id.empty() || boot_id.size() > max_boot_id_bytes ||
      boot_id.find('/') != std::string::npos)
    return std::string();
  std::string identity = boot_id;
  for (const char* kind : {"net", "pid"}) {
    auto inode = namespace_inode(kind);
    if (!inode)
      return std::string();
    identity += '/';
    identity += kind;
    identity += ':';
    identity += *inode;
  }
  utsname names{};
  if (::uname(&names) == 0)
    identity += '/' + std::string(names.nodename, ::strnlen(names.nodename, sizeof names.nodename));
  return identity;
}

const std::string& host_identity() {
  static const std::string identity = compute_host_identity();
  return identity;
}

bool is_arena_name(std::string_view name) noexcept {
  if (!name.starts_with(proc_prefix))
    return false;
  auto rest = skip_number(name.substr(proc_prefix.size()));
  if (!rest || !rest->starts_with(fd_infix))
    return false;
  rest = skip_number(rest->substr(fd_infix.size()));
  return rest && rest->empty();
}

// ================================================================================================
// shm_send_arena

result<std::unique_ptr<shm_send_arena>> shm_send_arena::create(std::size_t bytes) {
  if (bytes == 0)
    return error{errc::invalid_argument, "shared-memory arena of 0 bytes"};
  const int fd = ::memfd_create("troupe-arena", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0)
    return error{errc::io_error, "memfd_create: " + errno_text(errno)};
  auto fail = [&](const char* step) {
    const int code = errno;
    ::close(fd);
    return error{errc::io_error, std::string(step) + " of a shared-memory arena of " +
                                     std::to_string(bytes) + " bytes: " + errno_text(code)};
  };
  if (::ftruncate(fd, static_cast<off_t>(bytes)) != 0)
    return fail("ftruncate");
  // The size is fixed from here on: a reader's mapping can never lose its pages.
  if (::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0)
    return fail("sealing");
  void* base = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (base == MAP_FAILED)
    return fail("mmap");
  std::string name = std::string(proc_prefix) + std::to_string(::getpid()) + std::string(fd_infix) +
                     std::to_string(fd);
  return std::unique_ptr<shm_send_arena>(
      new shm_send_arena(fd, std::move(name), static_cast<std::byte*>(base), bytes));
}

shm_send_arena::~shm_send_arena() {
  unlink();
  ::munmap(base_, size_);
}

void shm_send_arena::unlink() noexcept {
  if (fd_ >= 0) {
    ::close(fd_);
    fd_ = -1;
  }
}

namespace {
/// How many times the new region and the bytes in flight the free start of the arena must hold
/// before a region goes there while the end still has room (shm_send_arena::allocate).
constexpr std::size_t early_wrap_room = 4;
} // namespace

std::optional<std::size_t> shm_send_arena::allocate(std::size_t bytes) {
  if (bytes == 0 || bytes > size_)
    return std::nullopt;
  const std::size_t need = (bytes + region_alignment - 1) / region_alignment * region_alignment;
  if (need > size_)
    return std::nullopt;
  std::size_t at;
  if (regions_.empty()) {
    at = 0;
  } else {
    const std::size_t front = regions_.front().offset;
    const std::size_t back_end = regions_.back().end;
    const bool wrapped = regions_.back().offset < front;
    if (wrapped) {
      // In use: [front, ...) up to the old end, and [0, back_end): room only in between.
      if (need > front - back_end)
        return std::nullopt;
      at = back_end;
    } else if (early_wrap_room * (need + (back_end - front)) <= front) {
      // In use: [front, back_end). The free start holds several times this region and what is
      // in flight: wrap early, to keep few pages in use (and warm).
      at = 0;
    } else if (need <= size_ - back_end) {
      // Wrapping now would leave only [0, front) for everything sent until the front region is
      // released. Wrapping whenever the start had room for the region (as before) left room for a
      // region or two when a few were in flight, and the rest went inline while most of the
      // arena stood free: a simulation of 80 KiB regions with up to 6 in flight, released in
      // order, failed 19 % of allocations so, none with the start holding 4 times as much.
      at = back_end;
    } else if (need <= front) {
      at = 0;
    } else {
      return std::nullopt;
    }
  }
  regions_.push_back(region{at, at + need, false});
  return at;
}

bool shm_send_arena::release(std::uint64_t offset) {
  // Outstanding regions are few (each one is a tensor chunk in flight) and mostly released
  // near the front, so a linear search from the front is fine.
  auto i = regions_.begin();
  for (; i != regions_.end(); ++i)
    if (i->offset == offset && !i->released)
      break;
  if (i == regions_.end())
    return false;
  i->released = true;
  while (!regions_.empty() && regions_.front().released)
    regions_.pop_front();
  return true;
}

// ================================================================================================
// shm_peer_arena

result<std::shared_ptr<shm_peer_arena>> shm_peer_arena::open(const std::string& name,
                                                             std::size_t bytes) {
  if (!is_arena_name(name))
    return error{errc::invalid_argument, "arena name \"" + name + "\" is not /proc/<pid>/fd/<fd>"};
  if (bytes == 0)
    return error{errc::invalid_argument, "arena of 0 bytes"};
  const int fd = ::open(name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return error{errc::io_error, "open " + name + ": " + errno_text(errno)};
  auto refuse = [&](errc code, std::string why) {
    ::close(fd);
    return error{code, "arena " + name + " " + why};
  };
  // Only a memory file sealed against shrinking is safe to map: its owner could otherwise cut
  // it short and make every read of the mapping fault.
  const int seals = ::fcntl(fd, F_GET_SEALS);
  if (seals < 0)
    return refuse(errc::invalid_argument,
                  "is not a sealed memory file (" + errno_text(errno) + ")");
  if ((seals & F_SEAL_SHRINK) == 0)
    return refuse(errc::invalid_argument, "is not sealed against shrinking");
  struct stat info {};
  if (::fstat(fd, &info) != 0)
    return refuse(errc::io_error, "cannot be examined: " + errno_text(errno));
  if (info.st_size < 0 || static_cast<std::uint64_t>(info.st_size) < bytes)
    return refuse(errc::invalid_argument, "has " + std::to_string(info.st_size) + " bytes, " +
                                              std::to_string(bytes) + " announced");
  void* base = ::mmap(nullptr, bytes, PROT_READ, MAP_SHARED, fd, 0);
  const int code = errno;
  ::close(fd);
  if (base == MAP_FAILED)
    return error{errc::io_error, "mmap " + name + ": " + errno_text(code)};
  return std::shared_ptr<shm_peer_arena>(
      new shm_peer_arena(static_cast<const std::byte*>(base), bytes));
}

shm_peer_arena::~shm_peer_arena() {
  ::munmap(const_cast<std::byte*>(base_), size_);
}

std::shared_ptr<const void> shm_peer_arena::hold(std::uint64_t offset) {
  // The owner keeps the mapping (this object) alive as long as the tensor views it.
  auto self = shared_from_this();
  return std::shared_ptr<const void>(
      static_cast<const void*>(base_ + offset),
      [self = std::move(self), offset](const void*) { self->release(offset); });
}

void shm_peer_arena::release(std::uint64_t offset) noexcept {
  std::function<void()> wake;
  try {
    std::lock_guard<std::mutex> guard{mutex_};
    if (detached_)
      return;
    const bool was_empty = releases_.empty();
    releases_.push_back(offset);
    if (was_empty)
      wake = wake_;
  } catch (...) {
    // Out of memory: the region stays taken, and the sender falls back to inline frames.
    return;
  }
  if (wake) {
    try {
      wake();
    } catch (...) {
      // The broker is told with the next release; until then the region stays taken.
    }
  }
}

std::vector<std::uint64_t> shm_peer_arena::take_releases() {
  std::lock_guard<std::mutex> guard{mutex_};
  return std::exchange(releases_, {});
}

void shm_peer_arena::on_release(std::function<void()> wake) {
  std::lock_guard<std::mutex> guard{mutex_};
  wake_ = std::move(wake);
}

void shm_peer_arena::detach() {
  std::lock_guard<std::mutex> guard{mutex_};
  detached_ = true;
  wake_ = nullptr;
  releases_.clear();
}

} // namespace troupe
