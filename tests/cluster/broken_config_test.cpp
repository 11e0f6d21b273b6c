// One table of broken configurations, run against every program that reads the cluster
// configuration: troupe-node as scheduler and server (and without either role), troupe-launch,
// train_mnist and kvstore_demo as workers and as the nodes they embed (serve_if_node_role), and
// kvbench. Each row gives one bad value one way (a cluster file named by --config or
// TROUPE_CONFIG, an environment variable, a command-line flag) and names the field as the user
// wrote it. Every row must end its program with exit code 2 within a bounded time, print exactly
// one line on stderr, "<program>: ...", naming that field, print nothing on stdout, and touch no
// network: every program is pointed at a scheduler that is the test's own listening socket, and a
// server's data port is another, so a program that connected finds a connection waiting there,
// and one that would listen finds the port taken (and would say so instead of naming the field).
// The control case shows that the same setups without the bad value do reach those sockets.

#include <algorithm>
#include <cctype>
#include <map>
#include <ostream>
#include <string>
#include <string_view>
#include <thread>
#include <unistd.h>
#include <vector>

#include <boost/test/data/monomorphic.hpp>
#include <boost/test/data/test_case.hpp>
#include <boost/test/unit_test.hpp>

#include "actors/config/config.hpp"
#include "process_support.hpp"

using namespace troupe::testing;
namespace data = boost::unit_test::data;

