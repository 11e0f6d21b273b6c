// The distributed KVStore across real processes on 127.0.0.1: troupe-launch starts troupe-node
// schedulers and servers and tests/cluster/kv_worker workers, which check MXNet's closed forms
// themselves and exit 0 only when they hold. Every wait is bounded; every process is stopped by
// its PID.

#include <filesystem>
#include <optional>
#include <set>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "process_support.hpp"
#include "tests/shm_files.hpp"

using namespace troupe::testing;

namespace {

const std::string launch_path = TROUPE_LAUNCH_PATH;
const std::string node_path = TROUPE_NODE_PATH;
const std::string worker_path = TROUPE_KV_WORKER_PATH;

/// troupe-launch -n workers -s servers -- kv_worker worker_args...
outcome launch_job(int workers, int servers, std::vector<std::string> worker_args,
                   std::chrono::milliseconds limit = 120s) {
  std::vector<std::string> args{"-n",
                                std::to_string(workers),
                                "-s",
                                std::to_string(servers),
                                "--node-binary",
                                node_path,
                                "--",
                                worker_path};
  args.insert(args.end(), worker_args.begin(), worker_args.end());
  return run(launch_path, args, {}, limit);
}

/// A port on 127.0.0.1 that was free a moment ago (listened on, then closed).
std::uint16_t free_port() {
  return static_cast<std::uint16_t>(listening_socket{}.port());
}

std::size_t count_lines(const std::string& text, const std::string& fragment) {
  std::size_t count = 0;
  for (const auto& line : lines_of(text))
    if (line.find(fragment) != std::string::npos)
      ++count;
  return count;
}

void require_job_success(const outcome& result, int workers, const std::string& check) {
  BOOST_TEST(!result.timed_out);
  BOOST_TEST(result.exit_code == 0, "exit " << result.exit_code << "\nstdout:\n"
                                            << result.out << "\nstderr:\n"
                                            << result.err);
  BOOST_TEST(count_lines(result.out, check + " checks hold") == static_cast<std::size_t>(workers),
             result.out);
  // The launcher's prefixes are the ranks the scheduler granted.
  for (int rank = 0; rank < workers; ++rank) {
    auto expected =
        "[worker " + std::to_string(rank) + "] kv_worker rank " + std::to_string(rank) + ":";
    BOOST_TEST(count_lines(result.out, expected) == 1u, expected << "\n" << result.out);
  }
}

} // namespace

BOOST_AUTO_TEST_SUITE(kvstore_across_processes)

BOOST_AUTO_TEST_CASE(on_one_host_tensors_go_through_shared_memory_and_leave_nothing_in_dev_shm) {
  const auto before = arena_files();
  // PS_VERBOSE=1 makes the data links log when their fast path is on.
  auto result =
      run(launch_path,
          {"-n", "2", "-s", "1", "--node-binary", node_path, "--env", "PS_VERBOSE=1", "--",
           worker_path, "--check", "sync", "--rounds", "3", "--shapes", "2x3,1200x1200,1211x1211"},
          {}, 120s);
  require_job_success(result, 2, "sync");
  // Each of the 2 worker-server connections, in both directions.
  BOOST_TEST(count_lines(result.out + result.err, "go through shared memory") == 4u,
             result.out << result.err);
  BOOST_TEST((arena_files() == before));
}

BOOST_AUTO_TEST_CASE(with_shm_arena_bytes_0_the_job_uses_tcp_only) {
  const auto before = arena_files();
  temp_dir dir;
  auto config = dir.write("noshm.toml", "[data]\nshm_arena_bytes = 0\n");
  auto result = run(launch_path,
                    {"-n", "2", "-s", "1", "--node-binary", node_path, "--env", "PS_VERBOSE=1",
                     "--config", config.string(), "--", worker_path, "--check", "sync", "--rounds",
                     "3", "--shapes", "2x3,1211x1211"},
                    {}, 120s);
  require_job_success(result, 2, "sync");
  BOOST_TEST(count_lines(result.out + result.err, "go through shared memory") == 0u);
  BOOST_TEST((arena_files() == before));
}

BOOST_AUTO_TEST_CASE(four_workers_and_two_servers_match_the_sync_closed_form_in_float32) {
  require_job_success(
      launch_job(4, 2, {"--check", "sync", "--rounds", "3", "--shapes", "2x3,1200x1200,1211x1211"}),
      4, "sync");
}

BOOST_AUTO_TEST_CASE(four_workers_and_two_servers_match_the_sync_closed_form_in_float16) {
  require_job_success(launch_job(4, 2,
                                 {"--check", "sync", "--rounds", "3", "--dtype", "float16",
                                  "--shapes", "2x3,1200x1200,1211x1211"}),
                      4, "sync");
}

BOOST_AUTO_TEST_CASE(seven_workers_and_seven_servers_match_the_sync_closed_form) {
  require_job_success(
      launch_job(7, 7, {"--check", "sync", "--rounds", "4", "--shapes", "2x3,1200x1200,1211x1211"}),
      7, "sync");
}

BOOST_AUTO_TEST_CASE(dist_async_applies_every_push_exactly_once_across_processes) {
  require_job_success(launch_job(4, 2,
                                 {"--type", "dist_async", "--check", "async", "--rounds", "20",
                                  "--shapes", "2x3,1211x1211"}),
                      4, "async");
}

BOOST_AUTO_TEST_CASE(without_an_optimizer_each_round_replaces_the_value_with_its_sum) {
  require_job_success(
      launch_job(3, 2, {"--check", "replace", "--rounds", "3", "--shapes", "2x3,1211x1211"}), 3,
      "replace");
}

