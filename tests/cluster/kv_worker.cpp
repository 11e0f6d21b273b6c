// kv_worker: a worker program for the multi-process tests, started by troupe-launch (or by a test
// with the DMLC_* environment). Like any troupe program it first calls serve_if_node_role, so
// that with DMLC_ROLE=scheduler or server it is that node (and exits with its code); it takes the
// cluster flags (--quorum, --timeout, ...) and passes them to its store. As a worker it creates a
// dist KVStore and checks MXNet's closed forms:
//
//   kv_worker --check sync     keys initialised to ones, `test` optimizer with rescale_grad 2, rank
//                              r pushes ones*(r+1): after round i every pull is n(n+1)(i+1) + 1;
//                              with --absent A, rank A is no kv_worker (a test's own node, which
//                              never pushes; the job's quorum lets rounds close without it), and
//                              the sum leaves its pushes out: 2 (i+1) sum_{r != A} (r+1) + 1
//   kv_worker --check async    each worker pushes ones*(r+1) M times, then a barrier: the value is
//                              1 + 2 M n(n+1)/2 exactly; with --round-ms T, each round also
//                              pulls every key and sleeps T ms
//   kv_worker --check replace  no optimizer: after each round the value is the round's sum
//   kv_worker --check hang     push and pull until an error (for the failure tests), then make one
//                              more call: both errors go to stderr
//   kv_worker --check flood --stall-ms T
//                              dist_sync, 2 workers: rank 0 issues M pushes at once (push_async,
//                              no pull in between) while rank 1 sleeps T ms before pushing its M
//                              rounds one by one; then both pull 1 + 2 M (1 + 2): the servers hold
//                              at most max_rounds_ahead rounds of rank 0's pushes meanwhile
//   kv_worker --check quorum --victim V
//                              dist_async with a quorum below the number of workers: rank V
//                              pushes and pulls until it is killed; every other rank r pushes
//                              ones*(r+1) M times, then a barrier (which completes once rank V is
//                              lost): the value is 1 + 2 (M sum_{r != V} (r+1) + k (V+1)) for
//                              some k >= 0 pushes of the victim
//   kv_worker --check uneven --rounds-of-rank 5,8,11 [--barrier-after B]
//                              dist_sync, `test` optimizer with rescale_grad 2: rank r pushes
//                              ones*(r+1) and pulls for its own number of rounds R_r, then calls
//                              kv.leave() and checks that a later call fails naming the leave.
//                              After round i every pull is 1 + 2 sum_{j <= i} sum_{r': R_r' > j}
//                              (r'+1): MXNet's closed form with the workers still in each round.
//                              With --barrier-after B, each rank with R_r > B calls kv.barrier()
//                              after round B, which the ranks that left do not hold up
//   kv_worker --check elastic --first-round-of-rank 0,0,3,6 --rounds-of-rank 9,9,12,12
//             [--barrier-after B]
//                              dist_sync with workers joining the running job (job.max_workers):
//                              rank r is in rounds [F_r, R_r), pushing ones*(r+1) and pulling;
//                              before a round t that some rank joins at, every rank in the job
//                              writes $KV_WORKER_DIR/want-t (for the test to start the joiner)
//                              and waits until kv.num_workers() counts it. A joiner checks that
//                              its first pull is the value after round F_r - 1. After round i
//                              every pull is 1 + 2 sum_{j <= i} sum_{r: F_r <= j < R_r} (r+1);
//                              each rank leaves after its last round as in --check uneven, and
//                              with --barrier-after B the ranks in the job call kv.barrier()
//                              after round B (a joiner's barriers are in step with the others')
//   kv_worker --check recover --round-ms T
//                              dist_sync, sgd with momentum: rank r pushes gradients of
//                              non-integral values that depend on the key, the round and r, pulls
//                              every key each round and sleeps T ms; after the last round it
//                              writes the bytes of every key's final value to
//                              $KV_WORKER_DIR/final-rank-R, so that a test compares a job whose
//                              server was killed and recovered with one that ran without fault,
//                              bit for bit; with --round-log it prints when each round's pulls
//                              are in (for scripts/recovery_time.sh)
//
// --pause-before-rounds T1,T2,... (--check sync, async and recover): before pushing round T, every
// rank writes $KV_WORKER_DIR/want-T-rank-R and waits (up to 120 s) for $KV_WORKER_DIR/go-T, so
// that a test acts on the job (a server joins or leaves) with every key at a round boundary.
//
// With $KV_WORKER_DIR set, every rank writes its pid to $KV_WORKER_DIR/rank-R once its keys are
// initialised, so a test can find (and kill) the process of a rank while the job runs.
// Exit 0 when every check holds, 1 with the first failure on stderr.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>
#include <unistd.h>
#include <vector>