namespace {

const std::string launch_path = TROUPE_LAUNCH_PATH;
const std::string node_path = TROUPE_NODE_PATH;
const std::string train_path = TROUPE_TRAIN_MNIST_PATH;
const std::string demo_path = TROUPE_KVSTORE_DEMO_PATH;
const std::string kvbench_path = TROUPE_KVBENCH_PATH;

/// A program as a user runs it in a job, with a configuration that is complete and valid.
enum class program : std::uint8_t {
  scheduler,         ///< troupe-node --role scheduler
  server,            ///< troupe-node --role server
  node_without_role, ///< troupe-node with no scheduler or server role
  launcher,          ///< troupe-launch -n 1 -s 1 -- kvstore_demo --type dist_sync
  train_worker,      ///< train_mnist --kvstore dist_sync
  train_as_server,   ///< train_mnist with DMLC_ROLE=server (serve_if_node_role)
  demo_worker,       ///< kvstore_demo --type dist_sync
  demo_local,        ///< kvstore_demo --type local
  demo_as_scheduler, ///< kvstore_demo with DMLC_ROLE=scheduler (serve_if_node_role)
  kvbench_worker,    ///< kvbench --type dist_sync
};

constexpr program every_program[] = {
    program::scheduler,      program::server,       program::node_without_role,
    program::launcher,       program::train_worker, program::train_as_server,
    program::demo_worker,    program::demo_local,   program::demo_as_scheduler,
    program::kvbench_worker,
};

/// How a row gives its bad value.
enum class given : std::uint8_t {
  config_flag, ///< in a cluster file named by --config
  config_env,  ///< in a cluster file named by TROUPE_CONFIG
  env,         ///< an environment variable
  flag,        ///< command-line arguments
};

struct broken_config {
  program runs;
  given how;
  /// config_*: the cluster file's text, or nothing for a file that does not exist; env: the
  /// variable and its value; flag: the arguments. "{dir}" stands for the row's directory, which
  /// holds `token`, a token file group and others may read (mode 0644).
  std::vector<std::string> setting;
  /// What the line must name, as the user wrote it: a key, variable, flag or section.
  std::string_view field;
  std::string_view what; ///< what is wrong, for messages
};

/// The rows. Every cluster file is written with mode 0644, so a job.token in one is refused.
std::vector<broken_config> table() {
  using p = program;
  using g = given;
  // clang-format off
  return {
    // troupe-node --role scheduler
    {p::scheduler, g::config_flag, {"[job]\nnum_workers = \"2\"\n"}, "job.num_workers",
     "a string where a number is expected"},
    {p::scheduler, g::env, {"DMLC_NUM_WORKER", "-1"}, "DMLC_NUM_WORKER", "a negative count"},
    {p::scheduler, g::env, {"DMLC_NUM_WORKER", "99999999999999999999"}, "DMLC_NUM_WORKER",
     "a count too big for 64 bits"},
    {p::scheduler, g::flag, {"--num-servers", "0"}, "--num-servers", "zero servers"},
    {p::scheduler, g::env, {"TROUPE_MAX_WORKERS", "0"}, "TROUPE_MAX_WORKERS",
     "room for zero workers"},
    {p::scheduler, g::flag, {"--max-servers", "1", "--num-servers", "2"}, "--max-servers",
     "fewer key ranges than servers"},
    {p::scheduler, g::config_flag, {"[scheduler]\nport = 70000\n"}, "scheduler.port",
     "a port out of range"},
    {p::scheduler, g::config_flag, {"[scheduler]\nport = 99999999999999999999\n"},
     "scheduler.port", "a port too big for TOML's 64 bits"},
    {p::scheduler, g::config_flag, {"[jobs]\nnum_workers = 1\n"}, "[jobs]", "an unknown section"},
    {p::scheduler, g::config_flag, {"[job]\nnum_servrs = 1\n"}, "num_servrs", "an unknown key"},
    {p::scheduler, g::config_flag, {"num_workers = 1\n"}, "num_workers",
     "a key outside any section"},
    {p::scheduler, g::config_env, {"[job]\nid = \"unterminated\n"}, "job.id",
     "malformed TOML (an unterminated string)"},
    {p::scheduler, g::config_flag, {}, "--config", "a cluster file that does not exist"},
    {p::scheduler, g::config_flag, {"[job]\ntoken_file = \"{dir}/token\"\n"}, "job.token_file",
     "a token file others may read"},
    {p::scheduler, g::env, {"PS_VERBOSE", "3"}, "PS_VERBOSE", "a verbosity out of range"},
    {p::scheduler, g::env, {"DMLC_PS_ROOT_URI", "a host"}, "DMLC_PS_ROOT_URI",
     "a scheduler host with a space"},
    {p::scheduler, g::config_flag, {"[timeouts]\nheartbeat = \"5s\"\n"}, "timeouts.heartbeat",
     "a heartbeat not shorter than the peer timeout"},
    {p::scheduler, g::env, {"TROUPE_JOB_ID", "a b"}, "TROUPE_JOB_ID", "a job id with a space"},
    {p::scheduler, g::config_flag, {"[job]\ninsecure = \"yes\"\n"}, "job.insecure",
     "a string where a boolean is expected"},
    {p::scheduler, g::flag, {"--startup-timeout", "0s"}, "--startup-timeout", "a zero duration"},
    {p::scheduler, g::config_flag, {"[sync]\nrescale_quorum = 1\n"}, "sync.rescale_quorum",
     "an integer where a boolean is expected"},
    // troupe-node --role server
    {p::server, g::env, {"DMLC_PS_ROOT_PORT", "65536"}, "DMLC_PS_ROOT_PORT",
     "a scheduler port out of range"},
    {p::server, g::env, {"PORT", "-5"}, "PORT", "a negative data port"},
    {p::server, g::env, {"DMLC_INTERFACE", "troupe-nope0"}, "DMLC_INTERFACE",
     "an interface this machine lacks"},
    {p::server, g::env, {"DMLC_NODE_HOST", "a\tb"}, "DMLC_NODE_HOST", "a node host with a tab"},
    {p::server, g::flag, {"--shards", "0"}, "--shards", "zero shards"},
    {p::server, g::flag, {"--server-device", "tpu(0)"}, "--server-device",
     "a server device that is no device"},
    {p::server, g::flag, {"--timeout", "5"}, "--timeout", "a duration without its unit"},
    {p::server, g::flag, {"--peer-timeout", "0ms"}, "--peer-timeout", "a zero peer timeout"},
    {p::server, g::flag, {"--link-window-bytes", "64 MiB"}, "--link-window-bytes",
     "a size with a space before its unit"},
    {p::server, g::flag, {"--token-file", "{dir}/token"}, "--token-file",
     "a token file others may read"},
    {p::server, g::env, {"DMLC_NUM_SERVER", ""}, "DMLC_NUM_SERVER",
     "an empty server count, which counts as none"},
    {p::server, g::env, {"TROUPE_INSECURE", "maybe"}, "TROUPE_INSECURE",
     "a boolean that is neither"},
    {p::server, g::flag, {"--max-frame-bytes", "1KiB"}, "--max-frame-bytes",
     "a frame cap below its minimum"},
    {p::server, g::config_flag, {"[data]\nreceive_budget_bytes = \"1MiB\"\n"},
     "data.receive_budget_bytes", "a receive budget below the frame cap"},
    {p::server, g::flag, {"--max-send-queue-bytes", "lots"}, "--max-send-queue-bytes",
     "a send queue bound that is no size"},
    {p::server, g::flag, {"--max-store-bytes", "-1"}, "--max-store-bytes",
     "a negative store budget"},
    {p::server, g::config_flag, {"[data]\nmax_value_bytes = 0\n"}, "data.max_value_bytes",
     "a zero value cap"},
    {p::server, g::config_env, {"[timeouts]\nstalled_frame = \"-1s\"\n"},
     "timeouts.stalled_frame", "a negative stalled-frame timeout"},
    {p::server, g::flag, {"--frame-grace", "10"}, "--frame-grace",
     "a frame grace without its unit"},
    {p::server, g::config_flag, {"[data]\nmin_frame_rate = \"fast\"\n"}, "data.min_frame_rate",
     "a minimum frame rate that is no size"},
    {p::server, g::env, {"MXNET_KVSTORE_BIGARRAY_BOUND", "0"}, "MXNET_KVSTORE_BIGARRAY_BOUND",
     "a zero bigarray bound"},
    {p::server, g::flag, {"--bind", "a b"}, "--bind", "a bind address with a space"},
    {p::server, g::env, {"TROUPE_RANK_HINT", "-2"}, "TROUPE_RANK_HINT", "a rank hint below -1"},
    {p::server, g::flag, {"--num-wrkers", "2"}, "--num-wrkers", "an unknown flag"},
    {p::server, g::flag, {"--checkpoint-every-rounds", "-1"}, "--checkpoint-every-rounds",
     "a negative checkpoint period"},
    {p::server, g::config_flag, {"[checkpoint]\nevery = \"often\"\n"}, "checkpoint.every",
     "a checkpoint interval that is no duration"},
    {p::server, g::config_env, {"[checkpoint]\ndir = \"\"\n"}, "checkpoint.dir",
     "an empty checkpoint directory"},
    {p::server, g::flag, {"--checkpoint-dir", "/dev/null/checkpoints"}, "--checkpoint-dir",
     "a checkpoint directory that cannot be made"},
    {p::server, g::env, {"TROUPE_TLS", "maybe"}, "TROUPE_TLS", "a boolean that is neither"},
    {p::server, g::flag, {"--server-rejoin", "1m"}, "--server-rejoin",
     "a server rejoin time without periodic checkpoints"},
    {p::server, g::env, {"TROUPE_RECOVER", "maybe"}, "TROUPE_RECOVER",
     "a boolean that is neither"},
    {p::server, g::flag, {"--recover", "--rank-hint", "0", "--checkpoint-dir", "{dir}"},
     "--recover", "a checkpoint to recover that does not exist"},
    {p::server, g::config_flag, {"[tls]\ncert_file = 5\n"}, "tls.cert_file",
     "a number where a certificate file is expected"},
    // troupe-node without a scheduler or server role
    {p::node_without_role, g::env, {"DMLC_ROLE", "worker"}, "DMLC_ROLE",
     "the worker role, which troupe-node does not run"},
    {p::node_without_role, g::flag, {"--role", "master"}, "--role", "an unknown role"},
    // troupe-launch -n 1 -s 1
    {p::launcher, g::flag, {"--quorum", "2"}, "--quorum", "a quorum larger than the workers"},
    {p::launcher, g::flag, {"--stop-grace", "5"}, "--stop-grace",
     "a grace period without its unit"},
    {p::launcher, g::env, {"DMLC_NUM_WORKER", "abc"}, "DMLC_NUM_WORKER",
     "a worker count that is no number"},
    {p::launcher, g::env, {"DMLC_ROLE", "foo"}, "DMLC_ROLE", "an unknown role"},
    {p::launcher, g::config_flag, {"[data]\nchunk_bytes = 4100\n"}, "data.chunk_bytes",
     "a chunk size the chunker refuses"},
    {p::launcher, g::config_env, {}, "TROUPE_CONFIG", "a cluster file that does not exist"},
    {p::launcher, g::flag, {"--env", "NOEQ"}, "--env", "an --env pair without '='"},
    {p::launcher, g::config_flag, {"[job]\ntoken = \"t0ps3cret\"\n"}, "job.token",
     "a token in a cluster file others may read"},
    // train_mnist --kvstore dist_sync
    {p::train_worker, g::env, {"DMLC_PS_ROOT_PORT", "0"}, "DMLC_PS_ROOT_PORT",
     "scheduler port 0 for a worker"},
    {p::train_worker, g::flag, {"--chunk-bytes", "4100"}, "--chunk-bytes",
     "a chunk size the chunker refuses"},
    {p::train_worker, g::flag, {"--quorum", "4"}, "--quorum", "a quorum larger than the workers"},
    {p::train_worker, g::flag, {"--slice-bytes", "-1"}, "--slice-bytes", "a negative slice size"},
    {p::train_worker, g::config_env, {"[sync]\nmax_staleness = -1\n"}, "sync.max_staleness",
     "a negative staleness bound"},
    {p::train_worker, g::config_flag, {"[node]\nverbose = true\n"}, "node.verbose",
     "a boolean where an integer is expected"},
    {p::train_worker, g::flag, {"--chunk-byte", "4096"}, "--chunk-byte", "an unknown flag"},
    {p::train_worker, g::env, {"TROUPE_MAX_ROUNDS_AHEAD", "0"}, "TROUPE_MAX_ROUNDS_AHEAD",
     "zero rounds ahead"},
    {p::train_worker, g::flag, {"--tls-key", ""}, "--tls-key", "an empty key file path"},
    // train_mnist as a server
    {p::train_as_server, g::env, {"TROUPE_QUORUM", "two"}, "TROUPE_QUORUM",
     "a quorum that is no number"},
    {p::train_as_server, g::flag, {"--shm-arena-bytes", "-1"}, "--shm-arena-bytes",
     "a negative arena size"},
    // kvstore_demo --type dist_sync
    {p::demo_worker, g::env, {"DMLC_NUM_SERVER", "abc"}, "DMLC_NUM_SERVER",
     "a server count that is no number"},
    {p::demo_worker, g::config_env, {"[timeouts]\nconnect = \"-1s\"\n"}, "timeouts.connect",
     "a negative connect timeout"},
    {p::demo_worker, g::flag, {"--rounds", "0"}, "--rounds", "zero rounds"},
    {p::demo_worker, g::config_env, {"[tls]\nca_file = \"\"\n"}, "tls.ca_file",
     "an empty CA file path"},
    // kvstore_demo --type local: a broken environment all the same
    {p::demo_local, g::env, {"DMLC_NUM_WORKER", "abc"}, "DMLC_NUM_WORKER",
     "a worker count that is no number"},
    // kvstore_demo as the scheduler
    {p::demo_as_scheduler, g::flag, {"--chunk-bytes", "4100"}, "--chunk-bytes",
     "a chunk size the chunker refuses"},
    {p::demo_as_scheduler, g::config_env,
     {"[data]\nchunk_bytes = \"8MiB\"\nmax_frame_bytes = \"4MiB\"\n"}, "data.chunk_bytes",
     "chunks larger than the frame cap"},
    {p::demo_as_scheduler, g::env, {"TROUPE_MAX_STALENESS", "x"}, "TROUPE_MAX_STALENESS",
     "a staleness bound that is no number"},
    // kvbench --type dist_sync
    {p::kvbench_worker, g::flag, {"--heartbeat", "10s"}, "--heartbeat",
     "a heartbeat longer than the peer timeout"},
    {p::kvbench_worker, g::env, {"TROUPE_RESCALE_QUORUM", "yes"}, "TROUPE_RESCALE_QUORUM",
     "a boolean that is neither"},
    {p::kvbench_worker, g::env, {"TROUPE_JOIN_AT_BARRIER", "maybe"}, "TROUPE_JOIN_AT_BARRIER",
     "a way to join that is no boolean"},
    {p::kvbench_worker, g::config_env, {"[job]\nrole = \"master\"\n"}, "job.role",
     "an unknown role in the file"},
    {p::kvbench_worker, g::flag, {"--repeats", "0"}, "--repeats", "zero repetitions"},
    {p::kvbench_worker, g::flag, {"--send-window-bytes", "-4MiB"}, "--send-window-bytes",
     "a negative send window"},
    {p::kvbench_worker, g::config_flag, {"[data]\nslice_credit = -1\n"}, "data.slice_credit",
     "a negative slice credit"},
    {p::server, g::config_env, {"[data]\nio_spin_us = 20000\n"}, "data.io_spin_us",
     "a poll longer than 10 ms"},
    {p::kvbench_worker, g::config_flag, {"[data]\nfuse_frame_bytes = -1\n"},
     "data.fuse_frame_bytes", "a negative fused frame size"},
    {p::server, g::config_env, {"[data]\nfuse_item_bytes = \"a few\"\n"}, "data.fuse_item_bytes",
     "a size that is no number of bytes"},
    {p::kvbench_worker, g::config_flag, {"[tls]\nallow_shared_memory = \"yes\"\n"},
     "tls.allow_shared_memory", "a string where a boolean is expected"},
    {p::server, g::config_env, {"[observe]\ntrace = \"\"\n"}, "observe.trace",
     "an empty trace file"},
    {p::kvbench_worker, g::env, {"TROUPE_SUMMARY", "sometimes"}, "TROUPE_SUMMARY",
     "a summary switch that is no boolean"},
  };
  // clang-format on
}

std::string_view describe(program runs) {
  switch (runs) {
  case program::scheduler:
    return "troupe-node --role scheduler";
  case program::server:
    return "troupe-node --role server";
  case program::node_without_role:
    return "troupe-node";
  case program::launcher:
    return "troupe-launch";
  case program::train_worker:
    return "train_mnist --kvstore dist_sync";
  case program::train_as_server:
    return "train_mnist as DMLC_ROLE=server";
  case program::demo_worker:
    return "kvstore_demo --type dist_sync";
  case program::demo_local:
    return "kvstore_demo --type local";
  case program::demo_as_scheduler:
    return "kvstore_demo as DMLC_ROLE=scheduler";
  case program::kvbench_worker:
    return "kvbench --type dist_sync";
  }
  return "?";
}

std::string_view describe(given how) {
  switch (how) {
  case given::config_flag:
    return "cluster file (--config)";
  case given::config_env:
    return "cluster file (TROUPE_CONFIG)";
  case given::env:
    return "environment";
  case given::flag:
    return "flag";
  }
  return "?";
}

// Printed as the data-driven case's context when a row fails (Boost.Test logs each sample).
std::ostream& operator<<(std::ostream& out, const broken_config& row) {
  return out << describe(row.runs) << ", " << describe(row.how) << ": " << row.what << " ("
             << row.field << ")";
}

/// How a program is started: its valid configuration, which a row then breaks.
struct program_run {
  std::string name; ///< how its lines start: "troupe-node"
  std::string path;
  std::vector<std::string> args_before; ///< before a row's flags
  std::vector<std::string> args_after;  ///< after them (the launcher's worker command)
  std::map<std::string, std::string> env;
};

/// `runs` in a job of one worker and one server whose scheduler is at 127.0.0.1:scheduler_port;
/// a server's data listener is at data_port.
program_run valid_run(program runs, int scheduler_port, int data_port) {
  const std::map<std::string, std::string> job{
      {"DMLC_NUM_WORKER", "1"},
      {"DMLC_NUM_SERVER", "1"},
      {"DMLC_PS_ROOT_URI", "127.0.0.1"},
      {"DMLC_PS_ROOT_PORT", std::to_string(scheduler_port)}};
  auto job_and = [&job](std::map<std::string, std::string> more) {
    more.insert(job.begin(), job.end());
    return more;
  };
  const std::string port = std::to_string(data_port);
  switch (runs) {
  case program::scheduler:
    return {"troupe-node", node_path, {"--role", "scheduler"}, {}, job};
  case program::server:
    return {"troupe-node", node_path, {"--role", "server"}, {}, job_and({{"PORT", port}})};
  case program::node_without_role:
    return {"troupe-node", node_path, {}, {}, job};
  case program::launcher:
    return {"troupe-launch",
            launch_path,
            {"-n", "1", "-s", "1", "--node-binary", node_path},
            {"--", demo_path, "--type", "dist_sync"},
            job};
  case program::train_worker:
    return {"train_mnist", train_path, {"--kvstore", "dist_sync"}, {}, job};
  case program::train_as_server:
    return {"train_mnist", train_path, {}, {}, job_and({{"DMLC_ROLE", "server"}, {"PORT", port}})};
  case program::demo_worker:
    return {"kvstore_demo", demo_path, {"--type", "dist_sync"}, {}, job};
  case program::demo_local:
    return {"kvstore_demo", demo_path, {"--type", "local"}, {}, job};
  case program::demo_as_scheduler:
    return {"kvstore_demo", demo_path, {}, {}, job_and({{"DMLC_ROLE", "scheduler"}})};
  case program::kvbench_worker:
    return {"kvbench", kvbench_path, {"--type", "dist_sync"}, {}, job};
  }
  BOOST_FAIL("no such program");
  return {};
}

std::string with_dir(std::string text, const fs::path& dir) {
  const std::string placeholder = "{dir}";
  for (auto at = text.find(placeholder); at != std::string::npos; at = text.find(placeholder))
    text.replace(at, placeholder.size(), dir.string());
  return text;
}

/// The row's bad value applied to its program's valid run; `cluster_file` is set to the cluster
/// file's path for the config_* rows.
program_run broken_run(const broken_config& row, const temp_dir& dir, int scheduler_port,
                       int data_port, std::string& cluster_file) {
  program_run run = valid_run(row.runs, scheduler_port, data_port);
  std::vector<std::string> flags;
  switch (row.how) {
  case given::config_flag:
  case given::config_env: {
    BOOST_TEST_REQUIRE(row.setting.size() <= 1u);
    const auto path = row.setting.empty()
                          ? dir / "absent.toml"
                          : dir.write("cluster.toml", with_dir(row.setting[0], dir.path()), 0644);
    cluster_file = path.string();
    if (row.how == given::config_flag)
      flags = {"--config", cluster_file};
    else
      run.env["TROUPE_CONFIG"] = cluster_file;
    break;
  }
  case given::env:
    BOOST_TEST_REQUIRE(row.setting.size() == 2u);
    run.env[row.setting[0]] = row.setting[1];
    break;
  case given::flag:
    for (const auto& arg : row.setting)
      flags.push_back(with_dir(arg, dir.path()));
    break;
  }
  run.args_before.insert(run.args_before.end(), flags.begin(), flags.end());
  run.args_before.insert(run.args_before.end(), run.args_after.begin(), run.args_after.end());
  return run;
}

/// Whether `line` names `field` as a whole word: "PORT" is not named by "DMLC_PS_ROOT_PORT", nor
/// "port" by "scheduler.port".
bool names(std::string_view line, std::string_view field) {
  auto part_of_a_name = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.';
  };
  for (auto at = line.find(field); at != std::string_view::npos; at = line.find(field, at + 1)) {
    const auto end = at + field.size();
    if ((at == 0 || !part_of_a_name(line[at - 1])) &&
        (end == line.size() || !part_of_a_name(line[end])))
      return true;
  }
  return false;
}

