// gluon's Trainer with row_sparse parameters, MXNet's rules (python/mxnet/gluon/trainer.py,
// _init_kvstore and _allreduce_grads): an embedding with sparse_grad trains exactly as its
// dense-gradient twin (plain sgd) with no store, on a local store over two contexts and in
// dist_sync; its lazy update leaves the rows no batch used alone; a row_sparse weight
// (sparse_embedding) lives in the store, each forward pulls only the rows its batch uses, and
// update_on_kvstore=false or no store is refused with MXNet's message.

#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/gluon/trainer.hpp"
#include "engine/autograd.hpp"
#include "engine/nd.hpp"
#include "engine/nn/block.hpp"
#include "engine/nn/initializer.hpp"
#include "tests/actors/kvstore/in_process_job.hpp"
#include "tests/temp_dir.hpp"

using namespace troupe;
using troupe::testing::in_process_job;
using troupe::testing::problems;
using troupe::testing::temp_dir;

namespace {

constexpr std::int64_t vocabulary = 12;
constexpr std::int64_t width = 4;
constexpr std::int64_t classes = 3;

std::vector<context> cpus(int count) {
  std::vector<context> contexts;
  for (int i = 0; i < count; ++i)
    contexts.push_back(context::cpu(i));
  return contexts;
}

std::vector<std::uint32_t> bits(const ndarray& array) {
  const auto values = array.to_vector<float>();
  std::vector<std::uint32_t> out(values.size());
  std::memcpy(out.data(), values.data(), values.size() * sizeof(float));
  return out;
}

/// An embedding (sparse_grad or not) followed by a dense classifier, fixed initial values.
struct model {
  std::shared_ptr<nn::sequential> net = std::make_shared<nn::sequential>();
  std::shared_ptr<nn::embedding> words;
  std::shared_ptr<nn::dense> head;

  model(bool sparse_grad, const std::vector<context>& contexts) {
    words = std::make_shared<nn::embedding>(vocabulary, width, sparse_grad, nullptr, "words_");
    head = std::make_shared<nn::dense>(classes, "", true, 2 * width, true, nullptr, "head_");
    net->add(words);
    net->add(head);
    net->initialize(std::make_shared<nn::xavier>(), contexts, 9);
  }
};

/// Batch `step` of worker `rank` on context `c`: two samples of two word indices each, drawn from
/// the first half of the vocabulary (the other half is never used), and their labels.
std::pair<ndarray, ndarray> batch(int step, int rank, int c, context ctx) {
  std::vector<float> indices;
  for (int i = 0; i < 4; ++i)
    indices.push_back(static_cast<float>((step * 5 + rank * 3 + c * 2 + i * 7) % (vocabulary / 2)));
  std::vector<float> labels{static_cast<float>((step + rank) % classes),
                            static_cast<float>((step + c + 1) % classes)};
  return {ndarray::from_values(indices, {2, 2}).copy_to(ctx),
          ndarray::from_values(labels, {2}).copy_to(ctx)};
}

/// Forward and backward of one step on every context of `m`.
void forward_backward(model& m, const std::vector<context>& contexts, int step, int rank) {
  for (std::size_t c = 0; c < contexts.size(); ++c) {
    auto [x, y] = batch(step, rank, static_cast<int>(c), contexts[c]);
    ndarray loss;
    {
      autograd::record_scope record;
      loss = nd::softmax_cross_entropy((*m.net)(x), y);
    }
    loss.backward();
  }
}

/// Every value of every copy of every parameter.
std::vector<std::vector<std::uint32_t>> snapshot(model& m) {
  std::vector<std::vector<std::uint32_t>> values;
  for (const auto& param : m.net->collect_params())
    for (auto& copy : param->list_data())
      values.push_back(bits(copy));
  return values;
}

/// `steps` steps of a model on one worker with the given store type; the parameters after them.
std::vector<std::vector<std::uint32_t>> train(bool sparse_grad, int contexts, std::string_view type,
                                              const optimizer_params& hyper,
                                              std::optional<bool> on_kvstore = std::nullopt,
                                              int steps = 4) {
  const auto where = cpus(contexts);
  model m{sparse_grad, where};
  auto made = trainer::create(m.net->collect_params(), "sgd", hyper, type, on_kvstore);
  BOOST_TEST_REQUIRE(made.has_value(), (made ? "" : made.error().to_string()));
  for (int step = 0; step < steps; ++step) {
    forward_backward(m, where, step, 0);
    auto stepped = (*made)->step(2);
    BOOST_TEST_REQUIRE(stepped.has_value(), (stepped ? "" : stepped.error().to_string()));
  }
  return snapshot(m);
}

template <class T>
bool says(const result<T>& outcome, const std::string& fragment) {
  return !outcome && outcome.error().message().find(fragment) != std::string::npos;
}

} // namespace

