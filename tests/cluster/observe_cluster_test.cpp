// What a running job tells about itself, across real processes on 127.0.0.1: the job trace
// (troupe-launch --trace) holds every push, merge, update and pull of every key and round in the
// order the protocol allows; the summary (--summary) counts each key's traffic; SIGUSR1 makes a
// running server print its summary. Every wait is bounded; every process is stopped by its PID.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <thread>
#include <tuple>

#include <boost/test/unit_test.hpp>

#include "process_support.hpp"

using namespace troupe::testing;

namespace {

const std::string launch_path = TROUPE_LAUNCH_PATH;
const std::string node_path = TROUPE_NODE_PATH;
const std::string worker_path = TROUPE_KV_WORKER_PATH;

/// One span of the merged trace, its begin and end paired.
struct span {
  std::string node; ///< "server-0", "worker-1"
  std::string name;
  std::uint64_t key = 0;
  std::uint64_t round = 0;
  std::int64_t peer = -1;
  std::int64_t begin = 0;
  std::int64_t end = -1;
};

std::vector<span> spans_of(const nlohmann::json& trace) {
  std::map<int, std::string> node_of_pid;
  for (const auto& event : trace["traceEvents"])
    if (event["ph"] == "M" && event["name"] == "process_name")
      node_of_pid[event["pid"].get<int>()] = event["args"]["name"].get<std::string>();
  std::map<std::pair<int, std::string>, span> open;
  std::vector<span> done;
  for (const auto& event : trace["traceEvents"]) {
    if (event["ph"] != "b" && event["ph"] != "e")
      continue;
    const auto id =
        std::make_pair(event["pid"].get<int>(), event["id2"]["local"].get<std::string>());
    if (event["ph"] == "b") {
      span s;
      s.node = node_of_pid[id.first];
      s.name = event["name"].get<std::string>();
      s.key = event["args"]["key"].get<std::uint64_t>();
      s.round = event["args"]["round"].get<std::uint64_t>();
      s.peer = event["args"]["peer"].get<std::int64_t>();
      s.begin = event["ts"].get<std::int64_t>();
      open[id] = s;
    } else {
      auto found = open.find(id);
      BOOST_TEST_REQUIRE((found != open.end()), "an end without its begin");
      found->second.end = event["ts"].get<std::int64_t>();
      BOOST_TEST(found->second.end >= found->second.begin);
      done.push_back(found->second);
      open.erase(found);
    }
  }
  BOOST_TEST(open.empty(), open.size() << " spans never ended");
  return done;
}

} // namespace

BOOST_AUTO_TEST_SUITE(cluster_observe)

