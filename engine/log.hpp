#pragma once
// One logging facility for every troupe process. Levels follow ps-lite's PS_VERBOSE: 0 failures
// and warnings only, 1 also connections and phases, 2 also every message. Each line goes to stderr,
// whole (the sink is thread-safe), as
//
//   2026-12-01 21:15:47.123 E troupe scheduler@127.0.0.1: worker 1 (node 11) was lost: ...
//
// with a prefix naming who speaks: role, rank and host (node_name), plus a part when it helps
// ("server 0@10.0.0.7 data link"). A logger is a small value handed down in options, never looked
// up globally, so two nodes in one test process log under their own names. Backed by spdlog.

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>

namespace troupe {

/// error and warning always print; info from verbose 1 on, debug from 2 on.
enum class log_level : std::uint8_t { error, warning, info, debug };

/// The verbosity from which a level prints: 0, 0, 1, 2.
constexpr int verbosity_of(log_level level) noexcept {
  return level == log_level::info ? 1 : level == log_level::debug ? 2 : 0;
}

class logger {
public:
  /// A logger that prints nothing.
  logger() = default;
  /// Prints the lines whose level is at most `verbose` (0, 1 or 2; errors always), each after
  /// `who`.
  logger(std::string who, int verbose);

  bool enabled(log_level level) const noexcept { return sink_ && verbosity_of(level) <= verbose_; }
  void error(std::string_view text) const;
  /// Something the caller should know that is not a failure (MXNet's warnings).
  void warning(std::string_view text) const;
  void info(std::string_view text) const;
  void debug(std::string_view text) const;
  /// debug(make): calls `make()` for the text only when debug lines print, so a line on a path
  /// that runs for every message costs nothing at the default verbosity.
  template <class Make>
  requires std::is_invocable_r_v<std::string, Make>
  void debug(Make&& make) const {
    if (enabled(log_level::debug))
      log(log_level::debug, std::forward<Make>(make)());
  }
  void log(log_level level, std::string_view text) const;

  /// The same level and sink under another name ("worker 1@host" -> "worker 1@host data link").
  logger named(std::string who) const;
  /// who + " " + part.
  logger part(std::string_view part) const;

  const std::string& who() const noexcept { return who_; }
  int verbose() const noexcept { return verbose_; }

private:
  std::shared_ptr<void> sink_; // the process's stderr sink; null: silent
  std::string who_;
  int verbose_ = 0;
};

/// The prefix convention: "worker 1@10.0.0.2", "scheduler@127.0.0.1", "server (joining)@host".
std::string node_name(std::string_view role, std::optional<std::uint32_t> rank,
                      std::string_view host);

} // namespace troupe