BOOST_AUTO_TEST_SUITE(trainer_with_row_sparse_parameters)

BOOST_AUTO_TEST_CASE(sparse_grad_trains_as_the_dense_gradient_does_with_plain_sgd) {
  // Plain sgd moves no row without a gradient, so the lazy rule and the dense rule agree: one
  // context without a store, two on a local store (gradients summed there, each context updating
  // its own copy, MXNet's default for sparse gradients on one machine), and the same with the
  // store running the optimizer.
  const optimizer_params sgd{{"learning_rate", 0.5}};
  BOOST_TEST(train(true, 1, "local", sgd) == train(false, 1, "local", sgd));
  BOOST_TEST(train(true, 2, "local", sgd) == train(false, 2, "local", sgd));
  BOOST_TEST(train(true, 2, "local", sgd, true) == train(false, 2, "local", sgd, true));
}

BOOST_AUTO_TEST_CASE(the_lazy_update_leaves_rows_no_batch_used_as_they_were) {
  // With momentum and weight decay the dense rule moves every row; the lazy one (MXNet's
  // default for sgd with a row_sparse gradient) only the rows a batch used.
  const optimizer_params momentum{{"learning_rate", 0.5}, {"momentum", 0.9}, {"wd", 0.01}};
  for (std::optional<bool> on_kvstore : {std::optional<bool>{}, std::optional<bool>{true}}) {
    const auto where = cpus(2);
    model m{true, where};
    const auto initial = m.words->weight()->list_data().front().to_vector<float>();
    auto made = trainer::create(m.net->collect_params(), "sgd", momentum, "local", on_kvstore);
    BOOST_TEST_REQUIRE(made.has_value(), (made ? "" : made.error().to_string()));
    BOOST_TEST((*made)->update_on_kvstore() == on_kvstore.value_or(false));
    for (int step = 0; step < 3; ++step) {
      forward_backward(m, where, step, 0);
      auto stepped = (*made)->step(2);
      BOOST_TEST_REQUIRE(stepped.has_value(), (stepped ? "" : stepped.error().to_string()));
    }
    for (auto& copy : m.words->weight()->list_data()) {
      const auto now = copy.to_vector<float>();
      for (std::int64_t row = 0; row < vocabulary; ++row)
        for (std::int64_t c = 0; c < width; ++c) {
          const auto at = static_cast<std::size_t>(row * width + c);
          if (row >= vocabulary / 2)
            BOOST_TEST(now[at] == initial[at], "unused row " << row << " moved");
          else if (row == 0)
            BOOST_TEST(now[at] != initial[at], "row 0 was used and did not move");
        }
    }
  }
}