/// "connected" when a connection is waiting on `socket` (the caller's process made one), else
/// "nobody connected".
std::string who_connected(const listening_socket& socket) {
  const int fd = socket.accept_waiting();
  if (fd < 0)
    return "nobody connected";
  ::close(fd);
  return "connected";
}

} // namespace

BOOST_AUTO_TEST_SUITE(broken_configuration)

BOOST_AUTO_TEST_CASE(the_table_has_30_rows_and_covers_every_key_program_and_way_to_give_a_value) {
  const auto rows = table();
  BOOST_TEST(rows.size() >= 30u);
  // Every key of the configuration is broken by some row, by its key, variable or flag.
  for (const auto& key : troupe::config_keys()) {
    const std::string dotted = std::string(key.section) + "." + std::string(key.name);
    const bool covered = std::any_of(rows.begin(), rows.end(), [&](const broken_config& row) {
      return row.field == dotted || (!key.env.empty() && row.field == key.env) ||
             (!key.flag.empty() && row.field == key.flag);
    });
    BOOST_TEST(covered, dotted << " is broken by no row");
  }
  for (program runs : every_program)
    BOOST_TEST(std::any_of(rows.begin(), rows.end(),
                           [runs](const broken_config& row) { return row.runs == runs; }),
               describe(runs) << " has no row");
  for (given how : {given::config_flag, given::config_env, given::env, given::flag})
    BOOST_TEST(std::any_of(rows.begin(), rows.end(),
                           [how](const broken_config& row) { return row.how == how; }),
               describe(how) << " has no row");
}

