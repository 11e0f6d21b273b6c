// fake_node: a test double for the nodes troupe-launch starts, so that the launcher's own
// behaviour (environment, prefixes, exit codes, stopping) is tested without a real job.
//
// It reads DMLC_ROLE and prints what the launcher gave it (TROUPE_JOB_TOKEN included: a test
// double's output is the place to check which token reached it) and the directory it runs in,
// then behaves as the FAKE_NODE_*
// variables say:
//   FAKE_NODE_DIR          directory for its files (required): pid-<pid> holds "<role>"; it
//                          claims an index per role by creating <role>-<k> (arrival order)
//   FAKE_NODE_WORKER_MS    how long a worker works before it succeeds (default 0)
//   FAKE_NODE_FAIL_INDEX   the workers (by claimed index, comma-separated) that fail instead,
//   FAKE_NODE_FAIL_DELAY_MS  after (default 300) with exit code FAKE_NODE_FAIL_CODE, or by
//   FAKE_NODE_FAIL_SIGNAL  raising
//   FAKE_NODE_SERVER_FAIL_SIGNAL  servers raise this signal after FAKE_NODE_FAIL_DELAY_MS
//   FAKE_NODE_STAY=1       scheduler and servers do not exit by themselves
//   FAKE_NODE_IGNORE_TERM=1  scheduler and servers ignore SIGTERM
//   FAKE_NODE_FREEZE=1     scheduler and servers stop themselves (SIGSTOP): a frozen node
//   FAKE_NODE_GRANDCHILD=1 every node also forks a process that sleeps (its pid is recorded)
// A worker that succeeds creates done-<index>; the scheduler and servers exit 0 once there are
// DMLC_NUM_WORKER of them. With TROUPE_QUORUM set they stop waiting once that many workers are
// done, as a job with a quorum does, and the scheduler then exits 3 (workers lost) when fewer than
// DMLC_NUM_WORKER are. Every wait ends after 60 s (exit 9), so nothing outlives a broken test.

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <unistd.h>

namespace {

std::string env_or(const char* name, const std::string& fallback) {
  const char* value = std::getenv(name);
  return value ? std::string(value) : fallback;
}

int env_int(const char* name, int fallback) {
  const char* value = std::getenv(name);
  return value && *value ? std::atoi(value) : fallback;
}

void record_pid(const std::filesystem::path& dir, pid_t pid, const std::string& what) {
  std::ofstream(dir / ("pid-" + std::to_string(pid))) << what << "\n";
}

/// The first free index k for which <dir>/<prefix>-<k> could be created.
int claim(const std::filesystem::path& dir, const std::string& prefix) {
  for (int k = 0;; ++k) {
    int fd = ::open((dir / (prefix + "-" + std::to_string(k))).c_str(),
                    O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, 0644);
    if (fd >= 0) {
      ::close(fd);
      return k;
    }
    if (errno != EEXIST)
      return -1;
  }
}

/// Whether `index` is in the comma-separated list `list`.
bool listed(const std::string& list, int index) {
  std::size_t begin = 0;
  while (begin <= list.size()) {
    const auto end = std::min(list.find(',', begin), list.size());
    const auto item = list.substr(begin, end - begin);
    if (!item.empty() && std::atoi(item.c_str()) == index)
      return true;
    begin = end + 1;
  }
  return false;
}

int count_done(const std::filesystem::path& dir) {
  int n = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir))
    n += entry.path().filename().string().starts_with("done-") ? 1 : 0;
  return n;
}

} // namespace

int main(int argc, char** argv) {
  const std::string role = env_or("DMLC_ROLE", "none");
  const std::string dir_name = env_or("FAKE_NODE_DIR", "");
  if (dir_name.empty()) {
    std::fprintf(stderr, "fake_node: FAKE_NODE_DIR is not set\n");
    return 8;
  }
  const std::filesystem::path dir{dir_name};
  record_pid(dir, ::getpid(), role);
  const int index = claim(dir, role);

  std::string args;
  for (int i = 1; i < argc; ++i)
    args += std::string(i > 1 ? "|" : "") + argv[i];
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  std::printf("fake node role=%s index=%d quorum=%s token=%s malloc=%s hint=%s cwd=%s host=%s "
              "root=%s:%s workers=%s servers=%s config=%s echo=%s args=%s\n",
              role.c_str(), index, env_or("TROUPE_QUORUM", "-").c_str(),
              env_or("TROUPE_JOB_TOKEN", "-").c_str(), env_or("GLIBC_TUNABLES", "-").c_str(),
              env_or("TROUPE_RANK_HINT", "-").c_str(), cwd.c_str(),
              env_or("DMLC_NODE_HOST", "-").c_str(), env_or("DMLC_PS_ROOT_URI", "-").c_str(),
              env_or("DMLC_PS_ROOT_PORT", "-").c_str(), env_or("DMLC_NUM_WORKER", "-").c_str(),
              env_or("DMLC_NUM_SERVER", "-").c_str(), env_or("TROUPE_CONFIG", "-").c_str(),
              env_or("FAKE_NODE_ECHO", "-").c_str(), args.c_str());
  std::fprintf(stderr, "fake node stderr role=%s\n", role.c_str());
  std::fflush(stdout);

  if (env_int("FAKE_NODE_GRANDCHILD", 0) == 1) {
    pid_t pid = ::fork();
    if (pid == 0) {
      record_pid(dir, ::getpid(), "grandchild of " + role);
      std::this_thread::sleep_for(std::chrono::seconds(60));
      ::_exit(0);
    }
  }

  using clock = std::chrono::steady_clock;
  const auto give_up = clock::now() + std::chrono::seconds(60);
  if (role == "worker") {
    if (listed(env_or("FAKE_NODE_FAIL_INDEX", ""), index)) {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(env_int("FAKE_NODE_FAIL_DELAY_MS", 300)));
      std::printf("worker %d failing\n", index);
      std::fflush(stdout);
      if (int sig = env_int("FAKE_NODE_FAIL_SIGNAL", 0); sig != 0)
        ::raise(sig);
      return env_int("FAKE_NODE_FAIL_CODE", 1);
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(env_int("FAKE_NODE_WORKER_MS", 0)));
    std::ofstream(dir / ("done-" + std::to_string(index)));
    std::printf("last words without a newline");
    return 0;
  }

  if (int sig = env_int("FAKE_NODE_SERVER_FAIL_SIGNAL", 0); sig != 0 && role == "server") {
    std::this_thread::sleep_for(std::chrono::milliseconds(env_int("FAKE_NODE_FAIL_DELAY_MS", 300)));
    ::raise(sig);
  }
  if (env_int("FAKE_NODE_IGNORE_TERM", 0) == 1)
    std::signal(SIGTERM, SIG_IGN);
  if (env_int("FAKE_NODE_FREEZE", 0) == 1)
    ::raise(SIGSTOP);
  const bool stay = env_int("FAKE_NODE_STAY", 0) == 1;
  const int workers = env_int("DMLC_NUM_WORKER", 1);
  const int quorum = env_int("TROUPE_QUORUM", workers);
  while (clock::now() < give_up) {
    if (const int done = count_done(dir); !stay && done >= quorum) {
      std::printf("%s done\n", role.c_str());
      return role == "scheduler" && done < workers ? 3 : 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return 9;
}
