#pragma once
// The job trace (observe.trace, TROUPE_TRACE, --trace FILE): every node records what happens to
// each key in each round as spans, and writes them as Chrome trace JSON (Perfetto and
// chrome://tracing open it):
//
//   worker  push / pushpull / pull   from the request leaving to its answer (args: key, round,
//                                    server, bytes)
//   server  merge                    a push's first byte in to its last byte summed into its
//                                    round (args: key, round, worker, bytes)
//           update                   the optimizer (or the replace) applying a round's sum, or
//                                    one dist_async push (args: key, round)
//           pull                     a pull (or a pushpull's pull half) arriving to its value
//                                    being sent, waiting for the round included (args: key,
//                                    round, worker, bytes)
//
// Keys are ps-keys (a worker's key, or one slice of a big one: docs/architecture.md). Spans of one
// key overlap (workers' pushes merge at once; a push's ack and the pull after it are both under
// way), so each is an async slice ("ph":"b"/"e", its own id), which trace viewers stack without
// requiring nesting. Times are the wall clock in microseconds, so the spans of the nodes of one
// host line up; across hosts they are as close as the hosts' clocks.
//
// A node writes its spans to `<FILE>.<role>-<rank>` when the job ends (the process identifies the
// node: pid 1 the scheduler, 1000 + rank a server, 2000 + rank a worker). `troupe-launch --trace
// FILE` passes FILE to every node and merges their files into FILE when the job is over;
// merge_trace_files does the same for files collected by hand. The recorder holds at most
// `max_events` spans (then counts what it drops, and says so in the file's metadata), so a long
// job's trace costs bounded memory.

#include <atomic>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/error.hpp"

namespace troupe {

/// One span. `name` must be a string literal (the recorder keeps the pointer).
struct trace_span {
  const char* name = "";
  std::uint64_t key = 0;
  std::uint64_t round = 0;
  /// The worker a server span is about, or the server a worker span went to; -1: none.
  std::int64_t peer = -1;
  std::uint64_t bytes = 0;
  std::int64_t start_us = 0;
  std::int64_t end_us = 0;
};

class job_trace {
public:
  static constexpr std::size_t default_max_events = 2'000'000;

  /// The process's recorder (off until start()).
  static job_trace& process() noexcept;
  /// Microseconds of the wall clock, the spans' time base.
  static std::int64_t now_us() noexcept;

  /// Turns recording on; the node's file is `file_prefix` + "." + role + "-" + rank.
  void start(std::string file_prefix, std::size_t max_events = default_max_events);
  bool enabled() const noexcept { return enabled_.load(std::memory_order_relaxed); }
  /// Names this process's node once the scheduler has admitted it ("worker", 1).
  void set_node(std::string role, std::int64_t rank);
  /// Keeps `span` (or counts it as dropped when max_events are held). Never throws.
  void record(const trace_span& span) noexcept;
  /// Writes the spans recorded so far to this node's file, replacing an earlier one; the path
  /// written. Recording goes on.
  result<std::string> write() const;
  /// The node file's path (empty before start()).
  std::string file() const;
  std::size_t size() const;
  std::uint64_t dropped() const noexcept { return dropped_.load(std::memory_order_relaxed); }
  /// Drops every span and turns recording off (tests).
  void reset();

private:
  std::atomic<bool> enabled_{false};
  std::atomic<std::uint64_t> dropped_{0};
  mutable std::mutex mutex_;
  std::string prefix_;
  std::string role_ = "node";
  std::int64_t rank_ = -1;
  std::size_t max_events_ = default_max_events;
  std::vector<trace_span> spans_;
};

/// Times one span on the process's recorder: start at construction, recorded by finish() (or
/// at destruction) unless recording is off.
inline std::int64_t trace_start_time() noexcept {
  return job_trace::process().enabled() ? job_trace::now_us() : 0;
}

/// Merges node trace files (as job_trace::write makes them) into one Chrome trace at `output`.
/// A part that is not such a file is refused naming it; nothing is written then.
status merge_trace_files(const std::string& output, std::span<const std::string> parts);

/// The node files of `file_prefix` in its directory (FILE.scheduler-0, FILE.server-1, ...),
/// sorted.
std::vector<std::string> node_trace_files(const std::string& file_prefix);

} // namespace troupe
