// troupe-launch as a user runs it: the real binary, with tests/cluster/fake_node as the node
// program and as the worker command (a test double that prints its environment, records its
// pid and exits as told), so that what is checked is the launcher's own behaviour: environment,
// prefixes, exit codes, and that no process is left behind. Every wait is bounded.

#include <algorithm>
#include <arpa/inet.h>
#include <array>
#include <cerrno>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <netinet/in.h>
#include <optional>
#include <poll.h>
#include <regex>
#include <set>
#include <spawn.h>
#include <sstream>
#include <string>
#include <sys/socket.h>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "process_support.hpp"

using namespace troupe::testing;
namespace fs = std::filesystem;
using namespace std::chrono_literals;
using clock_type = std::chrono::steady_clock;

namespace {

const std::string launch_path = TROUPE_LAUNCH_PATH;
const std::string fake_node_path = TROUPE_FAKE_NODE_PATH;

outcome run_launch(const std::vector<std::string>& args,
                   const std::map<std::string, std::string>& env,
                   std::chrono::milliseconds limit = 30s) {
  return run(launch_path, args, env, limit);
}

// temp_dir, child_process, run, alive, lines_of, with_prefix: process_support.hpp

/// The pids the fake nodes recorded in `dir`.
std::vector<pid_t> recorded_pids(const fs::path& dir) {
  std::vector<pid_t> pids;
  for (const auto& entry : fs::directory_iterator(dir)) {
    auto name = entry.path().filename().string();
    if (name.starts_with("pid-"))
      pids.push_back(std::stoi(name.substr(4)));
  }
  return pids;
}

/// The running processes whose environment holds FAKE_NODE_DIR=`dir`: every fake node of a
/// test, including one stopped before it could record its pid.
std::vector<pid_t> processes_of(const fs::path& dir) {
  const std::string marker = "FAKE_NODE_DIR=" + dir.string();
  std::vector<pid_t> pids;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator("/proc", ec)) {
    auto name = entry.path().filename().string();
    if (name.empty() || !std::all_of(name.begin(), name.end(), ::isdigit))
      continue;
    std::ifstream in(entry.path() / "environ", std::ios::binary);
    std::string variable;
    while (std::getline(in, variable, '\0'))
      if (variable == marker) {
        pids.push_back(std::stoi(name));
        break;
      }
  }
  return pids;
}

/// No fake node of `dir` runs: neither a recorded pid nor a process whose environment names
/// `dir`. Waits up to 2 s for the kernel to finish with them.
bool none_left_alive(const fs::path& dir, std::string& left) {
  const auto deadline = clock_type::now() + 2s;
  do {
    left.clear();
    auto pids = recorded_pids(dir);
    auto found = processes_of(dir);
    pids.insert(pids.end(), found.begin(), found.end());
    for (pid_t pid : pids)
      if (alive(pid))
        left += std::to_string(pid) + " ";
    if (left.empty())
      return true;
    std::this_thread::sleep_for(20ms);
  } while (clock_type::now() < deadline);
  return false;
}

std::vector<std::string> job_args(int workers, std::optional<int> servers,
                                  std::vector<std::string> extra = {}) {
  std::vector<std::string> args{"-n", std::to_string(workers)};
  if (servers) {
    args.push_back("-s");
    args.push_back(std::to_string(*servers));
  }
  args.insert(args.end(), {"--node-binary", fake_node_path, "--stop-grace", "1s"});
  args.insert(args.end(), extra.begin(), extra.end());
  return args;
}

/// The environment of a fake job in which the workers `failing` (claimed indices, comma-separated)
/// fail with exit `code` while the others would work 30 s; `more` adds FAKE_NODE_* settings.
std::map<std::string, std::string>
with_failing_workers(const temp_dir& dir, std::string failing, std::string code,
                     std::map<std::string, std::string> more = {}) {
  more.insert({{"FAKE_NODE_DIR", dir.path().string()},
               {"FAKE_NODE_FAIL_INDEX", std::move(failing)},
               {"FAKE_NODE_FAIL_CODE", std::move(code)},
               {"FAKE_NODE_WORKER_MS", "30000"}});
  return more;
}

std::vector<std::string> with_command(std::vector<std::string> args,
                                      std::vector<std::string> command = {}) {
  args.push_back("--");
  args.push_back(fake_node_path);
  args.insert(args.end(), command.begin(), command.end());
  return args;
}

/// The TROUPE_JOB_TOKEN each fake node printed ("-" for none), by its output prefix.
std::map<std::string, std::string> node_tokens(const std::string& out) {
  std::map<std::string, std::string> tokens;
  const std::regex line_re{
      R"(^\[([a-z]+(?: \d+)?)\] fake node role=\S+ index=\S+ quorum=\S+ token=(\S+) )"};
  for (const auto& line : lines_of(out)) {
    std::smatch m;
    if (std::regex_search(line, m, line_re))
      tokens[m[1]] = m[2];
  }
  return tokens;
}

/// `text` with every "token=<token>" field of the fake nodes' lines taken out: what remains must
/// not hold the token.
std::string without_token_fields(std::string text, const std::string& token) {
  const std::string field = "token=" + token;
  for (auto at = text.find(field); at != std::string::npos; at = text.find(field, at))
    text.erase(at, field.size());
  return text;
}

