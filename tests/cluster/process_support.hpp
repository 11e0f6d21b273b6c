#pragma once
// Starting, watching and stopping the processes of a multi-process test: every wait bounded,
// every child stopped by its PID; the environment, ports and pids of a job's nodes that a test
// starts itself. Shared by the launcher tests and the cluster KVStore and identity tests.

#include <arpa/inet.h>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <netinet/in.h>
#include <poll.h>
#include <set>
#include <spawn.h>
#include <sstream>
#include <string>
#include <string_view>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "tests/listening_socket.hpp"
#include "tests/tcp_sockets.hpp"
#include "tests/temp_dir.hpp"

extern char** environ;

namespace troupe::testing {

namespace fs = std::filesystem;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

struct outcome {
  int exit_code = -1; ///< code, or 128 + signal
  std::string out;
  std::string err;
  std::chrono::milliseconds elapsed{0};
  bool timed_out = false;
};

/// A started program whose output is collected. The test's own DMLC_*, TROUPE_* and FAKE_NODE_*
/// variables are not passed on: a child sees only what `env` gives it.
class child_process {
public:
  child_process(const std::string& program, const std::vector<std::string>& args,
                const std::map<std::string, std::string>& env) {
    int out[2], err[2];
    BOOST_TEST_REQUIRE(::pipe2(out, O_CLOEXEC) == 0);
    BOOST_TEST_REQUIRE(::pipe2(err, O_CLOEXEC) == 0);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);

    std::vector<std::string> argv_s{program};
    argv_s.insert(argv_s.end(), args.begin(), args.end());
    std::vector<std::string> env_s;
    for (char** e = environ; *e; ++e) {
      std::string entry = *e;
      std::string name = entry.substr(0, entry.find('='));
      // The launcher's result must not depend on the environment the tests run in.
      if (!env.count(name) && !name.starts_with("DMLC_") && !name.starts_with("TROUPE_") &&
          !name.starts_with("FAKE_NODE_") && !name.starts_with("SLURM") && name != "PORT" &&
          name != "PS_VERBOSE" && name != "GLIBC_TUNABLES")
        env_s.push_back(entry);
    }
    for (const auto& [k, v] : env)
      env_s.push_back(k + "=" + v);
    std::vector<char*> argv_c, env_c;
    for (auto& a : argv_s)
      argv_c.push_back(a.data());
    argv_c.push_back(nullptr);
    for (auto& e : env_s)
      env_c.push_back(e.data());
    env_c.push_back(nullptr);
    start_ = clock_type::now();
    int rc = ::posix_spawn(&pid_, program.c_str(), &actions, nullptr, argv_c.data(), env_c.data());
    posix_spawn_file_actions_destroy(&actions);
    ::close(out[1]);
    ::close(err[1]);
    fds_[0] = out[0];
    fds_[1] = err[0];
    BOOST_TEST_REQUIRE(rc == 0);
  }

  ~child_process() {
    if (pid_ > 0 && !reaped_) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
    }
    for (int fd : fds_)
      if (fd >= 0)
        ::close(fd);
  }

  pid_t pid() const { return pid_; }

  /// Reads the process's output while it runs until its stdout (`stream` 0) or stderr (1) holds
  /// `text` after byte `from` (collected so far), or `limit` passes or the stream closes: whether
  /// it came. What was read stays for wait()'s outcome.
  bool await_output(int stream, std::string_view text, std::chrono::milliseconds limit,
                    std::size_t from = 0) {
    const auto deadline = clock_type::now() + limit;
    while (true) {
      if (early_[stream].find(text, std::min(from, early_[stream].size())) != std::string::npos)
        return true;
      if (fds_[stream] < 0 || clock_type::now() >= deadline)
        return false;
      pollfd probe{fds_[stream], POLLIN, 0};
      if (::poll(&probe, 1, 20) <= 0)
        continue;
      char buffer[4096];
      const ssize_t n = ::read(fds_[stream], buffer, sizeof buffer);
      if (n > 0) {
        early_[stream].append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        ::close(fds_[stream]);
        fds_[stream] = -1;
      }
    }
  }
  /// What await_output has read of stdout (0) or stderr (1) so far.
  const std::string& output_so_far(int stream) const { return early_[stream]; }

  /// Collects output until the launcher exits and closes its pipes, or `limit` passes (then it
  /// is killed and the outcome says timed_out).
  outcome wait(std::chrono::milliseconds limit = 30s) {
    outcome result;
    result.out = early_[0];
    result.err = early_[1];
    const auto deadline = start_ + limit;
    std::string* sinks[2] = {&result.out, &result.err};
    while (fds_[0] >= 0 || fds_[1] >= 0 || !reaped_) {
      auto left =
          std::chrono::duration_cast<std::chrono::milliseconds>(deadline - clock_type::now());
      if (left <= 0ms) {
        result.timed_out = true;
        ::kill(pid_, SIGKILL);
        left = 1000ms;
      }
      std::vector<pollfd> fds;
      for (int fd : fds_)
        if (fd >= 0)
          fds.push_back({fd, POLLIN, 0});
      ::poll(fds.data(), fds.size(), static_cast<int>(std::min<std::int64_t>(left.count(), 20)));
      for (int s = 0; s < 2; ++s) {
        if (fds_[s] < 0)
          continue;
        pollfd probe{fds_[s], POLLIN, 0};
        if (::poll(&probe, 1, 0) <= 0)
          continue;
        char buffer[4096];
        ssize_t n = ::read(fds_[s], buffer, sizeof buffer);
        if (n > 0) {
          sinks[s]->append(buffer, static_cast<std::size_t>(n));
        } else if (n == 0 || errno != EINTR) {
          ::close(fds_[s]);
          fds_[s] = -1;
        }
      }
      if (!reaped_) {
        int status = 0;
        if (::waitpid(pid_, &status, WNOHANG) == pid_) {
          reaped_ = true;
          result.exit_code = WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status);
          result.elapsed =
              std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - start_);
        }
      }
      if (result.timed_out && clock_type::now() > deadline + 5s)
        break;
    }
    return result;
  }

