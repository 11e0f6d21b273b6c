// troupe-launch: starts a whole job, as MXNet's tools/launch.py does.
//
//   troupe-launch -n W [-s S] [--quorum K] [-H hostfile] [--launcher local|ssh|slurm]
//                 [--config FILE] [--env NAME:VALUE]... [--env-server ...] [--env-worker ...]
//                 [--sync-dst-dir DIR] [--restart-servers[=N]] [--trace FILE] [--summary]
//                 -- COMMAND ARGS...
//   troupe-launch -n W [-s S] --emit k8s --image IMAGE [--name NAME] ... -- COMMAND ARGS...
//   troupe-launch --merge-trace FILE
//
// launch.py's flags mean what they mean there (docs/launching.md maps them): --env NAME:VALUE or
// NAME=VALUE sets a variable for every node and a bare --env NAME passes on this environment's
// value, --env-server and --env-worker do the same for one role; a hostfile line is `host`,
// `host:sshport`, optionally followed by MPI's `slots=N` (ignored, as launch.py does); and
// --sync-dst-dir copies the working directory to DIR on every host with rsync before an ssh job
// starts, the remote nodes then running there; each path they are given that lies inside the
// working directory names its copy under DIR (synced_paths).
//
// Two more modes start no job of their own. --launcher slurm runs under srun, one task per node:
// each task becomes the node its SLURM_PROCID names (0 the scheduler, then the servers, then the
// workers; apps/slurm_tasks.hpp) by exec. --emit k8s writes the job's Kubernetes manifests on
// stdout (apps/k8s_manifests.hpp).
//
// It starts the scheduler (`troupe-node --role scheduler`), S servers (`troupe-node --role
// server`, S defaults to W) and W workers running COMMAND, each with DMLC_ROLE,
// DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT, DMLC_NUM_WORKER, DMLC_NUM_SERVER (TROUPE_QUORUM with
// --quorum, TROUPE_CONFIG with --config) set, and prints every line they write prefixed with
// `[scheduler]`, `[server i]` or `[worker i]` (i is the node's rank: each asks the scheduler for
// the rank of its start index through TROUPE_RANK_HINT, which a node whose program is not
// troupe's ignores). It exits 0 when every worker succeeded and the scheduler and servers then
// exited by themselves. A worker that fails while the job runs is lost: within the quorum
// (--quorum K, TROUPE_QUORUM or [sync] quorum: up to W - K workers) the job goes on without it,
// and the launcher exits 3 with a summary line naming the lost workers, as the scheduler does (it
// exits 3 itself then, which is no failure); beyond the quorum, or when the scheduler or a server
// fails, it stops the rest and exits with that failure's code. Exit codes are listed in --help.
// A worker the scheduler declares lost (silent for timeouts.peer: frozen, hung, cut off; or its
// connection closed) and that has not ended --stop-grace later is stopped by the launcher, by PID
// (SIGCONT, then SIGKILL to its process group), and then counts as a failed worker: the scheduler
// tells the launcher on a pipe it gets as descriptor 3 (troupe-node's TROUPE_LAUNCHER_EVENTS_FD),
// so the job ends by itself whatever state the lost process is in.
//
// With --restart-servers[=N] (default 3) a server that dies while the job runs is started again
// with its rank hint, environment and command plus --recover, up to N times per server
// (job::restart_server): it loads its last checkpoint and takes its rank back while the scheduler
// holds it open (timeouts.server_rejoin), and the workers send again what it may have lost. The
// launcher refuses the flag (exit 2) when the job's configuration lacks checkpoint.dir or
// timeouts.server_rejoin (which itself needs periodic checkpoints).
//
// --trace FILE gives every node TROUPE_TRACE (observe.trace: actors/logic/job_trace.hpp) and, when
// the job is over, merges the node files FILE.<role>-<rank> into FILE (only those on this host,
// beside FILE or, with --sync-dst-dir, beside its copy under DIR: in ssh mode, copy the others
// beside FILE and run --merge-trace FILE). --summary gives every node TROUPE_SUMMARY. SIGUSR1 to
// the launcher goes on to its local scheduler and servers, which print their summary.
//
// --max-workers M gives every node TROUPE_MAX_WORKERS (job.max_workers): the running job takes up
// to M workers in all. SIGUSR2 to the launcher starts one more worker (local or ssh mode), which
// joins the running job with the next rank; beyond M it is refused, and the launcher says so.
//
// Local mode forks every node on this machine; ssh mode runs the scheduler here and the servers
// and workers round-robin over the hosts of the hostfile through `ssh -o BatchMode=yes`.
//
// A usage error (bad flags, config, hostfile, a port in use, a failed --sync-dst-dir copy) is one
// plain line "troupe-launch: ..." and exit code 2, before anything starts. Once the job runs, the
// launcher's own messages (a node that could not start or failed, signals, nodes being stopped) go
// through troupe::logger as "troupe-launch"; with verbose 1 ([node] verbose or PS_VERBOSE) it also
// logs each node's start and end. What to do when a node fails is decided in one place,
// job::on_worker_failed and job::on_node_failed.
//
// The job token: when the configuration names none (no job.token, job.token_file or
// TROUPE_JOB_TOKEN), the launcher makes one, 32 random bytes from getrandom(2) as 64 hex digits,
// so that only the nodes it starts can join the job. Every node gets the job's token through the
// TROUPE_JOB_TOKEN environment variable, never on a command line (`ps` shows those to every user)
// and never in a log line: a local node in the environment it is spawned with; an ssh node as the
// first line on its ssh channel's stdin, which the remote shell reads and exports before it runs
// the program (the other variables of ssh mode travel on the remote command line, which is why
// the token does not). In ssh mode a configured token travels the same way, so that remote nodes
// use the launcher's token whatever their own environment holds.
//
// The launcher learns the quorum from its own configuration only: a quorum given to the worker
// program alone (`-- train_mnist --quorum 2`) reaches the scheduler through worker rank 0, but a
// launcher that does not know it stops the job at the first lost worker. Give --quorum to the
// launcher, which passes it to every node as TROUPE_QUORUM.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <arpa/inet.h>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <csignal>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <netinet/in.h>
#include <optional>
#include <poll.h>
#include <regex>
#include <spawn.h>
#include <string>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

#include "actors/config/config.hpp"
#include "actors/logic/job_trace.hpp"
#include "apps/k8s_manifests.hpp"
#include "apps/slurm_tasks.hpp"
#include "engine/log.hpp"

extern char** environ;

namespace {

using troupe::errc;
using troupe::error;
using troupe::result;
using troupe::status;
using clock_type = std::chrono::steady_clock;
using namespace std::chrono_literals;

// Exit codes of the launcher itself (a worker's code is passed through).
constexpr int exit_usage = 2;            ///< bad flags, config, hostfile, port in use
constexpr int exit_lost_workers = 3;     ///< finished, with workers lost within the quorum
constexpr int exit_finish_timeout = 124; ///< scheduler or servers outlived the workers
constexpr int exit_cannot_start = 127;   ///< a node's program could not be started

/// Variables the launcher sets itself; --env may not set them.
const std::vector<std::string> launcher_variables{
    "DMLC_ROLE",       "DMLC_PS_ROOT_URI", "DMLC_PS_ROOT_PORT", "DMLC_NUM_WORKER",
    "DMLC_NUM_SERVER", "TROUPE_CONFIG",    "TROUPE_RANK_HINT",  "TROUPE_QUORUM"};

/// The variable that carries the job token to every node (see the file comment).
constexpr const char* token_variable = "TROUPE_JOB_TOKEN";

struct host {
  std::string name;
  std::optional<int> ssh_port;
};

struct options {
  int num_workers = 0;
  std::optional<int> num_servers;
  std::optional<int> quorum;
  /// --max-workers: workers the running job may take in all (TROUPE_MAX_WORKERS).
  std::optional<int> max_workers;
  std::string hostfile;
  std::string launcher;
  std::optional<std::string> config;
  /// --env, --env-server, --env-worker as given: NAME=VALUE, NAME:VALUE or NAME (env_pair).
  std::vector<std::string> env;
  std::vector<std::string> env_server;
  std::vector<std::string> env_worker;
  /// --sync-dst-dir: ssh mode copies this directory here to DIR on every host first.
  std::string sync_dst_dir;
  std::string node_binary;
  std::string stop_grace = "5s";
  std::string finish_timeout = "10s";
  /// --restart-servers[=N]: how often each server may be restarted with --recover; 0: never.
  int restart_servers = 0;
  std::vector<std::string> ssh_options;
  /// --trace FILE: every server and worker records the job trace; merged into FILE at the end.
  std::string trace;
  /// --merge-trace FILE: only merge FILE.<role>-<rank> files into FILE, start nothing.
  std::string merge_trace;
  /// --summary: every server and worker prints its summary at the end (TROUPE_SUMMARY).
  bool summary = false;
  /// --emit k8s: write the job's Kubernetes manifests instead of starting it.
  std::string emit;
  std::string image;
  std::string name = "troupe";
  std::string k8s_secret;
  std::vector<std::string> command;
};

/// One started node.
struct child {
  std::string label; ///< "scheduler", "server 1", "worker 0": the prefix of its lines
  troupe::node_role role = troupe::node_role::worker;
  pid_t pid = -1;         ///< also its process group
  int fds[2] = {-1, -1};  ///< read ends of its stdout and stderr
  int stdin_fd = -1;      ///< write end of its stdin, held open (ssh mode), or -1
  std::string pending[2]; ///< a line not yet ended by '\n', per stream
  bool reaped = false;
  int exit_code = 0; ///< code, or 128 + signal
  std::string how;   ///< "exited with code 3", "was killed by signal 9"
  /// How to start it again (a server under --restart-servers): the command that recovers it
  /// (its own plus --recover, inside ssh's in ssh mode), its variables and stdin; empty: never.
  std::vector<std::string> recover_argv;
  std::vector<std::string> env;
  bool hold_stdin = false;
  std::string stdin_text;
  int restarts = 0; ///< how often it was started again
  /// A worker the scheduler declared lost: when the launcher stops it unless it has ended.
  std::optional<std::chrono::steady_clock::time_point> stop_lost_at;
};

/// Writes all of `text` to `fd`; a closed stdout (EPIPE) is not the job's failure.
void write_all(int fd, std::string_view text) {
  while (!text.empty()) {
    ssize_t n = ::write(fd, text.data(), text.size());
    if (n < 0 && errno == EINTR)
      continue;
    if (n <= 0)
      return;
    text.remove_prefix(static_cast<std::size_t>(n));
  }
}

/// A usage error: one plain line on stderr, the launcher's answer to its command line (exit code
/// 2, nothing started). What happens once the job runs goes through the logger instead.
int usage_error(const std::string& message) {
  write_all(STDERR_FILENO, "troupe-launch: " + message + "\n");
  return exit_usage;
}

/// Shell-quotes one word for the remote command of ssh mode.
std::string quote(std::string_view word) {
  std::string out = "'";
  for (char c : word)
    out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

result<std::vector<host>> read_hostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    return error{errc::io_error, "cannot read hostfile " + path + ": " + std::strerror(errno)};
  std::vector<host> hosts;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    line = line.substr(0, line.find('#'));
    auto first = line.find_first_not_of(" \t\r");
    if (first == std::string::npos)
      continue;
    line = line.substr(first, line.find_last_not_of(" \t\r") - first + 1);
    // An MPI hostfile's "host slots=N" is read as launch.py reads it: the slots are ignored.
    if (auto space = line.find_first_of(" \t"); space != std::string::npos) {
      const auto rest = line.substr(line.find_first_not_of(" \t", space));
      if (!std::regex_match(rest, std::regex{"slots=[0-9]+"}))
        return error{errc::invalid_argument,
                     path + ":" + std::to_string(number) +
                         ": one host (or host:port), optionally followed by slots=N, per line, "
                         "got \"" +
                         line + "\""};
      line = line.substr(0, space);
    }
    host h{line, std::nullopt};
    if (auto colon = line.rfind(':'); colon != std::string::npos && line.find(':') == colon) {
      h.name = line.substr(0, colon);
      std::string port = line.substr(colon + 1);
      int value = 0;
      bool digits =
          !port.empty() && port.size() <= 5 &&
          std::all_of(port.begin(), port.end(), [](char c) { return c >= '0' && c <= '9'; });
      if (digits)
        value = std::stoi(port);
      if (!digits || value < 1 || value > 65535 || h.name.empty())
        return error{errc::invalid_argument, path + ":" + std::to_string(number) +
                                                 ": ssh port must be 1 to 65535, got \"" + line +
                                                 "\""};
      h.ssh_port = value;
    }
    hosts.push_back(std::move(h));
  }
  if (hosts.empty())
    return error{errc::invalid_argument, "hostfile " + path + " names no host"};
  return hosts;
}

