#pragma once
// What troupe's same-host shared-memory arenas (actors/logic/shm_arena.hpp) keep open: a sender
// holds its arena's descriptor only until the peer has answered its offer, so tests check that
// none is left once the arenas are set up.

#include <filesystem>
#include <set>
#include <string>
#include <system_error>
#include <unistd.h>

namespace troupe::testing {

/// The descriptors of process `pid` that refer to a troupe arena (memfd "troupe-arena").
inline std::set<std::string> arena_descriptors(pid_t pid = ::getpid()) {
  std::set<std::string> found;
  std::error_code ec;
  const auto dir = std::filesystem::path("/proc") / std::to_string(pid) / "fd";
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    std::error_code unreadable;
    const auto target = std::filesystem::read_symlink(entry.path(), unreadable);
    if (!unreadable && target.string().starts_with("/memfd:troupe-arena"))
      found.insert(entry.path().filename().string());
  }
  return found;
}

} // namespace troupe::testing