BOOST_AUTO_TEST_CASE(a_killed_worker_makes_every_other_process_fail_naming_it_within_the_timeout) {
  temp_dir dir;
  auto port = std::to_string(free_port());
  std::map<std::string, std::string> job{
      {"DMLC_PS_ROOT_URI", "127.0.0.1"}, {"DMLC_PS_ROOT_PORT", port},
      {"DMLC_NUM_WORKER", "3"},          {"DMLC_NUM_SERVER", "1"},
      {"DMLC_NODE_HOST", "127.0.0.1"},   {"KV_WORKER_DIR", dir.path().string()}};
  auto as = [&](const std::string& role) {
    auto env = job;
    env["DMLC_ROLE"] = role;
    return env;
  };
  child_process scheduler{node_path, {}, as("scheduler")};
  child_process server{node_path, {}, as("server")};
  std::vector<std::unique_ptr<child_process>> workers;
  for (int i = 0; i < 3; ++i)
    workers.push_back(std::make_unique<child_process>(
        worker_path, std::vector<std::string>{"--check", "hang"}, as("worker")));

  // Wait (bounded) until every worker runs its loop, then kill rank 1.
  const auto started = clock_type::now();
  while (clock_type::now() - started < 30s &&
         std::distance(fs::directory_iterator(dir.path()), fs::directory_iterator{}) < 3)
    std::this_thread::sleep_for(20ms);
  std::ifstream pid_file(dir.path() / "rank-1");
  pid_t victim = 0;
  pid_file >> victim;
  BOOST_TEST_REQUIRE(victim > 0);
  BOOST_TEST_REQUIRE(::kill(victim, SIGKILL) == 0);
  const auto killed_at = clock_type::now();

  // Every other process ends on its own, with an error naming worker 1, within the timeout
  // (5 s by default) plus slack for a loaded machine.
  std::vector<child_process*> survivors{&scheduler, &server};
  for (auto& worker : workers)
    if (worker->pid() != victim)
      survivors.push_back(worker.get());
  for (auto* survivor : survivors) {
    auto result = survivor->wait(15s);
    auto after_kill =
        std::chrono::duration_cast<std::chrono::milliseconds>(clock_type::now() - killed_at);
    BOOST_TEST(!result.timed_out, "pid " << survivor->pid() << " still running");
    BOOST_TEST(result.exit_code != 0);
    BOOST_TEST(after_kill < 10s);
    BOOST_TEST(result.err.find("worker 1") != std::string::npos, result.err);
  }
  for (auto& worker : workers)
    if (worker->pid() == victim)
      BOOST_TEST(worker->wait(5s).exit_code == 128 + SIGKILL);
}

BOOST_AUTO_TEST_CASE(the_dmlc_environment_alone_turns_any_troupe_program_into_any_node) {
  // As with MXNet's launch.py: the same program for every role, the role from DMLC_ROLE.
  auto port = std::to_string(free_port());
  std::map<std::string, std::string> job{{"DMLC_PS_ROOT_URI", "127.0.0.1"},
                                         {"DMLC_PS_ROOT_PORT", port},
                                         {"DMLC_NUM_WORKER", "2"},
                                         {"DMLC_NUM_SERVER", "1"},
                                         {"DMLC_NODE_HOST", "127.0.0.1"}};
  std::vector<std::unique_ptr<child_process>> nodes;
  for (std::string role : {"scheduler", "server", "worker", "worker"}) {
    auto env = job;
    env["DMLC_ROLE"] = role;
    nodes.push_back(std::make_unique<child_process>(
        worker_path, std::vector<std::string>{"--check", "sync", "--shapes", "2x3,1211x1211"},
        env));
  }
  std::size_t checks = 0;
  for (auto& node : nodes) {
    auto result = node->wait(60s);
    BOOST_TEST(!result.timed_out);
    BOOST_TEST(result.exit_code == 0, result.err);
    checks += count_lines(result.out, "sync checks hold");
  }
  BOOST_TEST(checks == 2u);
}

BOOST_AUTO_TEST_CASE(a_broken_configuration_exits_2_with_one_line_naming_the_place) {
  temp_dir dir;
  auto file = dir.write("cluster.toml", "[job]\nnum_workers = 2\nnum_servrs = 1\n");
  auto typo = run(node_path, {"--role", "server", "--config", file.string()}, {}, 20s);
  BOOST_TEST(typo.exit_code == 2);
  BOOST_TEST(lines_of(typo.err).size() == 1u, typo.err);
  BOOST_TEST(typo.err.find("cluster.toml:3") != std::string::npos, typo.err);
  BOOST_TEST(typo.err.find("num_servrs") != std::string::npos, typo.err);

  auto bad_env =
      run(node_path, {"--role", "scheduler"},
          {{"DMLC_NUM_WORKER", "two"}, {"DMLC_NUM_SERVER", "1"}, {"DMLC_PS_ROOT_PORT", "0"}}, 20s);
  BOOST_TEST(bad_env.exit_code == 2);
  BOOST_TEST(bad_env.err.find("DMLC_NUM_WORKER") != std::string::npos, bad_env.err);

  // A port in use is refused before anything listens or connects.
  std::optional<outcome> busy_run;
  {
    listening_socket taken;
    busy_run = run(node_path, {"--role", "scheduler"},
                   {{"DMLC_NUM_WORKER", "1"},
                    {"DMLC_NUM_SERVER", "1"},
                    {"DMLC_PS_ROOT_PORT", std::to_string(taken.port())}},
                   20s);
  }
  auto& busy = *busy_run;
  BOOST_TEST(busy.exit_code == 2);
  BOOST_TEST(busy.err.find("in use") != std::string::npos, busy.err);
}

BOOST_AUTO_TEST_SUITE_END()
