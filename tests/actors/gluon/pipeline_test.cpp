// Model parallelism (engine/nn/pipeline.hpp) trained by the Trainer: the parameters after some
// steps equal those of the same network on one context, whether the batch goes through whole or
// in micro-batches, in one process and in a dist_sync job. gluon_tests_device runs it again with
// every stage on its own device actor.

#include <cmath>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/gluon/trainer.hpp"
#include "engine/autograd.hpp"
#include "engine/nd.hpp"
#include "engine/nn/initializer.hpp"
#include "engine/nn/pipeline.hpp"
#include "tests/actors/kvstore/in_process_job.hpp"

using namespace troupe;
using troupe::testing::in_process_job;
using troupe::testing::problems;

namespace {

/// 12 -> 16 (relu) -> 8 (relu) -> 4, with fixed prefixes so that every build names its
/// parameters alike (the initial values follow the names and the seed).
std::shared_ptr<nn::sequential> make_net() {
  auto net = std::make_shared<nn::sequential>();
  net->add(std::make_shared<nn::dense>(16, "relu", true, 12, true, nullptr, "first_"));
  net->add(std::make_shared<nn::dense>(8, "relu", true, 16, true, nullptr, "second_"));
  net->add(std::make_shared<nn::dense>(4, "", true, 8, true, nullptr, "third_"));
  return net;
}

ndarray batch_data(int step, std::int64_t rows) {
  return ndarray::random_uniform(-1, 1, {rows, 12}, 100 + static_cast<std::uint64_t>(step));
}

ndarray batch_labels(int step, std::int64_t rows) {
  std::vector<float> labels;
  for (std::int64_t i = 0; i < rows; ++i)
    labels.push_back(static_cast<float>((i * 7 + step) % 4));
  return ndarray::from_values(labels, {rows});
}

/// The loss of each micro-batch of `x` (labels moved to the output's context), recorded, then one
/// backward over all of them.
void forward_and_backward(nn::pipeline& net, const ndarray& x, const ndarray& labels,
                          std::int64_t parts) {
  std::vector<ndarray> losses;
  {
    autograd::record_scope record;
    auto outputs = net.forward_micro_batches(x, parts);
    std::int64_t begin = 0;
    for (auto& out : outputs) {
      const auto end = begin + out.shape()[0];
      losses.push_back(nd::softmax_cross_entropy(out, labels.slice(begin, end).copy_to(out.ctx())));
      begin = end;
    }
  }
  autograd::backward(losses);
}

/// One step on batch `step` of `rows` rows: forward_and_backward, then the update.
void train_step(nn::pipeline& net, trainer& train, int step, std::int64_t rows,
                std::int64_t parts) {
  forward_and_backward(net, batch_data(step, rows), batch_labels(step, rows), parts);
  BOOST_TEST_REQUIRE(train.step(rows).has_value());
}

std::vector<std::vector<float>> values_of(const nn::block& net) {
  std::vector<std::vector<float>> values;
  for (const auto& param : net.collect_params())
    values.push_back(param->list_data().front().to_vector<float>());
  return values;
}

/// The parameters after `steps` steps of `contexts.size()` stages with `parts` micro-batches.
std::vector<std::vector<float>> trained(std::vector<context> contexts, std::int64_t parts,
                                        int steps = 5, std::int64_t rows = 24) {
  auto net = nn::pipeline::split(*make_net(), contexts);
  net->initialize_stages(std::make_shared<nn::xavier>(), 3);
  auto train =
      trainer::create(net->collect_params(), "sgd", {{"learning_rate", 0.5}}, "device").value();
  for (int step = 0; step < steps; ++step)
    train_step(*net, *train, step, rows, parts);
  return values_of(*net);
}

void require_close(const std::vector<std::vector<float>>& got,
                   const std::vector<std::vector<float>>& want, const std::string& what) {
  BOOST_TEST_REQUIRE(got.size() == want.size());
  for (std::size_t p = 0; p < got.size(); ++p) {
    BOOST_TEST_REQUIRE(got[p].size() == want[p].size());
    for (std::size_t i = 0; i < got[p].size(); ++i)
      BOOST_TEST_REQUIRE(std::abs(got[p][i] - want[p][i]) <= 1e-5f + 1e-4f * std::abs(want[p][i]),
                         what << ": parameter " << p << " element " << i << " is " << got[p][i]
                              << ", on one context " << want[p][i]);
  }
}

} // namespace