BOOST_AUTO_TEST_CASE(the_job_trace_holds_every_push_merge_update_and_pull_in_protocol_order) {
  temp_dir dir;
  const auto trace_file = (dir.path() / "job.json").string();
  constexpr int workers = 2, rounds = 3;
  // 1211x1211 is above the big-array bound: its slices live on both servers.
  auto result = run(launch_path,
                    {"-n", std::to_string(workers), "-s", "2", "--node-binary", node_path,
                     "--trace", trace_file, "--summary", "--", worker_path, "--check", "sync",
                     "--rounds", std::to_string(rounds), "--shapes", "2x3,1211x1211"},
                    {}, 120s);
  BOOST_TEST_REQUIRE(result.exit_code == 0, result.out << result.err);
  BOOST_TEST_REQUIRE(fs::exists(trace_file), result.err);
  // The node files were merged and removed.
  std::size_t files = 0;
  for ([[maybe_unused]] const auto& entry : fs::directory_iterator{dir.path()})
    ++files;
  BOOST_TEST(files == 1u);

  std::ifstream in{trace_file};
  const auto trace = nlohmann::json::parse(in);
  BOOST_TEST(trace["otherData"]["nodes"] ==
             nlohmann::json({"server-0", "server-1", "worker-0", "worker-1"}));
  BOOST_TEST(trace["otherData"]["dropped_spans"] == 0);
  const auto spans = spans_of(trace);

  using where = std::tuple<std::string, std::uint64_t, std::uint64_t, std::int64_t>;
  std::map<where, span> by; // (name, key, round, peer) -> span; worker spans by their node
  std::set<std::uint64_t> keys;
  for (const auto& s : spans) {
    const bool on_worker = s.node.starts_with("worker-");
    const std::int64_t who = on_worker ? std::stoll(s.node.substr(7)) : s.peer;
    BOOST_TEST(
        (by.emplace(where{s.name + (on_worker ? "@worker" : ""), s.key, s.round, who}, s).second),
        "two " << s.name << " spans of key " << s.key << " round " << s.round);
    if (s.name == "update")
      keys.insert(s.key);
  }
  // 13 ps-keys: the small key, and the big one's 12 slices (split over the 2 servers, each half
  // cut into 6 slices of at most data.slice_bytes, 512 KiB).
  BOOST_TEST(keys.size() == 13u);
  for (auto key : keys) {
    for (std::uint64_t round = 0; round < rounds; ++round) {
      auto update = by.find(where{"update", key, round, -1});
      BOOST_TEST_REQUIRE((update != by.end()), "no update of key " << key << " round " << round);
      for (std::int64_t w = 0; w < workers; ++w) {
        auto push = by.find(where{"push@worker", key, round, w});
        auto merge = by.find(where{"merge", key, round, w});
        auto pull = by.find(where{"pull@worker", key, round + 1, w});
        auto served = by.find(where{"pull", key, round + 1, w});
        BOOST_TEST_REQUIRE(
            (push != by.end() && merge != by.end() && pull != by.end() && served != by.end()),
            "key " << key << " round " << round << " worker " << w);
        // The push leaves, the server merges it, then acks; the round's update follows every
        // merge; the pull waits at the server for the update and is answered after it.
        BOOST_TEST(push->second.begin <= merge->second.begin);
        BOOST_TEST(merge->second.end <= push->second.end);
        BOOST_TEST(merge->second.end <= update->second.begin);
        BOOST_TEST(pull->second.begin <= served->second.begin);
        BOOST_TEST(update->second.end <= served->second.end);
        BOOST_TEST(served->second.end <= pull->second.end);
        BOOST_TEST(merge->second.node == update->second.node);
      }
    }
  }

  // The summary: each ps-key took workers x rounds pushes at its server; both workers timed theirs.
  BOOST_TEST(count_lines(result.out + result.err,
                         ": " + std::to_string(workers * rounds) + " pushes, ") == keys.size(),
             result.err);
  BOOST_TEST(count_lines(result.err, "push times over ") == static_cast<std::size_t>(workers),
             result.err);
  BOOST_TEST(count_lines(result.err, "links: 0 bad frames refused") == 2u, result.err);
}

BOOST_AUTO_TEST_CASE(sigusr1_makes_the_servers_of_a_running_job_print_their_summary) {
  temp_dir dir;
  // dist_async paced at 100 ms a round: the job runs about 3 s after its keys are initialised.
  child_process launcher(launch_path,
                         {"-n", "2", "-s", "1", "--node-binary", node_path, "--", worker_path,
                          "--type", "dist_async", "--check", "async", "--rounds", "30",
                          "--round-ms", "100"},
                         {{"KV_WORKER_DIR", dir.path().string()}});
  const auto deadline = clock_type::now() + 60s;
  while (!fs::exists(dir.path() / "rank-0") && clock_type::now() < deadline)
    std::this_thread::sleep_for(20ms);
  BOOST_TEST_REQUIRE(fs::exists(dir.path() / "rank-0"), "the job did not start within 60 s");
  BOOST_TEST_REQUIRE(::kill(launcher.pid(), SIGUSR1) == 0);
  auto result = launcher.wait(60s);
  BOOST_TEST(result.exit_code == 0, result.out << result.err);
  // Without --summary and at verbose 0 the server prints its summary only when asked.
  BOOST_TEST(count_lines(result.err, "[server 0]") >= 1u, result.err);
  BOOST_TEST(count_lines(result.err, " shards: ") >= 1u, result.err);
  BOOST_TEST(count_lines(result.err, "dist_async staleness") == 1u, result.err);
  BOOST_TEST(count_lines(result.err, " pushes, ") >= 1u, result.err);
}

BOOST_AUTO_TEST_CASE(merge_trace_alone_merges_node_files_copied_by_hand_and_names_a_missing_one) {
  temp_dir dir;
  const auto trace_file = (dir.path() / "none.json").string();
  auto result = run(launch_path, {"--merge-trace", trace_file}, {}, 30s);
  BOOST_TEST(result.exit_code == 1);
  BOOST_TEST(count_lines(result.err, "no node trace files " + trace_file) == 1u, result.err);
}

BOOST_AUTO_TEST_SUITE_END()
