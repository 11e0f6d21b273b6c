// kvstore_demo: the KVStore at work, printing each step.
//
//   build/apps/kvstore_demo [--type local|device] [--contexts N] [--rounds R]
//   build/apps/troupe-launch -n 2 -s 1 -- build/apps/kvstore_demo --type dist_sync
//
// It initialises a key, lets N cpu contexts push ones*(d+1) for R rounds through MXNet's `test`
// optimizer (rescale_grad 2), and checks each pulled value against MXNet's closed form
// 1 + W n(n+1)(i+1) for W workers (1 in the local modes); then it trains a least-squares weight
// with SGD and momentum in a local store, saves the optimizer state, and shows that a second
// store resumes from it bit for bit. Exit status 0 when every check holds; 2 (one line) for a bad
// flag, a bad value in the environment or the cluster file (whatever the store), or a dist_sync
// worker whose configuration is incomplete; 1 when anything else fails.
//
// As every troupe program, it starts with serve_if_node_role: under a tracker that runs one
// program for every role (DMLC_ROLE=scheduler or server) it serves the job and exits with the
// node's code instead; with --type dist_sync it is a worker of that job.

#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <string>
#include <unistd.h>
#include <vector>

#include <fmt/core.h>

#include "actors/config/config.hpp"
#include "actors/dist_job.hpp"
#include "actors/kvstore/kvstore.hpp"
#include "engine/log.hpp"

using namespace troupe;

namespace {

int fail(const error& err) {
  logger{"kvstore_demo", 0}.error(err.to_string());
  return 1;
}

/// Gradient of 0.5 * |w - target|² at w.
ndarray gradient_at(const ndarray& weight, const ndarray& target) {
  return weight - target;
}

} // namespace

int main(int argc, char** argv) {
  if (auto served = serve_if_node_role(argc, argv))
    return *served;
  CLI::App app{"troupe's KVStore, step by step"};
  std::string type = "local";
  int contexts = 4;
  int rounds = 3;
  app.add_option("--type", type, "KVStore type (dist_sync: a worker of a job)")
      ->check(CLI::IsMember({"local", "device", "dist_sync"}));
  app.add_option("--contexts", contexts, "cpu contexts pushing each round")
      ->check(CLI::Range(1, 64));
  app.add_option("--rounds", rounds, "push rounds")->check(CLI::Range(1, 1000));
  if (auto done = parse_command_line(app, "kvstore_demo", argc, argv))
    return *done;
  // A bad or missing value of the configuration the store will read is a usage error. A local
  // store reads none, but a broken environment (DMLC_NUM_WORKER=abc) is a broken setup all the
  // same: the program says so rather than run as if nothing were set.
  auto config = type.starts_with("dist") ? load_worker_config(process_environment(), {})
                                         : load_config(std::nullopt, process_environment(), {});
  if (!config) {
    std::cerr << "kvstore_demo: " << config.error().message() << "\n";
    return 2;
  }

  auto created = kvstore::create(type);
  if (!created)
    return fail(created.error());
  auto& kv = **created;
  fmt::print("created kvstore '{}': rank {}, {} worker(s), optimizer capable: {}\n", kv.type(),
             kv.rank(), kv.num_workers(), kv.is_capable("optimizer"));

  // Part 1: MXNet's sync-round closed form, n contexts on each of W workers' stores.
  if (auto set = kv.set_optimizer("test", {{"rescale_grad", 2.0}}); !set)
    return fail(set.error());
  shape_vector shape{2, 3};
  if (auto init = kv.init(3, ndarray::ones(shape)); !init)
    return fail(init.error());
  std::vector<ndarray> grads;
  for (int d = 0; d < contexts; ++d)
    grads.push_back(ndarray::full(shape, d + 1.0, context::cpu(d)));
  fmt::print("key 3 initialised to ones{}; {} contexts push ones*(d+1) with optimizer 'test' "
             "(rescale_grad 2)\n",
             shape_to_string(shape), contexts);
  auto out = ndarray::zeros(shape);
  const double workers = kv.num_workers();
  bool all_hold = true;
  for (int round = 0; round < rounds; ++round) {
    if (auto pushed = kv.push(3, grads); !pushed)
      return fail(pushed.error());
    if (auto pulled = kv.pull(3, out); !pulled)
      return fail(pulled.error());
    double expected = 1.0 + workers * contexts * (contexts + 1.0) * (round + 1);
    bool holds = out.sum() == expected * static_cast<double>(out.size());
    all_hold = all_hold && holds;
    fmt::print("round {}: pulled value {} (closed form 1 + W n(n+1)(i+1) = {}) {}\n", round,
               out.to_vector<float>()[0], expected, holds ? "ok" : "MISMATCH");
  }
  std::cout << out << "\n";

  // A mistake is an error value naming what is wrong; the stored value stays.
  auto wrong = kv.push(3, ndarray::ones({3, 2}));
  fmt::print("push of shape (3,2) to key 3 -> {}\n",
             wrong ? "accepted?!" : wrong.error().to_string());
  all_hold = all_hold && !wrong;

  // Part 2: SGD with momentum in the store; save and resume the optimizer state. A worker joins
  // its job once, so this part runs on local stores.
  const std::string local_type = type == "dist_sync" ? "local" : type;
  auto target = ndarray::random_uniform(-1, 1, {4}, 42);
  auto weight = ndarray::zeros({4});
  auto trainer_store = kvstore::create(local_type).value();
  optimizer_params sgd{{"learning_rate", 0.1}, {"momentum", 0.9}};
  if (auto set = trainer_store->set_optimizer("sgd", sgd); !set)
    return fail(set.error());
  (void)trainer_store->init("w", weight);
  // One file per process: the workers of a job may share a host.
  auto states = (std::filesystem::temp_directory_path() /
                 ("troupe-kvstore-demo-" + std::to_string(::getpid()) + ".states"))
                    .string();
  ndarray weight_at_save;
  for (int step = 1; step <= 40; ++step) {
    (void)trainer_store->pushpull("w", gradient_at(weight, target), weight);
    if (step % 10 == 0)
      fmt::print("sgd step {:2}: |w - target| = {:.6f}\n", step, (weight - target).l2_norm());
    if (step == 20) {
      if (auto saved = trainer_store->save_optimizer_states(states); !saved)
        return fail(saved.error());
      weight_at_save = weight.copy();
      fmt::print("saved optimizer state to {}\n", states);
    }
  }
  auto resumed_store = kvstore::create(local_type).value();
  (void)resumed_store->set_optimizer("sgd", sgd);
  (void)resumed_store->init("w", weight_at_save);
  if (auto loaded = resumed_store->load_optimizer_states(states); !loaded)
    return fail(loaded.error());
  auto resumed = weight_at_save.copy();
  for (int step = 21; step <= 40; ++step)
    (void)resumed_store->pushpull("w", gradient_at(resumed, target), resumed);
  bool identical = resumed.to_vector<float>() == weight.to_vector<float>();
  all_hold = all_hold && identical;
  fmt::print("a second store loaded the state at step 20 and ran 20 more steps: weights {}\n",
             identical ? "bit-identical" : "DIFFER");
  std::remove(states.c_str());

  fmt::print("{}\n", all_hold ? "all checks hold" : "SOME CHECKS FAILED");
  return all_hold ? 0 : 1;
}