/// A port nothing listens on now: bind port 0, read it back, close. Another process may take it
/// before the scheduler binds it, as with launch.py.
result<std::uint16_t> pick_free_port(const std::string& address) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0)
    return error{errc::io_error, std::string("cannot open a socket: ") + std::strerror(errno)};
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (::inet_pton(AF_INET, address.c_str(), &addr.sin_addr) != 1)
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof addr;
  int rc = ::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
  if (rc == 0)
    rc = ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  int saved = errno;
  ::close(fd);
  if (rc != 0)
    return error{errc::io_error,
                 "cannot find a free port on " + address + ": " + std::strerror(saved)};
  return ntohs(addr.sin_port);
}

/// The node binary beside this executable, as the build and `make install` put them.
std::string default_node_binary() {
  std::error_code ec;
  auto self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec)
    return "troupe-node";
  return (self.parent_path() / "troupe-node").string();
}

/// How many workers the job may lose: it goes on while `quorum` of `num_workers` live.
struct worker_quorum {
  int num_workers = 1;
  int quorum = 1;

  int losses_allowed() const noexcept { return num_workers - quorum; }
  /// "quorum 2 of 3".
  std::string describe() const {
    return "quorum " + std::to_string(quorum) + " of " + std::to_string(num_workers);
  }
};

/// The glibc malloc setting local nodes start with unless the launcher's environment sets
/// GLIBC_TUNABLES itself. A worker frees small blocks per key (its requests' state) and allocates
/// blocks of 1 KiB or more per fused frame; with fastbins on, each such allocation first merges
/// every small block freed since (malloc_consolidate), 9 % of a job's CPU samples at 10,000 keys
/// of 4 KiB per round. Without fastbins (tcache still serves small blocks) a round took 44-48 ms
/// against 52-60, and 1,000 keys 4.5-5.5 ms against 5.3-6.4 (alternating runs, 2026-12-06).
constexpr const char* node_malloc_tuning = "GLIBC_TUNABLES=glibc.malloc.mxfast=0";

/// Adds node_malloc_tuning to `env` when it holds no GLIBC_TUNABLES (the user's choice wins).
void add_malloc_tuning(std::vector<std::string>& env) {
  if (std::none_of(env.begin(), env.end(),
                   [](const std::string& e) { return e.starts_with("GLIBC_TUNABLES="); }))
    env.emplace_back(node_malloc_tuning);
}

/// `base` with `env` (NAME=VALUE) set in it, a name in both taking `env`'s value.
std::vector<std::string> merged_environment(std::vector<std::string> base,
                                            const std::vector<std::string>& env) {
  for (const auto& kv : env) {
    auto name = kv.substr(0, kv.find('=') + 1);
    std::erase_if(base, [&](const std::string& e) { return e.starts_with(name); });
    base.push_back(kv);
  }
  return base;
}

/// Runs the job: starts the children, relays their output, watches their ends.
/// A node's label: "scheduler", "server 1", "worker 0" (its rank: TROUPE_RANK_HINT).
std::string label_for(troupe::node_role role, int index) {
  if (role == troupe::node_role::scheduler)
    return "scheduler";
  return std::string(troupe::to_string(role)) + " " + std::to_string(index);
}

class job {
public:
  job(std::vector<std::string> base_env, int signal_fd, std::chrono::milliseconds stop_grace,
      std::chrono::milliseconds finish_timeout, worker_quorum quorum, int max_restarts,
      troupe::logger log)
      : base_env_(std::move(base_env)), signal_fd_(signal_fd), stop_grace_(stop_grace),
        finish_timeout_(finish_timeout), quorum_(quorum), max_restarts_(max_restarts),
        log_(std::move(log)) {}

  /// Starts `argv` with `env` added to the environment; false (after saying why) when it cannot.
  /// Its stdin is /dev/null, or with `hold_stdin` a pipe the launcher keeps open until it exits:
  /// an ssh node's remote side watches it to stop when the launcher or its ssh client goes. With
  /// `hold_stdin`, `stdin_text` is written to that pipe first (an ssh node's token line).
  /// With `recover_argv`, a server that fails while the job runs is started again that way
  /// (restart_server).
  bool start(std::string label, troupe::node_role role, const std::vector<std::string>& argv,
             const std::vector<std::string>& env, bool hold_stdin = false,
             std::string_view stdin_text = {}, std::vector<std::string> recover_argv = {}) {
    child c;
    c.label = std::move(label);
    c.role = role;
    c.env = env;
    c.hold_stdin = hold_stdin;
    c.stdin_text = stdin_text;
    c.recover_argv = std::move(recover_argv);
    if (!spawn(c, argv))
      return false;
    children_.push_back(std::move(c));
    return true;
  }

  /// What SIGUSR2 does: start one more worker (set by main once the job's plan is made).
  void on_add_worker(std::function<void()> add) { add_worker_ = std::move(add); }

  /// Relays output and reacts to ends and signals until every child is gone; the exit code.
  int run() {
    if (!stopping_)
      check_progress();
    while (std::any_of(children_.begin(), children_.end(), [](auto& c) { return !c.reaped; })) {
      std::vector<pollfd> fds{{signal_fd_, POLLIN, 0}};
      if (events_read_ >= 0)
        fds.push_back({events_read_, POLLIN, 0});
      for (const auto& c : children_)
        for (int fd : c.fds)
          if (fd >= 0)
            fds.push_back({fd, POLLIN, 0});
      ::poll(fds.data(), fds.size(), poll_timeout_ms());
      for (auto& c : children_)
        drain(c);
      read_events();
      if (fds[0].revents & POLLIN)
        handle_signals();
      reap();
      on_deadline();
    }
    // Everyone has exited; output a grandchild still writes is not waited for.
    for (auto& c : children_) {
      drain(c);
      close_streams(c);
      // Whatever a node left behind in its process group goes with it.
      ::kill(-c.pid, SIGKILL);
    }
    if (!stopping_ && (!lost_.empty() || scheduler_lost_workers_)) {
      log_summary();
      return exit_lost_workers;
    }
    return exit_code_;
  }

private:
  /// Starts `argv` as `c` (its label, role, env and stdin set); false (after saying why and
  /// stopping the job) when it cannot.
  bool spawn(child& c, const std::vector<std::string>& argv) {
    const bool hold_stdin = c.hold_stdin;
    const std::string_view stdin_text = c.stdin_text;
    int out[2], err[2], in[2] = {-1, -1};
    if (::pipe2(out, O_CLOEXEC) != 0 || ::pipe2(err, O_CLOEXEC) != 0 ||
        (hold_stdin && ::pipe2(in, O_CLOEXEC) != 0)) {
      log_.error("cannot create pipes for " + c.label + ": " + std::strerror(errno));
      return fail_start(exit_cannot_start);
    }
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    if (hold_stdin)
      posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
    else
      posix_spawn_file_actions_addopen(&actions, STDIN_FILENO, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
    posix_spawn_file_actions_adddup2(&actions, err[1], STDERR_FILENO);
    // The scheduler tells the launcher which workers it declares lost (troupe-node's
    // TROUPE_LAUNCHER_EVENTS_FD), on a pipe it gets as descriptor 3.
    std::vector<std::string> env = c.env;
    if (c.role == troupe::node_role::scheduler && open_events()) {
      posix_spawn_file_actions_adddup2(&actions, events_write_, events_child_fd);
      env.push_back("TROUPE_LAUNCHER_EVENTS_FD=" + std::to_string(events_child_fd));
    }
    posix_spawnattr_t attr;
    posix_spawnattr_init(&attr);
    // Its own process group, so that stopping it reaches whatever it starts; the launcher's
    // blocked and ignored signals are not inherited.
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                        POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(&attr, 0);
    sigset_t none, defaults;
    sigemptyset(&none);
    posix_spawnattr_setsigmask(&attr, &none);
    sigemptyset(&defaults);
    for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGPIPE})
      sigaddset(&defaults, s);
    posix_spawnattr_setsigdefault(&attr, &defaults);

