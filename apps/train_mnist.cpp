// train_mnist: the Fashion-MNIST training job, gluon style: blocks, autograd, a Trainer over a
// KVStore, locally or as a worker of a distributed job.
//
//   build/apps/train_mnist --model mlp --epochs 5
//   build/apps/train_mnist --model lenet --contexts "cpu(0),cpu(1)" --hybridize --plot run.svg
//   build/apps/train_mnist --model mlp-wide --init torch --epochs 1 --max-batches 50 --quiet
//   cd build/apps && ./troupe-launch -n 2 -s 1 -- ./train_mnist --kvstore dist_sync --batch-size 64
//
// Per epoch it shows progress on stderr (a bar on a terminal, a line every few seconds
// otherwise), then prints on stdout
//
//   epoch 3 train_loss 0.4100 train_acc 85.20 test_acc 84.90 samples_per_s 41000 time_s 1.60
//
// and at the end one JSON line for scripts, {"final_test_acc":..,"final_train_loss":..,
// "samples_per_s":..,...} (report::final_line). --csv and --plot write the per-epoch metrics as
// CSV and as an SVG plot. train_loss and train_acc are over this worker's batches; samples_per_s
// counts the samples of all workers over the training loop's time (evaluation excluded). In a
// distributed job each worker's own rate (its samples over its own loop time) is gathered at the
// barrier ending each epoch (kvstore::gather_at_barrier) into the plot, the CSV and the final
// line ("worker_samples_per_s").
//
// Distributed (--kvstore dist_*): worker r of n reads part r of n of the training set (MXNet's
// part_range), and every worker runs common_batch_count steps per epoch, the number of full
// batches the smallest part holds. A worker whose part has one batch more would otherwise push
// into a sync round no other worker joins and wait forever (apache/mxnet#7888). Rank 0 alone
// evaluates the whole test set after each epoch and prints; then all workers meet in a barrier,
// which waits as long as the job's startup timeout, where a push would give up after the request
// timeout.
//
// The step batch (--step-batch, what trainer.step() is given, so the gradient is rescaled by
// 1/step_batch) defaults to the per-worker batch times the number of workers. The store sums the
// workers' gradients, so with this default n workers of batch b make the same update as one
// process with batch n·b: the benchmark recipe of 2 workers with batch 64 each and step(128)
// matches the single-process batch 128. Pass --step-batch 64 for MXNet's habit of giving each
// worker's own batch (the update is then n times larger).
//
// --model mlp-wide (784-4096-4096-10, 20M parameters, 80 MB of gradients a step) loads the links
// rather than the cores; --epochs 1 --max-batches N times a fixed number of steps, and the final
// line's samples_per_s covers them (the banner and the final line give the parameter count).
//
// The initial weights are Xavier's by default (--init xavier); --init torch draws them from
// PyTorch's default law, so that the job and bench/pytorch_mnist.py train BENCHMARKS.md's recipe
// from the same distribution, and uniform or normal pick MXNet's other initializers.
//
// Under a tracker that runs this one program for every role (DMLC_ROLE=scheduler or server), the
// process serves the job instead (serve_if_node_role) and exits with the node's code. The cluster
// flags (--quorum K, --max-staleness S, --rescale-quorum, --timeout, ...; see --help) configure
// a dist_* worker's store on top of the cluster file and the environment, and are refused with
// a local store:
//
//   troupe-launch -n 3 -s 1 --quorum 2 -- train_mnist --kvstore dist_sync --slow-worker 2:5ms
//
// runs dist_sync rounds that close with 2 of 3 workers (the launcher passes its --quorum to every
// node; given to the launcher, a worker lost within the quorum does not stop the job), while
// worker 2 sleeps 5 ms in every step after computing its gradients and before the trainer's step:
// --slow-worker RANK:DURATION is a flag for straggler experiments.
//
// Elastic jobs: a worker that joins the running job does so at the barrier ending an epoch
// (job.join_at_barrier, set here), and --leave-after-epoch RANK:EPOCH makes a worker leave after
// that barrier; at every epoch whose workers differ from the last one's, they cut the training set
// anew among themselves (follow_membership).
//
// main() runs the phases in order: flags, joining the job (dist_*), data, network and trainer,
// the epochs (train_epoch, end_epoch), the outputs. Exit status: 0 after training; 1 when the
// job fails (data, store, trainer), logged through troupe::logger ("train_mnist worker 1: ...");
// 2 for bad flags or a bad configuration (a DMLC_* or other variable of the cluster
// configuration, whatever the store; for dist_*, a value a worker lacks), with one plain line
// naming the flag or variable.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <array>
#include <charconv>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>
#include <string_view>
#include <thread>
#include <unistd.h>
#include <vector>

#include <fmt/core.h>
#include <fmt/ranges.h>

#include "actors/config/config.hpp"
#include "actors/device_actors.hpp"
#include "actors/dist_job.hpp"
#include "actors/gluon/trainer.hpp"
#include "actors/kvstore/kvstore.hpp"
#include "apps/training_report.hpp"
#include "engine/autograd.hpp"
#include "engine/blas_setup.hpp"
#include "engine/context.hpp"
#include "engine/data/idx.hpp"
#include "engine/data/loader.hpp"
#include "engine/data/split.hpp"
#include "engine/gradient_compression.hpp"
#include "engine/log.hpp"
#include "engine/lr_scheduler.hpp"
#include "engine/nd.hpp"
#include "engine/nn/block.hpp"
#include "engine/nn/initializer.hpp"
#include "engine/nn/pipeline.hpp"
#include "kernels/cpu/gemm.hpp"

using namespace troupe;

namespace {

constexpr int exit_failure = 1;
constexpr int exit_usage = 2;

/// --slow-worker: the worker of `rank` sleeps `delay` in each step; with no rank ("rotate"),
/// worker r sleeps in steps r, r + W, r + 2W... so that the straggler moves from step to step.
struct slow_worker {
  std::optional<int> rank;
  std::chrono::milliseconds delay{0};

