#pragma once
// What troupe's same-host shared-memory arenas (actors/logic/shm_arena.hpp) leave in /dev/shm:
// tests compare it before and after a job, which must leave nothing behind.

#include <filesystem>
#include <set>
#include <string>
#include <system_error>

namespace troupe::testing {

/// Names of the /dev/shm entries that look like troupe arenas ("troupe-...").
inline std::set<std::string> arena_files() {
  std::set<std::string> names;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator("/dev/shm", ec))
    if (entry.path().filename().string().starts_with("troupe-"))
      names.insert(entry.path().filename().string());
  return names;
}

} // namespace troupe::testing