/// Runs `argv` to its end (bounded); its exit code, or -1 when it could not run or timed out.
int run_tool(const std::vector<std::string>& argv, std::chrono::milliseconds limit = 20s) {
  std::vector<char*> argv_c;
  for (const auto& a : argv)
    argv_c.push_back(const_cast<char*>(a.c_str()));
  argv_c.push_back(nullptr);
  pid_t pid = -1;
  if (::posix_spawn(&pid, argv_c[0], nullptr, nullptr, argv_c.data(), environ) != 0)
    return -1;
  const auto deadline = clock_type::now() + limit;
  int status = 0;
  while (::waitpid(pid, &status, WNOHANG) == 0) {
    if (clock_type::now() > deadline) {
      ::kill(pid, SIGKILL);
      ::waitpid(pid, &status, 0);
      return -1;
    }
    std::this_thread::sleep_for(10ms);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/// Why ssh mode cannot be tested on this machine, or nullopt when an sshd can be started.
std::optional<std::string> ssh_unavailable() {
  if (::access("/usr/sbin/sshd", X_OK) != 0)
    return "no /usr/sbin/sshd (openssh-server is not installed)";
  if (::access("/usr/bin/ssh", X_OK) != 0 || ::access("/usr/bin/ssh-keygen", X_OK) != 0)
    return "no ssh client (openssh-client is not installed)";
  if (::geteuid() == 0 && !fs::is_directory("/run/sshd"))
    return "running as root, where sshd needs /run/sshd, which is absent";
  return std::nullopt;
}

boost::test_tools::assertion_result sshd_available(boost::unit_test::test_unit_id) {
  auto reason = ssh_unavailable();
  boost::test_tools::assertion_result result(!reason);
  if (reason)
    result.message() << "ssh mode not tested: " << *reason;
  return result;
}

/// An sshd on 127.0.0.1 at a free port that lets this user in with a key made for the test, and
/// nobody else in any way; stopped on destruction.
class ssh_server {
public:
  explicit ssh_server(const fs::path& dir) : dir_(dir) {
    BOOST_TEST_REQUIRE(run_tool({"/usr/bin/ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                                 (dir / "host_key").string()}) == 0);
    BOOST_TEST_REQUIRE(run_tool({"/usr/bin/ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f",
                                 (dir / "user_key").string()}) == 0);
    fs::copy_file(dir / "user_key.pub", dir / "authorized_keys");
    {
      listening_socket probe; // a port that was free a moment ago
      port_ = probe.port();
    }
    std::ofstream(dir / "sshd_config")
        << "Port " << port_ << "\nListenAddress 127.0.0.1\nHostKey " << (dir / "host_key").string()
        << "\nAuthorizedKeysFile " << (dir / "authorized_keys").string()
        << "\nStrictModes no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
           "UsePAM no\nPermitRootLogin prohibit-password\nLogLevel ERROR\n";
    const std::string config = (dir / "sshd_config").string();
    const std::string log = (dir / "sshd.log").string();
    // sshd must be started by its absolute path; -D keeps it in the foreground, our child.
    std::vector<const char*> argv{"/usr/sbin/sshd", "-D",   "-f", config.c_str(), "-E",
                                  log.c_str(),      nullptr};
    BOOST_TEST_REQUIRE(::posix_spawn(&pid_, argv[0], nullptr, nullptr,
                                     const_cast<char**>(argv.data()), environ) == 0);
    const auto deadline = clock_type::now() + 10s;
    while (!accepts() && clock_type::now() < deadline) {
      if (::waitpid(pid_, nullptr, WNOHANG) == pid_) {
        pid_ = -1;
        std::ifstream in(log);
        std::string text((std::istreambuf_iterator<char>(in)), {});
        BOOST_FAIL("sshd exited: " << text);
      }
      std::this_thread::sleep_for(20ms);
    }
    BOOST_TEST_REQUIRE(accepts());
  }
  ~ssh_server() {
    if (pid_ <= 0)
      return;
    ::kill(pid_, SIGTERM);
    const auto deadline = clock_type::now() + 5s;
    while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
      if (clock_type::now() > deadline) {
        ::kill(pid_, SIGKILL);
        ::waitpid(pid_, nullptr, 0);
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
  }
  ssh_server(const ssh_server&) = delete;
  ssh_server& operator=(const ssh_server&) = delete;

  /// A hostfile naming this server `count` times.
  fs::path hostfile(int count) const {
    std::ofstream out(dir_ / "hosts");
    out << "# the test's sshd\n";
    for (int i = 0; i < count; ++i)
      out << "127.0.0.1:" << port_ << "\n";
    return dir_ / "hosts";
  }

  /// troupe-launch flags that make ssh use the test's key and trust the test's host key.
  std::vector<std::string> launch_flags() const {
    std::vector<std::string> flags;
    for (const std::string& option :
         {"IdentityFile=" + (dir_ / "user_key").string(), std::string("IdentitiesOnly=yes"),
          std::string("StrictHostKeyChecking=no"), std::string("UserKnownHostsFile=/dev/null"),
          std::string("LogLevel=ERROR")}) {
      flags.push_back("--ssh-option");
      flags.push_back(option);
    }
    return flags;
  }

private:
  bool accepts() const {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<std::uint16_t>(port_));
    bool ok = ::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0;
    ::close(fd);
    return ok;
  }

  fs::path dir_;
  int port_ = 0;
  pid_t pid_ = -1;
};

/// An `ssh` for ssh mode without an sshd, written into `dir`/bin: it records the arguments it was
/// given in `dir`/ssh-args-<pid>, skips ssh's options and the host, and runs the remote command
/// here as sshd would (`sh -c` of the rest, joined by spaces), so rsync can use it too. Returns
/// the PATH that puts it first.
std::string fake_ssh_path(const temp_dir& dir) {
  const fs::path bin = dir.path() / "bin";
  fs::create_directories(bin);
  dir.write("bin/ssh",
            "#!/bin/sh\n"
            "printf '%s\\n' \"$@\" > \"" +
                (dir.path() / "ssh-args-").string() +
                "$$\"\n"
                "while [ $# -gt 0 ]; do\n"
                "  case \"$1\" in\n"
                "    -o|-p|-l|-i|-e) shift 2 ;;\n"
                "    -*) shift ;;\n"
                "    *) break ;;\n"
                "  esac\n"
                "done\n"
                "shift\n"
                // Every fake host is this machine: the rsync servers of --sync-dst-dir, which
                // on real hosts write to different disks, would race to create the same
                // directory here. One at a time, as on hosts of their own.
                "case \"$1\" in rsync) exec flock \"" +
                (dir.path() / "rsync.lock").string() +
                "\" /bin/sh -c \"$*\" ;; esac\n"
                "exec /bin/sh -c \"$*\"\n",
            0700);
  const char* path = std::getenv("PATH");
  return bin.string() + ":" + (path ? path : "/usr/bin:/bin");
}

/// The argument lists the fake ssh of `dir` recorded, one string each (an argument a line).
std::vector<std::string> ssh_runs(const fs::path& dir) {
  std::vector<std::string> runs;
  for (const auto& entry : fs::directory_iterator(dir))
    if (entry.path().filename().string().starts_with("ssh-args-")) {
      std::ifstream in(entry.path());
      runs.emplace_back(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    }
  return runs;
}

/// The field `name`=VALUE of a fake node's line (VALUE up to the next blank), or "".
std::string field(const std::string& line, const std::string& name) {
  const auto at = line.find(" " + name + "=");
  if (at == std::string::npos)
    return "";
  const auto begin = at + name.size() + 2;
  return line.substr(begin, line.find(' ', begin) - begin);
}

/// troupe-launch run in directory `cwd` (through sh, as child_process starts in the test's own).
outcome run_launch_in(const fs::path& cwd, const std::vector<std::string>& args,
                      const std::map<std::string, std::string>& env) {
  std::vector<std::string> sh_args{"-c", "cd \"$1\" && shift && exec \"$@\"", "sh", cwd.string(),
                                   launch_path};
  sh_args.insert(sh_args.end(), args.begin(), args.end());
  return run("/bin/sh", sh_args, env);
}

boost::test_tools::assertion_result rsync_available(boost::unit_test::test_unit_id) {
  boost::test_tools::assertion_result result(::access("/usr/bin/rsync", X_OK) == 0);
  if (!result)
    result.message() << "--sync-dst-dir not tested: no /usr/bin/rsync (rsync is not installed)";
  return result;
}

/// The environment srun gives task `procid` of `ntasks` running on `node` (see
/// apps/slurm_tasks.hpp), plus `more`.
std::map<std::string, std::string> slurm_env(int procid, int ntasks, const std::string& node,
                                             std::map<std::string, std::string> more) {
  more.insert({{"SLURM_PROCID", std::to_string(procid)},
               {"SLURM_NTASKS", std::to_string(ntasks)},
               {"SLURMD_NODENAME", node}});
  return more;
}

} // namespace

BOOST_AUTO_TEST_SUITE(launcher)

BOOST_AUTO_TEST_CASE(every_line_carries_its_role_and_start_index_and_success_exits_0) {
  temp_dir dir;
  auto r = run_launch(with_command(job_args(3, 2), {"arg1", "two words"}),
                      {{"FAKE_NODE_DIR", dir.path().string()}, {"FAKE_NODE_GRANDCHILD", "1"}});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 0, r.err);

  // Every line is prefixed; each node printed its role under its own prefix.
  for (const auto& line : lines_of(r.out))
    BOOST_TEST(std::regex_match(line, std::regex{R"(\[(scheduler|server \d|worker \d)\] .*)"}),
               line);
  BOOST_TEST(with_prefix(r.out, "[scheduler] fake node role=scheduler ").size() == 1);
  for (int i = 0; i < 2; ++i)
    BOOST_TEST(
        with_prefix(r.out, "[server " + std::to_string(i) + "] fake node role=server ").size() ==
        1);
  for (int i = 0; i < 3; ++i) {
    auto lines = with_prefix(r.out, "[worker " + std::to_string(i) + "] ");
    BOOST_TEST_REQUIRE(lines.size() == 2);
    BOOST_TEST(lines[0].find("fake node role=worker ") != std::string::npos);
    BOOST_TEST(lines[0].ends_with("args=arg1|two words"));
    // A last line without '\n' is still printed, as a line of its own.
    BOOST_TEST(lines[1] == "[worker " + std::to_string(i) + "] last words without a newline");
    BOOST_TEST(with_prefix(r.err, "[worker " + std::to_string(i) + "] fake node stderr").size() ==
               1);
  }
  BOOST_TEST(with_prefix(r.out, "[server 2]").empty());
  BOOST_TEST(with_prefix(r.out, "[worker 3]").empty());

  // Every node got the same scheduler address and job size.
  std::set<std::string> roots;
  std::regex env_re{R"(root=(\S+) workers=(\S+) servers=(\S+) config=(\S+))"};
  for (const auto& line : lines_of(r.out)) {
    std::smatch m;
    if (!std::regex_search(line, m, env_re))
      continue;
    roots.insert(m[1]);
    BOOST_TEST(m[2] == "3");
    BOOST_TEST(m[3] == "2");
    BOOST_TEST(m[4] == "-"); // no --config, no TROUPE_CONFIG
  }
  BOOST_TEST_REQUIRE(roots.size() == 1);
  BOOST_TEST(std::regex_match(*roots.begin(), std::regex{R"(127\.0\.0\.1:[1-9]\d*)"}));
  BOOST_TEST(
      with_prefix(r.out, "[scheduler] fake node").front().ends_with("args=--role|scheduler"));

  std::string left;
  BOOST_TEST(recorded_pids(dir.path()).size() == 12); // 6 nodes and a grandchild each
  BOOST_TEST(none_left_alive(dir.path(), left), "still alive: " << left);
}

BOOST_AUTO_TEST_CASE(servers_default_to_the_number_of_workers) {
  temp_dir dir;
  auto r =
      run_launch(with_command(job_args(2, std::nullopt)), {{"FAKE_NODE_DIR", dir.path().string()}});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 0, r.err);
  BOOST_TEST(with_prefix(r.out, "[server 1] fake node role=server").size() == 1);
  BOOST_TEST(with_prefix(r.out, "[server 2]").empty());
  BOOST_TEST(r.out.find("servers=2 ") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(the_first_failing_worker_code_is_returned_and_every_other_node_stopped) {
  temp_dir dir;
  auto r = run_launch(with_command(job_args(3, 2)),
                      with_failing_workers(dir, "1", "3", {{"FAKE_NODE_GRANDCHILD", "1"}}));
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 3, r.err);
  BOOST_TEST(r.elapsed < 15s); // the other workers would have run 30 s
  BOOST_TEST(std::regex_search(r.err, std::regex{R"(troupe-launch: worker \d exited with code 3; )"
                                                 R"(stopping the job)"}),
             r.err);
  BOOST_TEST(r.out.find("worker 1 failing") != std::string::npos);
  std::string left;
  BOOST_TEST(recorded_pids(dir.path()).size() == 12);
  BOOST_TEST(none_left_alive(dir.path(), left), "still alive: " << left);
}

BOOST_AUTO_TEST_CASE(a_worker_failing_within_the_quorum_leaves_the_job_to_finish_with_exit_3) {
  temp_dir dir;
  // Worker 1 fails once the others are done, and the scheduler has exited 3 (fake_node's quorum).
  auto r = run_launch(with_command(job_args(3, 2, {"--quorum", "2"})),
                      {{"FAKE_NODE_DIR", dir.path().string()},
                       {"FAKE_NODE_FAIL_INDEX", "1"},
                       {"FAKE_NODE_FAIL_CODE", "5"},
                       {"FAKE_NODE_FAIL_DELAY_MS", "500"},
                       {"FAKE_NODE_GRANDCHILD", "1"}});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 3, r.err);
  // --quorum reaches every node as TROUPE_QUORUM.
  for (const auto& line : lines_of(r.out))
    if (line.find("fake node role=") != std::string::npos)
      BOOST_TEST(line.find(" quorum=2 ") != std::string::npos, line);
  BOOST_TEST(r.out.find("worker 1 failing") != std::string::npos, r.out);
  BOOST_TEST(r.err.find("stopping the job") == std::string::npos, r.err);
  BOOST_TEST(std::regex_search(r.err, std::regex{R"(troupe-launch: worker \d exited with code 5; )"
                                                 R"(the job goes on without it \(quorum 2 of 3: )"
                                                 R"(1 of 1 workers that may be lost\))"}),
             r.err);
  BOOST_TEST(std::regex_search(r.err, std::regex{R"(troupe-launch: summary: the job finished with )"
                                                 R"(lost workers: 1 of 3 lost \(quorum 2 of 3\): )"
                                                 R"(worker \d exited with code 5 after \d+m?s\n)"}),
             r.err);
  std::string left;
  BOOST_TEST(recorded_pids(dir.path()).size() == 12);
  BOOST_TEST(none_left_alive(dir.path(), left), "still alive: " << left);
}

BOOST_AUTO_TEST_CASE(a_worker_lost_beyond_the_quorum_stops_the_job_with_its_code) {
  temp_dir dir;
  auto r = run_launch(with_command(job_args(3, 1, {"--quorum", "2"})),
                      with_failing_workers(dir, "0,1", "5"));
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 5, r.err);
  BOOST_TEST(r.elapsed < 15s); // the third worker would have run 30 s
  BOOST_TEST(
      std::regex_search(r.err, std::regex{R"(worker \d exited with code 5; the job goes on)"}),
      r.err);
  BOOST_TEST(
      std::regex_search(r.err, std::regex{R"(worker \d exited with code 5; stopping the job)"}),
      r.err);
  BOOST_TEST(r.err.find("summary") == std::string::npos, r.err);
  std::string left;
  BOOST_TEST(none_left_alive(dir.path(), left), "still alive: " << left);
}

BOOST_AUTO_TEST_CASE(a_quorum_larger_than_the_workers_exits_2_naming_the_flag) {
  temp_dir dir;
  auto r = run_launch(with_command(job_args(3, 1, {"--quorum", "4"})),
                      {{"FAKE_NODE_DIR", dir.path().string()}});
  BOOST_TEST(r.exit_code == 2, r.err);
  BOOST_TEST(r.err.find("--quorum (4) must not exceed") != std::string::npos, r.err);
  BOOST_TEST(lines_of(r.err).size() == 1u, r.err);
  BOOST_TEST(recorded_pids(dir.path()).empty());
}

BOOST_AUTO_TEST_CASE(restart_servers_without_a_checkpoint_dir_or_server_rejoin_exits_2) {
  temp_dir dir;
  const std::vector<std::pair<std::string, std::string>> cases{
      {"[checkpoint]\nevery_rounds = 1\n", "needs checkpoint.dir"},
      {"[checkpoint]\ndir = \"" + (dir / "checkpoints").string() + "\"\nevery_rounds = 1\n",
       "needs timeouts.server_rejoin above 0s"}};
  for (const auto& [text, expected] : cases) {
    const auto config = dir.write("cluster.toml", text);
    auto r =
        run_launch(with_command(job_args(1, 1, {"--config", config.string(), "--restart-servers"})),
                   {{"FAKE_NODE_DIR", dir.path().string()}});
    BOOST_TEST(r.exit_code == 2, r.err);
    BOOST_TEST(r.err.starts_with("troupe-launch: --restart-servers=3 " + expected), r.err);
    BOOST_TEST(lines_of(r.err).size() == 1u, r.err);
    BOOST_TEST(recorded_pids(dir.path()).empty());
  }
}

BOOST_AUTO_TEST_CASE(a_server_that_keeps_dying_is_restarted_n_times_then_the_job_fails_naming_it) {
  temp_dir dir;
  const auto config =
      dir.write("cluster.toml", "[timeouts]\nserver_rejoin = \"30s\"\n[checkpoint]\ndir = \"" +
                                    (dir / "checkpoints").string() + "\"\nevery_rounds = 1\n");
  // The servers die by SIGKILL 100 ms after each start; the workers would work 30 s.
  auto r =
      run_launch(with_command(job_args(1, 1, {"--config", config.string(), "--restart-servers=2"})),
                 with_failing_workers(
                     dir, "", "0",
                     {{"FAKE_NODE_SERVER_FAIL_SIGNAL", "9"}, {"FAKE_NODE_FAIL_DELAY_MS", "100"}}));
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 128 + SIGKILL, r.err);
  for (int restart = 1; restart <= 2; ++restart)
    BOOST_TEST(count_lines(r.err, "troupe-launch: server 0 was killed by signal 9; restarting it "
                                  "with --recover (restart " +
                                      std::to_string(restart) + " of 2)") == 1u,
               r.err);
  BOOST_TEST(count_lines(r.err, "troupe-launch: server 0 was killed by signal 9 after 2 restarts "
                                "(--restart-servers=2); stopping the job") == 1u,
             r.err);
  // The same command, environment and rank each time, plus --recover after the first.
  const auto starts = with_prefix(r.out, "[server 0] fake node role=server ");
  BOOST_TEST_REQUIRE(starts.size() == 3u, r.out);
  BOOST_TEST(starts[0].ends_with("args=--role|server"));
  BOOST_TEST(starts[1].ends_with("args=--role|server|--recover"));
  BOOST_TEST(starts[2].ends_with("args=--role|server|--recover"));
  std::string left;
  BOOST_TEST(none_left_alive(dir.path(), left), "still alive: " << left);
}

BOOST_AUTO_TEST_CASE(a_worker_killed_by_a_signal_gives_128_plus_the_signal) {
  temp_dir dir;
  auto r = run_launch(with_command(job_args(2, 1)), {{"FAKE_NODE_DIR", dir.path().string()},
                                                     {"FAKE_NODE_FAIL_INDEX", "0"},
                                                     {"FAKE_NODE_FAIL_SIGNAL", "9"},
                                                     {"FAKE_NODE_WORKER_MS", "30000"}});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 128 + 9, r.err);
  BOOST_TEST(std::regex_search(r.err, std::regex{R"(worker \d was killed by signal 9)"}), r.err);
  std::string left;
  BOOST_TEST(none_left_alive(dir.path(), left), "still alive: " << left);
}