  bool sleeps(int worker, int workers, std::int64_t step) const {
    return rank ? *rank == worker : step % workers == worker;
  }
};

struct options {
  std::string model = "mlp";
  int epochs = 5;
  std::int64_t batch_size = 128;
  double lr = 0.1;
  double momentum = 0.0;
  double wd = 0.0;
  std::string optimizer = "sgd";
  std::uint64_t seed = 0;
  std::string kvstore = "local";
  std::string update_on_kvstore; ///< "", "true" or "false"
  std::string compression_name = "none";
  std::optional<double> compression_threshold;
  bool compress_pulls = false;
  gradient_compression compression; ///< parsed by check_flags
  std::string contexts = "cpu(0)";
  std::string model_parallel;     ///< stage contexts, empty: no model parallelism
  std::int64_t micro_batches = 1; ///< parts of each batch that pipeline through the stages
  std::vector<context> stages;    ///< parsed from model_parallel by check_flags
  bool hybridize = false;
  // Xavier by default: over seeds 0-9 it reaches a median 82.2 % after one epoch against 81.0 %
  // with PyTorch's law (BENCHMARKS.md); --init torch gives the like-for-like baseline recipe.
  std::string init = "xavier";
  std::string data_dir = "/usr/share/datasets/fashion-mnist";
  std::int64_t step_batch = 0; ///< 0: batch_size × workers
  std::string csv;
  std::string plot;
  int threads = 1;
  std::string lr_scheduler = "none";
  double lr_factor = 0.1;
  std::string lr_step_epochs;
  double final_lr = 0.0;
  double warmup_epochs = 0.0;
  double warmup_begin_lr = 0.0;
  std::int64_t train_limit = 0; ///< 0: the whole training set
  std::int64_t max_batches = 0; ///< 0: every batch of the epoch
  std::string save_params;
  bool quiet = false;
  bool no_progress = false;
  bool momentum_given = false;
  std::string slow_worker_text;    ///< --slow-worker as given
  std::optional<slow_worker> slow; ///< parsed by check_flags
  std::string leave_text;          ///< --leave-after-epoch as given
  /// Parsed by check_flags: worker rank -> the epoch after whose barrier it leaves the job.
  std::map<int, int> leave_after;
  config_overrides cluster; ///< the cluster flags, for a dist_* store
  /// dist_*: the configuration the store will read (the flags over file and environment), loaded
  /// by check_flags so that a bad value is a usage error.
  std::optional<cluster_config> cluster_view;
};

/// A failure once the flags are accepted (data, store, trainer) is a diagnostic, logged; the
/// exit status is 1.
int fail(const logger& log, const std::string& what) {
  std::fflush(stdout);
  log.error(what);
  return exit_failure;
}

/// A usage error is the answer to the command line: one plain line, as CLI11's own, and exit
/// status 2.
int usage(const std::string& what) {
  std::cerr << "train_mnist: " << what << "\n";
  return exit_usage;
}

/// "cpu(0),cpu(1)" -> contexts; an error names the flag and the item that is not a context.
result<std::vector<context>> parse_contexts(const std::string& text,
                                            const std::string& flag = "--contexts") {
  std::vector<context> out;
  std::stringstream list{text};
  std::string item;
  while (std::getline(list, item, ',')) {
    item.erase(0, item.find_first_not_of(" \t"));
    item.erase(item.find_last_not_of(" \t") + 1);
    auto ctx = parse_context(item);
    if (!ctx)
      return error{errc::invalid_argument,
                   flag + ": '" + item + "' is not a context like cpu(0) or gpu(1)"};
    if (std::find(out.begin(), out.end(), *ctx) != out.end())
      return error{errc::invalid_argument, flag + ": " + item + " is listed twice"};
    out.push_back(*ctx);
  }
  if (out.empty())
    return error{errc::invalid_argument, flag + ": no context given"};
  return out;
}

/// "10,20" -> {10, 20}; an error names the item that is not a positive number.
result<std::vector<double>> parse_epoch_list(const std::string& text) {
  std::vector<double> out;
  std::stringstream list{text};
  std::string item;
  while (std::getline(list, item, ',')) {
    try {
      std::size_t used = 0;
      double value = std::stod(item, &used);
      if (used != item.size() || !(value > 0))
        throw std::invalid_argument(item);
      out.push_back(value);
    } catch (const std::exception&) {
      return error{errc::invalid_argument,
                   "--lr-step-epochs: '" + item + "' is not a positive number of epochs"};
    }
  }
  return out;
}

/// "2:5ms" -> worker 2 sleeps 5 ms per step; "rotate:5ms" -> a different worker each step; an
/// error names the flag and what is wrong.
result<slow_worker> parse_slow_worker(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return error{errc::invalid_argument, "--slow-worker " + text + ": " + why};
  };
  const auto colon = text.find(':');
  if (colon == std::string::npos)
    return bad("expected RANK:DURATION or rotate:DURATION, such as 2:5ms");
  const std::string rank_text = text.substr(0, colon);
  std::optional<int> rank;
  if (rank_text != "rotate") {
    int parsed = -1;
    const auto [end, ec] =
        std::from_chars(rank_text.data(), rank_text.data() + rank_text.size(), parsed);
    if (ec != std::errc{} || end != rank_text.data() + rank_text.size() || parsed < 0)
      return bad("'" + rank_text + "' is not a worker rank (an integer >= 0) nor rotate");
    rank = parsed;
  }
  auto delay = parse_duration(text.substr(colon + 1));
  if (!delay)
    return bad(delay.error().message());
  if (delay->count() <= 0)
    return bad("the duration must be positive");
  return slow_worker{rank, *delay};
}

/// "2:3,3:3" -> workers 2 and 3 leave after epoch 3; an error names the flag and what is wrong.
result<std::map<int, int>> parse_leave_after(const std::string& text) {
  const auto bad = [&](const std::string& why) {
    return error{errc::invalid_argument, "--leave-after-epoch " + text + ": " + why};
  };
  std::map<int, int> out;
  std::size_t at = 0;
  while (at <= text.size()) {
    const auto comma = std::min(text.find(',', at), text.size());
    const std::string item = text.substr(at, comma - at);
    const auto colon = item.find(':');
    int rank = -1, epoch = -1;
    const auto number = [](std::string_view digits, int& value) {
      const auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), value);
      return ec == std::errc{} && end == digits.data() + digits.size();
    };
    if (colon == std::string::npos || !number(std::string_view{item}.substr(0, colon), rank) ||
        !number(std::string_view{item}.substr(colon + 1), epoch) || rank < 0 || epoch < 1)
      return bad("'" + item + "' is not RANK:EPOCH (a rank >= 0, an epoch >= 1), such as 2:3");
    if (rank == 0)
      return bad("worker 0 evaluates and writes the outputs: it cannot leave");
    if (!out.emplace(rank, epoch).second)
      return bad("worker " + std::to_string(rank) + " is named twice");
    at = comma + 1;
  }
  return out;
}

/// A set as float32 [n, 784] (or [n, 1, 28, 28] for `spatial`) in [0, 1] and float32 labels,
/// keeping the first `limit` samples (0: all).
result<data::in_memory_dataset> load_set(const std::string& dir, const std::string& prefix,
                                         std::int64_t limit, bool spatial) {
  auto images = data::read_idx_images(dir + "/" + prefix + "-images-idx3-ubyte.gz");
  if (!images)
    return images.error();
  auto labels = data::read_idx_labels(dir + "/" + prefix + "-labels-idx1-ubyte.gz");
  if (!labels)
    return labels.error();
  if (static_cast<std::int64_t>(labels->size()) != images->count)
    return error{errc::corrupt_data, dir + "/" + prefix + ": " + std::to_string(images->count) +
                                         " images but " + std::to_string(labels->size()) +
                                         " labels"};
  const std::int64_t n = limit > 0 ? std::min(limit, images->count) : images->count;
  const std::int64_t pixels = images->rows * images->cols;
  shape_vector shape =
      spatial ? shape_vector{n, 1, images->rows, images->cols} : shape_vector{n, pixels};
  ndarray x{shape};
  ndarray y{{n}};
  float* xd = x.data<float>();
  float* yd = y.data<float>();
  for (std::int64_t i = 0; i < n * pixels; ++i)
    xd[i] = static_cast<float>(images->pixels[static_cast<std::size_t>(i)]) / 255.0f;
  for (std::int64_t i = 0; i < n; ++i)
    yd[i] = static_cast<float>((*labels)[static_cast<std::size_t>(i)]);
  return data::in_memory_dataset::create(std::move(x), std::move(y));
}

