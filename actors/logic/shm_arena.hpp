#pragma once
// The same-host fast path of a data connection (actors/data_link.hpp, docs/data-path.md): tensor
// payloads travel through shared memory and only small frames through the socket.
//
// Each end that sends creates one arena for its own direction (shm_send_arena): an anonymous
// memory file (memfd_create) of a fixed size, sealed so that it can never shrink or grow, and
// offers it by the path the peer opens it at, /proc/<pid>/fd/<fd>. It closes that descriptor as
// soon as the peer has answered: from then on the memory lives only as long as the two mappings.
// Nothing has a name in any file system, so nothing is left behind when a process dies, and
// /dev/shm's size (64 MiB in a default container) does not matter.
// The peer opens it read-only, refuses it unless it is sealed against shrinking, and maps it
// (shm_peer_arena). A payload is copied into a region of the ring (the
// copy that otherwise goes into CAF's write buffer), the frame carries (offset, bytes), the
// receiver's tensor views its mapping in place, and when the receiver drops the tensor the region
// goes back to the sender in an arena_release frame. The sender reclaims regions in FIFO order.
//
// Trust: the receiver checks every reference against the arena's bounds (wire::decode_body) and
// reads the bytes as plain numbers; the sender never reuses a region before its release arrives.
// The seals make a reader's mapping safe from its owner: an arena that could shrink under the
// mapping (and make the reader fault with SIGBUS in the copy) is never mapped. Opening another
// process's descriptor needs the same user (ptrace read access); a peer in another PID namespace
// cannot be opened, and its direction stays on TCP.

#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "engine/error.hpp"

namespace troupe {

/// This host's identity for the link hello, computed once per process:
///   <boot_id>/net:<inode>/pid:<inode>/<uts hostname>
/// boot_id from /proc/sys/kernel/random/boot_id (36 characters), the inodes (at most 20 digits
/// each) those of /proc/self/ns/net and /proc/self/ns/pid, the hostname at most 64 bytes: at
/// most 151 bytes. Two processes with the same identity share a kernel, hence memory; a network
/// namespace of its own makes a process another host (an emulated one: its peers are reached
/// through its own network stack, and should be reached only that way), and a PID namespace of
/// its own makes /proc/<pid>/fd/<fd> of the arena's creator name another process, or none. The
/// mount namespace is left out: the arena is a memory file reached through procfs's fd link,
/// which does not depend on the opener's other mounts, so a private mount namespace (a private
/// /dev/shm or /tmp) must not cost the fast path; it could change only which procfs is at /proc,
/// and a procfs shows the PID namespace of the process that mounted it, so a setup that mounts
/// another one there (a container) puts its processes in that PID namespace, which the identity
/// includes. Empty when boot_id or either namespace cannot be read (then no arena is ever
/// offered).
const std::string& host_identity();
/// What host_identity() is cached from, computed anew: for a test that changes namespaces.
std::string compute_host_identity();

/// Smallest payload that goes through the arena; smaller ones are copied into the frame, where
/// a copy is as cheap as the bookkeeping.
inline constexpr std::size_t default_shm_threshold_bytes = std::size_t{64} << 10;

/// Whether `name` has the form shm_send_arena gives names: "/proc/<pid>/fd/<fd>", each a
/// decimal number of at most 9 digits without leading zeros.
bool is_arena_name(std::string_view name) noexcept;

/// The sending side's arena: a sealed memory file mapped read-write, handed out as a ring of
/// regions. Not thread-safe: one per connection, used on its broker's thread.
class shm_send_arena {
public:
  /// Creates a memory file of `bytes` bytes, seals its size (F_SEAL_SHRINK, F_SEAL_GROW,
  /// F_SEAL_SEAL) and maps it; its name is the path of the descriptor kept open for the peer.
  /// Errors (io_error) name the step that failed; nothing is left behind then.
  static result<std::unique_ptr<shm_send_arena>> create(std::size_t bytes);

  shm_send_arena(const shm_send_arena&) = delete;
  shm_send_arena& operator=(const shm_send_arena&) = delete;
  /// Unmaps, and closes the descriptor if unlink() was not called.
  ~shm_send_arena();

  /// "/proc/<pid>/fd/<fd>": where the peer opens the arena, until unlink().
  const std::string& name() const noexcept { return name_; }
  std::size_t size() const noexcept { return size_; }
  std::span<std::byte> bytes() const noexcept { return {base_, size_}; }
  /// Closes the descriptor the name refers to (the mappings stay valid): the arena can no longer
  /// be opened. Idempotent.
  void unlink() noexcept;

  /// A region of `bytes` bytes (> 0) at a 64-byte-aligned offset, or nullopt when the ring has no
  /// contiguous room (the caller sends inline). Regions are handed out in ring order; when the
  /// free beginning of the arena holds four times the region and what is in flight, a new region
  /// goes there, so the pages in use stay few; otherwise the end is used first.
  std::optional<std::size_t> allocate(std::size_t bytes);
  /// Marks the region at `offset` released and reclaims the released prefix of the ring. False
  /// (and nothing changes) when no outstanding region starts at `offset`.
  bool release(std::uint64_t offset);
  /// Regions handed out and not yet reclaimed (released ones behind an unreleased one included).
  std::size_t outstanding() const noexcept { return regions_.size(); }

private:
  shm_send_arena(int fd, std::string name, std::byte* base, std::size_t size) noexcept
      : fd_(fd), name_(std::move(name)), base_(base), size_(size) {}

  struct region {
    std::size_t offset;
    std::size_t end; ///< offset + bytes, rounded up to the alignment
    bool released;
  };
  int fd_; ///< -1 once unlinked
  std::string name_;
  std::byte* base_;
  std::size_t size_;
  std::deque<region> regions_; ///< in allocation order: the front is reclaimed first
};

/// The receiving side's view of the peer's arena: mapped read-only, shared by every tensor that
/// views it (the mapping goes when the connection and the last such tensor are gone). Collects
/// the releases of those tensors from whichever thread drops them. Thread-safe.
class shm_peer_arena : public std::enable_shared_from_this<shm_peer_arena> {
public:
  /// Opens `name` (checked with is_arena_name) read-only and maps `bytes` of it; refuses a file
  /// that is not sealed against shrinking or is smaller than `bytes`. Errors (invalid_argument,
  /// io_error) say why.
  static result<std::shared_ptr<shm_peer_arena>> open(const std::string& name, std::size_t bytes);

  shm_peer_arena(const shm_peer_arena&) = delete;
  shm_peer_arena& operator=(const shm_peer_arena&) = delete;
  ~shm_peer_arena();

  std::span<const std::byte> bytes() const noexcept { return {base_, size_}; }

  /// An owner for a decoded tensor viewing [offset, ...): when its last copy goes, `offset` is
  /// queued for release and, if the queue was empty, the wake callback runs (outside the lock).
  std::shared_ptr<const void> hold(std::uint64_t offset);
  /// Takes the queued releases.
  std::vector<std::uint64_t> take_releases();
  /// Called when a release is queued into an empty queue (the broker then sends them). Set once,
  /// before any hold(); detach() clears it.
  void on_release(std::function<void()> wake);
  /// The connection is gone: releases are dropped from now on (the mapping stays while held).
  void detach();

private:
  shm_peer_arena(const std::byte* base, std::size_t size) noexcept : base_(base), size_(size) {}
  void release(std::uint64_t offset) noexcept;

  const std::byte* base_;
  std::size_t size_;
  std::mutex mutex_;
  std::vector<std::uint64_t> releases_;
  std::function<void()> wake_;
  bool detached_ = false;
};

} // namespace troupe