BOOST_AUTO_TEST_CASE(nodes_that_ignore_sigterm_are_killed_after_the_grace_period) {
  temp_dir dir;
  auto r = run_launch(with_command(job_args(2, 2)),
                      with_failing_workers(dir, "0", "5", {{"FAKE_NODE_IGNORE_TERM", "1"}}));
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 5, r.err);
  BOOST_TEST(r.err.find("after SIGTERM; sending SIGKILL") != std::string::npos, r.err);
  BOOST_TEST(r.elapsed >= 1s); // --stop-grace 1s
  BOOST_TEST(r.elapsed < 15s);
  std::string left;
  BOOST_TEST(none_left_alive(dir.path(), left), "still alive: " << left);
}

BOOST_AUTO_TEST_CASE(frozen_nodes_are_stopped_at_once_not_after_the_grace_period) {
  // A stopped process acts on SIGTERM only once continued: the launcher continues what it stops.
  temp_dir dir;
  auto r = run_launch(with_command(job_args(2, 2)),
                      with_failing_workers(dir, "0", "5", {{"FAKE_NODE_FREEZE", "1"}}));
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 5, r.err);
  // Frozen, they would ignore SIGTERM until the grace (1 s) ran out and SIGKILL came.
  BOOST_TEST(r.err.find("sending SIGKILL") == std::string::npos, r.err);
  std::string left;
  BOOST_TEST(none_left_alive(dir.path(), left), "still alive: " << left);
}

