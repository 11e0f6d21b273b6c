#pragma once
// Per-hop timestamps of a small request's round trip, for docs/data-path.md's "Where a small
// request's time goes" (bench/hop_table.py turns them into the table). Compiled in only by a
// build configured with -DTROUPE_HOP_PROBE=ON; otherwise TROUPE_HOP(...) is nothing.
//
// Each stamp is (CLOCK_MONOTONIC nanoseconds, hop) appended to a file mapped into the process,
// `$TROUPE_HOP_PROBE_DIR/hops.<pid>` (no stamps without the variable), which survives however the
// process ends. The clock is the machine's, so the stamps of a worker and a server on one host
// line up; with one request in flight at a time (kvbench), sorting every process's stamps by
// time gives each round trip's hops in order. A file holds at most `capacity` stamps; later ones
// are dropped.

#ifdef TROUPE_HOP_PROBE

#include <atomic>
#include <cstdint>
#include <cstdlib>
#include <ctime>
#include <fcntl.h>
#include <string>
#include <sys/mman.h>
#include <unistd.h>

namespace troupe::hop_probe {

/// The hops, in the order a request and its reply cross them.
enum class hop : std::uint32_t {
  caller_send = 1,  ///< the facade hands the call to the worker actor (caller's thread)
  link_in,          ///< the client link broker takes the worker's envelope
  link_queued,      ///< ... and has encoded the frame (next: to the socket, or CAF)
  link_written,     ///< CAF reports the frame written to the socket (data_transferred_msg)
  server_prefix,    ///< the server broker read a frame's 8-byte prefix
  server_body,      ///< ... and its body
  server_to_shard,  ///< the server broker sends the request to the shard actor
  shard_in,         ///< the shard actor starts handling it (a scheduler thread)
  shard_out,        ///< the shard sends its reply to the server broker
  server_reply_in,  ///< the server broker takes the reply
  server_queued,    ///< ... and has encoded the reply
  server_written,   ///< CAF reports the reply written
  client_prefix,    ///< the client link read the reply's prefix
  client_body,      ///< ... and its body
  client_to_worker, ///< the client link sends the reply to the worker actor
  delivered,        ///< the worker delivers the call's completion
  caller_woken,     ///< the caller's wait returned
};

struct stamp_record {
  std::int64_t ns;
  std::uint32_t hop;
  std::uint32_t spare;
};

inline constexpr std::size_t capacity = std::size_t{1} << 22;

struct recorder {
  stamp_record* records = nullptr;
  std::atomic<std::size_t> next{0};

  recorder() {
    const char* dir = std::getenv("TROUPE_HOP_PROBE_DIR");
    if (dir == nullptr)
      return;
    const std::string path = std::string(dir) + "/hops." + std::to_string(::getpid());
    const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0)
      return;
    const auto bytes = capacity * sizeof(stamp_record);
    if (::ftruncate(fd, static_cast<off_t>(bytes)) == 0) {
      void* mapped = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      if (mapped != MAP_FAILED)
        records = static_cast<stamp_record*>(mapped);
    }
    ::close(fd);
  }
};

inline recorder& process_recorder() {
  static recorder r;
  return r;
}

inline void stamp(hop h) noexcept {
  auto& r = process_recorder();
  if (r.records == nullptr)
    return;
  const auto at = r.next.fetch_add(1, std::memory_order_relaxed);
  if (at >= capacity)
    return;
  timespec now{};
  ::clock_gettime(CLOCK_MONOTONIC, &now);
  r.records[at] = {now.tv_sec * 1'000'000'000 + now.tv_nsec, static_cast<std::uint32_t>(h), 0};
}

} // namespace troupe::hop_probe

#define TROUPE_HOP(h) ::troupe::hop_probe::stamp(::troupe::hop_probe::hop::h)

#else

#define TROUPE_HOP(h) ((void)0)

#endif