BOOST_AUTO_TEST_CASE(dist_sync_pushes_the_rows_updates_on_the_servers_and_pulls_the_weight) {
  // The Gluon-on-dist_sync closed form with row_sparse gradients: every row starts at 1, worker
  // r's gradient is r + 1 in rows r and 5 (sgd, rate 1, step(1)): row r becomes 1 - (r + 1), row
  // 5 becomes 1 - n(n+1)/2, and every other row stays 1, on every worker. A bigarray bound of
  // 20 splits the (12, 4) table by rows over both servers.
  constexpr std::uint32_t workers = 2;
  in_process_job job{"dist_sync", workers, 2, 2, 20};
  problems seen;
  job.run([&](std::uint32_t rank, kvstore& kv) {
    auto weight = std::make_shared<nn::parameter>(
        "table", shape_vector{vocabulary, width}, grad_req::write,
        std::make_shared<nn::constant>(1.0), storage_type::dense, storage_type::row_sparse);
    weight->initialize(nullptr, cpus(1), 0);
    const std::string who = "worker " + std::to_string(rank);
    if (auto refused = trainer::create({weight}, "sgd", {{"learning_rate", 1.0}}, &kv, false);
        !says(refused, "Cannot set update_on_kvstore=False on dist kvstore when sparse"))
      seen.add(who + ": update_on_kvstore=false was not refused as MXNet refuses it");
    auto made = trainer::create({weight}, "sgd", {{"learning_rate", 1.0}}, &kv, std::nullopt);
    if (!made || !(*made)->update_on_kvstore()) {
      seen.add(who + ": create: " + (made ? "update_on_kvstore false" : made.error().to_string()));
      return;
    }
    const std::vector<std::int64_t> rows{static_cast<std::int64_t>(rank), 5};
    auto values = ndarray::ones({2, width}) * static_cast<double>(rank + 1);
    weight->set_row_sparse_grad(
        context::cpu(), row_sparse_array::from_rows(values, rows, {vocabulary, width}).value());
    if (!seen.check((*made)->step(1), who + " step"))
      return;
    const auto now = weight->data().to_vector<float>();
    for (std::int64_t row = 0; row < vocabulary; ++row) {
      float expected = 1.0f;
      if (row == 5)
        expected = 1.0f - workers * (workers + 1) / 2.0f;
      else if (row < static_cast<std::int64_t>(workers))
        expected = 1.0f - static_cast<float>(row + 1);
      for (std::int64_t c = 0; c < width; ++c)
        if (now[static_cast<std::size_t>(row * width + c)] != expected)
          seen.add(who + ": row " + std::to_string(row) + " holds " +
                   std::to_string(now[static_cast<std::size_t>(row * width + c)]) + ", expected " +
                   std::to_string(expected));
    }
  });
  BOOST_TEST(seen.seen.empty(), seen.report());
}