BOOST_AUTO_TEST_CASE(a_scheduler_and_servers_outliving_the_workers_are_stopped_with_124) {
  temp_dir dir;
  auto r = run_launch(with_command(job_args(1, 1, {"--finish-timeout", "500ms"})),
                      {{"FAKE_NODE_DIR", dir.path().string()}, {"FAKE_NODE_STAY", "1"}});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 124, r.err);
  BOOST_TEST(r.err.find("scheduler, server 0 still running 500ms after every worker finished") !=
                 std::string::npos,
             r.err);
  std::string left;
  BOOST_TEST(none_left_alive(dir.path(), left), "still alive: " << left);
}

BOOST_AUTO_TEST_CASE(sigterm_to_the_launcher_stops_every_node) {
  temp_dir dir;
  child_process l(launch_path, with_command(job_args(2, 2)),
                  {{"FAKE_NODE_DIR", dir.path().string()},
                   {"FAKE_NODE_WORKER_MS", "30000"},
                   {"FAKE_NODE_GRANDCHILD", "1"}});
  // Wait (bounded) until all five nodes and their grandchildren have recorded their pids.
  const auto deadline = clock_type::now() + 10s;
  while (recorded_pids(dir.path()).size() < 10 && clock_type::now() < deadline)
    std::this_thread::sleep_for(20ms);
  BOOST_TEST_REQUIRE(recorded_pids(dir.path()).size() == 10);
  BOOST_TEST_REQUIRE(::kill(l.pid(), SIGTERM) == 0);
  auto r = l.wait(15s);
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 128 + SIGTERM, r.err);
  BOOST_TEST(r.err.find("got signal 15: stopping the job") != std::string::npos, r.err);
  std::string left;
  BOOST_TEST(none_left_alive(dir.path(), left), "still alive: " << left);
}

BOOST_AUTO_TEST_CASE(a_broken_config_file_exits_2_with_one_line_naming_it_and_starts_nothing) {
  temp_dir dir;
  auto config = dir.write("cluster.toml", "[job]\nnum_workrs = 2\n");
  auto r = run_launch(with_command(job_args(2, 1, {"--config", config.string()})),
                      {{"FAKE_NODE_DIR", dir.path().string()}});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 2);
  BOOST_TEST(r.err ==
             "troupe-launch: " + config.string() + ":2:1: unknown key 'num_workrs' in [job]\n");
  BOOST_TEST(r.out.empty());
  BOOST_TEST(recorded_pids(dir.path()).empty());

  auto toml = dir.write("broken.toml", "[job]\nid = \"unterminated\n");
  r = run_launch(with_command(job_args(2, 1, {"--config", toml.string()})),
                 {{"FAKE_NODE_DIR", dir.path().string()}});
  BOOST_TEST(r.exit_code == 2);
  BOOST_TEST(r.err.starts_with("troupe-launch: " + toml.string() + ":2:"), r.err);
  BOOST_TEST(lines_of(r.err).size() == 1);
  BOOST_TEST(recorded_pids(dir.path()).empty());
}

BOOST_AUTO_TEST_CASE(a_bad_dmlc_variable_exits_2_naming_the_variable) {
  temp_dir dir;
  auto r = run_launch(with_command(job_args(1, 1)),
                      {{"FAKE_NODE_DIR", dir.path().string()}, {"DMLC_PS_ROOT_PORT", "http"}});
  BOOST_TEST(r.exit_code == 2);
  BOOST_TEST(r.err == "troupe-launch: DMLC_PS_ROOT_PORT must be a port number from 0 to 65535, "
                      "got \"http\"\n");
  BOOST_TEST(recorded_pids(dir.path()).empty());
}

BOOST_AUTO_TEST_CASE(a_scheduler_port_in_use_exits_2_before_starting_anything) {
  temp_dir dir;
  listening_socket taken;
  auto config =
      dir.write("cluster.toml", "[scheduler]\nport = " + std::to_string(taken.port()) + "\n");
  auto r = run_launch(with_command(job_args(1, 1, {"--config", config.string()})),
                      {{"FAKE_NODE_DIR", dir.path().string()}});
  BOOST_TEST(r.exit_code == 2);
  BOOST_TEST(r.err == "troupe-launch: scheduler port: port " + std::to_string(taken.port()) +
                          " on 127.0.0.1 is in use\n");
  BOOST_TEST(recorded_pids(dir.path()).empty());

  r = run_launch(with_command(job_args(1, 1)),
                 {{"FAKE_NODE_DIR", dir.path().string()},
                  {"DMLC_PS_ROOT_PORT", std::to_string(taken.port())}});
  BOOST_TEST(r.exit_code == 2);
  BOOST_TEST(r.err.find("is in use") != std::string::npos);
  BOOST_TEST(recorded_pids(dir.path()).empty());
}

/// How many fake nodes printed their line in `out`; each line is checked to hold `expected`.
int fake_nodes_saying(const std::string& out, const std::string& expected) {
  int nodes = 0;
  for (const auto& line : lines_of(out))
    if (line.find("fake node role=") != std::string::npos) {
      ++nodes;
      BOOST_TEST(line.find(expected) != std::string::npos, line);
    }
  return nodes;
}

BOOST_AUTO_TEST_CASE(the_config_file_port_and_env_pairs_reach_every_node) {
  temp_dir dir;
  int port = 0;
  {
    listening_socket probe; // a port that was free a moment ago
    port = probe.port();
  }
  auto config = dir.write("cluster.toml", "[scheduler]\nport = " + std::to_string(port) + "\n");
  auto r =
      run_launch(with_command(job_args(
                     2, 1, {"--config", config.string(), "--env", "FAKE_NODE_ECHO=hello world"})),
                 {{"FAKE_NODE_DIR", dir.path().string()}});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 0, r.err);
  const std::string expected = "root=127.0.0.1:" + std::to_string(port) +
                               " workers=2 servers=1 config=" + fs::absolute(config).string() +
                               " echo=hello world ";
  BOOST_TEST(fake_nodes_saying(r.out, expected) == 4);
}

BOOST_AUTO_TEST_CASE(local_nodes_start_without_glibc_fastbins_unless_the_environment_says) {
  // node_malloc_tuning in apps/troupe_launch.cpp; the launcher's own GLIBC_TUNABLES wins, even
  // an empty one.
  for (const auto& [set, expected] :
       std::vector<std::pair<std::optional<std::string>, std::string>>{
           {std::nullopt, " malloc=glibc.malloc.mxfast=0 "},
           {"glibc.malloc.tcache_count=3", " malloc=glibc.malloc.tcache_count=3 "},
           {"", " malloc= "}}) {
    temp_dir dir;
    std::map<std::string, std::string> env{{"FAKE_NODE_DIR", dir.path().string()}};
    if (set)
      env["GLIBC_TUNABLES"] = *set;
    auto r = run_launch(with_command(job_args(1, 1)), env);
    BOOST_TEST_REQUIRE(!r.timed_out);
    BOOST_TEST(r.exit_code == 0, r.err);
    BOOST_TEST(fake_nodes_saying(r.out, expected) == 3);
  }
}

