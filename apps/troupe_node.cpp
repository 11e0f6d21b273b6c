// troupe-node: one scheduler or server process of a distributed job.
//
//   troupe-node --role scheduler|server [--config FILE] [flags]   (or DMLC_ROLE=... troupe-node)
//
// Configuration: the cluster file, then the DMLC_* environment, then flags (later wins); see
// docs/cluster.sample.toml. A broken file, a missing or malformed value or a port in use ends the
// process with exit code 2 and one line naming the file and line or the variable, before any
// network activity; so does a server started with --recover whose checkpoint files are missing,
// torn or of another layout (the line names the file). Otherwise it runs until the job ends: exit 0
// when every worker finished; 3 (the scheduler only) when the job finished but some workers were
// lost within the quorum (sync.quorum below the number of workers), the summary naming them; 1 when
// the job failed (a lost server, more lost workers than the quorum allows, a startup timeout), with
// the reason logged through troupe::logger under the node's name ("server@127.0.0.1"). The
// scheduler prints "troupe-node: scheduler listening on HOST:PORT" on stdout once it is bound: with
// port 0 that line is how the port is found. SIGUSR1 makes a server print its summary
// (observe.summary) within a second. SIGUSR2 makes a server leave the job (elastic servers,
// job.max_servers): its key ranges move to the other servers, then it exits 0.
//
// TROUPE_LAUNCHER_EVENTS_FD=N (troupe-launch sets it for the scheduler it starts): the scheduler
// writes "lost worker R" and a newline to file descriptor N each time it declares worker rank R
// lost, so that the launcher stops that process whatever state it is in (a frozen one included).
// Best effort: a full or closed pipe drops the line.

#include <CLI/CLI.hpp>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fcntl.h>
#include <functional>
#include <iostream>
#include <string>
#include <unistd.h>

#include "actors/config/config.hpp"
#include "actors/dist_job.hpp"

using namespace troupe;

namespace {

/// The launcher's event pipe (TROUPE_LAUNCHER_EVENTS_FD), made non-blocking: the scheduler's
/// thread writes to it and must never wait for the launcher. Null when the variable is unset or
/// names no open descriptor.
std::function<void(std::uint32_t)> launcher_events() {
  const char* text = std::getenv("TROUPE_LAUNCHER_EVENTS_FD");
  if (text == nullptr)
    return {};
  char* end = nullptr;
  const long fd = std::strtol(text, &end, 10);
  if (end == text || *end != '\0' || fd < 0 || fd > 1'000'000 ||
      ::fcntl(static_cast<int>(fd), F_GETFD) < 0)
    return {};
  ::fcntl(static_cast<int>(fd), F_SETFL, ::fcntl(static_cast<int>(fd), F_GETFL) | O_NONBLOCK);
  return [fd = static_cast<int>(fd)](std::uint32_t rank) {
    const std::string line = "lost worker " + std::to_string(rank) + "\n";
    // One short write (below PIPE_BUF, so whole or not at all); EINTR is tried again.
    while (::write(fd, line.data(), line.size()) < 0 && errno == EINTR) {
    }
  };
}

/// A configuration error is the answer to the command line: one plain line, exit code 2.
int configuration_error(const error& err) {
  std::cerr << "troupe-node: " << err.message() << "\n";
  return 2;
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"troupe-node: a scheduler or server of a troupe job"};
  app.footer("Exit codes: 0 every worker finished; 3 (scheduler) the job finished but workers were "
             "lost within the quorum (sync.quorum), the summary on stderr names them; 1 the job "
             "failed (a lost server, more workers lost than the quorum allows, a startup "
             "timeout); 2 a bad configuration or a port in use.");
  config_overrides flags;
  add_config_flags(app, flags);
  if (auto done = parse_command_line(app, "troupe-node", argc, argv))
    return *done;
  auto config = load_config(std::nullopt, process_environment(), flags);
  if (!config)
    return configuration_error(config.error());
  if (!config->role || *config->role == node_role::worker)
    return configuration_error(
        error{errc::invalid_argument,
              "troupe-node runs a scheduler or a server: give --role scheduler|server or DMLC_ROLE "
              "(a worker is any program that creates a dist_* KVStore)"});
  if (auto valid = check_node_config(*config); !valid)
    return configuration_error(valid.error());
  // --recover: a torn or foreign checkpoint is refused like a missing one, before the network.
  auto restore = load_server_checkpoint(*config);
  if (!restore)
    return configuration_error(restore.error());
  std::signal(SIGUSR1, [](int) { ask_for_summary(); });
  std::signal(SIGUSR2, [](int) { ask_to_leave(); });
  const auto host = config->scheduler_host;
  return serve_node(
      *config, std::move(*restore),
      [&host](std::uint16_t port) {
        std::printf("troupe-node: scheduler listening on %s:%u\n", host.c_str(), port);
        std::fflush(stdout);
      },
      launcher_events());
}