/// The networks. Input sizes are given, so every parameter is created by initialize() (no
/// deferred shapes) and the torch initialisation below can see each weight's fan-in.
std::shared_ptr<nn::sequential> make_model(const std::string& model) {
  auto net = std::make_shared<nn::sequential>();
  if (model == "mlp") {
    // The benchmark recipe (BENCHMARKS.md): 784-256-10 with ReLU.
    net->add(std::make_shared<nn::dense>(256, "relu", true, 784));
    net->add(std::make_shared<nn::dense>(10, "", true, 256));
  } else if (model == "mlp-wide") {
    // The communication-heavy model: 784-4096-4096-10 with ReLU, the shape of VGG's and
    // AlexNet's fully connected layers. 20,037,642 parameters, so about 80 MB of float32
    // gradients cross the store every step.
    net->add(std::make_shared<nn::dense>(4096, "relu", true, 784));
    net->add(std::make_shared<nn::dense>(4096, "relu", true, 4096));
    net->add(std::make_shared<nn::dense>(10, "", true, 4096));
  } else {
    // LeNet-5 as in MXNet's examples (conv 20 and 50 of 5x5, 2x2 max pooling, dense 500), with
    // ReLU instead of tanh: it trains faster with plain SGD at lr 0.1.
    net->add(std::make_shared<nn::conv2d>(20, std::array<std::int64_t, 2>{5, 5},
                                          std::array<std::int64_t, 2>{1, 1},
                                          std::array<std::int64_t, 2>{0, 0}, "relu", true, 1));
    net->add(std::make_shared<nn::max_pool2d>(std::array<std::int64_t, 2>{2, 2}));
    net->add(std::make_shared<nn::conv2d>(50, std::array<std::int64_t, 2>{5, 5},
                                          std::array<std::int64_t, 2>{1, 1},
                                          std::array<std::int64_t, 2>{0, 0}, "relu", true, 20));
    net->add(std::make_shared<nn::max_pool2d>(std::array<std::int64_t, 2>{2, 2}));
    net->add(std::make_shared<nn::flatten>());
    net->add(std::make_shared<nn::dense>(500, "relu", true, 50 * 4 * 4));
    net->add(std::make_shared<nn::dense>(10, "", true, 500));
  }
  return net;
}

/// Elements of every parameter of `net` (weights and biases): 203,530 for mlp, 20,037,642 for
/// mlp-wide, 431,080 for lenet.
std::int64_t parameter_count(const nn::block& net) {
  std::int64_t count = 0;
  for (const auto& p : net.collect_params())
    count += element_count(p->shape());
  return count;
}

/// Fan-in of a weight [out, in, k...]: in · prod(k).
std::int64_t fan_in(const shape_vector& shape) {
  std::int64_t fan = shape.size() > 1 ? shape[1] : 1;
  for (std::size_t i = 2; i < shape.size(); ++i)
    fan *= shape[i];
  return fan;
}

/// PyTorch's default for Linear and Conv2d (kaiming_uniform with a = sqrt(5), and the bias
/// rule): weight and bias both uniform in [-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in being the
/// weight's. Applied over what initialize() made, so the baselines start from the same law.
void torch_init(const nn::parameter_list& params, std::uint64_t seed) {
  for (const auto& p : params) {
    const std::string& name = p->name();
    std::string weight_name = name;
    if (name.ends_with("bias"))
      weight_name = name.substr(0, name.size() - 4) + "weight";
    else if (!name.ends_with("weight"))
      continue;
    auto weight = std::find_if(params.begin(), params.end(),
                               [&](const auto& q) { return q->name() == weight_name; });
    if (weight == params.end())
      continue;
    double bound = 1.0 / std::sqrt(static_cast<double>(fan_in((*weight)->shape())));
    p->set_data(
        ndarray::random_uniform(-bound, bound, p->shape(), nn::initializer::seed_for(name, seed)));
  }
}

std::shared_ptr<const nn::initializer> make_initializer(const std::string& name) {
  if (name == "xavier")
    return std::make_shared<nn::xavier>();
  if (name == "normal")
    return std::make_shared<nn::normal>();
  return std::make_shared<nn::uniform>(); // "uniform" (gluon's default), and "torch" before
                                          // torch_init overwrites it
}

/// Index of the largest of `classes` values from `row`.
std::int64_t argmax(const float* row, std::int64_t classes) {
  return std::max_element(row, row + classes) - row;
}

/// Correct predictions of `logits` [n, classes] against float labels [n].
std::int64_t count_correct(const ndarray& logits, const ndarray& labels) {
  auto out = logits.to_vector<float>();
  auto want = labels.to_vector<float>();
  const std::int64_t classes = logits.shape()[1];
  std::int64_t correct = 0;
  for (std::size_t i = 0; i < want.size(); ++i)
    correct += argmax(out.data() + i * static_cast<std::size_t>(classes), classes) ==
               static_cast<std::int64_t>(want[i]);
  return correct;
}

/// Test accuracy in % over the whole set, in predict mode on the first context.
double evaluate(nn::block& net, const data::in_memory_dataset& test, context ctx) {
  constexpr std::int64_t chunk = 1000;
  std::int64_t correct = 0;
  const std::int64_t n = test.size();
  for (std::int64_t begin = 0; begin < n; begin += chunk) {
    std::int64_t end = std::min(n, begin + chunk);
    auto x = test.data().slice(begin, end).copy_to(ctx);
    correct += count_correct(net(x), test.label().slice(begin, end));
  }
  return n > 0 ? 100.0 * static_cast<double>(correct) / static_cast<double>(n) : 0.0;
}