private:
  pid_t pid_ = -1;
  int fds_[2] = {-1, -1};
  /// Output read by await_output before wait().
  std::string early_[2];
  bool reaped_ = false;
  clock_type::time_point start_;
};

inline outcome run(const std::string& program, const std::vector<std::string>& args,
                   const std::map<std::string, std::string>& env,
                   std::chrono::milliseconds limit = 30s) {
  child_process child(program, args, env);
  return child.wait(limit);
}

/// Built with AddressSanitizer (scripts/test.sh --sanitize): every node runs several times slower,
/// and keeps the blocks it frees in quarantine (ASan's quarantine_size_mb, 256 MiB by default).
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool address_sanitized = true;
#else
inline constexpr bool address_sanitized = false;
#endif

/// A memory figure of `pid` in bytes: the line `field` ("VmRSS:", "RssAnon:", "VmHWM:") of
/// /proc/<pid>/status; 0 when the process is gone.
inline std::size_t status_bytes(pid_t pid, std::string_view field) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with(field))
      return std::stoull(line.substr(field.size())) * 1024;
  return 0;
}

/// Resident memory of `pid` in bytes.
inline std::size_t resident_bytes(pid_t pid) {
  return status_bytes(pid, "VmRSS:");
}

/// Whether `pid` is a running process (a zombie has exited: it counts as gone).
inline bool alive(pid_t pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  std::string text;
  if (!std::getline(stat, text))
    return false;
  auto close_paren = text.rfind(')');
  return close_paren != std::string::npos && close_paren + 2 < text.size() &&
         text[close_paren + 2] != 'Z' && text[close_paren + 2] != 'X';
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    lines.push_back(line);
  return lines;
}

/// The lines of `text` that start with `prefix`.
inline std::vector<std::string> with_prefix(const std::string& text, const std::string& prefix) {
  std::vector<std::string> out;
  for (auto& line : lines_of(text))
    if (line.starts_with(prefix))
      out.push_back(line);
  return out;
}

/// How many lines of `text` hold `fragment`.
inline std::size_t count_lines(const std::string& text, const std::string& fragment) {
  std::size_t count = 0;
  for (const auto& line : lines_of(text))
    count += line.find(fragment) != std::string::npos ? 1 : 0;
  return count;
}

/// How many lines of `text` start with `prefix` and hold `fragment`.
inline std::size_t count_lines(const std::string& text, const std::string& prefix,
                               const std::string& fragment) {
  std::size_t count = 0;
  for (const auto& line : with_prefix(text, prefix))
    count += line.find(fragment) != std::string::npos ? 1 : 0;
  return count;
}

// --- the nodes of a job a test starts itself ---------------------------------------------------

/// A port on 127.0.0.1 that was free a moment ago (listened on, then closed).
inline std::uint16_t free_port() {
  return static_cast<std::uint16_t>(listening_socket{}.port());
}

/// The environment of a job of `workers` workers and `servers` servers whose processes a test
/// starts itself (no launcher), as `role`.
inline std::map<std::string, std::string> node_env(const std::string& role, int workers,
                                                   int servers, const std::string& port,
                                                   std::map<std::string, std::string> more = {}) {
  more["DMLC_ROLE"] = role;
  more["DMLC_PS_ROOT_URI"] = "127.0.0.1";
  more["DMLC_PS_ROOT_PORT"] = port;
  more["DMLC_NUM_WORKER"] = std::to_string(workers);
  more["DMLC_NUM_SERVER"] = std::to_string(servers);
  more["DMLC_NODE_HOST"] = "127.0.0.1";
  return more;
}

/// The pid of every rank's kv_worker, from the files they write into `dir` (KV_WORKER_DIR) once
/// their keys are initialised; waits (bounded) until all `workers` have written theirs.
inline std::vector<pid_t> worker_pids(const fs::path& dir, int workers,
                                      std::chrono::milliseconds limit = 60s) {
  std::vector<pid_t> pids(static_cast<std::size_t>(workers), 0);
  const auto deadline = clock_type::now() + limit;
  for (int rank = 0; rank < workers; ++rank) {
    const auto file = dir / ("rank-" + std::to_string(rank));
    while (!fs::exists(file) && clock_type::now() < deadline)
      std::this_thread::sleep_for(20ms);
    std::ifstream(file) >> pids[static_cast<std::size_t>(rank)];
    BOOST_TEST_REQUIRE(pids[static_cast<std::size_t>(rank)] > 0,
                       "no pid from worker rank " << rank << " within " << limit.count() << " ms");
  }
  return pids;
}

/// Waits (bounded) until `pid` listens on at least one TCP port, and returns its ports.
inline std::set<std::uint16_t> await_listening(pid_t pid, std::chrono::milliseconds limit = 30s) {
  const auto deadline = clock_type::now() + limit;
  auto ports = listening_ports_of(pid);
  while (ports.empty() && clock_type::now() < deadline) {
    std::this_thread::sleep_for(20ms);
    ports = listening_ports_of(pid);
  }
  BOOST_TEST_REQUIRE(!ports.empty(), "pid " << pid << " listens on no TCP port");
  return ports;
}

} // namespace troupe::testing