BOOST_AUTO_TEST_CASE(env_pairs_that_are_malformed_or_set_launcher_variables_exit_2) {
  temp_dir dir;
  const std::map<std::string, std::string> why{
      {"NOT_SET_HERE", "NOT_SET_HERE is not set in troupe-launch's environment"},
      {"=value", "expected NAME=VALUE, NAME:VALUE or NAME"},
      {"1X=2", "expected NAME=VALUE"},
      {"A-B=1", "expected NAME=VALUE"},
      {":x", "expected NAME=VALUE"},
      {"DMLC_ROLE=server", "troupe-launch sets DMLC_ROLE itself"},
      {"DMLC_PS_ROOT_PORT:1", "troupe-launch sets DMLC_PS_ROOT_PORT itself"},
      {"TROUPE_QUORUM", "troupe-launch sets TROUPE_QUORUM itself"}};
  for (const std::string flag : {"--env", "--env-server", "--env-worker"})
    for (const auto& [bad, message] : why) {
      auto r = run_launch(with_command(job_args(1, 1, {flag, bad})),
                          {{"FAKE_NODE_DIR", dir.path().string()}});
      BOOST_TEST(r.exit_code == 2, flag << " " << bad);
      BOOST_TEST(r.err.starts_with("troupe-launch: " + flag + " " + bad + ": " + message), r.err);
      BOOST_TEST(lines_of(r.err).size() == 1);
    }
  BOOST_TEST(recorded_pids(dir.path()).empty());
}

BOOST_AUTO_TEST_CASE(launch_py_s_env_forms_reach_their_roles_and_a_role_s_own_value_wins) {
  temp_dir dir;
  // NAME:VALUE splits at the first ':' (the value keeps the rest), NAME=VALUE at the first '='.
  auto r = run_launch(
      with_command(job_args(2, 2,
                            {"--env", "FAKE_NODE_ECHO:every:node", "--env-server",
                             "FAKE_NODE_ECHO=server=s", "--env-worker", "FAKE_NODE_ECHO:worker"})),
      {{"FAKE_NODE_DIR", dir.path().string()}, {"FAKE_NODE_ECHO", "the launcher's"}});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST_REQUIRE(r.exit_code == 0, r.err);
  const std::map<std::string, std::string> expected{{"[scheduler] ", "every:node"},
                                                    {"[server 0] ", "server=s"},
                                                    {"[server 1] ", "server=s"},
                                                    {"[worker 0] ", "worker"},
                                                    {"[worker 1] ", "worker"}};
  for (const auto& [prefix, echo] : expected) {
    auto lines = with_prefix(r.out, prefix + "fake node");
    BOOST_TEST_REQUIRE(lines.size() == 1u, prefix);
    BOOST_TEST(field(lines[0], "echo") == echo, lines[0]);
  }
}

// In ssh mode only the variables named reach the remote nodes: a bare --env NAME carries the
// launcher's value, and launch.py's defaults (OMP_NUM_THREADS, KMP_AFFINITY, LD_LIBRARY_PATH,
// DMLC_INTERFACE) go along when set. The fake ssh records the remote command line.
BOOST_AUTO_TEST_CASE(ssh_mode_passes_a_bare_env_name_s_value_and_launch_py_s_defaults) {
  temp_dir dir;
  auto hosts = dir.write("hosts", "node1 slots=4\nnode2:2222\tslots=8\n");
  auto r = run_launch(with_command(job_args(1, 1,
                                            {"-H", hosts.string(), "--env", "FAKE_NODE_ECHO",
                                             "--env-worker", "KMP_AFFINITY:compact,1"})),
                      {{"FAKE_NODE_DIR", dir.path().string()},
                       {"PATH", fake_ssh_path(dir)},
                       {"FAKE_NODE_ECHO", "from the launcher"},
                       {"OMP_NUM_THREADS", "3"},
                       {"KMP_AFFINITY", "scatter"}});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST_REQUIRE(r.exit_code == 0, r.err);
  const auto runs = ssh_runs(dir.path());
  BOOST_TEST_REQUIRE(runs.size() == 2u); // server 0 on node1, worker 0 on node2 (slots ignored)
  int on_node2 = 0;
  for (const auto& args : runs) {
    BOOST_TEST(args.find("'FAKE_NODE_ECHO=from the launcher'") != std::string::npos, args);
    BOOST_TEST(args.find("'OMP_NUM_THREADS=3'") != std::string::npos, args);
    if (args.find("\nnode2\n") != std::string::npos) {
      ++on_node2;
      BOOST_TEST(args.find("-p\n2222\n") != std::string::npos, args);
      // The worker's own value comes after launch.py's default, so it wins.
      BOOST_TEST(args.find("'KMP_AFFINITY=compact,1'") > args.find("'KMP_AFFINITY=scatter'"), args);
    } else {
      BOOST_TEST(args.find("\nnode1\n") != std::string::npos, args);
      BOOST_TEST(args.find("compact") == std::string::npos, args);
    }
  }
  BOOST_TEST(on_node2 == 1);
  BOOST_TEST(field(with_prefix(r.out, "[worker 0] fake node").front(), "host") == "node2");
}

BOOST_AUTO_TEST_CASE(a_hostfile_line_with_anything_but_slots_after_the_host_exits_2) {
  temp_dir dir;
  auto hosts = dir.write("hosts", "node1 slots=2\nnode2 cpus=4\n");
  auto r = run_launch(with_command(job_args(1, 1, {"-H", hosts.string()})),
                      {{"FAKE_NODE_DIR", dir.path().string()}});
  BOOST_TEST(r.exit_code == 2);
  BOOST_TEST(r.err == "troupe-launch: " + hosts.string() +
                          ":2: one host (or host:port), optionally followed by slots=N, per "
                          "line, got \"node2 cpus=4\"\n");
  BOOST_TEST(recorded_pids(dir.path()).empty());
}

BOOST_AUTO_TEST_CASE(sync_dst_dir_copies_the_working_directory_to_each_host_once_and_runs_there,
                     *boost::unit_test::precondition(rsync_available)) {
  temp_dir dir;
  const fs::path work = dir.path() / "work";
  const fs::path copy = dir.path() / "copy";
  fs::create_directories(work / "sub");
  dir.write("work/data.txt", "payload\n");
  dir.write("work/sub/more.txt", "more\n");
  // Three lines, two hosts: node1 twice.
  auto hosts = dir.write("hosts", "node1\nnode2:2222\nnode1\n");
  auto r = run_launch_in(
      work, with_command(job_args(2, 1, {"-H", hosts.string(), "--sync-dst-dir", copy.string()})),
      {{"FAKE_NODE_DIR", dir.path().string()}, {"PATH", fake_ssh_path(dir)}});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST_REQUIRE(r.exit_code == 0, r.err);
  std::ifstream data(copy / "data.txt"), more(copy / "sub" / "more.txt");
  std::string line;
  BOOST_TEST((std::getline(data, line) && line == "payload"));
  BOOST_TEST((std::getline(more, line) && line == "more"));
  // rsync ran once per host, through ssh with the host's port; the nodes started in the copy.
  int rsyncs = 0;
  for (const auto& args : ssh_runs(dir.path()))
    if (args.find("\nrsync\n") != std::string::npos) {
      ++rsyncs;
      BOOST_TEST(args.starts_with("-o\nBatchMode=yes\n"), args);
      BOOST_TEST((args.find("\nnode1\n") != std::string::npos) !=
                     (args.find("-p\n2222\nnode2\n") != std::string::npos),
                 args);
    }
  BOOST_TEST(rsyncs == 2);
  BOOST_TEST(field(with_prefix(r.out, "[scheduler] fake node").front(), "cwd") == work.string());
  for (const std::string prefix : {"[server 0] ", "[worker 0] ", "[worker 1] "}) {
    auto lines = with_prefix(r.out, prefix + "fake node");
    BOOST_TEST_REQUIRE(lines.size() == 1u, prefix);
    BOOST_TEST(field(lines[0], "cwd") == copy.string(), lines[0]);
  }
}