/// The scheduler of --lr-scheduler, with steps counted in updates (epochs × steps per epoch).
result<std::shared_ptr<lr_scheduler>> make_scheduler(const options& o,
                                                     std::int64_t steps_per_epoch) {
  auto updates = [&](double epochs) {
    return std::max<std::int64_t>(1, std::llround(epochs * static_cast<double>(steps_per_epoch)));
  };
  warmup_options warmup;
  warmup.steps = o.warmup_epochs > 0 ? updates(o.warmup_epochs) : 0;
  warmup.begin_lr = o.warmup_begin_lr;
  result<std::unique_ptr<lr_scheduler>> made = error{errc::invalid_argument, "no scheduler"};
  if (o.lr_scheduler == "factor" || o.lr_scheduler == "multifactor") {
    auto epochs = parse_epoch_list(o.lr_step_epochs);
    if (!epochs)
      return epochs.error();
    if (epochs->empty())
      return error{errc::invalid_argument,
                   "--lr-scheduler " + o.lr_scheduler + " needs --lr-step-epochs"};
    if (o.lr_scheduler == "factor") {
      if (epochs->size() != 1)
        return error{errc::invalid_argument,
                     "--lr-scheduler factor takes one --lr-step-epochs value (the interval)"};
      made = make_factor_scheduler(updates(epochs->front()), o.lr_factor, 1e-8, o.lr, warmup);
    } else {
      std::vector<std::int64_t> steps;
      for (double e : *epochs)
        steps.push_back(updates(e));
      made = make_multi_factor_scheduler(steps, o.lr_factor, o.lr, warmup);
    }
  } else if (o.lr_scheduler == "cosine" || o.lr_scheduler == "poly") {
    const std::int64_t total = updates(o.epochs);
    made = o.lr_scheduler == "cosine" ? make_cosine_scheduler(total, o.lr, o.final_lr, warmup)
                                      : make_poly_scheduler(total, o.lr, 2.0, o.final_lr, warmup);
  }
  if (!made)
    return error{made.error().code(),
                 "--lr-scheduler " + o.lr_scheduler + ": " + made.error().message()};
  return std::shared_ptr<lr_scheduler>(std::move(*made));
}

/// `cause` with `context` before its code and message. main() reports a phase's error with
/// fail(message()), so the logged line reads "<context><code>: <message>".
error with_context(const std::string& context, const error& cause) {
  return error{cause.code(), context + cause.to_string()};
}

/// Declares every flag on `app`, each writing its field of `o`.
void add_flags(CLI::App& app, options& o) {
  app.option_defaults()->always_capture_default(); // --help shows each default
  app.add_option("--model", o.model,
                 "network: mlp (784-256-10), mlp-wide (784-4096-4096-10, 20M parameters), "
                 "lenet")
      ->check(CLI::IsMember({"mlp", "mlp-wide", "lenet"}));
  app.add_option("--epochs", o.epochs, "passes over the training set")
      ->check(CLI::Range(1, 100000));
  app.add_option("--batch-size", o.batch_size, "samples per batch, per worker")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_option("--lr", o.lr, "learning rate")->check(positive_number());
  app.add_option("--momentum", o.momentum, "momentum (sgd, nag)");
  app.add_option("--wd", o.wd, "weight decay")->check(non_negative_number());
  app.add_option("--optimizer", o.optimizer, "update rule")
      ->check(CLI::IsMember({"sgd", "nag", "adam", "rmsprop", "adagrad"}));
  app.add_option("--seed", o.seed, "seeds the initial weights and the data order");
  app.add_option("--kvstore", o.kvstore, "KVStore type")
      ->check(CLI::IsMember(
          {"local", "device", "dist_sync", "dist_async", "dist_device_sync", "dist_device_async"}));
  app.add_option("--update-on-kvstore", o.update_on_kvstore,
                 "run the optimizer in the store (default: MXNet's rule)")
      ->check(CLI::IsMember({"true", "false"}));
  app.add_option("--gradient-compression", o.compression_name,
                 "compress each push of a dist_* store, MXNet's way (residual kept per key)")
      ->check(CLI::IsMember({"none", "2bit", "1bit"}));
  app.add_option("--compression-threshold", o.compression_threshold,
                 "threshold of --gradient-compression (default 0.5; 2bit: > 0, 1bit: >= 0)");
  app.add_flag("--compress-pulls", o.compress_pulls,
               "with --gradient-compression and --update-on-kvstore false: the servers pack the "
               "summed gradients they send back too (troupe's extension)");
  app.add_option("--contexts", o.contexts, "devices each batch is split over, e.g. cpu(0),cpu(1)");
  app.add_option("--model-parallel", o.model_parallel,
                 "model parallelism: the network cut into one stage per context, e.g. "
                 "cpu(0),cpu(1)");
  app.add_option("--micro-batches", o.micro_batches,
                 "with --model-parallel: parts of each batch pipelined through the stages")
      ->check(CLI::Range(std::int64_t{1}, std::int64_t{1} << 20));
  app.add_flag("--hybridize", o.hybridize, "run the network as a cached graph");
  app.add_option("--init", o.init,
                 "initial weights: xavier (magnitude 3, uniform), torch (PyTorch's default law, "
                 "the baseline's recipe), uniform (gluon's default, 0.07), normal (0.01)")
      ->check(CLI::IsMember({"torch", "xavier", "uniform", "normal"}));
  app.add_option("--data-dir", o.data_dir, "directory of the four Fashion-MNIST .gz files");
  app.add_option("--step-batch", o.step_batch,
                 "batch size passed to trainer.step (default: batch size x workers)")
      ->check(positive_number());
  app.add_option("--csv", o.csv, "write per-epoch metrics to this CSV file");
  app.add_option("--plot", o.plot, "write an SVG plot of loss and accuracy to this file");
  app.add_option("--threads", o.threads, "OpenBLAS threads")->check(CLI::Range(1, 256));
  app.add_option("--lr-scheduler", o.lr_scheduler, "learning-rate schedule")
      ->check(CLI::IsMember({"none", "factor", "multifactor", "cosine", "poly"}));
  app.add_option("--lr-factor", o.lr_factor, "factor and multifactor: rate multiplier per step");
  app.add_option("--lr-step-epochs", o.lr_step_epochs,
                 "factor: the interval in epochs; multifactor: the epochs, e.g. 10,20");
  app.add_option("--final-lr", o.final_lr, "cosine and poly: the rate at the last epoch");
  app.add_option("--warmup-epochs", o.warmup_epochs, "linear warmup length in epochs")
      ->check(non_negative_number());
  app.add_option("--warmup-begin-lr", o.warmup_begin_lr, "rate at the start of the warmup");
  app.add_option("--train-limit", o.train_limit,
                 "train on the first N samples of the set only (0: all)")
      ->check(non_negative_number());
  app.add_option("--max-batches", o.max_batches, "at most N steps per epoch (0: no limit)")
      ->check(non_negative_number());
  app.add_option("--save-params", o.save_params, "save the trained parameters to this file");
  app.add_flag("--no-progress", o.no_progress, "no progress display on stderr");
  app.add_flag("--quiet", o.quiet, "print only the final JSON line (and errors)");
  app.add_option(
         "--slow-worker", o.slow_worker_text,
         "for straggler experiments: worker RANK sleeps DURATION in each step, after its "
         "gradients and before the trainer's step (e.g. 2:5ms); with rotate:DURATION worker "
         "r sleeps in steps r, r + W, r + 2W... (the straggler moves)")
      ->type_name("RANK:DURATION");
  app.add_option("--leave-after-epoch", o.leave_text,
                 "dist_*: worker RANK leaves the job after the barrier ending epoch EPOCH, and "
                 "the others share the training set from the next epoch on (e.g. 2:3,3:3); "
                 "worker 0, which evaluates, cannot leave")
      ->type_name("RANK:EPOCH[,RANK:EPOCH...]");
  add_config_flags(app, o.cluster);
}