BOOST_AUTO_TEST_SUITE(model_parallelism)

BOOST_AUTO_TEST_CASE(stages_on_two_or_three_contexts_train_like_one_context) {
  const auto one_context = trained({context::cpu(0)}, 1);
  // Training moved the parameters, so the comparison below means something.
  BOOST_TEST(one_context != trained({context::cpu(0)}, 1, 0));
  require_close(trained({context::cpu(0), context::cpu(1)}, 1), one_context, "2 stages");
  require_close(trained({context::cpu(0), context::cpu(1)}, 4), one_context,
                "2 stages, 4 micro-batches");
  require_close(trained({context::cpu(1), context::cpu(2), context::cpu(0)}, 6), one_context,
                "3 stages, 6 micro-batches");
}

BOOST_AUTO_TEST_CASE(each_stage_keeps_its_parameters_on_its_context) {
  auto net = nn::pipeline::split(*make_net(), std::vector{context::cpu(0), context::cpu(1)});
  net->initialize_stages(std::make_shared<nn::xavier>());
  std::vector<std::string> placed;
  for (const auto& param : net->collect_params())
    placed.push_back(param->name() + "@" + param->list_ctx().front().to_string());
  BOOST_TEST(placed == (std::vector<std::string>{"first_weight@cpu(0)", "first_bias@cpu(0)",
                                                 "second_weight@cpu(0)", "second_bias@cpu(0)",
                                                 "third_weight@cpu(1)", "third_bias@cpu(1)"}),
             boost::test_tools::per_element());
  BOOST_TEST(net->forward(batch_data(0, 3)).ctx() == context::cpu(1));
}

BOOST_AUTO_TEST_CASE(bad_splits_and_micro_batch_counts_are_errors_naming_the_counts) {
  auto net = make_net();
  const std::vector<context> four{context::cpu(0), context::cpu(1), context::cpu(2),
                                  context::cpu(3)};
  try {
    (void)nn::pipeline::split(*net, four);
    BOOST_FAIL("no error");
  } catch (const exception& e) {
    BOOST_TEST(e.error().message() ==
               "pipeline: 4 contexts for a network of 3 blocks; each stage needs at least one "
               "block");
  }
  auto stages = nn::pipeline::split(*net, std::vector{context::cpu(0), context::cpu(1)});
  stages->initialize_stages();
  try {
    (void)stages->forward_micro_batches(batch_data(0, 3), 4);
    BOOST_FAIL("no error");
  } catch (const exception& e) {
    BOOST_TEST(e.error().message() ==
               "pipeline: 4 micro-batches of a batch of 3 rows; give 1 to 3");
  }
}

BOOST_AUTO_TEST_CASE(every_worker_of_a_dist_sync_job_runs_the_pipeline_and_pushes_its_stages) {
  // Two workers, each half of a batch of 24 through two stages in 3 micro-batches: the summed
  // update equals one context's on the whole batch.
  const auto one_context = trained({context::cpu(0)}, 1, 3, 24);
  const std::uint32_t workers = 2;
  in_process_job job{"dist_sync", workers, 1};
  problems seen;
  std::vector<std::vector<std::vector<float>>> results(workers);
  job.run([&](std::uint32_t rank, kvstore& kv) {
    auto net = nn::pipeline::split(*make_net(), std::vector{context::cpu(0), context::cpu(1)});
    net->initialize_stages(std::make_shared<nn::xavier>(), 3);
    auto made =
        trainer::create(net->collect_params(), "sgd", {{"learning_rate", 0.5}}, &kv, std::nullopt);
    if (!made) {
      seen.add("trainer: " + made.error().to_string());
      return;
    }
    for (int step = 0; step < 3; ++step) {
      forward_and_backward(*net, batch_data(step, 24).slice(rank * 12, rank * 12 + 12),
                           batch_labels(step, 24).slice(rank * 12, rank * 12 + 12), 3);
      if (!seen.check((*made)->step(24), "step"))
        return;
    }
    results[rank] = values_of(*net);
  });
  BOOST_TEST_REQUIRE(seen.seen.empty(), seen.report());
  for (std::uint32_t rank = 0; rank < workers; ++rank)
    require_close(results[rank], one_context, "worker " + std::to_string(rank));
}

BOOST_AUTO_TEST_SUITE_END()