#include "actors/config/config.hpp"
#include "actors/dist_job.hpp"
#include "actors/kvstore/kvstore.hpp"
#include "tests/poll.hpp"

using namespace troupe;

namespace {

std::vector<shape_vector> parse_shapes(const std::string& text) {
  std::vector<shape_vector> shapes;
  std::stringstream list{text};
  std::string item;
  while (std::getline(list, item, ',')) {
    shape_vector shape;
    std::stringstream dims{item};
    std::string dim;
    while (std::getline(dims, dim, 'x'))
      shape.push_back(std::stoll(dim));
    shapes.push_back(shape);
  }
  return shapes;
}

int failed(const std::string& what) {
  std::cerr << "kv_worker: " << what << "\n";
  return 1;
}

/// The first element of `array` that is not `expected`, described, or empty.
std::string mismatch(const ndarray& array, double expected) {
  auto values = array.to_vector<double>();
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i] != expected)
      return "element " + std::to_string(i) + " is " + std::to_string(values[i]) + ", expected " +
             std::to_string(expected);
  return {};
}

} // namespace

int main(int argc, char** argv) {
  if (auto served = serve_if_node_role(argc, argv))
    return *served;
  CLI::App app{"troupe multi-process test worker"};
  std::string type = "dist_sync", check = "sync", shapes_text = "2x3", dtype_name = "float32";
  int rounds = 3;
  app.add_option("--type", type);
  int victim = -1;
  int absent = -1;
  app.add_option("--absent", absent, "--check sync: the rank that never pushes");
  app.add_option("--check", check)
      ->check(CLI::IsMember(
          {"sync", "async", "replace", "hang", "quorum", "flood", "recover", "uneven", "elastic"}));
  std::vector<int> first_round_of_rank;
  std::vector<int> pause_before_rounds;
  app.add_option("--pause-before-rounds", pause_before_rounds,
                 "--check sync, async, recover: before pushing each of these rounds, write "
                 "$KV_WORKER_DIR/want-T-rank-R and wait for $KV_WORKER_DIR/go-T")
      ->delimiter(',');
  app.add_option("--first-round-of-rank", first_round_of_rank,
                 "--check elastic: the round each rank joins at (0: one of the first workers)")
      ->delimiter(',');
  std::vector<int> rounds_of_rank;
  app.add_option("--rounds-of-rank", rounds_of_rank,
                 "--check uneven, elastic: the round each rank leaves at")
      ->delimiter(',');
  int barrier_after = -1;
  app.add_option("--barrier-after", barrier_after,
                 "--check uneven, elastic: the ranks still in call barrier() after this round");
  int stall_ms = 0;
  app.add_option("--stall-ms", stall_ms, "--check flood: how long rank 1 waits before pushing");
  app.add_option("--victim", victim, "--check quorum: the rank the test kills");
  int round_ms = 0;
  app.add_option("--round-ms", round_ms, "--check recover, async: how long each round sleeps");
  bool round_log = false;
  app.add_flag("--round-log", round_log,
               "--check recover: print when each round's pulls are in (s since the epoch)");
  app.add_option("--shapes", shapes_text, "comma-separated shapes like 2x3,1200x1200");
  app.add_option("--dtype", dtype_name)->check(CLI::IsMember({"float32", "float16"}));
  app.add_option("--rounds", rounds);
  config_overrides cluster_flags;
  add_config_flags(app, cluster_flags);
  CLI11_PARSE(app, argc, argv);
  auto type_of_values = *parse_dtype(dtype_name);
  auto shapes = parse_shapes(shapes_text);

  auto created = kvstore::create(type, cluster_flags);
  if (!created)
    return failed("create " + type + ": " + created.error().to_string());
  auto& kv = **created;
  auto rank = kv.rank();
  double n = kv.num_workers();
  if (absent >= 0 && rank == absent)
    return failed("this worker was given rank " + std::to_string(rank) +
                  ", which --absent says "
                  "is not a kv_worker's");
  // What the workers that push add to a key each round, before the optimizer's rescale_grad 2.
  const double pushed_per_round = n * (n + 1) / 2 - (absent >= 0 ? absent + 1 : 0);

  std::vector<kv_key> keys;
  std::vector<ndarray> initial;
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    keys.push_back(static_cast<std::int64_t>(k * 3 + 1));
    initial.push_back(ndarray::ones(shapes[k], context::cpu(), type_of_values));
  }
  if (auto init = kv.init(keys, initial); !init)
    return failed("init: " + init.error().to_string());
  if (check == "recover") {
    if (auto set = kv.set_optimizer("sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}}); !set)
      return failed("set_optimizer: " + set.error().to_string());
  } else if (check != "replace")
    if (auto set = kv.set_optimizer("test", {{"rescale_grad", 2.0}}); !set)
      return failed("set_optimizer: " + set.error().to_string());

  if (const char* dir = std::getenv("KV_WORKER_DIR")) {
    // Written whole, then renamed: a reader never sees a partial file.
    const std::string file = std::string{dir} + "/rank-" + std::to_string(rank);
    std::ofstream(file + ".tmp") << ::getpid() << "\n";
    std::rename((file + ".tmp").c_str(), file.c_str());
  }

  if (check == "hang" || (check == "quorum" && rank == victim)) {
    for (std::uint64_t i = 0;; ++i) {
      // hang: ones; the quorum victim: ones*(r+1), like its pushes had it lived.
      auto grad = ndarray::full(shapes[0], check == "quorum" ? rank + 1.0 : 1.0, context::cpu(),
                                type_of_values);
      auto out = ndarray::zeros(shapes[0], context::cpu(), type_of_values);
      // After the first failure, one more call: it must fail the same way, at once.
      auto then = [&] {
        const auto again = kv.pull(keys[0], out);
        return again ? std::string{"then: ok"} : "then: " + again.error().to_string();
      };
      if (auto pushed = kv.push(keys[0], grad); !pushed)
        return failed("push: " + pushed.error().to_string() + "; " + then());
      if (auto pulled = kv.pull(keys[0], out); !pulled)
        return failed("pull: " + pulled.error().to_string() + "; " + then());
      std::this_thread::sleep_for(std::chrono::milliseconds{20});
    }
  }

  // --pause-before-rounds: what went wrong, if anything.
  auto pause_before = [&](int round) -> std::string {
    if (std::find(pause_before_rounds.begin(), pause_before_rounds.end(), round) ==
        pause_before_rounds.end())
      return {};
    const char* dir = std::getenv("KV_WORKER_DIR");
    if (dir == nullptr)
      return "--pause-before-rounds needs KV_WORKER_DIR";
    const std::string file =
        std::string{dir} + "/want-" + std::to_string(round) + "-rank-" + std::to_string(rank);
    std::ofstream(file + ".tmp") << round << "\n";
    std::rename((file + ".tmp").c_str(), file.c_str());
    const std::string go = std::string{dir} + "/go-" + std::to_string(round);
    if (!troupe::testing::poll_until([&] { return std::ifstream(go).good(); },
                                     std::chrono::seconds{120}))
      return "no " + go + " within 120 s";
    return {};
  };

  if (check == "recover") {
    std::vector<ndarray> outs;
    for (const auto& shape : shapes)
      outs.push_back(ndarray::zeros(shape, context::cpu(), dtype::float32));
    for (int round = 0; round < rounds; ++round) {
      if (auto wrong = pause_before(round); !wrong.empty())
        return failed(wrong);
      for (std::size_t k = 0; k < keys.size(); ++k) {
        auto grad = ndarray::empty(shapes[k], context::cpu(), dtype::float32);
        auto* values = static_cast<float*>(grad.raw_data());
        for (std::int64_t i = 0; i < grad.size(); ++i)
          values[i] = static_cast<float>(
              std::sin(0.37 * static_cast<double>(i) + 1.3 * round + 0.7 * k + rank) / 3.0);
        if (auto pushed = kv.push(keys[k], grad); !pushed)
          return failed("round " + std::to_string(round) + " push: " + pushed.error().to_string());
      }
      for (std::size_t k = 0; k < keys.size(); ++k)
        if (auto pulled = kv.pull(keys[k], outs[k]); !pulled)
          return failed("round " + std::to_string(round) + " pull: " + pulled.error().to_string());
      if (round_log) {
        const auto now = std::chrono::system_clock::now().time_since_epoch();
        std::printf("round %d pulled at %.3f\n", round, std::chrono::duration<double>(now).count());
        std::fflush(stdout);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds{round_ms});
    }
    if (const char* dir = std::getenv("KV_WORKER_DIR")) {
      std::ofstream file(std::string{dir} + "/final-rank-" + std::to_string(rank),
                         std::ios::binary);
      for (const auto& out : outs)
        file.write(static_cast<const char*>(out.raw_data()),
                   static_cast<std::streamsize>(out.nbytes()));
    }
    std::printf("kv_worker rank %d: recover ran %d rounds\n", rank, rounds);
    return 0;
  }

  // --check uneven and elastic: one round of this rank (it pushes ones*(rank+1) to every key, and
  // every pull must be `expected`), then the barrier after round --barrier-after. What went wrong.
  auto pushed_and_pulled = [&](int round, double expected) -> std::string {
    const std::string in_round = "round " + std::to_string(round);
    for (std::size_t k = 0; k < keys.size(); ++k) {
      auto grad = ndarray::full(shapes[k], rank + 1.0, context::cpu(), type_of_values);
      if (auto pushed = kv.push(keys[k], grad); !pushed)
        return in_round + " push: " + pushed.error().to_string();
    }
    for (std::size_t k = 0; k < keys.size(); ++k) {
      auto out = ndarray::zeros(shapes[k], context::cpu(), type_of_values);
      if (auto pulled = kv.pull(keys[k], out); !pulled)
        return in_round + " pull: " + pulled.error().to_string();
      if (auto wrong = mismatch(out, expected); !wrong.empty())
        return "rank " + std::to_string(rank) + " key " + to_string(keys[k]) + " " + in_round +
               ": " + wrong;
    }
    if (round == barrier_after)
      if (auto waited = kv.barrier(); !waited)
        return "barrier after " + in_round + ": " + waited.error().to_string();
    return {};
  };

  if (check == "uneven") {
    if (rounds_of_rank.size() != static_cast<std::size_t>(kv.num_workers()))
      return failed("--rounds-of-rank names " + std::to_string(rounds_of_rank.size()) +
                    " ranks; the job has " + std::to_string(kv.num_workers()));
    const int mine = rounds_of_rank[static_cast<std::size_t>(rank)];
    double expected = 1;
    for (int round = 0; round < mine; ++round) {
      for (std::size_t r = 0; r < rounds_of_rank.size(); ++r)
        if (rounds_of_rank[r] > round)
          expected += 2.0 * static_cast<double>(r + 1);
      if (auto wrong = pushed_and_pulled(round, expected); !wrong.empty())
        return failed(wrong);
    }
    if (auto left = kv.leave(); !left)
      return failed("leave: " + left.error().to_string());
    auto out = ndarray::zeros(shapes[0], context::cpu(), type_of_values);
    auto after = kv.pull(keys[0], out);
    if (after || after.error().message().find("has left the job") == std::string::npos)
      return failed("a pull after leave(): " +
                    (after ? std::string{"ok"} : after.error().to_string()));
    std::printf("kv_worker rank %d: uneven checks hold over its %d rounds\n", rank, mine);
    return 0;
  }

  if (check == "elastic") {
    const auto ranks = rounds_of_rank.size();
    if (first_round_of_rank.size() != ranks || rank < 0 || static_cast<std::size_t>(rank) >= ranks)
      return failed("--first-round-of-rank and --rounds-of-rank must name every rank, rank " +
                    std::to_string(rank) + " included");
    auto in_round = [&](std::size_t r, int round) {
      return first_round_of_rank[r] <= round && round < rounds_of_rank[r];
    };
    // The value after round `last` (1 before any round).
    auto closed_form = [&](int last) {
      double value = 1;
      for (int round = 0; round <= last; ++round)
        for (std::size_t r = 0; r < ranks; ++r)
          if (in_round(r, round))
            value += 2.0 * static_cast<double>(r + 1);
      return value;
    };
    const auto me = static_cast<std::size_t>(rank);
    const int first = first_round_of_rank[me], end = rounds_of_rank[me];
    if (first > 0)
      for (std::size_t k = 0; k < keys.size(); ++k) {
        auto out = ndarray::zeros(shapes[k], context::cpu(), type_of_values);
        if (auto pulled = kv.pull(keys[k], out); !pulled)
          return failed("first pull after joining: " + pulled.error().to_string());
        if (auto wrong = mismatch(out, closed_form(first - 1)); !wrong.empty())
          return failed("rank " + std::to_string(rank) + " key " + to_string(keys[k]) +
                        ": its first pull after joining at round " + std::to_string(first) + ": " +
                        wrong);
      }
    const char* dir = std::getenv("KV_WORKER_DIR");
    for (int round = first; round < end; ++round) {
      // A rank joins at this round: ask for it, and go on once the job counts it.
      int joining = 0, wanted = 0;
      for (std::size_t r = 0; r < ranks; ++r) {
        joining += first_round_of_rank[r] == round && round > 0;
        wanted += first_round_of_rank[r] <= round;
      }
      if (joining > 0 && round > first) {
        if (dir == nullptr)
          return failed("--check elastic needs KV_WORKER_DIR (where it asks for joiners)");
        const std::string file = std::string{dir} + "/want-" + std::to_string(round);
        const std::string temporary = file + ".rank" + std::to_string(rank);
        std::ofstream(temporary) << wanted << "\n";
        std::rename(temporary.c_str(), file.c_str());
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds{60};
        while (kv.num_workers() < wanted) {
          if (std::chrono::steady_clock::now() > deadline)
            return failed("round " + std::to_string(round) + ": the job still has " +
                          std::to_string(kv.num_workers()) + " workers, not " +
                          std::to_string(wanted) + ", after 60 s");
          std::this_thread::sleep_for(std::chrono::milliseconds{10});
        }
      }
      if (auto wrong = pushed_and_pulled(round, closed_form(round)); !wrong.empty())
        return failed(wrong);
    }
    if (auto left = kv.leave(); !left)
      return failed("leave: " + left.error().to_string());
    std::printf("kv_worker rank %d: elastic checks hold over its rounds %d..%d\n", rank, first,
                end - 1);
    return 0;
  }

  if (check == "flood") {
    // Every push of rank r adds 2 (r + 1) in each of the M rounds.
    auto grad = ndarray::full(shapes[0], rank + 1.0, context::cpu(), type_of_values);
    if (rank == 0) {
      std::vector<kv_request> pushes;
      for (int round = 0; round < rounds; ++round)
        pushes.push_back(kv.push_async(std::span{&keys[0], 1}, std::span{&grad, 1}));
      for (auto& pushed : pushes)
        if (auto done = pushed.wait(); !done)
          return failed("push: " + done.error().to_string());
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds{stall_ms});
      for (int round = 0; round < rounds; ++round)
        if (auto pushed = kv.push(keys[0], grad); !pushed)
          return failed("push: " + pushed.error().to_string());
    }
    auto out = ndarray::zeros(shapes[0], context::cpu(), type_of_values);
    if (auto pulled = kv.pull(keys[0], out); !pulled)
      return failed("pull: " + pulled.error().to_string());
    if (auto wrong = mismatch(out, 1 + 2.0 * rounds * n * (n + 1) / 2); !wrong.empty())
      return failed("rank " + std::to_string(rank) + ": " + wrong);
    std::printf("kv_worker rank %d: flood checks hold over %d rounds\n", rank, rounds);
    return 0;
  }

  for (int round = 0; round < rounds; ++round) {
    if (auto wrong = pause_before(round); !wrong.empty())
      return failed(wrong);
    for (std::size_t k = 0; k < keys.size(); ++k) {
      auto grad = ndarray::full(shapes[k], rank + 1.0, context::cpu(), type_of_values);
      if (auto pushed = kv.push(keys[k], grad); !pushed)
        return failed("push: " + pushed.error().to_string());
    }
    if (check == "async" && round_ms > 0) {
      // Paced, with pulls under way (their values depend on timing and are not checked), so
      // that a test can kill a server mid-job.
      for (std::size_t k = 0; k < keys.size(); ++k) {
        auto out = ndarray::zeros(shapes[k], context::cpu(), type_of_values);
        if (auto pulled = kv.pull(keys[k], out); !pulled)
          return failed("round " + std::to_string(round) + " pull: " + pulled.error().to_string());
      }
      std::this_thread::sleep_for(std::chrono::milliseconds{round_ms});
    }
    if (check == "async" || check == "quorum")
      continue;
    for (std::size_t k = 0; k < keys.size(); ++k) {
      auto out = ndarray::zeros(shapes[k], context::cpu(), type_of_values);
      if (auto pulled = kv.pull(keys[k], out); !pulled)
        return failed("pull: " + pulled.error().to_string());
      double expected = check == "sync" ? 2 * pushed_per_round * (round + 1) + 1 : n * (n + 1) / 2;
      if (auto wrong = mismatch(out, expected); !wrong.empty())
        return failed("rank " + std::to_string(rank) + " key " + to_string(keys[k]) + " round " +
                      std::to_string(round) + ": " + wrong);
    }
  }
  if (check == "async") {
    if (auto waited = kv.barrier(); !waited)
      return failed("barrier: " + waited.error().to_string());
    for (std::size_t k = 0; k < keys.size(); ++k) {
      auto out = ndarray::zeros(shapes[k], context::cpu(), type_of_values);
      if (auto pulled = kv.pull(keys[k], out); !pulled)
        return failed("pull: " + pulled.error().to_string());
      double expected = 1 + rounds * n * (n + 1);
      if (auto wrong = mismatch(out, expected); !wrong.empty())
        return failed("rank " + std::to_string(rank) + " key " + to_string(keys[k]) + ": " + wrong);
    }
  }
  if (check == "quorum") {
    if (victim < 0 || victim >= kv.num_workers())
      return failed("--check quorum needs --victim in [0, " + std::to_string(kv.num_workers()) +
                    ")");
    if (auto waited = kv.barrier(); !waited)
      return failed("barrier: " + waited.error().to_string());
    // Every push of rank r adds 2 (r+1) (the test optimizer's rescale_grad): the survivors' M
    // pushes each, and however many the victim made before it was killed.
    double survivors = 0;
    for (int r = 0; r < kv.num_workers(); ++r)
      survivors += r == victim ? 0 : r + 1;
    const double base = 1 + 2 * rounds * survivors;
    const double step = 2 * (victim + 1.0);
    for (std::size_t k = 0; k < keys.size(); ++k) {
      auto out = ndarray::zeros(shapes[k], context::cpu(), type_of_values);
      if (auto pulled = kv.pull(keys[k], out); !pulled)
        return failed("pull: " + pulled.error().to_string());
      const auto values = out.to_vector<double>();
      const double pushes = (values.front() - base) / step;
      if (pushes < 0 || pushes != std::floor(pushes))
        return failed("rank " + std::to_string(rank) + " key " + to_string(keys[k]) + ": " +
                      std::to_string(values.front()) + " is not " + std::to_string(base) +
                      " plus a whole number of the victim's pushes of " + std::to_string(step));
      if (auto wrong = mismatch(out, values.front()); !wrong.empty())
        return failed("rank " + std::to_string(rank) + " key " + to_string(keys[k]) + ": " + wrong);
    }
  }
  std::printf("kv_worker rank %d: %s checks hold for %zu keys over %d rounds\n", rank,
              check.c_str(), keys.size(), rounds);
  return 0;
}