BOOST_AUTO_TEST_CASE(a_sparse_embedding_pulls_only_the_rows_of_each_batch) {
  // sparse_embedding on dist_sync: every row starts at 1; worker r's batches use rows r and 5;
  // loss = sum(out), so a used row's gradient is its number of uses. After a step (sgd, rate 1)
  // the next forward reads row r = 0 and row 5 = -1; a row this worker never asked for keeps the
  // value it had in the worker's copy (1), though the servers moved it (the other worker's row).
  constexpr std::uint32_t workers = 2;
  in_process_job job{"dist_sync", workers, 2, 2, 20};
  problems seen;
  temp_dir files;
  job.run([&](std::uint32_t rank, kvstore& kv) {
    auto table = std::make_shared<nn::sparse_embedding>(vocabulary, width, nullptr, "table_");
    table->initialize(std::make_shared<nn::constant>(1.0));
    auto& weight = *table->weight();
    const std::string who = "worker " + std::to_string(rank);
    if (auto refused =
            trainer::create({table->weight()}, "sgd", {{"learning_rate", 1.0}}, &kv, false);
        !says(refused, "Cannot set update_on_kvstore=False when sparse weights are present"))
      seen.add(who + ": update_on_kvstore=false was not refused as MXNet refuses it");
    auto made =
        trainer::create({table->weight()}, "sgd", {{"learning_rate", 1.0}}, &kv, std::nullopt);
    if (!made) {
      seen.add(who + ": create: " + made.error().to_string());
      return;
    }
    if (auto second = trainer::create({table->weight()}, "sgd", {}, &kv, std::nullopt);
        !says(second, "already belongs to another trainer"))
      seen.add(who + ": a second trainer for a row_sparse weight was not refused");
    const auto indices = ndarray::from_values({static_cast<float>(rank), 5}, {2});
    const auto other = static_cast<std::size_t>(1 - rank);
    for (int step = 0; step < 2; ++step) {
      ndarray out;
      try {
        autograd::record_scope record;
        out = (*table)(indices);
        out = nd::sum(out);
      } catch (const exception& e) {
        seen.add(who + " forward: " + e.what());
        return;
      }
      const auto copy = weight.data().to_vector<float>();
      const float row_r = step == 0 ? 1.0f : 0.0f;
      const float row_5 = step == 0 ? 1.0f : -1.0f;
      for (std::int64_t c = 0; c < width; ++c) {
        if (copy[rank * width + c] != row_r || copy[5 * width + c] != row_5 ||
            copy[other * width + c] != 1.0f)
          seen.add(who + " step " + std::to_string(step) + ": rows " + std::to_string(rank) +
                   ", 5 and " + std::to_string(other) + " hold " +
                   std::to_string(copy[rank * width + c]) + ", " +
                   std::to_string(copy[5 * width + c]) + ", " +
                   std::to_string(copy[other * width + c]));
      }
      out.backward();
      if (weight.row_sparse_grad().indices() !=
          std::vector<std::int64_t>{static_cast<std::int64_t>(rank), 5})
        seen.add(who + ": the gradient holds other rows than the batch's");
      if (!seen.check((*made)->step(1), who + " step " + std::to_string(step)))
        return;
    }
    // Saving writes the store's values, not the worker's stale copy: after two steps row r and
    // the other worker's row hold -1, row 5 holds -3. Loading into a weight the store holds is
    // refused.
    const auto file = (files.path() / ("table" + std::to_string(rank) + ".params")).string();
    if (!seen.check(table->save_parameters(file), who + " save_parameters"))
      return;
    nn::sparse_embedding reread(vocabulary, width, nullptr, "table_");
    reread.initialize();
    if (!seen.check(reread.load_parameters(file), who + " load_parameters"))
      return;
    const auto saved = reread.weight()->data().to_vector<float>();
    for (std::size_t row : {static_cast<std::size_t>(rank), other, std::size_t{5}})
      if (saved[row * width] != (row == 5 ? -3.0f : -1.0f))
        seen.add(who + ": the saved row " + std::to_string(row) + " holds " +
                 std::to_string(saved[row * width]));
    if (auto refused = table->load_parameters(file); !says(refused, "load the parameters before"))
      seen.add(who + ": loading into a weight the store holds was not refused");
  });
  BOOST_TEST(seen.seen.empty(), seen.report());
}

BOOST_AUTO_TEST_CASE(a_sparse_embedding_on_one_machine_trains_as_a_dense_one) {
  // One context, `local`: the store exists (a row_sparse weight lives there) and runs the
  // trainer's optimizer; with plain sgd the result equals a dense embedding's, bit for bit.
  auto run = [](bool sparse) {
    auto table = sparse ? std::shared_ptr<nn::embedding>(std::make_shared<nn::sparse_embedding>(
                              vocabulary, width, nullptr, "t_"))
                        : std::make_shared<nn::embedding>(vocabulary, width, false, nullptr, "t_");
    table->initialize(std::make_shared<nn::xavier>(), nn::default_contexts, 4);
    auto made = trainer::create({table->weight()}, "sgd", {{"learning_rate", 0.25}}, "local");
    BOOST_TEST_REQUIRE(made.has_value(), (made ? "" : made.error().to_string()));
    BOOST_TEST(((*made)->store() != nullptr) == sparse);
    std::vector<std::vector<std::uint32_t>> seen;
    for (int step = 0; step < 3; ++step) {
      auto [x, y] = batch(step, 0, 0, context::cpu());
      ndarray loss;
      {
        autograd::record_scope record;
        loss = nd::sum(nd::square((*table)(x)));
      }
      seen.push_back(bits(loss));
      loss.backward();
      auto stepped = (*made)->step(1);
      BOOST_TEST_REQUIRE(stepped.has_value(), (stepped ? "" : stepped.error().to_string()));
    }
    return seen;
  };
  BOOST_TEST(run(true) == run(false));

  // No store for a row_sparse weight: refused, naming the parameter.
  auto table = std::make_shared<nn::sparse_embedding>(vocabulary, width, nullptr, "lonely_");
  table->initialize();
  auto refused = trainer::create({table->weight()}, "sgd", {}, "none");
  BOOST_TEST(says(refused, "lonely_weight"));
}

BOOST_AUTO_TEST_SUITE_END()
