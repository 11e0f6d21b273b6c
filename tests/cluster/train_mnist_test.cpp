// apps/train_mnist as a user runs it: the real binary on the real Fashion-MNIST files, alone and
// as the workers of a troupe-launch job; and its report (apps/training_report) on its own. The
// runs are kept short (one epoch, or a few hundred samples) for a 2-core CI machine; every wait is
// bounded.

#include <cmath>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>
#include <tuple>

#include <boost/test/unit_test.hpp>

#include "apps/training_report.hpp"
#include "process_support.hpp"

using namespace troupe::testing;
namespace report = troupe::report;

namespace {

const std::string launch_path = TROUPE_LAUNCH_PATH;
const std::string node_path = TROUPE_NODE_PATH;
const std::string train_path = TROUPE_TRAIN_MNIST_PATH;
const std::string data_dir = "/usr/share/datasets/fashion-mnist";

boost::test_tools::assertion_result fashion_mnist_present(boost::unit_test::test_unit_id) {
  const auto images = data_dir + "/train-images-idx3-ubyte.gz";
  if (fs::exists(images) && fs::exists(data_dir + "/t10k-images-idx3-ubyte.gz"))
    return true;
  boost::test_tools::assertion_result result{false};
  result.message() << "Fashion-MNIST is not installed at " << data_dir;
  return result;
}

std::string describe(const outcome& result) {
  std::ostringstream text;
  text << "exit " << result.exit_code << (result.timed_out ? " (timed out)" : "") << "\nstdout:\n"
       << result.out << "\nstderr:\n"
       << result.err;
  return text.str();
}

/// The value of "key":number in the last line of `text` that holds "final_test_acc".
std::optional<double> final_field(const std::string& text, const std::string& key) {
  std::string line;
  for (const auto& l : lines_of(text))
    if (l.find("\"final_test_acc\"") != std::string::npos)
      line = l;
  std::smatch match;
  if (!std::regex_search(line, match, std::regex("\"" + key + "\":([-0-9.eE+]+)")))
    return std::nullopt;
  return std::stod(match[1].str());
}

/// troupe-launch -n `workers` -s 1 `launcher_flags` -- train_mnist: one epoch of at most 20
/// batches of 64 from the first 6000 samples, then `train_args`.
outcome launch_short_training(int workers, std::vector<std::string> launcher_flags,
                              const std::vector<std::string>& train_args) {
  std::vector<std::string> args{"-n", std::to_string(workers), "-s",
                                "1",  "--node-binary",         node_path};
  args.insert(args.end(), launcher_flags.begin(), launcher_flags.end());
  args.insert(args.end(), {"--", train_path, "--train-limit", "6000", "--batch-size", "64",
                           "--epochs", "1", "--max-batches", "20", "--no-progress"});
  args.insert(args.end(), train_args.begin(), train_args.end());
  return run(launch_path, args, {}, 180s);
}

/// The two runs printed the same final test accuracy and training loss, to the last digit.
void require_same_final_metrics(const outcome& first, const outcome& second) {
  for (const char* key : {"final_test_acc", "final_train_loss"})
    BOOST_TEST(final_field(first.out, key).value_or(-1) ==
                   final_field(second.out, key).value_or(-2),
               key << "\n"
                   << first.out << "\n"
                   << second.out);
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

} // namespace

BOOST_AUTO_TEST_SUITE(train_mnist_job)

// The issue's recipe for one epoch, seed 0: troupe reaches 79.9% (77.0-80.9% over seeds 0-2,
// PyTorch's bench/pytorch_mnist.py 79.9-81.1%); 75% leaves room for another BLAS kernel while
// still failing a job that does not learn (chance is 10%; a wrong update scale or label order
// stays far below).
BOOST_AUTO_TEST_CASE(one_epoch_of_the_mlp_beats_75_percent_and_writes_its_report,
                     *boost::unit_test::precondition(fashion_mnist_present)) {
  temp_dir dir;
  auto result = run(train_path,
                    {"--model", "mlp", "--epochs", "1", "--no-progress", "--csv",
                     (dir / "metrics.csv").string(), "--plot", (dir / "plot.svg").string()},
                    {}, 180s);
  BOOST_TEST_REQUIRE(result.exit_code == 0, describe(result));
  BOOST_TEST(!with_prefix(result.out, "epoch 1 train_loss ").empty(), result.out);
  auto accuracy = final_field(result.out, "final_test_acc");
  BOOST_TEST_REQUIRE(accuracy.has_value(), result.out);
  BOOST_TEST(*accuracy > 75.0, result.out);
  BOOST_TEST(final_field(result.out, "samples_per_s").value_or(0) > 0, result.out);

  auto csv = lines_of(read_file(dir / "metrics.csv"));
  BOOST_TEST_REQUIRE(csv.size() == 2u);
  BOOST_TEST(csv[0].starts_with("epoch,train_loss,train_acc,test_acc,"));
  BOOST_TEST(csv[1].starts_with("1,"));
  auto svg = read_file(dir / "plot.svg");
  BOOST_TEST(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\""));
  BOOST_TEST(svg.ends_with("</svg>\n"));
  BOOST_TEST(svg.find("test accuracy") != std::string::npos);
}