/// The cluster flags and the file and environment under them, loaded and checked as a dist_*
/// worker's store will read them (load_worker_config: a scheduler or server role has been served
/// by serve_if_node_role before this runs), so that a bad or missing value is a usage error
/// naming its flag or variable. With a local store any cluster flag is a usage error, and the
/// environment is checked all the same: DMLC_ROLE=foo or DMLC_NUM_WORKER=abc is a broken setup
/// whatever the store, and a process that ignored it would train on as if nothing were set.
status check_cluster_flags(options& o) {
  if (!o.kvstore.starts_with("dist")) {
    std::string given;
    for (const auto& [key, flag] : o.cluster.flags)
      given += (given.empty() ? "" : ", ") + flag;
    if (o.cluster.config_file)
      given += std::string(given.empty() ? "" : ", ") + "--config";
    if (!given.empty())
      return error{errc::invalid_argument,
                   given + ": cluster flags apply to --kvstore dist_* only (not " + o.kvstore +
                       ")"};
    if (auto environment = load_config(std::nullopt, process_environment(), {}); !environment)
      return environment.error();
    return {};
  }
  auto loaded = load_worker_config(process_environment(), o.cluster);
  if (!loaded)
    return loaded.error();
  o.cluster_view = std::move(*loaded);
  return {};
}

/// The checks CLI11 cannot make flag by flag; the contexts --contexts names. Fills o.slow and
/// o.cluster_view. An error is a usage error, its message the line to print.
result<std::vector<context>> check_flags(options& o) {
  if (o.momentum_given && o.optimizer != "sgd" && o.optimizer != "nag")
    return error{errc::invalid_argument, "--momentum applies to --optimizer sgd and nag only"};
  if (!o.slow_worker_text.empty()) {
    auto slow = parse_slow_worker(o.slow_worker_text);
    if (!slow)
      return slow.error();
    o.slow = *slow;
  }
  if (!o.leave_text.empty()) {
    if (!o.kvstore.starts_with("dist"))
      return error{errc::invalid_argument,
                   "--leave-after-epoch applies to --kvstore dist_* only (not " + o.kvstore + ")"};
    auto leave = parse_leave_after(o.leave_text);
    if (!leave)
      return leave.error();
    o.leave_after = std::move(*leave);
  }
  if (auto cluster = check_cluster_flags(o); !cluster)
    return cluster.error();
  if (o.cluster_view)
    for (const auto& [rank, epoch] : o.leave_after)
      if (rank >= o.cluster_view->worker_capacity())
        return error{errc::invalid_argument,
                     fmt::format("--leave-after-epoch {}: the job has room for {} worker(s), "
                                 "ranks 0 to {}",
                                 o.leave_text, o.cluster_view->worker_capacity(),
                                 o.cluster_view->worker_capacity() - 1)};
  if (o.compression_threshold && o.compression_name == "none")
    return error{errc::invalid_argument, "--compression-threshold needs --gradient-compression"};
  if (o.compression_name != "none" && !o.kvstore.starts_with("dist"))
    return error{errc::invalid_argument, "--gradient-compression compresses what a dist_* store "
                                         "pushes; --kvstore " +
                                             o.kvstore + " pushes nothing over a link"};
  auto compression = gradient_compression::make(o.compression_name, o.compression_threshold);
  if (!compression)
    return error{errc::invalid_argument,
                 "--compression-threshold: " + compression.error().message()};
  o.compression = *compression;
  if (o.compress_pulls && !o.compression.enabled())
    return error{errc::invalid_argument, "--compress-pulls needs --gradient-compression"};
  o.compression.pulls = o.compress_pulls;
  auto contexts = parse_contexts(o.contexts);
  if (!contexts)
    return contexts.error();
  if (!o.model_parallel.empty()) {
    if (contexts->size() > 1)
      return error{errc::invalid_argument,
                   "--model-parallel and --contexts with more than one context do not combine "
                   "(data parallelism goes over workers: troupe-launch)"};
    auto stages = parse_contexts(o.model_parallel, "--model-parallel");
    if (!stages)
      return stages.error();
    o.stages = std::move(*stages);
    // The batch enters on the first stage's context (and is evaluated from there).
    contexts = std::vector<context>{o.stages.front()};
  } else if (o.micro_batches != 1) {
    return error{errc::invalid_argument, "--micro-batches needs --model-parallel"};
  }
  // A missing device is a usage error before anything is built, naming it and why it is missing.
  for (const auto& group : {*contexts, o.stages})
    for (const context ctx : group)
      if (auto available = check_available(ctx); !available)
        return available.error();
  if (o.micro_batches > o.batch_size)
    return error{errc::invalid_argument, "--micro-batches " + std::to_string(o.micro_batches) +
                                             " exceeds --batch-size " +
                                             std::to_string(o.batch_size)};
  if (o.lr_scheduler == "none" &&
      (!o.lr_step_epochs.empty() || o.warmup_epochs > 0 || o.final_lr != 0))
    return error{errc::invalid_argument,
                 "--lr-step-epochs, --warmup-epochs and --final-lr need --lr-scheduler"};
  return contexts;
}

/// This process's place in the job. A dist_* store comes first: it tells this process its rank,
/// which picks its part of the data. Local modes have no store here (the trainer makes its own).
struct membership {
  std::shared_ptr<kvstore> store; ///< the dist store, or null
  int rank = 0;
  /// The workers whose parts tile the training set this epoch (their ranks, ascending), and how
  /// many they are.
  std::vector<int> ranks{0};
  int workers = 1;
  /// The first epoch this worker trains: after the epoch whose barrier it joined at.
  int first_epoch = 1;
  /// Workers that said at the last barrier that they leave after it (--leave-after-epoch).
  std::vector<int> leaving;

  /// This worker's part of the training set: its place among `ranks`.
  int part() const noexcept {
    const auto at = std::find(ranks.begin(), ranks.end(), rank);
    return at == ranks.end() ? 0 : static_cast<int>(at - ranks.begin());
  }

  /// Rank 0 evaluates, prints and writes the outputs.
  bool lead() const noexcept { return rank == 0; }
};

/// The workers whose values at a barrier say they leave after it (end_epoch's third value).
std::vector<int> leavers(const std::vector<std::vector<double>>& gathered) {
  std::vector<int> out;
  for (std::size_t rank = 0; rank < gathered.size(); ++rank)
    if (gathered[rank].size() >= 3 && gathered[rank][2] != 0)
      out.push_back(static_cast<int>(rank));
  return out;
}