BOOST_DATA_TEST_CASE(exits_2_with_one_line_naming_the_field_before_any_network_activity,
                     data::make(table()), row) {
  temp_dir dir;
  dir.write("token", "t0ps3cret\n", 0644);
  const listening_socket scheduler; // where every program is told the scheduler is
  const listening_socket data_port; // the port a server would listen on
  std::string cluster_file;
  const auto run_as = broken_run(row, dir, scheduler.port(), data_port.port(), cluster_file);
  const auto result = run(run_as.path, run_as.args_before, run_as.env, 30s);

  BOOST_TEST(!result.timed_out);
  BOOST_TEST(result.exit_code == 2, "stderr: " << result.err);
  // One line, whatever else the program might have to say.
  std::string_view line = result.err;
  if (line.ends_with('\n'))
    line.remove_suffix(1);
  BOOST_TEST(!line.empty());
  BOOST_TEST(line.find('\n') == std::string_view::npos, "stderr: " << result.err);
  BOOST_TEST(line.starts_with(run_as.name + ": "), line);
  BOOST_TEST(names(line, row.field), line);
  if (!cluster_file.empty())
    BOOST_TEST(line.find(cluster_file) != std::string_view::npos, line);
  BOOST_TEST(result.out.empty(), "stdout: " << result.out);
  // Nothing connected; neither port could have been listened on, the test holds both.
  BOOST_TEST(who_connected(scheduler) == "nobody connected");
  BOOST_TEST(who_connected(data_port) == "nobody connected");
  BOOST_TEST(result.err.find("t0ps3cret") == std::string::npos, "a token was shown");
}