// What the remote nodes are given names the copy: the cluster file, the trace, the node program and
// the worker program (both inside the working directory here), an argument and an --env value that
// are absolute paths inside it; what lies outside passes as it is. The scheduler runs here, with
// the launcher's own paths.
BOOST_AUTO_TEST_CASE(sync_dst_dir_gives_the_remote_nodes_the_copy_s_paths,
                     *boost::unit_test::precondition(rsync_available)) {
  temp_dir dir;
  const fs::path work = dir.path() / "work";
  const fs::path copy = dir.path() / "copy";
  fs::create_directories(work / "bin");
  fs::copy_file(fake_node_path, work / "bin" / "fake-node");
  dir.write("work/cluster.toml", "[node]\nverbose = 0\n");
  dir.write("work/data.txt", "payload\n");
  auto hosts = dir.write("hosts", "node1\n");
  const std::string program = (work / "bin" / "fake-node").string();
  const std::string outside = (dir.path() / "elsewhere.txt").string();
  std::vector<std::string> args{"-n", "1", "-s", "1", "--stop-grace", "1s", "-H", hosts.string()};
  args.insert(args.end(), {"--node-binary", program, "--sync-dst-dir", copy.string() + "/"});
  args.insert(args.end(), {"--config", "cluster.toml", "--trace", "job.json"});
  args.insert(args.end(), {"--env", "FAKE_NODE_ECHO=" + (work / "data.txt").string()});
  args.insert(args.end(), {"--", program, (work / "data.txt").string(), outside});
  args.insert(args.end(), {work.string(), "relative/path"});
  auto r = run_launch_in(work, args,
                         {{"FAKE_NODE_DIR", dir.path().string()}, {"PATH", fake_ssh_path(dir)}});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST_REQUIRE(r.exit_code == 0, r.err);
  const auto scheduler = with_prefix(r.out, "[scheduler] fake node");
  BOOST_TEST_REQUIRE(scheduler.size() == 1u, r.out);
  BOOST_TEST(field(scheduler[0], "config") == (work / "cluster.toml").string(), scheduler[0]);
  BOOST_TEST(field(scheduler[0], "echo") == (work / "data.txt").string(), scheduler[0]);
  for (const std::string prefix : {"[server 0] ", "[worker 0] "}) {
    auto lines = with_prefix(r.out, prefix + "fake node");
    BOOST_TEST_REQUIRE(lines.size() == 1u, prefix);
    BOOST_TEST(field(lines[0], "cwd") == copy.string(), lines[0]);
    BOOST_TEST(field(lines[0], "config") == (copy / "cluster.toml").string(), lines[0]);
    BOOST_TEST(field(lines[0], "echo") == (copy / "data.txt").string(), lines[0]);
  }
  auto worker = with_prefix(r.out, "[worker 0] fake node");
  BOOST_TEST(field(worker.at(0), "args") == (copy / "data.txt").string() + "|" + outside + "|" +
                                                copy.string() + "|relative/path",
             worker[0]);
  // No remote command names the working directory: the programs and the trace are the copy's.
  int nodes = 0;
  for (const auto& recorded : ssh_runs(dir.path())) {
    if (recorded.find("\nrsync\n") != std::string::npos)
      continue;
    ++nodes;
    BOOST_TEST(recorded.find(work.string()) == std::string::npos, recorded);
    BOOST_TEST(recorded.find("'" + (copy / "bin" / "fake-node").string() + "'") !=
                   std::string::npos,
               recorded);
    BOOST_TEST(recorded.find("'TROUPE_TRACE=" + (copy / "job.json").string() + "'") !=
                   std::string::npos,
               recorded);
  }
  BOOST_TEST(nodes == 2);
}

BOOST_AUTO_TEST_CASE(a_failed_sync_exits_2_naming_the_host_and_starts_nothing,
                     *boost::unit_test::precondition(rsync_available)) {
  temp_dir dir;
  auto hosts = dir.write("hosts", "node1\n");
  const std::string unwritable = (dir.path() / "a-file" / "below").string();
  dir.write("a-file", "not a directory\n");
  auto r =
      run_launch(with_command(job_args(1, 1, {"-H", hosts.string(), "--sync-dst-dir", unwritable})),
                 {{"FAKE_NODE_DIR", dir.path().string()}, {"PATH", fake_ssh_path(dir)}});
  BOOST_TEST(r.exit_code == 2, r.err);
  BOOST_TEST(std::regex_search(r.err, std::regex{"troupe-launch: --sync-dst-dir: rsync to node1:" +
                                                 unwritable + " exited with code [1-9]"}),
             r.err);
  BOOST_TEST(recorded_pids(dir.path()).empty());
  // Outside ssh mode the flag is refused.
  r = run_launch(with_command(job_args(1, 1, {"--sync-dst-dir", unwritable})),
                 {{"FAKE_NODE_DIR", dir.path().string()}});
  BOOST_TEST(r.exit_code == 2);
  BOOST_TEST(r.err == "troupe-launch: --sync-dst-dir applies to --launcher ssh only\n");
}

// Slurm on one host: each srun task is a troupe-launch --launcher slurm with the variables srun
// gives it, started here; the fake nodes print what they got.
BOOST_AUTO_TEST_CASE(slurm_tasks_become_the_scheduler_servers_and_workers_by_procid) {
  temp_dir dir;
  const std::map<std::string, std::string> job{{"FAKE_NODE_DIR", dir.path().string()},
                                               {"SLURM_STEP_NODELIST", "node[01-02],gpu3"},
                                               {"SLURM_JOB_NODELIST", "ignored[1-9]"},
                                               {"SLURM_JOB_ID", "4242"},
                                               {"TROUPE_JOB_TOKEN", "the-slurm-token"}};
  // -n 2 -s 2: five tasks, placed in blocks over the three nodes.
  const std::vector<std::string> node_of{"node01", "node01", "node02", "node02", "gpu3"};
  std::vector<std::unique_ptr<child_process>> tasks;
  for (int procid = 0; procid < 5; ++procid)
    tasks.push_back(std::make_unique<child_process>(
        launch_path,
        with_command(job_args(2, 2, {"--launcher", "slurm", "--env-worker", "FAKE_NODE_ECHO:w"}),
                     {"x"}),
        slurm_env(procid, 5, node_of[procid], job)));
  // role, rank hint, node host of each task
  const std::vector<std::array<std::string, 3>> expected{{"scheduler", "-", "-"},
                                                         {"server", "0", "node01"},
                                                         {"server", "1", "node02"},
                                                         {"worker", "0", "node02"},
                                                         {"worker", "1", "gpu3"}};
  const auto pids = [&] {
    std::set<pid_t> set;
    for (auto& task : tasks)
      set.insert(task->pid());
    return set;
  }();
  for (int procid = 0; procid < 5; ++procid) {
    auto result = tasks[procid]->wait(30s);
    BOOST_TEST_REQUIRE(!result.timed_out);
    BOOST_TEST(result.exit_code == 0, procid << ": " << result.err);
    // troupe-launch became the node: no prefix, the node's own lines.
    auto lines = with_prefix(result.out, "fake node role=");
    BOOST_TEST_REQUIRE(lines.size() == 1u, result.out);
    const auto& [role, hint, host] = expected[procid];
    BOOST_TEST(field(lines[0], "role") == role, lines[0]);
    BOOST_TEST(field(lines[0], "hint") == hint, lines[0]);
    BOOST_TEST(field(lines[0], "host") == host, lines[0]);
    BOOST_TEST(field(lines[0], "root") == "node01:24242", lines[0]);
    BOOST_TEST(field(lines[0], "workers") == "2", lines[0]);
    BOOST_TEST(field(lines[0], "servers") == "2", lines[0]);
    BOOST_TEST(field(lines[0], "token") == "the-slurm-token", lines[0]);
    BOOST_TEST(field(lines[0], "echo") == (role == "worker" ? "w" : "-"), lines[0]);
    BOOST_TEST(lines[0].ends_with(role == "worker" ? "args=x" : "args=--role|" + role), lines[0]);
  }
  // Every node process is a task's own process (exec): srun sees its exit code and signals.
  auto recorded = recorded_pids(dir.path());
  BOOST_TEST(std::set<pid_t>(recorded.begin(), recorded.end()) == pids);
}