/// Joins the job of a dist_* store as a worker (main has let a scheduler or server process serve
/// before), with the cluster flags over the file and environment.
result<membership> join(const options& o) {
  membership m;
  if (!o.kvstore.starts_with("dist"))
    return m;
  // A worker that joins the running job does so at the barrier ending an epoch, where every
  // worker re-cuts the data (cut_data).
  auto cluster = o.cluster;
  cluster.set("job.join_at_barrier", "true");
  auto created = kvstore::create(o.kvstore, cluster);
  if (!created)
    return with_context("kvstore " + o.kvstore + ": ", created.error());
  m.store = std::move(*created);
  if (o.compression.enabled())
    if (auto compressed = m.store->set_gradient_compression(o.compression); !compressed)
      return with_context("kvstore " + o.kvstore + ": ", compressed.error());
  m.rank = m.store->rank();
  m.ranks = m.store->worker_ranks();
  m.workers = static_cast<int>(m.ranks.size());
  // Joined at an epoch's barrier: the others shared {samples/s, epoch, leaving} there
  // (end_epoch).
  if (const auto gathered = m.store->gathered_at_join()) {
    int done = 0;
    for (const auto& values : *gathered)
      if (values.size() >= 2)
        done = std::max(done, static_cast<int>(values[1]));
    m.first_epoch = done + 1;
    m.leaving = leavers(*gathered);
  }
  return m;
}

/// This worker's part of the training set, batched, and the test set on rank 0 only.
struct training_data {
  std::int64_t n_train = 0;                        ///< samples of the whole training set
  data::data_loader loader;                        ///< this worker's part
  std::optional<data::in_memory_dataset> test_set; ///< on rank 0, which alone evaluates
  std::int64_t steps = 0; ///< per epoch, on every worker (see the file comment)
};

/// This worker's part of `train_set` as `m` cuts it (part m.part() of m.workers), and the steps
/// every worker runs per epoch.
struct data_cut {
  data::data_loader loader;
  std::int64_t steps = 0;
};

result<data_cut> cut_data(const options& o, data::in_memory_dataset train_set,
                          const membership& m) {
  const std::int64_t n_train = train_set.size();
  auto order = data::make_sharded_sampler(n_train, m.workers, m.part(), true, o.seed);
  if (!order)
    return with_context("", order.error());
  auto loader = data::data_loader::create(std::move(train_set), *order, o.batch_size,
                                          data::last_batch::discard);
  if (!loader)
    return with_context("", loader.error());
  std::int64_t steps =
      data::common_batch_count(n_train, m.workers, o.batch_size, data::last_batch::discard);
  if (o.max_batches > 0)
    steps = std::min(steps, o.max_batches);
  if (steps == 0)
    return error{errc::invalid_argument,
                 fmt::format("{} training samples over {} worker(s) make no full batch of {}",
                             n_train, m.workers, o.batch_size)};
  return data_cut{std::move(*loader), steps};
}

result<training_data> load_data(const options& o, const membership& m) {
  const bool spatial = o.model == "lenet";
  auto train_set = load_set(o.data_dir, "train", o.train_limit, spatial);
  if (!train_set)
    return with_context("training set: ", train_set.error());
  std::optional<data::in_memory_dataset> test_set;
  if (m.lead()) {
    auto loaded = load_set(o.data_dir, "t10k", 0, spatial);
    if (!loaded)
      return with_context("test set: ", loaded.error());
    test_set = std::move(*loaded);
  }
  const std::int64_t n_train = train_set->size();
  auto cut = cut_data(o, std::move(*train_set), m);
  if (!cut)
    return cut.error();
  return training_data{n_train, std::move(cut->loader), std::move(test_set), cut->steps};
}

/// The network of --model: on every context, or cut into the stages of --model-parallel, each
/// on its context; initialised as --init says, hybridized with --hybridize.
std::shared_ptr<nn::block> build_network(const options& o, const std::vector<context>& contexts) {
  std::shared_ptr<nn::block> net = make_model(o.model);
  if (!o.stages.empty()) {
    auto stages = nn::pipeline::split(static_cast<nn::sequential&>(*net), o.stages);
    stages->initialize_stages(make_initializer(o.init), o.seed);
    net = std::move(stages);
  } else {
    net->initialize(make_initializer(o.init), contexts, o.seed);
  }
  if (o.init == "torch")
    torch_init(net->collect_params(), o.seed);
  if (o.hybridize)
    net->hybridize();
  return net;
}

/// A trainer of `net`'s parameters over the dist store, or over a store of --kvstore's type.
result<std::unique_ptr<trainer>> make_trainer(const options& o, nn::block& net,
                                              const membership& m) {
  std::optional<bool> update_on_kvstore;
  if (!o.update_on_kvstore.empty())
    update_on_kvstore = o.update_on_kvstore == "true";
  optimizer_params hyper{{"learning_rate", o.lr}, {"wd", o.wd}};
  if (o.momentum_given)
    hyper["momentum"] = o.momentum;
  auto made =
      m.store
          ? trainer::create(net.collect_params(), o.optimizer, hyper, m.store, update_on_kvstore)
          : trainer::create(net.collect_params(), o.optimizer, hyper, o.kvstore, update_on_kvstore);
  if (!made)
    return with_context("trainer: ", made.error());
  return made;
}

/// The schedule of --lr-scheduler on `train`, if any. An error is a usage error: the flags do
/// not make a schedule, or the trainer refuses one (dist with update_on_kvstore: the servers
/// hold the optimizer).
status attach_scheduler(const options& o, trainer& train, bool dist, std::int64_t steps) {
  if (o.lr_scheduler == "none")
    return {};
  auto scheduler = make_scheduler(o, steps);
  if (!scheduler)
    return scheduler.error();
  if (auto set = train.set_lr_scheduler(*scheduler); !set)
    return error{set.error().code(),
                 "--lr-scheduler: " + set.error().to_string() +
                     (dist && train.update_on_kvstore() ? " (--update-on-kvstore false)" : "")};
  return {};
}

/// What the epochs work with, made by the phases before them.
struct training_job {
  const options& o;
  std::vector<context> contexts;
  membership member;
  training_data data;
  std::shared_ptr<nn::block> net; ///< an nn::pipeline with --model-parallel
  std::unique_ptr<trainer> train;
  std::int64_t step_batch = 0; ///< what trainer.step() is given (see the file comment)
};

/// The running sums of one epoch on this worker.
struct epoch_tally {
  double loss_sum = 0;
  std::int64_t correct = 0;
  std::int64_t seen = 0;
};