// The communication-heavy model of issue 23: 784-4096-4096-10, 20,037,642 parameters (80 MB of
// float32 gradients a step). Two batches of 32 keep the run short; the banner and the final line
// both give the count, so a benchmark can tell what it moved.
BOOST_AUTO_TEST_CASE(mlp_wide_is_a_model_of_twenty_million_parameters,
                     *boost::unit_test::precondition(fashion_mnist_present)) {
  auto result = run(train_path,
                    {"--model", "mlp-wide", "--init", "torch", "--epochs", "1", "--train-limit",
                     "64", "--batch-size", "32", "--no-progress"},
                    {}, 120s);
  BOOST_TEST_REQUIRE(result.exit_code == 0, describe(result));
  BOOST_TEST(result.out.find("train_mnist: model mlp-wide (20037642 parameters) ") !=
                 std::string::npos,
             result.out);
  BOOST_TEST(final_field(result.out, "parameters").value_or(0) == 20037642.0, result.out);
  BOOST_TEST(final_field(result.out, "final_test_acc").value_or(-1) >= 0.0, result.out);
  BOOST_TEST(final_field(result.out, "samples_per_s").value_or(0) > 0, result.out);
}

// Hybridized and imperative runs compute with the same operators in the same order, so the
// metrics they print agree to the last digit; two contexts and a `device` store take the same
// path through split_and_load and the store's sum.
BOOST_AUTO_TEST_CASE(a_hybridized_run_on_two_contexts_prints_what_the_imperative_one_does,
                     *boost::unit_test::precondition(fashion_mnist_present)) {
  const std::vector<std::string> common{"--epochs", "1",          "--max-batches",
                                        "20",       "--quiet",    "--kvstore",
                                        "device",   "--contexts", "cpu(0),cpu(1)"};
  auto imperative = run(train_path, common, {}, 120s);
  auto with_hybrid = common;
  with_hybrid.push_back("--hybridize");
  auto hybridized = run(train_path, with_hybrid, {}, 120s);
  BOOST_TEST_REQUIRE(imperative.exit_code == 0, describe(imperative));
  BOOST_TEST_REQUIRE(hybridized.exit_code == 0, describe(hybridized));
  require_same_final_metrics(imperative, hybridized);
}

// Two model-parallel stages run the same operators in the same order as one context, so with the
// whole batch (one micro-batch) they print the same metrics; four micro-batches add the parts'
// gradients up in another order (float rounding), and a dist_sync job of two workers runs the
// pipeline in each.
BOOST_AUTO_TEST_CASE(a_two_stage_pipeline_trains_as_one_context_does,
                     *boost::unit_test::precondition(fashion_mnist_present)) {
  const std::vector<std::string> common{"--epochs", "1", "--max-batches", "20", "--quiet"};
  auto with = [&](std::vector<std::string> extra) {
    extra.insert(extra.begin(), common.begin(), common.end());
    return run(train_path, extra, {}, 120s);
  };
  auto one_context = with({});
  auto whole = with({"--model-parallel", "cpu(0),cpu(1)"});
  auto parts = with({"--model-parallel", "cpu(0),cpu(1)", "--micro-batches", "4"});
  for (const auto* result : {&one_context, &whole, &parts})
    BOOST_TEST_REQUIRE(result->exit_code == 0, describe(*result));
  require_same_final_metrics(one_context, whole);
  BOOST_TEST(std::abs(final_field(one_context.out, "final_test_acc").value_or(-1) -
                      final_field(parts.out, "final_test_acc").value_or(-100)) < 1.0,
             one_context.out << "\n"
                             << parts.out);
  BOOST_TEST(final_field(parts.out, "micro_batches").value_or(0) == 4, parts.out);

  auto job = launch_short_training(
      2, {},
      {"--kvstore", "dist_sync", "--model-parallel", "cpu(0),cpu(1)", "--micro-batches", "2"});
  BOOST_TEST_REQUIRE(job.exit_code == 0, describe(job));
  BOOST_TEST(final_field(job.out, "stages").value_or(0) == 2, job.out);
}