    const std::vector<std::string> environment = merged_environment(base_env_, env);
    std::vector<char*> argv_c, env_c;
    for (const auto& a : argv)
      argv_c.push_back(const_cast<char*>(a.c_str()));
    argv_c.push_back(nullptr);
    for (const auto& e : environment)
      env_c.push_back(const_cast<char*>(e.c_str()));
    env_c.push_back(nullptr);

    pid_t pid = -1;
    int rc = ::posix_spawnp(&pid, argv_c[0], &actions, &attr, argv_c.data(), env_c.data());
    posix_spawn_file_actions_destroy(&actions);
    posix_spawnattr_destroy(&attr);
    ::close(out[1]);
    ::close(err[1]);
    if (hold_stdin)
      ::close(in[0]);
    // Only the scheduler holds the write end now: its end is the pipe's.
    if (events_write_ >= 0) {
      ::close(events_write_);
      events_write_ = -1;
    }
    c.stdin_fd = in[1];
    if (rc != 0) {
      ::close(out[0]);
      ::close(err[0]);
      if (c.stdin_fd >= 0)
        ::close(c.stdin_fd);
      log_.error("cannot start " + c.label + " (" + argv[0] + "): " + std::strerror(rc));
      return fail_start(rc == EACCES ? 126 : exit_cannot_start);
    }
    c.pid = pid;
    // A few bytes into an empty pipe: written at once. Should ssh be gone already, its end
    // (EPIPE) is reaped like any other.
    if (c.stdin_fd >= 0 && !stdin_text.empty())
      write_all(c.stdin_fd, stdin_text);
    c.fds[0] = out[0];
    c.fds[1] = err[0];
    for (int fd : c.fds)
      ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
    log_.info("started " + c.label + " (pid " + std::to_string(c.pid) + "): " + argv[0]);
    return true;
  }

  /// Prints what `c` left unfinished and closes its pipes.
  void close_streams(child& c) {
    for (int s = 0; s < 2; ++s) {
      flush_pending(c, s);
      if (c.fds[s] >= 0)
        ::close(c.fds[s]);
      c.fds[s] = -1;
    }
    if (c.stdin_fd >= 0)
      ::close(c.stdin_fd);
    c.stdin_fd = -1;
  }

  bool fail_start(int code) {
    begin_stop(code);
    return false;
  }

  /// Reads what is there, without blocking, and prints whole lines.
  void drain(child& c) {
    char buffer[65536];
    for (int s = 0; s < 2; ++s) {
      while (c.fds[s] >= 0) {
        ssize_t n = ::read(c.fds[s], buffer, sizeof buffer);
        if (n < 0 && errno == EINTR)
          continue;
        if (n < 0)
          break; // EAGAIN: nothing more now
        if (n == 0) {
          flush_pending(c, s);
          ::close(c.fds[s]);
          c.fds[s] = -1;
          break;
        }
        c.pending[s].append(buffer, static_cast<std::size_t>(n));
        emit_lines(c, s);
      }
    }
  }

  void emit_lines(child& c, int s) {
    std::string& text = c.pending[s];
    std::string out;
    std::size_t start = 0;
    for (std::size_t nl; (nl = text.find('\n', start)) != std::string::npos; start = nl + 1)
      out += "[" + c.label + "] " + text.substr(start, nl - start + 1);
    text.erase(0, start);
    // A line that never ends must not grow without bound.
    if (text.size() > 65536) {
      out += "[" + c.label + "] " + text + "\n";
      text.clear();
    }
    write_all(s == 0 ? STDOUT_FILENO : STDERR_FILENO, out);
  }

  void flush_pending(child& c, int s) {
    if (c.pending[s].empty())
      return;
    write_all(s == 0 ? STDOUT_FILENO : STDERR_FILENO, "[" + c.label + "] " + c.pending[s] + "\n");
    c.pending[s].clear();
  }

  /// The pipe of the scheduler's events, once; false (the job goes on without it) when it cannot
  /// be made. Its write end lies above the descriptors spawn moves, so that moving it to
  /// events_child_fd in the child clears its close-on-exec flag.
  bool open_events() {
    if (events_read_ >= 0)
      return false; // one scheduler per job
    int ends[2];
    if (::pipe2(ends, O_CLOEXEC | O_NONBLOCK) != 0) {
      log_.warning(std::string{"cannot create the scheduler's event pipe: "} +
                   std::strerror(errno) + "; a worker it declares lost is not stopped here");
      return false;
    }
    events_read_ = ends[0];
    events_write_ = ::fcntl(ends[1], F_DUPFD_CLOEXEC, events_child_fd + 1);
    ::close(ends[1]);
    return events_write_ >= 0;
  }

  /// Reads the scheduler's events ("lost worker R" lines): each worker it declares lost is
  /// stopped by PID unless it ends within the stop grace (stop_lost_workers). Its end then counts
  /// as any worker's failure (on_worker_failed).
  void read_events() {
    char buffer[4096];
    while (events_read_ >= 0) {
      const ssize_t n = ::read(events_read_, buffer, sizeof buffer);
      if (n < 0 && errno == EINTR)
        continue;
      if (n < 0)
        return; // EAGAIN: nothing more now
      if (n == 0) {
        ::close(events_read_);
        events_read_ = -2; // the scheduler is gone; never opened again
        return;
      }
      events_pending_.append(buffer, static_cast<std::size_t>(n));
      for (std::size_t nl; (nl = events_pending_.find('\n')) != std::string::npos;) {
        on_event(events_pending_.substr(0, nl));
        events_pending_.erase(0, nl + 1);
      }
      if (events_pending_.size() > 4096)
        events_pending_.clear(); // not a line of troupe-node's
    }
  }

  void on_event(const std::string& line) {
    constexpr std::string_view lost = "lost worker ";
    if (!line.starts_with(lost))
      return;
    int rank = -1;
    const char* first = line.data() + lost.size();
    const char* last = line.data() + line.size();
    if (auto [end, why] = std::from_chars(first, last, rank); why != std::errc{} || end != last)
      return;
    // A worker lost because its connection closed is usually ending by itself, and its own
    // exit says more than a kill would: it gets the stop grace to end before it is stopped.
    const std::string label = label_for(troupe::node_role::worker, rank);
    for (auto& c : children_)
      if (c.role == troupe::node_role::worker && c.label == label && !c.reaped && !c.stop_lost_at)
        c.stop_lost_at = clock_type::now() + stop_grace_;
  }

  /// Stops the workers the scheduler declared lost that have not ended within the stop grace,
  /// whatever state they are in (SIGCONT, then SIGKILL to the process group: a frozen process
  /// would hold the launcher forever).
  void stop_lost_workers(clock_type::time_point now) {
    for (auto& c : children_)
      if (c.stop_lost_at && now >= *c.stop_lost_at && !c.reaped && !killed_) {
        c.stop_lost_at.reset();
        log_.error(c.label + " was declared lost by the scheduler and is still running " +
                   troupe::format_duration(stop_grace_) + " later; stopping it (pid " +
                   std::to_string(c.pid) + ")");
        ::kill(-c.pid, SIGCONT);
        ::kill(-c.pid, SIGKILL);
      }
  }

  void handle_signals() {
    signalfd_siginfo info;
    while (::read(signal_fd_, &info, sizeof info) == sizeof info) {
      int sig = static_cast<int>(info.ssi_signo);
      if (sig == SIGCHLD)
        continue; // reap() runs after every wake-up
      if (sig == SIGUSR2) {
        // One more worker for the running job (job.max_workers).
        if (!stopping_ && add_worker_)
          add_worker_();
        continue;
      }
      if (sig == SIGUSR1) {
        // Servers print their summary. Only local troupe-node processes: a worker program may
        // not handle it (its default action ends the process), and an ssh client would die.
        for (const auto& c : children_)
          if (!c.reaped && c.role != troupe::node_role::worker && !c.hold_stdin)
            ::kill(c.pid, SIGUSR1);
        continue;
      }
      if (stopping_) {
        log_.error("signal " + std::to_string(sig) + " again: killing every node now");
        kill_all(SIGKILL);
        continue;
      }
      log_.error("got signal " + std::to_string(sig) + ": stopping the job");
      begin_stop(128 + sig);
    }
  }

  void reap() {
    for (auto& c : children_) {
      if (c.reaped)
        continue;
      int wstatus = 0;
      pid_t pid = ::waitpid(c.pid, &wstatus, WNOHANG);
      if (pid != c.pid)
        continue;
      drain(c); // its last lines before the news of its end
      c.reaped = true;
      if (WIFSIGNALED(wstatus)) {
        c.exit_code = 128 + WTERMSIG(wstatus);
        c.how = "was killed by signal " + std::to_string(WTERMSIG(wstatus));
      } else {
        c.exit_code = WEXITSTATUS(wstatus);
        c.how = "exited with code " + std::to_string(c.exit_code);
      }
      if (stopping_ || c.exit_code == 0)
        log_.info(c.label + " " + c.how);
      else if (c.role == troupe::node_role::worker)
        on_worker_failed(c);
      else if (!c.recover_argv.empty())
        restart_server(c);
      else
        on_node_failed(c);
    }
    if (!stopping_)
      check_progress();
  }

  /// The policy for a worker that exited non-zero or was killed while the job ran: it is lost.
  /// While no more than W - K workers are lost (quorum K of W) the job goes on without it, as the
  /// scheduler and servers do; one loss more and the job fails: the other nodes are stopped and
  /// the launcher exits with this worker's code.
  void on_worker_failed(const child& c) {
    if (static_cast<int>(lost_.size()) >= quorum_.losses_allowed()) {
      fail_job(c);
      return;
    }
    lost_.push_back({c.label, c.how, clock_type::now() - started_});
    log_.error(c.label + " " + c.how + "; the job goes on without it (" + quorum_.describe() +
               ": " + std::to_string(lost_.size()) + " of " +
               std::to_string(quorum_.losses_allowed()) + " workers that may be lost)");
  }

  /// A server that exited non-zero or was killed while the job ran, under --restart-servers: it is
  /// started again with the same rank hint, environment and command plus --recover, and rejoins
  /// from its checkpoint while the scheduler keeps its rank open (timeouts.server_rejoin). After
  /// max_restarts_ restarts, or when a restarted server exits 2 (its checkpoint or configuration
  /// refused, which another start would not change), the job fails as without the flag.
  void restart_server(child& c) {
    const std::string restarts = std::to_string(c.restarts) + " restart" +
                                 (c.restarts == 1 ? "" : "s") +
                                 " (--restart-servers=" + std::to_string(max_restarts_) + ")";
    if (c.restarts >= max_restarts_) {
      log_.error(c.label + " " + c.how + " after " + restarts + "; stopping the job");
      begin_stop(c.exit_code);
      return;
    }
    if (c.restarts > 0 && c.exit_code == exit_usage) {
      log_.error(c.label + " " + c.how + " after " + restarts +
                 ": it refused its checkpoint or configuration (its line says why); stopping "
                 "the job");
      begin_stop(c.exit_code);
      return;
    }
    ++c.restarts;
    log_.error(c.label + " " + c.how + "; restarting it with --recover (restart " +
               std::to_string(c.restarts) + " of " + std::to_string(max_restarts_) + ")");
    close_streams(c);
    // Whatever the dead server left in its process group goes with it.
    ::kill(-c.pid, SIGKILL);
    c.reaped = false;
    c.exit_code = 0;
    c.how.clear();
    // When it cannot start, the job is stopping (spawn said why) and there is nothing to reap.
    if (!spawn(c, c.recover_argv)) {
      c.reaped = true;
      c.exit_code = exit_code_;
    }
  }

  /// The scheduler or a server exited non-zero or was killed while the job ran: the job cannot go
  /// on without it, and fails with its code. The scheduler's exit code 3 is no failure: the job
  /// finished, with workers lost within the quorum (its own summary names them).
  void on_node_failed(const child& c) {
    if (c.role == troupe::node_role::scheduler && c.exit_code == exit_lost_workers) {
      log_.info(c.label + " " + c.how + ": the job finished with lost workers");
      scheduler_lost_workers_ = true;
      return;
    }
    fail_job(c);
  }

  /// The launcher's summary of a job that finished with lost workers: how many, which, how and
  /// when (from the launcher's start).
  void log_summary() const {
    std::string which;
    for (const auto& loss : lost_)
      which += (which.empty() ? "" : "; ") + loss.label + " " + loss.how + " after " +
               troupe::format_duration(
                   std::chrono::duration_cast<std::chrono::milliseconds>(loss.after));
    if (lost_.empty())
      which = "every worker process succeeded, but the scheduler lost some (its summary names "
              "them)";
    log_.error("summary: the job finished with lost workers: " + std::to_string(lost_.size()) +
               " of " + std::to_string(quorum_.num_workers) + " lost (" + quorum_.describe() +
               "): " + which);
  }

  /// Stops every node because `c` failed; the launcher exits with `c`'s code.
  void fail_job(const child& c) {
    log_.error(c.label + " " + c.how + "; stopping the job");
    begin_stop(c.exit_code);
  }

  /// After every worker succeeded, the scheduler and servers get finish_timeout to exit.
  void check_progress() {
    bool workers_done = std::all_of(children_.begin(), children_.end(), [](const child& c) {
      return c.role != troupe::node_role::worker || c.reaped;
    });
    if (workers_done && !finish_deadline_)
      finish_deadline_ = clock_type::now() + finish_timeout_;
  }

  void on_deadline() {
    auto now = clock_type::now();
    stop_lost_workers(now);
    if (!stopping_ && finish_deadline_ && now >= *finish_deadline_) {
      std::string left;
      for (const auto& c : children_)
        if (!c.reaped)
          left += (left.empty() ? "" : ", ") + c.label;
      log_.error(left + " still running " + troupe::format_duration(finish_timeout_) +
                 " after every worker finished; stopping them");
      begin_stop(exit_finish_timeout);
    }
    if (stopping_ && !killed_ && now >= kill_deadline_) {
      log_.error("nodes still running " + troupe::format_duration(stop_grace_) +
                 " after SIGTERM; sending SIGKILL");
      kill_all(SIGKILL);
    }
  }

  int poll_timeout_ms() const {
    std::optional<clock_type::time_point> next;
    if (stopping_ && !killed_)
      next = kill_deadline_;
    else if (!stopping_ && finish_deadline_)
      next = finish_deadline_;
    if (!next)
      return 1000; // wake now and then; every event also wakes the poll
    auto left = std::chrono::ceil<std::chrono::milliseconds>(*next - clock_type::now());
    return static_cast<int>(std::clamp<std::int64_t>(left.count(), 0, 1000));
  }

  void begin_stop(int code) {
    if (stopping_)
      return;
    stopping_ = true;
    exit_code_ = code;
    kill_deadline_ = clock_type::now() + stop_grace_;
    kill_all(SIGTERM);
  }

  void kill_all(int sig) {
    if (sig == SIGKILL)
      killed_ = true;
    for (const auto& c : children_)
      if (!c.reaped) {
        ::kill(-c.pid, sig);
        // A stopped (frozen) process acts on SIGTERM only once continued.
        if (sig != SIGKILL)
          ::kill(-c.pid, SIGCONT);
      }
  }

  /// The scheduler's event pipe: the launcher's read end (-1 before it is made, -2 after the
  /// scheduler closed it), the write end until the scheduler is spawned, what is not a line yet.
  int events_read_ = -1;
  int events_write_ = -1;
  std::string events_pending_;
  static constexpr int events_child_fd = 3;
  std::vector<std::string> base_env_;
  int signal_fd_;
  std::chrono::milliseconds stop_grace_;
  std::chrono::milliseconds finish_timeout_;
  worker_quorum quorum_;
  int max_restarts_; ///< --restart-servers: restarts per server
  troupe::logger log_;
  /// SIGUSR2's action (on_add_worker).
  std::function<void()> add_worker_;
  std::vector<child> children_;
  /// A worker lost within the quorum: its label, how it ended and when.
  struct loss {
    std::string label;
    std::string how;
    clock_type::duration after;
  };
  std::vector<loss> lost_;
  bool scheduler_lost_workers_ = false; ///< the scheduler exited 3
  clock_type::time_point started_ = clock_type::now();
  bool stopping_ = false;
  bool killed_ = false;
  int exit_code_ = 0;
  clock_type::time_point kill_deadline_{};
  std::optional<clock_type::time_point> finish_deadline_;
};

