// hybridize_bench: what hybridize() saves. The same network runs imperatively (every operator
// call allocates its output and is recorded op by op) and hybridized (one bound executor with
// planned memory, recorded as one step), on the same input.
//
//   build/bench/hybridize_bench [--batch 128] [--repeats 30] [--warmup 3] [--models mlp,lenet]
//
// Models: mlp (dense 784→256 relu → 10) on [batch, 784]; lenet (conv 6 5x5 relu, max pool,
// conv 16 5x5 relu, max pool, flatten, dense 120 relu, dense 10) on [batch, 1, 28, 28].
// Modes: train = forward + softmax cross-entropy + backward under autograd::record_scope (no
// optimizer); infer = forward in predict mode. The two variants are separate networks with the
// same initial values, timed alternately (one imperative step, one hybridized step) so that
// drift of the machine's speed hits both. One JSON line per model and mode (engine/json_line.hpp):
//   imperative_ms, hybridized_ms  median time of one step;
//   speedup                      imperative_ms / hybridized_ms.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/autograd.hpp"
#include "engine/blas_setup.hpp"
#include "engine/json_line.hpp"
#include "engine/nd.hpp"
#include "engine/nn/block.hpp"
#include "engine/nn/initializer.hpp"

using namespace troupe;

namespace {

std::shared_ptr<nn::sequential> make_net(const std::string& model) {
  auto net = std::make_shared<nn::sequential>();
  if (model == "mlp") {
    net->add(std::make_shared<nn::dense>(256, "relu")).add(std::make_shared<nn::dense>(10));
    return net;
  }
  net->add(std::make_shared<nn::conv2d>(6, std::array<std::int64_t, 2>{5, 5},
                                        std::array<std::int64_t, 2>{1, 1},
                                        std::array<std::int64_t, 2>{0, 0}, "relu"))
      .add(std::make_shared<nn::max_pool2d>())
      .add(std::make_shared<nn::conv2d>(16, std::array<std::int64_t, 2>{5, 5},
                                        std::array<std::int64_t, 2>{1, 1},
                                        std::array<std::int64_t, 2>{0, 0}, "relu"))
      .add(std::make_shared<nn::max_pool2d>())
      .add(std::make_shared<nn::flatten>())
      .add(std::make_shared<nn::dense>(120, "relu"))
      .add(std::make_shared<nn::dense>(10));
  return net;
}

double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  auto middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

double time_ms(const std::function<void()>& step) {
  auto start = std::chrono::steady_clock::now();
  step();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
      .count();
}

} // namespace

int main(int argc, char** argv) {
  troupe::reexec_with_suited_openblas_core(argv);
  CLI::App app{"imperative vs hybridized training and inference steps"};
  std::int64_t batch = 128;
  int repeats = 30;
  int warmup = 3;
  std::vector<std::string> models{"mlp", "lenet"};
  app.add_option("--batch", batch, "batch size")->check(CLI::PositiveNumber);
  app.add_option("--repeats", repeats, "measured steps per variant")->check(CLI::PositiveNumber);
  app.add_option("--warmup", warmup, "unmeasured steps per variant first (the trace among them)")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--models", models, "mlp, lenet")
      ->delimiter(',')
      ->check(CLI::IsMember({"mlp", "lenet"}));
  CLI11_PARSE(app, argc, argv);

  for (const auto& model : models) {
    shape_vector shape = model == "mlp" ? shape_vector{batch, 784} : shape_vector{batch, 1, 28, 28};
    auto x = ndarray::random_normal(0, 1, shape, 1);
    std::vector<float> label_values;
    for (std::int64_t i = 0; i < batch; ++i)
      label_values.push_back(static_cast<float>(i % 10));
    auto labels = ndarray::from_values(label_values, {batch});

    auto imperative = make_net(model);
    auto hybridized = make_net(model);
    imperative->initialize(std::make_shared<nn::xavier>(), nn::default_contexts, 7);
    hybridized->initialize(std::make_shared<nn::xavier>(), nn::default_contexts, 7);
    hybridized->hybridize();

    for (std::string mode : {"train", "infer"}) {
      auto step = [&](nn::block& net) {
        if (mode == "train") {
          autograd::record_scope record;
          auto loss = nd::sum(nd::softmax_cross_entropy(net(x), labels));
          loss.backward();
        } else {
          auto out = net(x);
          (void)out;
        }
      };
      for (int i = 0; i < warmup; ++i) {
        step(*imperative);
        step(*hybridized);
      }
      std::vector<double> imperative_ms, hybridized_ms;
      for (int i = 0; i < repeats; ++i) {
        imperative_ms.push_back(time_ms([&] { step(*imperative); }));
        hybridized_ms.push_back(time_ms([&] { step(*hybridized); }));
      }
      double imp = median(imperative_ms), hyb = median(hybridized_ms);
      json_line::object line;
      line["bench"] = "hybridize";
      line["model"] = model;
      line["mode"] = mode;
      line["batch"] = batch;
      line["repeats"] = repeats;
      line["imperative_ms"] = json_line::fixed(imp, 3);
      line["hybridized_ms"] = json_line::fixed(hyb, 3);
      line["speedup"] = json_line::fixed(imp / hyb, 3);
      line["traces"] = hybridized->trace_count();
      json_line::print(line);
    }
  }
  return 0;
}