/// One step on `batch`: forward and loss per context under autograd, backward, the update;
/// the batch's losses and correct predictions go into `tally`. Errors carry the whole message.
status train_step(training_job& job, const data::batch& batch, int epoch, std::int64_t step,
                  epoch_tally& tally) {
  auto xs = data::split_and_load(batch.data, job.contexts, false);
  auto ys = data::split_and_load(batch.label, job.contexts, false);
  if (!xs || !ys)
    return with_context("", xs ? ys.error() : xs.error());
  std::vector<ndarray> losses, outputs;
  {
    autograd::record_scope record;
    if (auto* stages = dynamic_cast<nn::pipeline*>(job.net.get())) {
      // Model parallelism: the micro-batches of the one context's part go through the stages,
      // queued at once so that the stages overlap; their labels follow them.
      outputs = stages->forward_micro_batches((*xs)[0], job.o.micro_batches);
      std::vector<ndarray> labels;
      std::int64_t begin = 0;
      for (const auto& out : outputs) {
        const std::int64_t end = begin + out.shape()[0];
        labels.push_back((*ys)[0].slice(begin, end).copy_to(out.ctx()));
        losses.push_back(nd::softmax_cross_entropy(out, labels.back()));
        begin = end;
      }
      *ys = std::move(labels);
    } else {
      for (std::size_t c = 0; c < xs->size(); ++c) {
        outputs.push_back((*job.net)((*xs)[c]));
        losses.push_back(nd::softmax_cross_entropy(outputs.back(), (*ys)[c]));
      }
    }
  }
  autograd::backward(losses);
  // A straggler on purpose: its gradients are ready, its push is late.
  if (const auto& slow = job.o.slow;
      slow && slow->sleeps(job.member.rank, job.member.workers, step))
    std::this_thread::sleep_for(slow->delay);
  if (auto stepped = job.train->step(job.step_batch); !stepped)
    return with_context(fmt::format("epoch {} step {}: ", epoch, step + 1), stepped.error());
  for (std::size_t c = 0; c < losses.size(); ++c) {
    tally.loss_sum += losses[c].sum();
    tally.correct += count_correct(outputs[c], (*ys)[c]);
  }
  tally.seen += batch.label.size();
  return {};
}

/// Before epoch `epoch` of a dist job: when the workers in the job are no longer those the data
/// was cut for (a worker joined at the last barrier), every worker cuts it again for those in
/// now, so that their parts tile the training set, and the steps per epoch and the default step
/// batch follow. Every worker holds the same list after the barrier (kvstore::worker_ranks), so
/// they agree on the cut.
status follow_membership(training_job& job, int epoch) {
  auto& m = job.member;
  if (!m.store || !m.store->type().starts_with("dist"))
    return {};
  // Those that said they leave after the last barrier are out, whether or not a table says so
  // yet: every worker saw the same values there.
  auto ranks = m.store->worker_ranks();
  std::erase_if(ranks, [&](int rank) {
    return std::find(m.leaving.begin(), m.leaving.end(), rank) != m.leaving.end();
  });
  if (ranks == m.ranks || std::find(ranks.begin(), ranks.end(), m.rank) == ranks.end())
    return {};
  m.ranks = std::move(ranks);
  m.workers = static_cast<int>(m.ranks.size());
  auto cut = cut_data(job.o, job.data.loader.dataset(), m);
  if (!cut)
    return with_context(fmt::format("epoch {}: ", epoch), cut.error());
  job.data.loader = std::move(cut->loader);
  job.data.steps = cut->steps;
  if (job.o.step_batch <= 0)
    job.step_batch = job.o.batch_size * m.workers;
  if (m.lead() && !job.o.quiet)
    fmt::print("epoch {}: {} workers (ranks {}) share the training set, {} steps each\n", epoch,
               m.workers, fmt::join(m.ranks, ","), job.data.steps);
  return {};
}

/// Trains one epoch (1-based) on this worker's part and returns its training metrics; the test
/// accuracy is left for end_epoch.
result<report::epoch_metrics> train_epoch(training_job& job, int epoch, report::progress& bar) {
  if (auto recut = follow_membership(job, epoch); !recut)
    return recut.error();
  auto& loader = job.data.loader;
  const std::int64_t steps = job.data.steps;
  const std::int64_t workers = job.member.workers;
  // The sampler's order of this epoch (a worker that joined starts later).
  while (loader.epoch() < epoch - 1)
    loader.reset();
  bar.start(fmt::format("epoch {}/{}", epoch, job.o.epochs), steps);
  epoch_tally tally;
  const auto start = std::chrono::steady_clock::now();
  for (std::int64_t step = 0; step < steps; ++step) {
    auto batch = loader.next();
    if (!batch)
      return error{errc::internal,
                   fmt::format("the loader ran out after {} of {} batches", step, steps)};
    if (auto stepped = train_step(job, *batch, epoch, step, tally); !stepped)
      return stepped.error();
    const auto seen = static_cast<double>(tally.seen);
    bar.update(step + 1, tally.seen * workers, tally.loss_sum / seen,
               100.0 * static_cast<double>(tally.correct) / seen);
  }
  const double elapsed =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  bar.finish();

  report::epoch_metrics m;
  m.epoch = epoch;
  m.train_loss = tally.loss_sum / static_cast<double>(tally.seen);
  m.train_acc = 100.0 * static_cast<double>(tally.correct) / static_cast<double>(tally.seen);
  m.samples = tally.seen * workers;
  m.time_s = elapsed;
  m.samples_per_s = elapsed > 0 ? static_cast<double>(m.samples) / elapsed : 0;
  m.learning_rate = job.train->learning_rate();
  return m;
}

/// After an epoch: rank 0 evaluates the test set and prints the epoch's line; then every worker
/// of a dist job meets the others in a barrier, where they wait while rank 0 evaluates, and says
/// whether it leaves after it. Returns whether this worker leaves now.
result<bool> end_epoch(training_job& job, report::epoch_metrics& m) {
  if (job.member.lead()) {
    m.test_acc = evaluate(*job.net, *job.data.test_set, job.contexts.front());
    if (!job.o.quiet)
      fmt::print("{}\n", report::epoch_line(m));
    std::fflush(stdout);
  }
  if (!job.member.store)
    return false;
  // The barrier also gathers each worker's own samples/s for the plot, the CSV and the final
  // line (a straggler shows there).
  const double own = m.time_s > 0 ? static_cast<double>(m.samples) /
                                        static_cast<double>(job.member.workers) / m.time_s
                                  : 0;
  // The epoch tells a worker that joins at this barrier where the job is; the last value says
  // this worker leaves after it (--leave-after-epoch).
  const auto leave = job.o.leave_after.find(job.member.rank);
  const bool leaves = leave != job.o.leave_after.end() && leave->second == m.epoch;
  const std::array<double, 3> shared{own, static_cast<double>(m.epoch), leaves ? 1.0 : 0.0};
  auto gathered = job.member.store->gather_at_barrier(shared);
  if (!gathered)
    return error{gathered.error().code(),
                 fmt::format("barrier after epoch {}: {}", m.epoch, gathered.error().to_string())};
  if (job.member.store->type().starts_with("dist"))
    for (const auto& values : *gathered)
      m.worker_samples_per_s.push_back(values.empty() ? 0.0 : values.front());
  job.member.leaving = leavers(*gathered);
  return leaves;
}

