// What a job tells about itself: the job trace's node files and their merge (job_trace), the
// quantiles of the summary's times (latency_histogram), and a shard's per-key traffic and
// dist_async staleness (shard_core::stats), driven message by message.

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/logic/job_trace.hpp"
#include "actors/logic/latency_histogram.hpp"
#include "tests/actors/logic/shard_driver.hpp"
#include "tests/temp_dir.hpp"

using namespace troupe;
using troupe::testing::shard_driver;
using troupe::testing::temp_dir;

namespace {

nlohmann::json read_json(const std::filesystem::path& path) {
  std::ifstream in{path};
  return nlohmann::json::parse(in);
}

/// The process's recorder, reset before and after a test (it is one per process).
struct fresh_trace {
  fresh_trace() { job_trace::process().reset(); }
  ~fresh_trace() { job_trace::process().reset(); }
  job_trace& trace = job_trace::process();
};

/// Records `count` spans of `name` as node role-rank and writes its file under `prefix`.
std::string write_node(job_trace& trace, const std::string& prefix, const char* role, int rank,
                       const char* name, int count, std::size_t max_events = 100) {
  trace.reset();
  trace.start(prefix, max_events);
  trace.set_node(role, rank);
  for (int i = 0; i < count; ++i)
    trace.record({name, 7, static_cast<std::uint64_t>(i), 1, 64, 1'000 + 10 * i, 1'005 + 10 * i});
  auto written = trace.write();
  BOOST_TEST_REQUIRE(written.has_value());
  return *written;
}

} // namespace

BOOST_AUTO_TEST_SUITE(observe)

BOOST_AUTO_TEST_CASE(a_node_file_holds_each_span_as_a_begin_and_an_end_and_counts_what_it_dropped) {
  fresh_trace fresh;
  temp_dir dir;
  const auto prefix = (dir.path() / "job.json").string();
  const auto file = write_node(fresh.trace, prefix, "server", 1, "merge", 5, 3);
  BOOST_TEST(file == prefix + ".server-1");
  BOOST_TEST(fresh.trace.dropped() == 2u);
  const auto doc = read_json(file);
  BOOST_TEST(doc["otherData"]["node"] == "server-1");
  BOOST_TEST(doc["otherData"]["dropped_spans"] == 2);
  std::map<std::string, int> phases;
  for (const auto& event : doc["traceEvents"]) {
    phases[event["ph"].get<std::string>()]++;
    BOOST_TEST(event["pid"] == 1001);
    if (event["ph"] == "b" || event["ph"] == "e") {
      BOOST_TEST(event["name"] == "merge");
      BOOST_TEST(event["args"]["key"] == 7);
      BOOST_TEST(event["args"]["peer"] == 1);
    }
  }
  BOOST_TEST(phases["b"] == 3);
  BOOST_TEST(phases["e"] == 3);
  BOOST_TEST(phases["M"] == 2);
}

BOOST_AUTO_TEST_CASE(node_files_merge_into_one_trace_of_every_node) {
  fresh_trace fresh;
  temp_dir dir;
  const auto prefix = (dir.path() / "job.json").string();
  write_node(fresh.trace, prefix, "server", 0, "update", 2);
  write_node(fresh.trace, prefix, "worker", 0, "push", 3);
  write_node(fresh.trace, prefix, "worker", 1, "pull", 4);
  // Not a node file of this trace: left alone.
  std::ofstream{dir.path() / "job.json.notes"} << "x";
  const auto parts = node_trace_files(prefix);
  BOOST_TEST_REQUIRE(parts.size() == 3u);
  BOOST_TEST(parts[0] == prefix + ".server-0");
  BOOST_TEST_REQUIRE(merge_trace_files(prefix, parts).has_value());
  const auto doc = read_json(prefix);
  BOOST_TEST(doc["otherData"]["nodes"] == nlohmann::json({"server-0", "worker-0", "worker-1"}));
  std::map<std::pair<int, std::string>, int> begins;
  for (const auto& event : doc["traceEvents"])
    if (event["ph"] == "b")
      begins[{event["pid"].get<int>(), event["name"].get<std::string>()}]++;
  BOOST_TEST((begins[{1000, "update"}]) == 2);
  BOOST_TEST((begins[{2000, "push"}]) == 3);
  BOOST_TEST((begins[{2001, "pull"}]) == 4);
}

BOOST_AUTO_TEST_CASE(a_torn_or_foreign_node_file_is_refused_naming_it_and_nothing_is_written) {
  fresh_trace fresh;
  temp_dir dir;
  const auto prefix = (dir.path() / "job.json").string();
  const auto good = write_node(fresh.trace, prefix, "worker", 0, "push", 3);
  const auto torn = write_node(fresh.trace, prefix, "worker", 1, "push", 3);
  std::filesystem::resize_file(torn, std::filesystem::file_size(torn) / 2);
  std::vector<std::string> parts{good, torn};
  auto merged = merge_trace_files(prefix, parts);
  BOOST_TEST_REQUIRE(!merged.has_value());
  BOOST_TEST(merged.error().message().find(torn) != std::string::npos, merged.error().message());
  BOOST_TEST(!std::filesystem::exists(prefix));

  const auto foreign = (dir.path() / "foreign.json").string();
  std::ofstream{foreign} << R"({"traceEvents":[]})";
  parts = {good, foreign};
  merged = merge_trace_files(prefix, parts);
  BOOST_TEST_REQUIRE(!merged.has_value());
  BOOST_TEST(merged.error().message().find(foreign) != std::string::npos, merged.error().message());
  BOOST_TEST(!std::filesystem::exists(prefix));
}