// Without their bad value, the rows' setups are valid: a worker connects to the test's
// scheduler socket, a node finds the port the test holds taken, and a local store runs. So what
// stops each row is its bad value, and the checks above would see a connection or a listener.
BOOST_AUTO_TEST_CASE(without_the_bad_value_every_setup_reaches_the_test_s_sockets) {
  for (program runs : every_program) {
    if (runs == program::node_without_role)
      continue; // troupe-node runs nothing without a role: its row is the missing role
    BOOST_TEST_CONTEXT(describe(runs)) {
      const listening_socket scheduler;
      const listening_socket data_port;
      const auto valid = valid_run(runs, scheduler.port(), data_port.port());
      auto args = valid.args_before;
      args.insert(args.end(), valid.args_after.begin(), valid.args_after.end());
      switch (runs) {
      case program::train_worker:
      case program::demo_worker:
      case program::kvbench_worker: {
        // It connects, then waits for a scheduler that never answers: stopped by its PID.
        child_process worker{valid.path, args, valid.env};
        const auto deadline = clock_type::now() + 60s;
        std::string seen = who_connected(scheduler);
        while (seen != "connected" && clock_type::now() < deadline && alive(worker.pid())) {
          std::this_thread::sleep_for(20ms);
          seen = who_connected(scheduler);
        }
        BOOST_TEST(seen == "connected");
        break;
      }
      case program::demo_local: {
        const auto result = run(valid.path, args, valid.env, 60s);
        BOOST_TEST(result.exit_code == 0, result.err);
        BOOST_TEST(who_connected(scheduler) == "nobody connected");
        break;
      }
      default: {
        // A scheduler would listen on the scheduler port, a server on the data port.
        const bool scheduler_port = runs == program::scheduler || runs == program::launcher ||
                                    runs == program::demo_as_scheduler;
        const auto taken = std::to_string(scheduler_port ? scheduler.port() : data_port.port());
        const auto result = run(valid.path, args, valid.env, 30s);
        BOOST_TEST(result.exit_code == 2, result.err);
        BOOST_TEST(result.err.find("port " + taken + " on 127.0.0.1 is in use") !=
                       std::string::npos,
                   result.err);
        BOOST_TEST(who_connected(scheduler) == "nobody connected");
        break;
      }
      }
    }
  }
}

BOOST_AUTO_TEST_SUITE_END()
