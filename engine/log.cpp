#include "engine/log.hpp"

#include <mutex>
#include <spdlog/sinks/stdout_sinks.h>
#include <spdlog/spdlog.h>

namespace troupe {
namespace {

/// The one stderr sink of the process: stderr is one file whatever the loggers, so its lines are
/// serialised in one place.
std::shared_ptr<spdlog::logger> stderr_sink() {
  static std::shared_ptr<spdlog::logger> sink = [] {
    auto made = std::make_shared<spdlog::logger>("troupe",
                                                 std::make_shared<spdlog::sinks::stderr_sink_mt>());
    made->set_pattern("%Y-%m-%d %H:%M:%S.%e %L troupe %v");
    made->set_level(spdlog::level::trace);
    made->flush_on(spdlog::level::trace);
    return made;
  }();
  return sink;
}

spdlog::level::level_enum spdlog_level(log_level level) {
  switch (level) {
  case log_level::error:
    return spdlog::level::err;
  case log_level::warning:
    return spdlog::level::warn;
  case log_level::info:
    return spdlog::level::info;
  case log_level::debug:
    return spdlog::level::debug;
  }
  return spdlog::level::info;
}

} // namespace

logger::logger(std::string who, int verbose)
    : sink_(stderr_sink()), who_(std::move(who)), verbose_(verbose) {}

void logger::log(log_level level, std::string_view text) const {
  if (!enabled(level))
    return;
  static_cast<spdlog::logger*>(sink_.get())->log(spdlog_level(level), "{}: {}", who_, text);
}

void logger::error(std::string_view text) const {
  log(log_level::error, text);
}
void logger::warning(std::string_view text) const {
  log(log_level::warning, text);
}
void logger::info(std::string_view text) const {
  log(log_level::info, text);
}
void logger::debug(std::string_view text) const {
  log(log_level::debug, text);
}

logger logger::named(std::string who) const {
  logger copy = *this;
  copy.who_ = std::move(who);
  return copy;
}

logger logger::part(std::string_view part) const {
  return named(who_ + " " + std::string(part));
}

std::string node_name(std::string_view role, std::optional<std::uint32_t> rank,
                      std::string_view host) {
  std::string name{role};
  if (rank)
    name += " " + std::to_string(*rank);
  if (!host.empty())
    name += "@" + std::string(host);
  return name;
}

} // namespace troupe