BOOST_AUTO_TEST_CASE(recording_is_off_until_started) {
  fresh_trace fresh;
  fresh.trace.record({"push", 1, 1, 0, 8, 1, 2});
  BOOST_TEST(fresh.trace.size() == 0u);
  BOOST_TEST(trace_start_time() == 0);
  BOOST_TEST(!fresh.trace.write().has_value());
}

BOOST_AUTO_TEST_CASE(histogram_quantiles_are_within_their_bucket_of_the_recorded_values) {
  latency_histogram times;
  BOOST_TEST(times.quantile_us(0.5) == 0.0);
  for (int ms = 1; ms <= 1000; ++ms)
    times.record(std::chrono::milliseconds{ms});
  BOOST_TEST(times.count() == 1000u);
  BOOST_TEST(std::abs(times.quantile_us(0.5) / 500'000.0 - 1) < 0.045);
  BOOST_TEST(std::abs(times.quantile_us(0.99) / 990'000.0 - 1) < 0.045);
  BOOST_TEST(std::abs(times.quantile_us(1.0) / 1'000'000.0 - 1) < 0.045);
}

BOOST_AUTO_TEST_CASE(a_shard_counts_each_keys_pushes_and_pulls_with_their_bytes) {
  shard_driver job(2);
  const auto value = ndarray::ones({4});
  BOOST_TEST_REQUIRE(job.init(3, value));
  BOOST_TEST_REQUIRE(job.init(5, ndarray::ones({2})));
  for (std::uint64_t round = 0; round < 3; ++round)
    for (std::uint32_t worker = 0; worker < 2; ++worker)
      job.push(3, worker, round, value);
  job.pull(3, 0, 3);
  job.pull(3, 1, 3);
  const auto stats = job.shard->stats();
  BOOST_TEST_REQUIRE(stats.keys.size() == 2u);
  BOOST_TEST(stats.keys[0].key == 3u);
  BOOST_TEST(stats.keys[0].pushes == 6u);
  BOOST_TEST(stats.keys[0].push_bytes == 6u * value.nbytes());
  BOOST_TEST(stats.keys[0].pulls == 2u);
  BOOST_TEST(stats.keys[0].pull_bytes == 2u * value.nbytes());
  BOOST_TEST(stats.keys[1].key == 5u);
  BOOST_TEST(stats.keys[1].pushes == 0u);
  BOOST_TEST(stats.updates == 3u);
}

BOOST_AUTO_TEST_CASE(a_dist_async_shard_counts_how_far_ahead_each_push_arrived) {
  sync_policy async;
  async.mode = consistency::async;
  shard_driver job(2, async);
  const auto value = ndarray::ones({2});
  BOOST_TEST_REQUIRE(job.init(1, value));
  // Worker 0 pushes four times before worker 1 pushes once: it arrives 0, 1, 2 and 3 ahead.
  for (std::uint64_t sequence = 0; sequence < 4; ++sequence)
    job.push(1, 0, sequence, value);
  job.push(1, 1, 0, value);
  const auto stats = job.shard->stats();
  BOOST_TEST(stats.max_lead == 3u);
  BOOST_TEST(stats.lead_counts[0] == 2u); // worker 0's first push and worker 1's
  BOOST_TEST(stats.lead_counts[1] == 1u);
  BOOST_TEST(stats.lead_counts[2] == 1u);
  BOOST_TEST(stats.lead_counts[3] == 1u);
}

BOOST_AUTO_TEST_CASE(a_traced_shard_records_each_merge_update_and_pull_in_order) {
  fresh_trace fresh;
  temp_dir dir;
  fresh.trace.start((dir.path() / "t").string());
  shard_driver job(2);
  const auto value = ndarray::ones({4});
  BOOST_TEST_REQUIRE(job.init(3, value));
  job.push(3, 0, 0, value);
  job.pull(3, 0, 1); // waits for round 0
  job.push(3, 1, 0, value);
  BOOST_TEST(fresh.trace.size() == 4u);
  auto file = fresh.trace.write();
  BOOST_TEST_REQUIRE(file.has_value());
  std::vector<std::string> order;
  const auto doc = read_json(*file);
  for (const auto& event : doc["traceEvents"])
    if (event["ph"] == "e")
      order.push_back(event["name"].get<std::string>() + " w" +
                      std::to_string(event["args"]["peer"].get<int>()) + " r" +
                      std::to_string(event["args"]["round"].get<int>()));
  const std::vector<std::string> expected{"merge w0 r0", "merge w1 r0", "update w-1 r0",
                                          "pull w0 r1"};
  BOOST_TEST(order == expected, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