/// Declares the flags on `app`, each writing its field of `opt`, and the --help footer.
void add_flags(CLI::App& app, options& opt) {
  app.add_option("-n,--num-workers", opt.num_workers, "Number of workers (W); required")
      ->check(CLI::Range(1, 100'000))
      ->type_name("W");
  app.add_option("-s,--num-servers", opt.num_servers, "Number of servers (default: W)")
      ->check(CLI::Range(1, 100'000))
      ->type_name("S");
  app.add_option("--quorum", opt.quorum,
                 "The job goes on while K workers live: up to W - K workers may fail without "
                 "stopping it, and dist_sync rounds close with K workers. Passed to every node as "
                 "TROUPE_QUORUM (default: TROUPE_QUORUM, the config's [sync] quorum, else W)")
      ->check(CLI::Range(1, 100'000))
      ->type_name("K");
  app.add_option("--max-workers", opt.max_workers,
                 "Workers the running job may take in all (job.max_workers, given to every node "
                 "as TROUPE_MAX_WORKERS); SIGUSR2 to the launcher starts one more worker, which "
                 "joins the running job (default: W, none joins)")
      ->check(CLI::Range(1, 100'000))
      ->type_name("M");
  app.add_option("-H,--hostfile", opt.hostfile,
                 "File of hosts, one `host` or `host:sshport` a line, optionally followed by MPI's "
                 "`slots=N` (ignored, as launch.py does; # comments); servers and workers go "
                 "round-robin over them")
      ->type_name("FILE");
  app.add_option("--launcher", opt.launcher,
                 "local (default), ssh (the default with a hostfile), or slurm: under srun, "
                 "become task SLURM_PROCID's node (0 the scheduler, then servers, then workers)")
      ->check(CLI::IsMember({"local", "ssh", "slurm"}))
      ->type_name("MODE");
  app.add_option("--config", opt.config,
                 "Cluster config file (TOML), read here and passed to every node as "
                 "TROUPE_CONFIG")
      ->type_name("FILE");
  app.add_option("--env", opt.env,
                 "A variable for every node (repeatable): NAME:VALUE (launch.py's form) or "
                 "NAME=VALUE sets it; a bare NAME passes on this environment's value")
      ->allow_extra_args(false)
      ->type_name("NAME:VALUE");
  app.add_option("--env-server", opt.env_server,
                 "As --env, for the servers only (repeatable); beats --env")
      ->allow_extra_args(false)
      ->type_name("NAME:VALUE");
  app.add_option("--env-worker", opt.env_worker,
                 "As --env, for the workers only (repeatable); beats --env")
      ->allow_extra_args(false)
      ->type_name("NAME:VALUE");
  app.add_option("--sync-dst-dir", opt.sync_dst_dir,
                 "ssh mode: first copy this directory (rsync -az) to DIR on every host of the "
                 "hostfile, and run the remote nodes there; a path inside this directory that "
                 "they are given (the cluster file, --trace, the program, an argument or --env "
                 "value that is such an absolute path) names its copy under DIR")
      ->type_name("DIR");
  app.add_option("--node-binary", opt.node_binary,
                 "The troupe-node program run as scheduler and servers (default: troupe-node "
                 "beside troupe-launch)")
      ->type_name("PATH");
  app.add_option("--stop-grace", opt.stop_grace,
                 "Time between SIGTERM and SIGKILL when stopping nodes (default 5s)")
      ->type_name("DURATION");
  app.add_option("--finish-timeout", opt.finish_timeout,
                 "Time the scheduler and servers get to exit after every worker succeeded "
                 "(default 10s)")
      ->type_name("DURATION");
  app.add_option("--restart-servers", opt.restart_servers,
                 "A server that dies while the job runs (any end but the job's, a signal included) "
                 "is started again with the same rank, environment and command plus --recover, at "
                 "most N times per server (default 3); then the job fails. Needs checkpoint.dir, "
                 "periodic checkpoints and timeouts.server_rejoin in the cluster file")
      ->expected(0, 1)
      ->default_str("3") // what --restart-servers alone gives; without the flag, 0
      ->check(CLI::Range(1, 1'000))
      ->type_name("N");
  app.add_option("--ssh-option", opt.ssh_options,
                 "ssh -o OPTION for ssh mode (repeatable), e.g. IdentityFile=...")
      ->allow_extra_args(false)
      ->type_name("OPTION");
  app.add_option("--trace", opt.trace,
                 "Every server and worker records each key's push, merge, update and pull as "
                 "Chrome trace spans (observe.trace); when the job is over their files "
                 "FILE.<role>-<rank> are merged into FILE (Perfetto opens it)")
      ->type_name("FILE");
  app.add_option("--merge-trace", opt.merge_trace,
                 "Start nothing: merge the node trace files FILE.<role>-<rank> found beside FILE "
                 "(copied from the hosts of an ssh job, say) into FILE")
      ->type_name("FILE");
  app.add_flag("--summary", opt.summary,
               "Every server and worker prints its traffic summary at the end of the job "
               "(observe.summary); servers also on SIGUSR1, which the launcher passes on");
  app.add_option("--emit", opt.emit,
                 "k8s: write the job's Kubernetes manifests on stdout (a Service and Jobs for the "
                 "scheduler, servers and workers) instead of starting it")
      ->check(CLI::IsMember({"k8s"}))
      ->type_name("KIND");
  app.add_option("--image", opt.image,
                 "--emit k8s: the container image of every pod (troupe-node and COMMAND in it)")
      ->type_name("IMAGE");
  app.add_option("--name", opt.name, "--emit k8s: the prefix of every object's name (troupe)")
      ->type_name("NAME");
  app.add_option("--k8s-secret", opt.k8s_secret,
                 "--emit k8s: the Secret holding the job token under key \"token\" (NAME-token)")
      ->type_name("SECRET");
  app.add_option("command", opt.command, "The worker program and its arguments (after --)")
      ->type_name("COMMAND ARGS...");
  app.footer(
      "Output lines are prefixed with [scheduler], [server i] or [worker i], i being the node's "
      "rank: each node asks the scheduler for the rank of its start index (TROUPE_RANK_HINT).\n"
      "Every node gets DMLC_ROLE, DMLC_PS_ROOT_URI, DMLC_PS_ROOT_PORT (a free port unless the "
      "config or environment names one), DMLC_NUM_WORKER, DMLC_NUM_SERVER, TROUPE_CONFIG (with "
      "--config) and the --env pairs, on top of this environment (local mode).\n"
      "Job token: with none configured (job.token, job.token_file, TROUPE_JOB_TOKEN) the "
      "launcher makes a random one and gives it to every node as TROUPE_JOB_TOKEN, never on a "
      "command line; ssh nodes read the job's token from their ssh channel's stdin. --env may "
      "not set TROUPE_JOB_TOKEN (a command line shows in ps).\n"
      "ssh mode runs the scheduler here and each server and worker as `ssh -o BatchMode=yes "
      "[-o OPTION]... [-p PORT] HOST \"sh -c 'cd DIR && env K=V... COMMAND'\"` with "
      "DMLC_NODE_HOST=HOST; DIR and the programs must exist at the same paths on every host, "
      "and [scheduler] host must be an address of this machine the hosts can reach. The remote "
      "program gets SIGTERM when its ssh client ends (the launcher stops a node by stopping "
      "its ssh client); processes it started itself are not stopped on the remote host. "
      "tests/cluster tests ssh mode against an sshd on 127.0.0.1 where openssh-server is "
      "installed.\n"
      "--launcher slurm: run under `srun -n 1+S+W troupe-launch --launcher slurm -n W -s S -- "
      "COMMAND`; each task becomes its node by exec (task 0 the scheduler, at the first node "
      "of the step), so its exit code is the node's. The job token must be configured "
      "(TROUPE_JOB_TOKEN exported before srun, or job.token_file); the port is the configured "
      "one, else 20000 + SLURM_JOB_ID % 10000.\n"
      "--emit k8s writes a Service and Jobs for the scheduler, servers and workers (image "
      "IMAGE, troupe-node on its PATH unless --node-binary), the job token read from Secret "
      "NAME-token, and exits 0.\n"
      "Exit codes: 0 every node succeeded; 3 the job finished, but workers were lost within "
      "the quorum (at most W - K workers failed, or the scheduler exited 3), with a summary "
      "line naming them; otherwise the code of the node whose failure stopped the job (a "
      "worker lost beyond the quorum, the scheduler or a server; 128+N for signal N) after "
      "stopping the rest; 128+N when troupe-launch gets signal N; 2 bad flags, config, "
      "hostfile, a port in use or a failed --sync-dst-dir copy (nothing started); 124 the "
      "scheduler or a server kept "
      "running after the workers finished; 126/127 a program could not be started.");
}

/// The variables of --env, --env-server and --env-worker as NAME=VALUE: for every node, for the
/// servers only, for the workers only. A role's own come after the common ones, so they win.
struct env_settings {
  std::vector<std::string> every_node;
  std::vector<std::string> servers;
  std::vector<std::string> workers;
};

/// One value of `flag` (--env, --env-server, --env-worker) as NAME=VALUE. launch.py's forms mean
/// what they mean there: NAME:VALUE sets NAME, and a bare NAME passes on troupe-launch's own value
/// (an error when it has none: a variable asked for and missing is a mistake, which launch.py's
/// ssh mode also refuses). env(1)'s NAME=VALUE is read too. NAME is a shell variable name, so the
/// first ':' or '=' after it ends it and VALUE may hold either ("PATH:/opt/bin:/usr/bin"). NAME may
/// not be a variable the launcher sets itself, nor the job token, which would show in `ps` on a
/// command line. The error's message is the usage line.
result<std::string> env_pair(std::string_view flag, const std::string& text,
                             const troupe::env_lookup& env) {
  const auto is_name_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_';
  };
  const auto end = static_cast<std::size_t>(
      std::find_if_not(text.begin(), text.end(), is_name_char) - text.begin());
  const std::string name = text.substr(0, end);
  const bool bare = end == text.size();
  const std::string what = std::string(flag) + " " + text + ": ";
  if (name.empty() || std::isdigit(static_cast<unsigned char>(name[0])) ||
      (!bare && text[end] != '=' && text[end] != ':'))
    return error{errc::invalid_argument,
                 what + "expected NAME=VALUE, NAME:VALUE or NAME (a variable of troupe-launch's "
                        "environment to pass on)"};
  if (std::find(launcher_variables.begin(), launcher_variables.end(), name) !=
      launcher_variables.end())
    return error{errc::invalid_argument,
                 what + "troupe-launch sets " + name + " itself (use -n, -s, --quorum, --config)"};
  // The message names the variable, not the value.
  if (name == token_variable)
    return error{errc::invalid_argument,
                 std::string(flag) + " " + name + (bare ? "" : text.substr(end, 1) + "...") +
                     ": a token on the command line is visible to every user of this machine; "
                     "export " +
                     name + " or set job.token_file instead"};
  if (!bare)
    return name + "=" + text.substr(end + 1);
  auto value = env(name);
  if (!value)
    return error{errc::invalid_argument,
                 what + name +
                     " is not set in troupe-launch's environment, so there is no "
                     "value to pass on"};
  return name + "=" + *value;
}

/// Variables that launch.py's ssh mode passes on to every remote node when they are set here,
/// and so does troupe-launch's (local nodes inherit the whole environment). launch.py also passes
/// AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY; troupe-launch does not, since they would show on
/// the remote command line.
const std::vector<std::string> ssh_forwarded_variables{"OMP_NUM_THREADS", "KMP_AFFINITY",
                                                       "LD_LIBRARY_PATH", "DMLC_INTERFACE"};

/// The --env, --env-server and --env-worker values of `opt` as NAME=VALUE (env_pair), bare names
/// read from `env`; in ssh mode, the variables of ssh_forwarded_variables that `env` has come
/// first.
result<env_settings> resolve_env_flags(const options& opt, const troupe::env_lookup& env,
                                       bool ssh) {
  env_settings settings;
  if (ssh)
    for (const auto& name : ssh_forwarded_variables)
      if (auto value = env(name))
        settings.every_node.push_back(name + "=" + *value);
  const std::pair<const std::vector<std::string>*, std::vector<std::string>*> flags[] = {
      {&opt.env, &settings.every_node},
      {&opt.env_server, &settings.servers},
      {&opt.env_worker, &settings.workers}};
  const char* names[] = {"--env", "--env-server", "--env-worker"};
  for (std::size_t f = 0; f < 3; ++f)
    for (const auto& text : *flags[f].first) {
      auto pair = env_pair(names[f], text, env);
      if (!pair)
        return pair.error();
      flags[f].second->push_back(std::move(*pair));
    }
  return settings;
}

/// The configuration as a node of `role` will see it: the cluster file (named by its path as
/// given, so that messages match what the user typed), the environment, then -n, -s, --quorum,
/// --max-workers and `scheduler_host` (127.0.0.1 in local mode, the first node under Slurm) when
/// given.
result<troupe::cluster_config> load_job_config(const options& opt, int num_servers,
                                               const std::optional<std::string>& scheduler_host,
                                               troupe::node_role role) {
  troupe::config_overrides overrides;
  overrides.set("job.num_workers", std::to_string(opt.num_workers));
  overrides.set("job.num_servers", std::to_string(num_servers));
  if (opt.quorum)
    overrides.set("sync.quorum", std::to_string(*opt.quorum));
  if (opt.max_workers)
    overrides.set("job.max_workers", std::to_string(*opt.max_workers));
  if (scheduler_host)
    overrides.set("scheduler.host", *scheduler_host);
  overrides.set("job.role", std::string(troupe::to_string(role)));
  if (opt.config)
    overrides.config_file = *opt.config;
  return troupe::load_config(std::nullopt, troupe::process_environment(), overrides);
}

/// --restart-servers restarts a server with --recover, which loads its checkpoint from
/// checkpoint.dir and rejoins only while the scheduler keeps its rank open: the job's
/// configuration must have both (periodic checkpoints come with timeouts.server_rejoin, which the
/// configuration refuses without them). The error's message is the usage line.
status check_restart_servers(const options& opt, const troupe::cluster_config& cfg) {
  if (opt.restart_servers == 0)
    return {};
  const std::string why = "--restart-servers=" + std::to_string(opt.restart_servers) + " needs ";
  if (cfg.checkpoint_dir.empty())
    return error{errc::invalid_argument,
                 why + "checkpoint.dir (the cluster file, or TROUPE_CHECKPOINT_DIR exported to "
                       "troupe-launch) with periodic "
                       "checkpoints: a restarted server recovers from its checkpoint"};
  if (cfg.server_rejoin.count() <= 0)
    return error{errc::invalid_argument,
                 why + "timeouts.server_rejoin above 0s in the cluster file: without it the "
                       "scheduler fails the job when a server is lost"};
  return {};
}

/// The hosts of ssh mode, from the hostfile. Warns when the scheduler's address is one that other
/// hosts cannot reach.
result<std::vector<host>> load_hosts(const options& opt, const troupe::cluster_config& cfg,
                                     const troupe::logger& log) {
  if (opt.hostfile.empty())
    return error{errc::invalid_argument, "--launcher ssh needs -H HOSTFILE"};
  auto hosts = read_hostfile(opt.hostfile);
  if (!hosts)
    return hosts.error();
  bool remote = std::any_of(hosts->begin(), hosts->end(), [](const host& h) {
    return h.name != "localhost" && !h.name.starts_with("127.");
  });
  if (remote && cfg.scheduler_host.starts_with("127."))
    log.error("warning: the scheduler host is " + cfg.scheduler_host +
              ", which other hosts cannot reach; set [scheduler] host (DMLC_PS_ROOT_URI)");
  return hosts;
}

/// The scheduler's port: the configured one, checked to be free, or one the kernel picks.
result<std::uint16_t> choose_scheduler_port(const troupe::cluster_config& cfg) {
  std::uint16_t port = cfg.scheduler_port.value_or(0);
  if (port == 0)
    return pick_free_port(cfg.bind_address);
  if (auto free = troupe::check_port_free(cfg.bind_address, port); !free)
    return error{free.error().code(), "scheduler port: " + free.error().message()};
  return port;
}

/// 32 random bytes from the kernel (getrandom) as 64 lowercase hex digits.
result<std::string> random_token() {
  std::uint8_t bytes[32];
  if (auto filled = troupe::fill_random(bytes); !filled)
    return error{errc::io_error, "cannot make a job token: " + filled.error().message()};
  static constexpr char digits[] = "0123456789abcdef";
  std::string hex;
  for (std::uint8_t b : bytes) {
    hex += digits[b >> 4];
    hex += digits[b & 15];
  }
  return hex;
}

/// A signalfd for the signals the job reacts to, which are blocked, so that the poll loop sees
/// them in order with the output; -1 (errno set) when it cannot be made.
int job_signal_fd() {
  sigset_t handled;
  sigemptyset(&handled);
  for (int s : {SIGCHLD, SIGINT, SIGTERM, SIGHUP, SIGUSR1, SIGUSR2})
    sigaddset(&handled, s);
  ::sigprocmask(SIG_BLOCK, &handled, nullptr);
  ::signal(SIGPIPE, SIG_IGN);
  return ::signalfd(-1, &handled, SFD_NONBLOCK | SFD_CLOEXEC);
}

/// --trace: merges the nodes' trace files into `file` and removes them; false (logged) when there
/// were none or they could not be merged. With `also` (--sync-dst-dir: where the nodes started
/// over ssh on this host wrote theirs, in the copy), the node files of that prefix too.
bool merge_node_traces(const std::string& file, const troupe::logger& log,
                       const std::optional<std::string>& also = std::nullopt) {
  auto parts = troupe::node_trace_files(file);
  if (also) {
    auto more = troupe::node_trace_files(*also);
    parts.insert(parts.end(), more.begin(), more.end());
    // In node order (server-0, server-1, worker-0...), whichever directory holds each.
    std::sort(parts.begin(), parts.end(), [](const std::string& a, const std::string& b) {
      return std::filesystem::path(a).filename() < std::filesystem::path(b).filename();
    });
  }
  if (parts.empty()) {
    log.error("no node trace files " + file + ".<role>-<rank> to merge");
    return false;
  }
  if (auto merged = troupe::merge_trace_files(file, parts); !merged) {
    log.error("the job trace: " + merged.error().message());
    return false;
  }
  for (const auto& part : parts)
    std::filesystem::remove(part);
  log.info("merged the trace files of " + std::to_string(parts.size()) + " nodes into " + file);
  return true;
}

/// --sync-dst-dir: where the remote nodes find what lies in the launcher's working directory.
/// They run in the copy DIR, so every word the launcher hands a remote node (its program, each
/// argument, each variable's value: TROUPE_CONFIG, TROUPE_TRACE, the --env values) that is an
/// absolute path inside the working directory is rewritten to the same place under DIR; any other
/// word passes as it is. A path is inside when it is the working directory or below it, written
/// from the physical working directory or from $PWD when that names the same directory (a
/// symbolic link on the way), compared as written (lexically normal, no symbolic link resolved).
/// With a relative DIR (which rsync and the remote shell read from the login directory) the
/// rewritten path is relative too: the node runs in DIR.
class synced_paths {
public:
  synced_paths() = default;
  /// `cwd` copied to `dst` (empty: no copy, every word passes as it is).
  synced_paths(const std::string& cwd, const std::string& dst) {
    namespace fs = std::filesystem;
    if (dst.empty())
      return;
    dst_ = normal(dst);
    roots_.push_back(normal(cwd));
    // $PWD: the working directory as the shell names it, through a symbolic link maybe.
    if (const char* pwd = std::getenv("PWD"); pwd && *pwd == '/') {
      std::error_code ec;
      const fs::path logical = normal(pwd);
      if (logical != roots_.front() && fs::equivalent(logical, roots_.front(), ec) && !ec)
        roots_.push_back(logical);
    }
  }

  /// `word` at its place under DIR when it is an absolute path inside the working directory.
  std::string operator()(const std::string& word) const {
    namespace fs = std::filesystem;
    if (roots_.empty() || word.empty() || word.front() != '/')
      return word;
    const fs::path path = fs::path(word).lexically_normal();
    for (const auto& root : roots_) {
      auto [r, p] = std::mismatch(root.begin(), root.end(), path.begin(), path.end());
      if (r != root.end())
        continue;
      fs::path inside;
      for (; p != path.end(); ++p)
        inside /= *p;
      if (inside.empty()) // the working directory itself
        return dst_.is_relative() ? std::string(".") : dst_.string();
      return (dst_.is_relative() ? inside : dst_ / inside).string();
    }
    return word;
  }

  /// A NAME=VALUE pair with VALUE rewritten.
  std::string variable(const std::string& pair) const {
    const auto eq = pair.find('=');
    if (eq == std::string::npos)
      return pair;
    return pair.substr(0, eq + 1) + (*this)(pair.substr(eq + 1));
  }

  /// Where the working directory's `path` (absolute) lies under DIR on this host, when DIR is
  /// absolute and a path there differs; else nothing.
  std::optional<std::string> here(const std::string& path) const {
    if (roots_.empty() || !dst_.is_absolute())
      return std::nullopt;
    auto moved = (*this)(path);
    if (moved == path)
      return std::nullopt;
    return moved;
  }

private:
  /// Lexically normal, without a trailing separator ("copy/" is "copy").
  static std::filesystem::path normal(const std::string& path) {
    auto p = std::filesystem::path(path).lexically_normal();
    if (!p.has_filename() && p.has_relative_path())
      p = p.parent_path();
    return p;
  }

  std::vector<std::filesystem::path> roots_;
  std::filesystem::path dst_;
};

/// How the nodes are started: the launcher's flags and what was worked out from them.
struct launch_plan {
  const options& opt;
  bool ssh = false;
  std::vector<host> hosts;             ///< ssh mode: where servers and workers go, round-robin
  std::vector<std::string> common_env; ///< what every node gets (DMLC_*, TROUPE_CONFIG, --env)
  std::string cwd;                     ///< ssh mode: where the remote command runs
  synced_paths synced;                 ///< --sync-dst-dir: the paths remote nodes are given
  /// The token to hand every node as TROUPE_JOB_TOKEN (local nodes) or on stdin (ssh nodes);
  /// empty: none to hand (local nodes read the token the configuration names, as the launcher).
  std::string local_token;
  std::string ssh_token;
  /// --env-server and --env-worker, after common_env (which holds --env).
  std::vector<std::string> server_env;
  std::vector<std::string> worker_env;
  std::size_t next_host = 0;
};

/// The variables every node gets: the scheduler's address, the job's size, the cluster file (as
/// an absolute path, so a node started elsewhere finds it) and the --env pairs.
std::vector<std::string> common_environment(const options& opt, const std::string& scheduler_host,
                                            std::uint16_t port, int num_servers,
                                            const std::vector<std::string>& every_node) {
  std::vector<std::string> common;
  common.push_back("DMLC_PS_ROOT_URI=" + scheduler_host);
  common.push_back("DMLC_PS_ROOT_PORT=" + std::to_string(port));
  common.push_back("DMLC_NUM_WORKER=" + std::to_string(opt.num_workers));
  common.push_back("DMLC_NUM_SERVER=" + std::to_string(num_servers));
  if (opt.quorum)
    common.push_back("TROUPE_QUORUM=" + std::to_string(*opt.quorum));
  if (opt.max_workers)
    common.push_back("TROUPE_MAX_WORKERS=" + std::to_string(*opt.max_workers));
  if (opt.config) {
    std::error_code ec;
    auto config_file = std::filesystem::absolute(*opt.config, ec);
    common.push_back("TROUPE_CONFIG=" + (ec ? *opt.config : config_file.string()));
  }
  if (!opt.trace.empty()) {
    std::error_code ec;
    auto trace_file = std::filesystem::absolute(opt.trace, ec);
    common.push_back("TROUPE_TRACE=" + (ec ? opt.trace : trace_file.string()));
  }
  if (opt.summary)
    common.push_back("TROUPE_SUMMARY=true");
  common.insert(common.end(), every_node.begin(), every_node.end());
  return common;
}

/// The ssh command that runs `argv` with `env` on host `h` in directory `cwd`. The remote side
/// runs the program in the background and watches its stdin, the ssh channel: when the ssh
/// client ends (stopped by this launcher, or the launcher died), stdin reaches EOF and the
/// program gets SIGTERM. Its exit status passes through ssh (128+N when killed by signal N). A
/// background job's stdin is /dev/null unless redirected, hence fd 3.
///
/// With `read_token`, the script first reads one line from stdin into TROUPE_JOB_TOKEN and exports
/// it: the launcher writes the token there (start_node), so that it travels inside the ssh
/// channel and is never part of a command line on either host.
std::vector<std::string> ssh_command(const host& h, const std::vector<std::string>& env,
                                     const std::vector<std::string>& argv, const std::string& cwd,
                                     const std::vector<std::string>& ssh_options, bool read_token) {
  std::string program = "env";
  for (const auto& kv : env)
    program += " " + quote(kv);
  for (const auto& a : argv)
    program += " " + quote(a);
  std::string token = read_token ? std::string("IFS= read -r ") + token_variable +
                                       " || exit 127\nexport " + token_variable + "\n"
                                 : std::string();
  std::string script = token + "cd " + quote(cwd) + " || exit 127\n" + "exec 3<&0\n" + program +
                       " </dev/null 3<&- &\n" + "c=$!\n" +
                       "{ while read -r _; do :; done; kill -TERM $c; } <&3 2>/dev/null &\n" +
                       "w=$!\nexec 3<&-\nwait $c\ns=$?\nkill $w 2>/dev/null\nexit $s\n";
  std::vector<std::string> ssh_argv{"ssh", "-o", "BatchMode=yes"};
  for (const auto& o : ssh_options) {
    ssh_argv.push_back("-o");
    ssh_argv.push_back(o);
  }
  if (h.ssh_port) {
    ssh_argv.push_back("-p");
    ssh_argv.push_back(std::to_string(*h.ssh_port));
  }
  ssh_argv.push_back(h.name);
  ssh_argv.push_back("sh -c " + quote(script));
  return ssh_argv;
}

/// One word of rsync's --rsh command: rsync splits that command at spaces and keeps a quoted word
/// whole, but knows no backslash escapes, so a word that holds both kinds of quote cannot pass.
result<std::string> rsh_word(const std::string& word) {
  if (word.find_first_of(" \t'\"") == std::string::npos)
    return word;
  if (word.find('"') == std::string::npos)
    return "\"" + word + "\"";
  if (word.find('\'') == std::string::npos)
    return "'" + word + "'";
  return error{errc::invalid_argument, "--sync-dst-dir: rsync cannot pass the ssh option \"" +
                                           word + "\", which holds both kinds of quote"};
}

/// --sync-dst-dir: copies the directory `from` into `to` on every host of `hosts` (each host and
/// port once) with `rsync -az FROM/ HOST:TO`, all hosts at once, as launch.py does; rsync runs ssh
/// as the nodes' ssh does (BatchMode, the --ssh-option values, the host's port). Waits for every
/// copy; rsync's own messages go to stderr. An error names each host whose copy failed.
status sync_working_dir(const std::string& from, const std::string& to,
                        const std::vector<host>& hosts,
                        const std::vector<std::string>& ssh_options) {
  std::vector<host> targets;
  for (const auto& h : hosts)
    if (std::none_of(targets.begin(), targets.end(),
                     [&](const host& t) { return t.name == h.name && t.ssh_port == h.ssh_port; }))
      targets.push_back(h);
  std::vector<std::pair<std::string, pid_t>> copies;
  std::string failed;
  for (const auto& h : targets) {
    std::string rsh = "ssh -o BatchMode=yes";
    for (const auto& o : ssh_options) {
      auto word = rsh_word(o);
      if (!word)
        return word.error();
      rsh += " -o " + *word;
    }
    if (h.ssh_port)
      rsh += " -p " + std::to_string(*h.ssh_port);
    const std::vector<std::string> argv{"rsync", "-az", "-e", rsh, from + "/", h.name + ":" + to};
    std::vector<char*> argv_c;
    for (const auto& a : argv)
      argv_c.push_back(const_cast<char*>(a.c_str()));
    argv_c.push_back(nullptr);
    pid_t pid = -1;
    if (int rc = ::posix_spawnp(&pid, "rsync", nullptr, nullptr, argv_c.data(), environ); rc != 0) {
      failed +=
          (failed.empty() ? "" : "; ") + std::string("cannot run rsync: ") + std::strerror(rc);
      break;
    }
    copies.emplace_back(h.name, pid);
  }
  for (const auto& [name, pid] : copies) {
    int wstatus = 0;
    while (::waitpid(pid, &wstatus, 0) < 0 && errno == EINTR) {
    }
    if (WIFEXITED(wstatus) && WEXITSTATUS(wstatus) == 0)
      continue;
    failed += (failed.empty() ? "" : "; ") + std::string("rsync to ") + name + ":" + to + " " +
              (WIFSIGNALED(wstatus) ? "was killed by signal " + std::to_string(WTERMSIG(wstatus))
                                    : "exited with code " + std::to_string(WEXITSTATUS(wstatus)));
  }
  if (!failed.empty())
    return error{errc::io_error, "--sync-dst-dir: " + failed};
  return {};
}

/// Starts node `index` of `role` running `argv`: here, or in ssh mode (servers and workers) on
/// the next host. False when it could not start (the job is then stopping).
bool start_node(job& j, launch_plan& plan, troupe::node_role role, int index,
                const std::vector<std::string>& argv) {
  std::vector<std::string> env = plan.common_env;
  if (role == troupe::node_role::server)
    env.insert(env.end(), plan.server_env.begin(), plan.server_env.end());
  if (role == troupe::node_role::worker)
    env.insert(env.end(), plan.worker_env.begin(), plan.worker_env.end());
  env.push_back("DMLC_ROLE=" + std::string(troupe::to_string(role)));
  // The scheduler grants each node the rank of its index, so that "[worker 2]" is rank 2.
  if (role != troupe::node_role::scheduler)
    env.push_back("TROUPE_RANK_HINT=" + std::to_string(index));
  // Under --restart-servers a server that fails is started again as it was, recovering.
  std::vector<std::string> recover_argv;
  if (role == troupe::node_role::server && plan.opt.restart_servers > 0) {
    recover_argv = argv;
    recover_argv.emplace_back("--recover");
  }
  if (!plan.ssh || role == troupe::node_role::scheduler) {
    if (!plan.local_token.empty())
      env.push_back(std::string(token_variable) + "=" + plan.local_token);
    return j.start(label_for(role, index), role, argv, env, false, {}, std::move(recover_argv));
  }
  const host& h = plan.hosts[plan.next_host++ % plan.hosts.size()];
  env.push_back("DMLC_NODE_HOST=" + h.name);
  // Under --sync-dst-dir the remote node runs in the copy, and finds there what the launcher's
  // paths name in its working directory (synced_paths).
  for (auto& pair : env)
    pair = plan.synced.variable(pair);
  std::vector<std::string> remote_argv = argv;
  for (auto* words : {&remote_argv, &recover_argv})
    for (auto& word : *words)
      word = plan.synced(word);
  const bool token = !plan.ssh_token.empty();
  if (!recover_argv.empty())
    recover_argv = ssh_command(h, env, recover_argv, plan.cwd, plan.opt.ssh_options, token);
  return j.start(label_for(role, index), role,
                 ssh_command(h, env, remote_argv, plan.cwd, plan.opt.ssh_options, token), {}, true,
                 token ? plan.ssh_token + "\n" : std::string(), std::move(recover_argv));
}

/// The scheduler (always here), then the servers, then the workers, as launch.py orders them;
/// stops at the first node that cannot start.
void start_nodes(job& j, launch_plan& plan, const std::string& node_binary, int num_servers) {
  bool started =
      start_node(j, plan, troupe::node_role::scheduler, 0, {node_binary, "--role", "scheduler"});
  for (int i = 0; started && i < num_servers; ++i)
    started = start_node(j, plan, troupe::node_role::server, i, {node_binary, "--role", "server"});
  for (int i = 0; started && i < plan.opt.num_workers; ++i)
    started = start_node(j, plan, troupe::node_role::worker, i, plan.opt.command);
}

/// The launcher mode the flags ask for: "local", "ssh", "slurm", or "k8s" (--emit k8s); the
/// error's message is the usage line when flags of another mode are given with it.
result<std::string> launch_mode(const options& opt) {
  const std::string mode = !opt.emit.empty()       ? opt.emit
                           : !opt.launcher.empty() ? opt.launcher
                           : opt.hostfile.empty()  ? "local"
                                                   : "ssh";
  auto refuse = [&](const std::string& flag, const std::string& applies) {
    return error{errc::invalid_argument, flag + " applies to " + applies + " only"};
  };
  if (mode == "k8s" && !opt.launcher.empty())
    return error{errc::invalid_argument, "--emit k8s starts nothing: drop --launcher"};
  if (mode != "ssh" && !opt.hostfile.empty())
    return refuse("-H", "--launcher ssh");
  if (mode != "ssh" && !opt.sync_dst_dir.empty())
    return refuse("--sync-dst-dir", "--launcher ssh");
  if (mode != "ssh" && !opt.ssh_options.empty())
    return refuse("--ssh-option", "--launcher ssh");
  if ((mode == "slurm" || mode == "k8s") && opt.restart_servers > 0)
    return refuse("--restart-servers", "--launcher local and ssh");
  if (mode != "k8s" && (!opt.image.empty() || !opt.k8s_secret.empty() || opt.name != "troupe"))
    return error{errc::invalid_argument,
                 "--image, --name and --k8s-secret apply to --emit k8s only"};
  if (mode == "k8s" && opt.image.empty())
    return error{errc::invalid_argument, "--emit k8s needs --image IMAGE"};
  return mode;
}

/// --launcher slurm: this process is one task of `srun troupe-launch ...`; it becomes the node the
/// task's SLURM_PROCID names (apps/slurm_tasks.hpp) by exec, so that srun sees the node's own exit
/// code and signals. The job token must be configured, the same in every task (TROUPE_JOB_TOKEN
/// exported before srun, which passes it on, or job.token_file): tasks cannot agree on a random
/// one. The scheduler's address is DMLC_PS_ROOT_URI when exported, else the first node of the
/// step; its port the configured one, else slurm_job_port of SLURM_JOB_ID. A server or worker
/// whose configuration gives it no address other hosts can reach (no DMLC_NODE_HOST or
/// DMLC_INTERFACE, node.host loopback) is given its node's name (SLURMD_NODENAME).
int run_slurm_task(const options& opt, int num_servers, const env_settings& env_flags,
                   const std::string& node_binary) {
  const auto environment = troupe::process_environment();
  auto task = troupe::launch::place_slurm_task(environment, opt.num_workers, num_servers);
  if (!task)
    return usage_error(task.error().message());
  std::optional<std::string> scheduler_host;
  if (!environment("DMLC_PS_ROOT_URI"))
    scheduler_host = task->scheduler_host;
  auto cfg = load_job_config(opt, num_servers, scheduler_host, task->role);
  if (!cfg)
    return usage_error(cfg.error().message());
  if (cfg->auth_token.empty())
    return usage_error("--launcher slurm needs the job token configured, the same in every task: "
                       "export TROUPE_JOB_TOKEN before srun (e.g. TROUPE_JOB_TOKEN=$(openssl "
                       "rand -hex 32)) or set job.token_file on a shared file system");
  std::uint16_t port = cfg->scheduler_port.value_or(0);
  if (port == 0 && !task->job_port)
    return usage_error("--launcher slurm: no scheduler port: set DMLC_PS_ROOT_PORT or [scheduler] "
                       "port, or run under a Slurm job (SLURM_JOB_ID)");
  if (port == 0)
    port = *task->job_port;

  std::vector<std::string> env =
      common_environment(opt, cfg->scheduler_host, port, num_servers, env_flags.every_node);
  const auto role = task->role;
  const auto& role_pairs = role == troupe::node_role::server   ? env_flags.servers
                           : role == troupe::node_role::worker ? env_flags.workers
                                                               : std::vector<std::string>{};
  env.insert(env.end(), role_pairs.begin(), role_pairs.end());
  env.push_back("DMLC_ROLE=" + std::string(troupe::to_string(role)));
  if (role != troupe::node_role::scheduler) {
    env.push_back("TROUPE_RANK_HINT=" + std::to_string(task->index));
    if (!task->node_name.empty() && !environment("DMLC_NODE_HOST") &&
        !environment("DMLC_INTERFACE") &&
        (cfg->node_host.empty() || troupe::is_loopback(cfg->node_host)))
      env.push_back("DMLC_NODE_HOST=" + task->node_name);
  }
  std::vector<std::string> base;
  for (char** e = environ; *e; ++e)
    base.emplace_back(*e);
  const std::vector<std::string> environment_now = merged_environment(std::move(base), env);
  const std::vector<std::string> argv =
      role == troupe::node_role::worker
          ? opt.command
          : std::vector<std::string>{node_binary, "--role", std::string(troupe::to_string(role))};
  std::vector<char*> argv_c, env_c;
  for (const auto& a : argv)
    argv_c.push_back(const_cast<char*>(a.c_str()));
  argv_c.push_back(nullptr);
  for (const auto& e : environment_now)
    env_c.push_back(const_cast<char*>(e.c_str()));
  env_c.push_back(nullptr);
  ::execvpe(argv_c[0], argv_c.data(), env_c.data());
  const int failure = errno;
  write_all(STDERR_FILENO, "troupe-launch: cannot run " + argv[0] + " as " +
                               label_for(role, task->index) + ": " + std::strerror(failure) + "\n");
  return failure == EACCES ? 126 : exit_cannot_start;
}

/// --emit k8s: writes the manifests of the job (apps/k8s_manifests.hpp) on stdout. The cluster
/// file of --config goes into a ConfigMap, which is why it may not name a token: every pod reads
/// the token from the Secret. The scheduler's port is the configured one, else 9091 (dmlc-core's
/// Kubernetes tracker's).
int emit_k8s(const options& opt, int num_servers, const env_settings& env_flags) {
  troupe::launch::k8s_job job;
  auto cfg = load_job_config(opt, num_servers, std::nullopt, troupe::node_role::scheduler);
  if (!cfg)
    return usage_error(cfg.error().message());
  if (opt.config) {
    auto file_only =
        troupe::load_config(*opt.config, troupe::environment_from({}), troupe::config_overrides{});
    if (!file_only)
      return usage_error(file_only.error().message());
    if (!file_only->auth_token.empty() || !file_only->auth_token_file.empty())
      return usage_error("--emit k8s: the cluster file " + *opt.config +
                         " names a job token (job.token or job.token_file); on Kubernetes every "
                         "pod reads it from the Secret, so leave it out of the file");
    auto text = troupe::read_file(*opt.config, "cluster file");
    if (!text)
      return usage_error(text.error().message());
    job.config_text = std::move(*text);
  }
  job.name = opt.name;
  job.image = opt.image;
  job.secret = opt.k8s_secret;
  job.num_workers = opt.num_workers;
  job.num_servers = num_servers;
  if (cfg->scheduler_port && *cfg->scheduler_port != 0)
    job.port = *cfg->scheduler_port;
  job.quorum = opt.quorum;
  if (!opt.node_binary.empty())
    job.node_binary = opt.node_binary;
  job.command = opt.command;
  job.every_node_env = env_flags.every_node;
  job.server_env = env_flags.servers;
  job.worker_env = env_flags.workers;
  auto manifests = troupe::launch::k8s_manifests(job);
  if (!manifests)
    return usage_error("--emit k8s: " + manifests.error().message());
  write_all(STDOUT_FILENO, *manifests);
  return 0;
}

} // namespace

int main(int argc, char** argv) {
  options opt;
  CLI::App app{"troupe-launch: starts a troupe job (scheduler, servers, workers), as MXNet's "
               "tools/launch.py does."};
  add_flags(app, opt);
  if (auto done = troupe::parse_command_line(app, "troupe-launch", argc, argv))
    return *done;

  if (!opt.merge_trace.empty()) {
    const troupe::logger log{"troupe-launch", 1};
    return merge_node_traces(opt.merge_trace, log) ? 0 : 1;
  }
  if (opt.num_workers == 0)
    return usage_error("--num-workers is required");
  if (opt.command.empty())
    return usage_error("give the worker program and its arguments after --");
  // Everything that can be wrong with the request is checked before anything starts.
  auto stop_grace = troupe::parse_duration(opt.stop_grace);
  if (!stop_grace)
    return usage_error("--stop-grace: " + stop_grace.error().message());
  auto finish_timeout = troupe::parse_duration(opt.finish_timeout);
  if (!finish_timeout)
    return usage_error("--finish-timeout: " + finish_timeout.error().message());
  const int num_servers = opt.num_servers.value_or(opt.num_workers);
  auto mode = launch_mode(opt);
  if (!mode)
    return usage_error(mode.error().message());
  const bool ssh = *mode == "ssh";
  auto env_flags = resolve_env_flags(opt, troupe::process_environment(), ssh);
  if (!env_flags)
    return usage_error(env_flags.error().message());
  if (*mode == "k8s")
    return emit_k8s(opt, num_servers, *env_flags);

  std::string node_binary = opt.node_binary.empty() ? default_node_binary() : opt.node_binary;
  if (::access(node_binary.c_str(), X_OK) != 0)
    return usage_error("no node program at " + node_binary + " (" + std::strerror(errno) +
                       "); build troupe-node or pass --node-binary");
  if (*mode == "slurm")
    return run_slurm_task(opt, num_servers, *env_flags, node_binary);

  auto cfg = load_job_config(opt, num_servers,
                             ssh ? std::nullopt : std::optional<std::string>("127.0.0.1"),
                             troupe::node_role::scheduler);
  if (!cfg)
    return usage_error(cfg.error().message());
  if (auto restartable = check_restart_servers(opt, *cfg); !restartable)
    return usage_error(restartable.error().message());
  const troupe::logger log{"troupe-launch", cfg->verbose};

  std::vector<host> hosts;
  if (ssh) {
    auto read = load_hosts(opt, *cfg, log);
    if (!read)
      return usage_error(read.error().message());
    hosts = std::move(*read);
  }
  auto port = choose_scheduler_port(*cfg);
  if (!port)
    return usage_error(port.error().message());
  std::error_code ec;
  const std::string cwd = std::filesystem::current_path(ec).string();
  // launch.py's --sync-dst-dir: the remote nodes run in the copy.
  if (!opt.sync_dst_dir.empty())
    if (auto synced = sync_working_dir(cwd, opt.sync_dst_dir, hosts, opt.ssh_options); !synced)
      return usage_error(synced.error().message());

  int signal_fd = job_signal_fd();
  if (signal_fd < 0) {
    log.error(std::string("cannot create a signalfd: ") + std::strerror(errno));
    return 1;
  }
  std::vector<std::string> base_env;
  for (char** e = environ; *e; ++e)
    base_env.emplace_back(*e);
  add_malloc_tuning(base_env);
  // The job's token (see the file comment): the configured one, else a fresh one.
  std::string token = cfg->auth_token;
  const bool made_token = token.empty();
  if (made_token) {
    auto made = random_token();
    if (!made) {
      log.error(made.error().message());
      return 1;
    }
    token = std::move(*made);
  }
  launch_plan plan{opt,
                   ssh,
                   std::move(hosts),
                   common_environment(opt, ssh ? cfg->scheduler_host : std::string("127.0.0.1"),
                                      *port, num_servers, env_flags->every_node),
                   opt.sync_dst_dir.empty() ? cwd : opt.sync_dst_dir,
                   synced_paths(cwd, opt.sync_dst_dir),
                   made_token ? token : std::string(),
                   ssh ? token : std::string(),
                   env_flags->servers,
                   env_flags->workers};

  const worker_quorum quorum{opt.num_workers, cfg->quorum.value_or(opt.num_workers)};
  job j(std::move(base_env), signal_fd, *stop_grace, *finish_timeout, quorum, opt.restart_servers,
        log);
  start_nodes(j, plan, node_binary, num_servers);
  int next_worker = opt.num_workers;
  const int capacity = cfg->max_workers.value_or(opt.num_workers);
  j.on_add_worker([&] {
    if (next_worker >= capacity) {
      log.error("SIGUSR2: the job has room for " + std::to_string(capacity) +
                " workers, all started (--max-workers)");
      return;
    }
    log.info("SIGUSR2: starting worker " + std::to_string(next_worker) +
             ", which joins the running job");
    start_node(j, plan, troupe::node_role::worker, next_worker, opt.command);
    ++next_worker;
  });
  // When a node could not start, the job is already stopping: run() waits for what did start.
  const int code = j.run();
  if (!opt.trace.empty()) {
    std::error_code absolute_ec;
    const auto trace = std::filesystem::absolute(opt.trace, absolute_ec).string();
    merge_node_traces(opt.trace, log, absolute_ec ? std::nullopt : plan.synced.here(trace));
  }
  return code;
}