/// Rank 0's outputs after the last epoch: the CSV, the plot and the parameters when asked for,
/// then the final JSON line.
status write_outputs(const training_job& job, const std::vector<report::epoch_metrics>& history,
                     double job_time_s) {
  const options& o = job.o;
  const std::string title =
      fmt::format("train_mnist {} - {} x{} - batch {} - {} lr {}", o.model, o.kvstore,
                  job.member.workers, o.batch_size, o.optimizer, o.lr);
  if (!o.csv.empty())
    if (auto written = report::write_csv(o.csv, history); !written)
      return with_context("", written.error());
  if (!o.plot.empty())
    if (auto written = report::write_svg(o.plot, history, title); !written)
      return with_context("", written.error());
  if (!o.save_params.empty())
    if (auto saved = job.net->save_parameters(o.save_params); !saved)
      return with_context("", saved.error());
  report::run_summary run;
  run.epochs = o.epochs;
  run.model = o.model;
  run.kvstore = o.kvstore;
  run.gradient_compression = o.compression.describe();
  run.workers = job.member.workers;
  run.batch_size = o.batch_size;
  run.step_batch = job.step_batch;
  run.contexts = job.contexts.size();
  run.stages = std::max<std::size_t>(1, o.stages.size());
  run.micro_batches = o.micro_batches;
  run.threads = o.threads;
  run.hybridize = o.hybridize;
  run.job_time_s = job_time_s;
  run.parameters = parameter_count(*job.net);
  fmt::print("{}\n", report::final_line(history, run));
  std::fflush(stdout);
  return {};
}

/// ", quorum 2, max staleness 1, worker 2 sleeps 5ms per step": what makes this job's workers
/// wait for each other differently from plain dist_sync or dist_async.
std::string sync_note(const options& o) {
  std::string note;
  if (o.cluster_view && o.cluster_view->quorum)
    note += fmt::format(", quorum {}{}", *o.cluster_view->quorum,
                        o.cluster_view->rescale_quorum ? " (rescaled)" : "");
  if (o.cluster_view && o.cluster_view->max_staleness)
    note += fmt::format(", max staleness {}", *o.cluster_view->max_staleness);
  if (o.slow && o.slow->rank)
    note += fmt::format(", worker {} sleeps {} per step", *o.slow->rank,
                        format_duration(o.slow->delay));
  else if (o.slow)
    note += fmt::format(", one worker in turn sleeps {} per step", format_duration(o.slow->delay));
  return note;
}

/// The banner rank 0 prints before training.
void print_banner(const training_job& job) {
  const options& o = job.o;
  fmt::print("train_mnist: model {} ({} parameters) kvstore {} (update_on_kvstore {}) workers {} "
             "contexts {} batch {} per worker, step batch {}, {} steps per epoch over {} training "
             "samples{}{}\n",
             o.model, parameter_count(*job.net), o.kvstore, job.train->update_on_kvstore(),
             job.member.workers,
             o.stages.empty() ? o.contexts
                              : fmt::format("{} (model-parallel stages, {} micro-batches)",
                                            o.model_parallel, o.micro_batches),
             o.batch_size, job.step_batch, job.data.steps, job.data.n_train,
             o.hybridize ? ", hybridized" : "", sync_note(o));
}

} // namespace

int main(int argc, char** argv) {
  reexec_with_suited_openblas_core(argv);
  if (auto served = serve_if_node_role(argc, argv))
    return *served;
  options o;
  CLI::App app{"Fashion-MNIST training with troupe's gluon-style API (local or distributed)"};
  add_flags(app, o);
  if (auto done = parse_command_line(app, "train_mnist", argc, argv))
    return *done;
  o.momentum_given = app.count("--momentum") > 0;
  auto contexts = check_flags(o);
  if (!contexts)
    return usage(contexts.error().message());

  // The kernels call OpenBLAS, whose pthreads build otherwise starts one thread per core.
  kernels::cpu::set_blas_threads(o.threads);
  logger log{"train_mnist", 0};
  // One device actor per context, so that the contexts of --contexts compute concurrently.
  const auto use_device_actors = device_actors_requested();
  if (!use_device_actors)
    return usage(use_device_actors.error().message());
  std::optional<device_scope> devices;
  if (*use_device_actors)
    devices.emplace();

  auto member = join(o);
  if (!member)
    return fail(log, member.error().message());
  if (member->store)
    log = log.part(node_name("worker", static_cast<std::uint32_t>(member->rank), ""));
  if (o.slow && o.slow->rank && *o.slow->rank >= member->workers)
    return usage(fmt::format("--slow-worker {}: the job has {} worker(s), ranks 0 to {}",
                             o.slow_worker_text, member->workers, member->workers - 1));

  try {
    auto data = load_data(o, *member);
    if (!data)
      return fail(log, data.error().message());
    if (o.batch_size < static_cast<std::int64_t>(contexts->size()))
      return usage(fmt::format("--batch-size {} is smaller than the {} contexts it is split over",
                               o.batch_size, contexts->size()));
    auto net = build_network(o, *contexts);
    auto train = make_trainer(o, *net, *member);
    if (!train)
      return fail(log, train.error().message());
    if (auto attached = attach_scheduler(o, **train, member->store != nullptr, data->steps);
        !attached)
      return usage(attached.error().message());

    const std::int64_t step_batch =
        o.step_batch > 0 ? o.step_batch : o.batch_size * static_cast<std::int64_t>(member->workers);
    training_job job{o,
                     std::move(*contexts),
                     std::move(*member),
                     std::move(*data),
                     std::move(net),
                     std::move(*train),
                     step_batch};
    if (job.member.lead() && !o.quiet)
      print_banner(job);
    std::fflush(stdout);

    using report::progress;
    progress bar(job.member.lead() && !o.quiet && !o.no_progress
                     ? std::nullopt
                     : std::optional{progress::mode::off});
    std::vector<report::epoch_metrics> history;
    const auto started = std::chrono::steady_clock::now();
    if (job.member.first_epoch > 1 && !o.quiet)
      fmt::print("joined the running job after epoch {}: trains epochs {} to {}\n",
                 job.member.first_epoch - 1, job.member.first_epoch, o.epochs);
    for (int epoch = job.member.first_epoch; epoch <= o.epochs; ++epoch) {
      auto metrics = train_epoch(job, epoch, bar);
      if (!metrics)
        return fail(log, metrics.error().message());
      auto leaves = end_epoch(job, *metrics);
      if (!leaves)
        return fail(log, leaves.error().message());
      history.push_back(*metrics);
      if (*leaves) {
        // The others cut the data without it from the next epoch on; its pushes are all
        // answered, so the servers close its rounds from the next one on.
        if (auto left = job.member.store->leave(); !left)
          return fail(log, "leaving after epoch " + std::to_string(epoch) + ": " +
                               left.error().message());
        if (!o.quiet)
          fmt::print("left the job after epoch {}\n", epoch);
        break;
      }
    }
    if (job.member.lead())
      if (auto written = write_outputs(
              job, history,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count());
          !written)
        return fail(log, written.error().message());
  } catch (const std::exception& e) {
    return fail(log, e.what());
  }
  return 0;
}