// 1023 samples over 2 workers: part 0 holds 512 (8 batches of 64), part 1 511 (7 batches). A
// worker that ran its 8th batch would push into a sync round nobody else joins (MXNet hangs there,
// apache/mxnet#7888; troupe's store would time out). Every worker runs common_batch_count = 7
// steps, so the job ends, twice over (two epochs), well inside the bound.
BOOST_AUTO_TEST_CASE(dist_sync_workers_with_unequal_parts_finish_without_waiting_on_each_other,
                     *boost::unit_test::precondition(fashion_mnist_present)) {
  auto result = run(launch_path,
                    {"-n", "2", "-s", "1", "--node-binary", node_path, "--", train_path,
                     "--kvstore", "dist_sync", "--train-limit", "1023", "--batch-size", "64",
                     "--epochs", "2", "--no-progress"},
                    {}, 120s);
  BOOST_TEST_REQUIRE(!result.timed_out, describe(result));
  BOOST_TEST_REQUIRE(result.exit_code == 0, describe(result));
  BOOST_TEST(result.out.find("step batch 128, 7 steps per epoch over 1023 training samples") !=
                 std::string::npos,
             result.out);
  BOOST_TEST(with_prefix(result.out, "[worker 0] epoch ").size() == 2u, result.out);
  BOOST_TEST(final_field(result.out, "workers").value_or(0) == 2.0, result.out);
  BOOST_TEST(result.err.find("timeout") == std::string::npos, result.err);
}

// 3 workers in dist_sync whose rounds close with 2 of them (--quorum given to the workers, which
// pass it to their stores; rank 0 announces it to the servers) while worker 2 sleeps in every
// step: the laggard's late pushes are dropped and the job still ends, every round having reached
// its quorum.
BOOST_AUTO_TEST_CASE(dist_sync_workers_with_a_quorum_of_2_of_3_and_a_slow_worker_finish,
                     *boost::unit_test::precondition(fashion_mnist_present)) {
  auto result = launch_short_training(
      3, {"--env", "PS_VERBOSE=1"},
      {"--kvstore", "dist_sync", "--quorum", "2", "--slow-worker", "2:10ms", "--timeout", "20s"});
  BOOST_TEST_REQUIRE(!result.timed_out, describe(result));
  BOOST_TEST_REQUIRE(result.exit_code == 0, describe(result));
  BOOST_TEST(result.out.find("20 steps per epoch over 6000 training samples, quorum 2, worker 2 "
                             "sleeps 10ms per step") != std::string::npos,
             result.out);
  BOOST_TEST(final_field(result.out, "workers").value_or(0) == 3.0, result.out);
  // The servers' shards heard the quorum from rank 0, and the server logs its counters at the end.
  BOOST_TEST(result.err.find("dist_sync, quorum 2 of 3") != std::string::npos, result.err);
  BOOST_TEST(count_lines(result.err, "[server 0]", "late pushes dropped") == 1u, result.err);
}

BOOST_AUTO_TEST_CASE(dist_async_workers_with_a_staleness_bound_of_1_finish,
                     *boost::unit_test::precondition(fashion_mnist_present)) {
  auto result = launch_short_training(2, {}, {"--kvstore", "dist_async", "--max-staleness", "1"});
  BOOST_TEST_REQUIRE(!result.timed_out, describe(result));
  BOOST_TEST_REQUIRE(result.exit_code == 0, describe(result));
  BOOST_TEST(result.out.find("training samples, max staleness 1") != std::string::npos, result.out);
  BOOST_TEST(final_field(result.out, "final_test_acc").value_or(0) > 10.0, result.out);
}