BOOST_AUTO_TEST_CASE(a_slurm_task_exits_with_its_node_s_code_and_takes_the_configured_port) {
  temp_dir dir;
  // Worker 0 alone (task 2 of -n 1 -s 1), failing with 7; DMLC_PS_ROOT_PORT beats the job's port
  // and DMLC_PS_ROOT_URI the first node.
  auto r = run(launch_path, with_command(job_args(1, 1, {"--launcher", "slurm"})),
               slurm_env(2, 3, "n2",
                         {{"FAKE_NODE_DIR", dir.path().string()},
                          {"FAKE_NODE_FAIL_INDEX", "0"},
                          {"FAKE_NODE_FAIL_CODE", "7"},
                          {"FAKE_NODE_FAIL_DELAY_MS", "0"},
                          {"SLURM_STEP_NODELIST", "n[1-2]"},
                          {"SLURM_JOB_ID", "4242"},
                          {"DMLC_PS_ROOT_PORT", "5555"},
                          {"DMLC_PS_ROOT_URI", "10.0.0.1"},
                          {"TROUPE_JOB_TOKEN", "t"}}));
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 7, r.err);
  auto lines = with_prefix(r.out, "fake node role=worker");
  BOOST_TEST_REQUIRE(lines.size() == 1u, r.out);
  BOOST_TEST(field(lines[0], "root") == "10.0.0.1:5555", lines[0]);
  BOOST_TEST(field(lines[0], "host") == "n2", lines[0]);
}

BOOST_AUTO_TEST_CASE(a_slurm_task_that_cannot_place_itself_exits_2_in_one_line_starting_nothing) {
  temp_dir dir;
  const std::map<std::string, std::string> fine{{"FAKE_NODE_DIR", dir.path().string()},
                                                {"SLURM_STEP_NODELIST", "n[1-4]"},
                                                {"SLURM_JOB_ID", "9"},
                                                {"TROUPE_JOB_TOKEN", "t"}};
  struct bad_case {
    std::map<std::string, std::string> env;
    std::vector<std::string> extra;
    std::string message;
  };
  auto with = [&](std::map<std::string, std::string> changes, int procid = 1, int ntasks = 4) {
    auto env = slurm_env(procid, ntasks, "n1", fine);
    for (auto& [k, v] : changes)
      if (v.empty())
        env.erase(k);
      else
        env[k] = v;
    return env;
  };
  const std::vector<bad_case> cases{
      {with({{"SLURM_PROCID", ""}}), {}, "SLURM_PROCID is not set; run troupe-launch under srun"},
      {with({}, 1, 5), {}, "srun started 5 tasks (SLURM_NTASKS), but -n 2 -s 1 needs 4"},
      {with({{"SLURM_STEP_NODELIST", "n[4-1]"}}), {}, "range \"4-1\" runs backwards"},
      {with({{"TROUPE_JOB_TOKEN", ""}}), {}, "--launcher slurm needs the job token configured"},
      {with({{"SLURM_JOB_ID", ""}}), {}, "--launcher slurm: no scheduler port"},
      {with({{"SLURMD_NODENAME", "n3"}}, 0), {}, "task 0 (the scheduler) runs on n3"},
      {with({}), {"-H", "/dev/null"}, "-H applies to --launcher ssh only"},
      {with({}), {"--restart-servers"}, "--restart-servers applies to --launcher local and ssh"},
  };
  for (const auto& [env, extra, message] : cases) {
    auto args = job_args(2, 1, {"--launcher", "slurm"});
    args.insert(args.end(), extra.begin(), extra.end());
    auto r = run_launch(with_command(args), env);
    BOOST_TEST(r.exit_code == 2, message);
    BOOST_TEST(r.err.starts_with("troupe-launch: "), r.err);
    BOOST_TEST(r.err.find(message) != std::string::npos, r.err);
    BOOST_TEST(lines_of(r.err).size() == 1u, r.err);
  }
  BOOST_TEST(recorded_pids(dir.path()).empty());
}

BOOST_AUTO_TEST_CASE(a_worker_program_that_cannot_start_exits_127_and_stops_the_rest) {
  temp_dir dir;
  auto args = job_args(2, 1);
  args.insert(args.end(), {"--", (dir.path() / "no-such-program").string()});
  auto r = run_launch(args, {{"FAKE_NODE_DIR", dir.path().string()}});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 127, r.err);
  BOOST_TEST(r.err.find("cannot start worker 0") != std::string::npos, r.err);
  std::string left;
  BOOST_TEST(none_left_alive(dir.path(), left), "still alive: " << left);
}

BOOST_AUTO_TEST_CASE(usage_errors_exit_2_and_help_exits_0) {
  temp_dir dir;
  const std::map<std::string, std::string> env{{"FAKE_NODE_DIR", dir.path().string()}};
  BOOST_TEST(run_launch(job_args(1, 1), env).exit_code == 2);            // no command
  BOOST_TEST(run_launch(with_command({"-n", "0"}), env).exit_code == 2); // no worker
  BOOST_TEST(run_launch(with_command(job_args(1, 1, {"--stop-grace", "5"})), env).exit_code == 2);
  auto missing =
      run_launch(with_command({"-n", "1", "--node-binary", "/nonexistent/troupe-node"}), env);
  BOOST_TEST(missing.exit_code == 2);
  BOOST_TEST(missing.err.find("no node program at /nonexistent/troupe-node") != std::string::npos);
  auto help = run_launch({"--help"}, env);
  BOOST_TEST(help.exit_code == 0);
  BOOST_TEST(help.out.find("the rank of its start index") != std::string::npos);
  BOOST_TEST(recorded_pids(dir.path()).empty());
}

BOOST_AUTO_TEST_CASE(hostfile_errors_name_the_file_and_line_before_starting_anything) {
  temp_dir dir;
  const std::map<std::string, std::string> env{{"FAKE_NODE_DIR", dir.path().string()}};
  auto hosts = dir.write("hosts", "# the hosts\nnode1\nnode2:22x\n");
  auto r = run_launch(with_command(job_args(1, 1, {"-H", hosts.string()})), env);
  BOOST_TEST(r.exit_code == 2);
  BOOST_TEST(r.err == "troupe-launch: " + hosts.string() +
                          ":3: ssh port must be 1 to 65535, got \"node2:22x\"\n");
  auto empty = dir.write("empty", "# nobody\n\n");
  r = run_launch(with_command(job_args(1, 1, {"-H", empty.string()})), env);
  BOOST_TEST(r.exit_code == 2);
  BOOST_TEST(r.err.find("names no host") != std::string::npos);
  r = run_launch(with_command(job_args(1, 1, {"--launcher", "ssh"})), env);
  BOOST_TEST(r.exit_code == 2);
  BOOST_TEST(r.err.find("needs -H HOSTFILE") != std::string::npos);
  BOOST_TEST(recorded_pids(dir.path()).empty());
}

BOOST_AUTO_TEST_CASE(an_env_pair_takes_one_value_so_the_command_may_follow_without_dashes) {
  temp_dir dir;
  auto args = job_args(1, 1, {"--env", "FAKE_NODE_ECHO=x"});
  args.push_back(fake_node_path);
  args.push_back("tail");
  auto r = run_launch(args, {{"FAKE_NODE_DIR", dir.path().string()}});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 0, r.err);
  BOOST_TEST(with_prefix(r.out, "[worker 0] fake node").front().ends_with("echo=x args=tail"));
}

BOOST_AUTO_TEST_CASE(a_job_without_a_token_gets_a_random_one_in_every_node_s_environment_only) {
  temp_dir dir;
  const std::map<std::string, std::string> env{{"FAKE_NODE_DIR", dir.path().string()},
                                               {"PS_VERBOSE", "1"}};
  auto r = run_launch(with_command(job_args(2, 1), {"plain", "args"}), env);
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST_REQUIRE(r.exit_code == 0, r.err);
  auto tokens = node_tokens(r.out);
  BOOST_TEST_REQUIRE(tokens.size() == 4u, r.out); // scheduler, server 0, worker 0, worker 1
  const std::string token = tokens.begin()->second;
  BOOST_TEST(std::regex_match(token, std::regex{"[0-9a-f]{64}"}), token);
  for (const auto& [node, got] : tokens)
    BOOST_TEST(got == token, node);
  // Nowhere else: not in a command line the nodes were given, not in the launcher's own log
  // (verbose 1 logs every start), not in any other line.
  BOOST_TEST(without_token_fields(r.out, token).find(token) == std::string::npos, r.out);
  BOOST_TEST(r.err.find(token) == std::string::npos, r.err);
  BOOST_TEST(r.err.find("troupe-launch") != std::string::npos, r.err); // the log was on

  // A fresh one for every job.
  temp_dir again;
  auto second =
      run_launch(with_command(job_args(1, 1)), {{"FAKE_NODE_DIR", again.path().string()}});
  BOOST_TEST_REQUIRE(second.exit_code == 0, second.err);
  auto second_tokens = node_tokens(second.out);
  BOOST_TEST_REQUIRE(second_tokens.size() == 3u, second.out);
  BOOST_TEST(second_tokens.begin()->second != token);
  BOOST_TEST(std::regex_match(second_tokens.begin()->second, std::regex{"[0-9a-f]{64}"}));
}