// The per-worker throughput, gathered at each epoch's barrier: rank 0's CSV has a rate column per
// worker, its plot a panel with a series per worker, its final line the last epoch's rates.
// Overlap changes when each request is waited for, never a value. With device actors (the
// default) the trainer starts each key as backward writes its gradient and leaves the pulls under
// way when step() returns; with TROUPE_ENGINE_TYPE=naive it waits for every pull in step(). The
// two jobs (2 workers, keys cut into slices of 64 KiB, momentum) save the same bytes. Two workers,
// because a server adds the pushes of a round in the order they arrive, and a sum of two floats
// is the same in either order (of three it need not be).
BOOST_AUTO_TEST_CASE(overlapped_steps_save_the_same_parameters_as_waiting_steps,
                     *boost::unit_test::precondition(fashion_mnist_present)) {
  temp_dir dir;
  const auto overlapped = (dir.path() / "overlapped.params").string();
  const auto waiting = (dir.path() / "waiting.params").string();
  const std::vector<std::string> recipe{"--kvstore", "dist_sync",     "--momentum",
                                        "0.9",       "--slice-bytes", "65536"};
  auto with = [&](std::vector<std::string> args, const std::string& path) {
    args.insert(args.begin(), recipe.begin(), recipe.end());
    args.insert(args.end(), {"--save-params", path});
    return args;
  };
  auto first = launch_short_training(2, {}, with({}, overlapped));
  BOOST_TEST_REQUIRE(first.exit_code == 0, describe(first));
  auto second = launch_short_training(2, {"--env", "TROUPE_ENGINE_TYPE=naive"}, with({}, waiting));
  BOOST_TEST_REQUIRE(second.exit_code == 0, describe(second));
  const auto overlapped_bytes = read_file(overlapped);
  BOOST_TEST_REQUIRE(overlapped_bytes.size() > 200'000u * sizeof(float));
  BOOST_TEST((overlapped_bytes == read_file(waiting)), "the saved parameters differ");
}

// A third worker joins a 2-worker dist_sync job while it trains (troupe-launch --max-workers 3,
// SIGUSR2): it waits at the workers' next barrier, which takes it in, and from the next epoch on
// the three cut the training set in three. The test holds the two workers (SIGSTOP) from the end
// of epoch 1 until the scheduler has the joiner's arrival, so the joiner is taken in at the
// barrier after epoch 1 or (if both had already arrived there) after epoch 2, never later. 3000
// samples make 23 steps of 64 per epoch over 2 workers, 15 over 3.
BOOST_AUTO_TEST_CASE(
    a_worker_that_joins_while_it_trains_gets_a_part_of_the_data_from_the_next_epoch,
    *boost::unit_test::precondition(fashion_mnist_present)) {
  child_process launcher{launch_path,
                         {"-n",
                          "2",
                          "-s",
                          "1",
                          "--max-workers",
                          "3",
                          "--env",
                          "PS_VERBOSE=1",
                          "--node-binary",
                          node_path,
                          "--",
                          train_path,
                          "--kvstore",
                          "dist_sync",
                          "--train-limit",
                          "3000",
                          "--batch-size",
                          "64",
                          "--epochs",
                          "3",
                          "--no-progress"},
                         {{"PS_VERBOSE", "1"}}};
  std::vector<pid_t> workers;
  for (const char* label : {"started worker 0 (pid ", "started worker 1 (pid "}) {
    BOOST_TEST_REQUIRE(launcher.await_output(1, label, 60s), launcher.output_so_far(1));
    const auto& err = launcher.output_so_far(1);
    workers.push_back(std::stoi(err.substr(err.find(label) + std::string_view{label}.size())));
  }
  BOOST_TEST_REQUIRE(launcher.await_output(0, "[worker 0] epoch 1 ", 120s),
                     launcher.output_so_far(0));
  for (const pid_t pid : workers)
    BOOST_TEST_REQUIRE(::kill(pid, SIGSTOP) == 0);
  BOOST_TEST_REQUIRE(::kill(launcher.pid(), SIGUSR2) == 0);
  const bool arrived = launcher.await_output(
      1, "worker 2 (node 13) waits to join at the workers' next barrier", 60s);
  for (const pid_t pid : workers)
    ::kill(pid, SIGCONT);
  BOOST_TEST_REQUIRE(arrived, launcher.output_so_far(1));
  const auto result = launcher.wait(180s);
  BOOST_TEST_REQUIRE(!result.timed_out, describe(result));
  BOOST_TEST_REQUIRE(result.exit_code == 0, describe(result));
  const bool after_epoch_1 =
      result.out.find("epoch 2: 3 workers (ranks 0,1,2) share the training set, 15 steps each") !=
      std::string::npos;
  const bool after_epoch_2 =
      result.out.find("epoch 3: 3 workers (ranks 0,1,2) share the training set, 15 steps each") !=
      std::string::npos;
  BOOST_TEST(after_epoch_1 != after_epoch_2, result.out);
  BOOST_TEST(count_lines(result.out, after_epoch_1
                                         ? "[worker 2] joined the running job after epoch 1"
                                         : "[worker 2] joined the running job after epoch 2") == 1u,
             result.out);
  BOOST_TEST(count_lines(result.err, "joined: worker 2 (node 13)") == 1u, result.err);
  BOOST_TEST(with_prefix(result.out, "[worker 0] epoch ").size() >= 3u, result.out);
}

// Three workers; worker 2 leaves after epoch 1 (--leave-after-epoch 2:1): it says so at the
// barrier ending epoch 1, and from epoch 2 on the other two cut the training set in two (23 steps
// of 64 each over 3000 samples instead of 15). The job exits 0.
BOOST_AUTO_TEST_CASE(a_worker_that_leaves_after_an_epoch_hands_its_part_of_the_data_to_the_others,
                     *boost::unit_test::precondition(fashion_mnist_present)) {
  auto result = run(launch_path,
                    {"-n", "3", "-s", "1", "--node-binary", node_path, "--", train_path,
                     "--kvstore", "dist_sync", "--train-limit", "3000", "--batch-size", "64",
                     "--epochs", "3", "--leave-after-epoch", "2:1", "--no-progress"},
                    {}, 180s);
  BOOST_TEST_REQUIRE(!result.timed_out, describe(result));
  BOOST_TEST_REQUIRE(result.exit_code == 0, describe(result));
  BOOST_TEST(result.out.find("15 steps per epoch over 3000 training samples") != std::string::npos,
             result.out);
  BOOST_TEST(count_lines(result.out, "[worker 2] left the job after epoch 1") == 1u, result.out);
  BOOST_TEST(count_lines(result.out, "[worker 0] epoch 2: 2 workers (ranks 0,1) share the "
                                     "training set, 23 steps each") == 1u,
             result.out);
  BOOST_TEST(with_prefix(result.out, "[worker 0] epoch 3 ").size() == 1u, result.out);
}

BOOST_AUTO_TEST_CASE(a_dist_job_reports_every_workers_throughput_in_the_csv_plot_and_final_line,
                     *boost::unit_test::precondition(fashion_mnist_present)) {
  temp_dir dir;
  const auto csv = (dir.path() / "run.csv").string();
  const auto svg = (dir.path() / "run.svg").string();
  auto result =
      launch_short_training(2, {}, {"--kvstore", "dist_sync", "--csv", csv, "--plot", svg});
  BOOST_TEST_REQUIRE(!result.timed_out, describe(result));
  BOOST_TEST_REQUIRE(result.exit_code == 0, describe(result));
  std::ifstream csv_in(csv);
  std::string header, row;
  BOOST_TEST_REQUIRE(static_cast<bool>(std::getline(csv_in, header)));
  BOOST_TEST(header.ends_with(",samples,worker0_samples_per_s,worker1_samples_per_s"), header);
  int rows = 0;
  while (std::getline(csv_in, row)) {
    ++rows;
    std::vector<std::string> cells;
    std::istringstream fields(row);
    for (std::string cell; std::getline(fields, cell, ',');)
      cells.push_back(cell);
    BOOST_TEST_REQUIRE(cells.size() == 10u, row);
    BOOST_TEST(std::stod(cells[8]) > 0.0, row);
    BOOST_TEST(std::stod(cells[9]) > 0.0, row);
  }
  BOOST_TEST(rows == 1);
  std::ifstream svg_in(svg);
  const std::string plot{std::istreambuf_iterator<char>(svg_in), std::istreambuf_iterator<char>()};
  BOOST_TEST(plot.find("throughput per worker") != std::string::npos);
  BOOST_TEST(plot.find("worker 0 epoch 1:") != std::string::npos);
  BOOST_TEST(plot.find("worker 1 epoch 1:") != std::string::npos);
  BOOST_TEST(result.out.find("\"worker_samples_per_s\":[") != std::string::npos, result.out);
}

BOOST_AUTO_TEST_CASE(bad_slow_worker_and_cluster_flags_exit_2_naming_the_flag) {
  for (const auto& [value, says] : std::vector<std::pair<std::string, std::string>>{
           {"2", "expected RANK:DURATION"},
           {"x:5ms", "'x' is not a worker rank"},
           {"-1:5ms", "'-1' is not a worker rank"},
           {"1:fast", "\"fast\" is not a duration"},
           {"1:0ms", "the duration must be positive"},
           {"1:5ms", "the job has 1 worker(s), ranks 0 to 0"}}) {
    auto bad = run(train_path, {"--slow-worker", value, "--max-batches", "1"}, {}, 30s);
    BOOST_TEST(bad.exit_code == 2, value << ": " << describe(bad));
    BOOST_TEST(lines_of(bad.err).size() == 1u, bad.err);
    BOOST_TEST(bad.err.find("train_mnist: --slow-worker " + value + ": " + says) !=
                   std::string::npos,
               bad.err);
  }
  for (const auto& [value, says] : std::vector<std::pair<std::string, std::string>>{
           {"2", "'2' is not RANK:EPOCH"},
           {"2:0", "'2:0' is not RANK:EPOCH"},
           {"0:1", "worker 0 evaluates and writes the outputs: it cannot leave"},
           {"1:1,1:2", "worker 1 is named twice"},
           {"5:1", "the job has room for 3 worker(s), ranks 0 to 2"}}) {
    auto bad =
        run(train_path, {"--kvstore", "dist_sync", "--leave-after-epoch", value},
            {{"DMLC_NUM_WORKER", "3"}, {"DMLC_NUM_SERVER", "1"}, {"DMLC_PS_ROOT_PORT", "9"}}, 30s);
    BOOST_TEST(bad.exit_code == 2, value << ": " << describe(bad));
    BOOST_TEST(bad.err.find("train_mnist: --leave-after-epoch " + value + ": " + says) !=
                   std::string::npos,
               bad.err);
  }
  auto local = run(train_path, {"--quorum", "2"}, {}, 30s);
  BOOST_TEST(local.exit_code == 2, describe(local));
  BOOST_TEST(local.err.find("--quorum: cluster flags apply to --kvstore dist_* only") !=
                 std::string::npos,
             local.err);
  // Checked against the job's size before joining it.
  auto too_many =
      run(train_path, {"--kvstore", "dist_sync", "--quorum", "4"}, {{"DMLC_NUM_WORKER", "3"}}, 30s);
  BOOST_TEST(too_many.exit_code == 2, describe(too_many));
  BOOST_TEST(too_many.err.find("--quorum (4) must not exceed DMLC_NUM_WORKER (3)") !=
                 std::string::npos,
             too_many.err);
}

// A bad DMLC_* value is a usage error like a bad flag, whatever the store: the environment says
// what the process is (DMLC_ROLE) before the store is chosen. None of these runs gets as far as
// the data.
BOOST_AUTO_TEST_CASE(bad_dmlc_values_exit_2_with_one_line_naming_the_variable) {
  const std::vector<std::pair<std::string, std::string>> bad{
      {"DMLC_NUM_WORKER", "abc"},        {"DMLC_ROLE", "foo"},           {"DMLC_NUM_SERVER", "0"},
      {"DMLC_PS_ROOT_PORT", "http"},     {"DMLC_PS_ROOT_URI", "a host"}, {"DMLC_NODE_HOST", "a\tb"},
      {"DMLC_INTERFACE", "troupe-nope0"}};
  for (const std::string store : {"local", "dist_sync"})
    for (const auto& [variable, value] : bad) {
      auto result = run(train_path, {"--kvstore", store, "--max-batches", "1", "--epochs", "1"},
                        {{variable, value}}, 30s);
      BOOST_TEST(result.exit_code == 2, store << " " << variable << ": " << describe(result));
      BOOST_TEST(lines_of(result.err).size() == 1u, result.err);
      BOOST_TEST(result.err.starts_with("train_mnist: " + variable), result.err);
    }
  // A worker of a dist_* store that lacks a value, or cannot reach port 0, says which, before it
  // tries to join.
  const std::map<std::string, std::string> job{
      {"DMLC_NUM_WORKER", "1"}, {"DMLC_NUM_SERVER", "1"}, {"DMLC_PS_ROOT_PORT", "0"}};
  auto port0 = run(train_path, {"--kvstore", "dist_sync"}, job, 30s);
  BOOST_TEST(port0.exit_code == 2, describe(port0));
  BOOST_TEST(lines_of(port0.err).size() == 1u, port0.err);
  BOOST_TEST(port0.err.starts_with("train_mnist: a worker cannot reach a scheduler on port 0: "
                                   "DMLC_PS_ROOT_PORT"),
             port0.err);
  auto missing = run(train_path, {"--kvstore", "dist_sync"}, {{"DMLC_NUM_WORKER", "1"}}, 30s);
  BOOST_TEST(missing.exit_code == 2, describe(missing));
  BOOST_TEST(missing.err == "train_mnist: a worker needs DMLC_PS_ROOT_PORT ([scheduler] port or "
                            "--scheduler-port) and DMLC_NUM_SERVER ([job] num_servers or "
                            "--num-servers)\n",
             missing.err);
  // A scheduler or server role that cannot serve exits 2 as well (serve_if_node_role).
  auto server = run(train_path, {}, {{"DMLC_ROLE", "server"}, {"DMLC_NUM_WORKER", "abc"}}, 30s);
  BOOST_TEST(server.exit_code == 2, describe(server));
  BOOST_TEST(lines_of(server.err).size() == 1u, server.err);
  BOOST_TEST(server.err.find("DMLC_NUM_WORKER must be a positive integer, got \"abc\"") !=
                 std::string::npos,
             server.err);
}

// A chunk size wire::chunker would refuse is refused with the configuration (exit 2), not at the
// first tensor that needs chunking.
BOOST_AUTO_TEST_CASE(a_chunk_size_the_chunker_refuses_exits_2_naming_the_flag) {
  auto result =
      run(train_path, {"--kvstore", "dist_sync", "--chunk-bytes", "4100"},
          {{"DMLC_NUM_WORKER", "1"}, {"DMLC_NUM_SERVER", "1"}, {"DMLC_PS_ROOT_PORT", "1"}}, 30s);
  BOOST_TEST(result.exit_code == 2, describe(result));
  BOOST_TEST(lines_of(result.err).size() == 1u, result.err);
  BOOST_TEST(result.err.starts_with("train_mnist: --chunk-bytes must be a size in bytes that "
                                    "wire::chunker accepts: a multiple of 8"),
             result.err);
}

BOOST_AUTO_TEST_CASE(bad_flags_exit_2_with_one_line_naming_them) {
  auto unknown = run(train_path, {"--no-such-flag"}, {}, 30s);
  BOOST_TEST(unknown.exit_code == 2, describe(unknown));
  auto context = run(train_path, {"--contexts", "cpu(0),tpu(1)"}, {}, 30s);
  BOOST_TEST(context.exit_code == 2, describe(context));
  BOOST_TEST(context.err.find("'tpu(1)' is not a context") != std::string::npos, context.err);
  auto momentum = run(train_path, {"--optimizer", "adam", "--momentum", "0.9"}, {}, 30s);
  BOOST_TEST(momentum.exit_code == 2, describe(momentum));
  auto parts = run(train_path, {"--micro-batches", "4"}, {}, 30s);
  BOOST_TEST(parts.exit_code == 2, describe(parts));
  BOOST_TEST(parts.err.find("--micro-batches needs --model-parallel") != std::string::npos,
             parts.err);
  for (const auto& [flags, wanted] :
       {std::pair{std::vector<std::string>{"--gradient-compression", "2bit"},
                  "--gradient-compression compresses what a dist_* store pushes"},
        std::pair{std::vector<std::string>{"--compression-threshold", "0.5"},
                  "--compression-threshold needs --gradient-compression"},
        std::pair{std::vector<std::string>{"--kvstore", "dist_sync", "--scheduler-port", "1",
                                           "--num-workers", "1", "--num-servers", "1",
                                           "--gradient-compression", "2bit",
                                           "--compression-threshold", "0"},
                  "threshold 0 must be finite and > 0"}}) {
    auto compression = run(train_path, flags, {}, 30s);
    BOOST_TEST(compression.exit_code == 2, describe(compression));
    BOOST_TEST(compression.err.find(wanted) != std::string::npos, compression.err);
  }
  auto both = run(train_path, {"--model-parallel", "cpu(0),cpu(1)", "--contexts", "cpu(0),cpu(1)"},
                  {}, 30s);
  BOOST_TEST(both.exit_code == 2, describe(both));
  BOOST_TEST(both.err.find("--model-parallel and --contexts") != std::string::npos, both.err);
  // Plain bounds: CLI11's own check of a positive number prints the largest double in 309 digits.
  for (const auto& [flag, value, wanted] :
       {std::tuple{"--lr", "-0.1", "--lr: -0.1 is not a positive number"},
        std::tuple{"--lr", "nan", "--lr: nan is not a positive number"},
        std::tuple{"--wd", "-1", "--wd: -1 is not a number of at least 0"}}) {
    auto bad = run(train_path, {flag, value}, {}, 30s);
    BOOST_TEST(bad.exit_code == 2, describe(bad));
    BOOST_TEST(bad.err.find(wanted) != std::string::npos, bad.err);
    BOOST_TEST(bad.err.size() < 200u, bad.err);
  }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(training_report)

BOOST_AUTO_TEST_CASE(the_epoch_line_has_the_issue_s_fields_in_order) {
  report::epoch_metrics m;
  m.epoch = 3;
  m.train_loss = 0.41;
  m.train_acc = 85.2;
  m.test_acc = 84.9;
  m.samples_per_s = 41000;
  m.time_s = 1.6;
  BOOST_TEST(report::epoch_line(m) == "epoch 3 train_loss 0.4100 train_acc 85.20 test_acc 84.90 "
                                      "samples_per_s 41000 time_s 1.60");
  m.test_acc.reset();
  BOOST_TEST(report::epoch_line(m) ==
             "epoch 3 train_loss 0.4100 train_acc 85.20 samples_per_s 41000 time_s 1.60");
}

// run_train_bench.sh and the tests above read this line; its keys, their order and the compact
// form are what they rely on.
BOOST_AUTO_TEST_CASE(the_final_line_is_compact_json_with_its_keys_in_order) {
  std::vector<report::epoch_metrics> epochs(2);
  epochs[0].epoch = 1;
  epochs[0].time_s = 1.25;
  epochs[0].samples = 60000;
  epochs[1].epoch = 2;
  epochs[1].time_s = 1.5;
  epochs[1].samples = 60000;
  epochs[1].train_loss = 0.412345678;
  epochs[1].test_acc = 84.9;
  report::run_summary run;
  run.epochs = 2;
  run.model = "mlp";
  run.kvstore = "dist_sync";
  run.workers = 2;
  run.batch_size = 64;
  run.step_batch = 128;
  run.job_time_s = 4.0;
  run.parameters = 203530;
  BOOST_TEST(
      report::final_line(epochs, run) ==
      R"({"final_test_acc":84.9,"final_train_loss":0.412346,"samples_per_s":43636.4,)"
      R"("time_s":2.75,"epochs":2,"model":"mlp","kvstore":"dist_sync","gradient_compression":"none",)"
      R"("workers":2,)"
      R"("batch_size":64,"step_batch":128,"contexts":1,"stages":1,"micro_batches":1,)"
      R"("threads":1,"hybridize":false,)"
      R"("job_time_s":4.0,"job_samples_per_s":30000.0,"parameters":203530})");
  epochs[1].test_acc.reset(); // a worker that did not evaluate
  BOOST_TEST(report::final_line(epochs, run).starts_with(R"({"final_test_acc":null,)"));
}

BOOST_AUTO_TEST_CASE(the_csv_leaves_an_absent_test_accuracy_empty) {
  std::vector<report::epoch_metrics> epochs(2);
  epochs[0].epoch = 1;
  epochs[0].test_acc = 80;
  epochs[1].epoch = 2;
  auto rows = lines_of(report::csv_text(epochs));
  BOOST_TEST_REQUIRE(rows.size() == 3u);
  BOOST_TEST(rows[1].starts_with("1,0.000000,0.0000,80.0000,"));
  BOOST_TEST(rows[2].starts_with("2,0.000000,0.0000,,"));
}

BOOST_AUTO_TEST_CASE(nice_ticks_cover_the_range_in_round_steps) {
  auto ticks = report::nice_ticks(0.38, 0.72, 6);
  BOOST_TEST_REQUIRE(ticks.size() >= 2u);
  BOOST_TEST(ticks.front() <= 0.38);
  BOOST_TEST(ticks.back() >= 0.72);
  BOOST_TEST(ticks.size() <= 8u);
  // One value: the range is widened rather than divided by zero.
  auto single = report::nice_ticks(80, 80, 6);
  BOOST_TEST(single.size() >= 2u);
  BOOST_TEST(single.front() <= 80);
  BOOST_TEST(single.back() >= 80);
}

BOOST_AUTO_TEST_CASE(the_svg_is_one_document_even_without_epochs) {
  auto empty = report::svg_plot({}, "nothing <yet>");
  BOOST_TEST(empty.starts_with("<svg "));
  BOOST_TEST(empty.ends_with("</svg>\n"));
  BOOST_TEST(empty.find("nothing &lt;yet&gt;") != std::string::npos);
  std::vector<report::epoch_metrics> epochs(3);
  for (int i = 0; i < 3; ++i) {
    epochs[i].epoch = i + 1;
    epochs[i].train_loss = 0.7 - 0.1 * i;
    epochs[i].train_acc = 75 + 4 * i;
    epochs[i].test_acc = 78 + 3 * i;
  }
  auto svg = report::svg_plot(epochs, "run");
  // Three markers per accuracy series and for the loss, each with its tooltip.
  std::size_t markers = 0;
  for (auto at = svg.find("<circle"); at != std::string::npos; at = svg.find("<circle", at + 1))
    ++markers;
  BOOST_TEST(markers == 9u);
  BOOST_TEST(svg.find("test accuracy epoch 3: 84") != std::string::npos);
}

BOOST_AUTO_TEST_SUITE_END()