BOOST_AUTO_TEST_CASE(a_configured_token_is_the_job_s_and_none_is_made) {
  temp_dir dir;
  // From the environment: the nodes inherit it.
  auto r = run_launch(with_command(job_args(1, 1)), {{"FAKE_NODE_DIR", dir.path().string()},
                                                     {"TROUPE_JOB_TOKEN", "from-the-env"}});
  BOOST_TEST_REQUIRE(r.exit_code == 0, r.err);
  auto tokens = node_tokens(r.out);
  BOOST_TEST_REQUIRE(tokens.size() == 3u, r.out);
  for (const auto& [node, got] : tokens)
    BOOST_TEST(got == "from-the-env", node);

  // From a token file the cluster file names: the nodes read it themselves (TROUPE_CONFIG).
  temp_dir other;
  auto token = other.write("token", "from-a-file\n", 0600);
  auto config =
      other.write("cluster.toml", "[job]\ntoken_file = \"" + token.string() + "\"\n", 0600);
  r = run_launch(with_command(job_args(1, 1, {"--config", config.string()})),
                 {{"FAKE_NODE_DIR", other.path().string()}});
  BOOST_TEST_REQUIRE(r.exit_code == 0, r.err);
  tokens = node_tokens(r.out);
  BOOST_TEST_REQUIRE(tokens.size() == 3u, r.out);
  for (const auto& [node, got] : tokens)
    BOOST_TEST(got == "-", node);

  // A token file others may read is refused before anything starts, naming the file and the fix.
  fs::permissions(token, static_cast<fs::perms>(0644));
  r = run_launch(with_command(job_args(1, 1, {"--config", config.string()})),
                 {{"FAKE_NODE_DIR", other.path().string()}});
  BOOST_TEST(r.exit_code == 2);
  BOOST_TEST(r.err.find("(mode 0644); run chmod 600 " + token.string()) != std::string::npos,
             r.err);
  BOOST_TEST(r.err.find("from-a-file") == std::string::npos, r.err);
  BOOST_TEST(lines_of(r.err).size() == 1u, r.err);
}

BOOST_AUTO_TEST_CASE(an_env_pair_that_sets_the_token_exits_2_without_showing_it) {
  temp_dir dir;
  auto r = run_launch(with_command(job_args(1, 1, {"--env", "TROUPE_JOB_TOKEN=t0ps3cret"})),
                      {{"FAKE_NODE_DIR", dir.path().string()}});
  BOOST_TEST(r.exit_code == 2);
  BOOST_TEST(r.err == "troupe-launch: --env TROUPE_JOB_TOKEN=...: a token on the command line is "
                      "visible to every user of this machine; export TROUPE_JOB_TOKEN or set "
                      "job.token_file instead\n");
  BOOST_TEST(recorded_pids(dir.path()).empty());
}

// ssh mode without an sshd: an `ssh` first in PATH that runs the remote command here, as sshd
// would, and records the command line it was given. What it shows is how the token travels: on
// the ssh channel's stdin, read and exported by the remote script, never on the command line.
BOOST_AUTO_TEST_CASE(ssh_nodes_read_the_token_from_their_channel_not_their_command_line) {
  temp_dir dir;
  const std::string path = fake_ssh_path(dir);
  auto hosts = dir.write("hosts", "node1\nnode2\n");
  auto r = run_launch(
      with_command(job_args(2, 1, {"-H", hosts.string(), "--env", "FAKE_NODE_ECHO=remote"})),
      {{"FAKE_NODE_DIR", dir.path().string()}, {"PATH", path}});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST_REQUIRE(r.exit_code == 0, r.err);
  auto tokens = node_tokens(r.out);
  BOOST_TEST_REQUIRE(tokens.size() == 4u, r.out);
  const std::string token = tokens["scheduler"];
  BOOST_TEST(std::regex_match(token, std::regex{"[0-9a-f]{64}"}), token);
  for (const auto& [node, got] : tokens)
    BOOST_TEST(got == token, node);
  // Servers and workers went through ssh (with their --env pairs), and no ssh command line held
  // the token.
  BOOST_TEST(with_prefix(r.out, "[worker 1] fake node").front().find(" host=node") !=
             std::string::npos);
  const auto runs = ssh_runs(dir.path());
  for (const auto& args : runs) {
    BOOST_TEST(args.find("FAKE_NODE_ECHO=remote") != std::string::npos, args);
    BOOST_TEST(args.find(token) == std::string::npos, args);
  }
  BOOST_TEST(runs.size() == 3u);
  BOOST_TEST(without_token_fields(r.out, token).find(token) == std::string::npos, r.out);
  BOOST_TEST(r.err.find(token) == std::string::npos, r.err);
  std::string left;
  BOOST_TEST(none_left_alive(dir.path(), left), "still alive: " << left);
}

BOOST_AUTO_TEST_CASE(ssh_mode_runs_servers_and_workers_through_ssh_with_their_environment,
                     *boost::unit_test::precondition(sshd_available)) {
  temp_dir dir;
  ssh_server sshd(dir.path());
  auto args =
      job_args(2, 1,
               {"-H", sshd.hostfile(2).string(), "--env", "FAKE_NODE_DIR=" + dir.path().string(),
                "--env", "FAKE_NODE_ECHO=it's remote"});
  auto flags = sshd.launch_flags();
  args.insert(args.end(), flags.begin(), flags.end());
  auto r = run_launch(with_command(args, {"a b"}), {});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 0, r.err);
  auto scheduler = with_prefix(r.out, "[scheduler] fake node role=scheduler");
  BOOST_TEST_REQUIRE(scheduler.size() == 1);
  BOOST_TEST(scheduler[0].find(" host=- ") != std::string::npos); // started here, not via ssh
  std::smatch m;
  BOOST_TEST_REQUIRE(std::regex_search(scheduler[0], m, std::regex{R"(root=(\S+) )"}));
  const std::string root = m[1];
  for (const std::string prefix : {"[server 0] ", "[worker 0] ", "[worker 1] "}) {
    auto lines = with_prefix(r.out, prefix + "fake node");
    BOOST_TEST_REQUIRE(lines.size() == 1, prefix);
    BOOST_TEST(lines[0].find(" host=127.0.0.1 root=" + root + " workers=2 servers=1 ") !=
                   std::string::npos,
               lines[0]);
    BOOST_TEST(lines[0].find(" echo=it's remote ") != std::string::npos, lines[0]);
    // The job's token reached the remote node through its ssh channel.
    BOOST_TEST(node_tokens(r.out)[prefix.substr(1, prefix.size() - 3)] ==
                   node_tokens(r.out)["scheduler"],
               lines[0]);
    if (prefix.starts_with("[worker"))
      BOOST_TEST(lines[0].ends_with("args=a b"), lines[0]);
  }
  std::string left;
  BOOST_TEST(none_left_alive(dir.path(), left), "still alive: " << left);
}

BOOST_AUTO_TEST_CASE(ssh_mode_stops_the_remote_nodes_when_a_worker_fails,
                     *boost::unit_test::precondition(sshd_available)) {
  temp_dir dir;
  ssh_server sshd(dir.path());
  auto args = job_args(2, 2, {"-H", sshd.hostfile(1).string()});
  for (const auto& pair :
       {"FAKE_NODE_DIR=" + dir.path().string(), std::string("FAKE_NODE_FAIL_INDEX=1"),
        std::string("FAKE_NODE_FAIL_CODE=4"), std::string("FAKE_NODE_WORKER_MS=30000")}) {
    args.push_back("--env");
    args.push_back(pair);
  }
  auto flags = sshd.launch_flags();
  args.insert(args.end(), flags.begin(), flags.end());
  auto r = run_launch(with_command(args), {});
  BOOST_TEST_REQUIRE(!r.timed_out);
  BOOST_TEST(r.exit_code == 4, r.err);
  BOOST_TEST(r.elapsed < 15s);
  // The failing worker can stop the job before a slow ssh start has let every node record its pid
  // (seen under the sanitizers); those not recorded are still found by their environment.
  BOOST_TEST(!recorded_pids(dir.path()).empty());
  std::string left;
  BOOST_TEST(none_left_alive(dir.path(), left), "still alive: " << left);
}

BOOST_AUTO_TEST_SUITE_END()
