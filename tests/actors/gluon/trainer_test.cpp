// gluon's Trainer against MXNet's semantics: the Gluon-on-dist_sync closed form (gradients summed
// over workers and contexts), local reduction over contexts, rescaling by the batch size, the
// update_on_kvstore choices and misuse errors, the scheduler, and save/load of optimizer states
// continuing bit for bit.

#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/gluon/trainer.hpp"
#include "engine/autograd.hpp"
#include "engine/dispatch.hpp"
#include "engine/nd.hpp"
#include "engine/nn/block.hpp"
#include "engine/nn/initializer.hpp"
#include "tests/actors/kvstore/in_process_job.hpp"
#include "tests/engine/lane_threads.hpp"
#include "tests/temp_dir.hpp"

using namespace troupe;
using troupe::testing::in_process_job;
using troupe::testing::in_process_options;
using troupe::testing::problems;
using troupe::testing::temp_dir;

namespace {

std::vector<context> cpus(int count) {
  std::vector<context> contexts;
  for (int i = 0; i < count; ++i)
    contexts.push_back(context::cpu(i));
  return contexts;
}

/// A parameter of `shape` on `contexts`, every element `value` (names avoid "bias" and the other
/// suffixes the initializer treats specially).
std::shared_ptr<nn::parameter> make_param(const std::string& name, shape_vector shape,
                                          const std::vector<context>& contexts, double value,
                                          grad_req req = grad_req::write) {
  auto param = std::make_shared<nn::parameter>(name, std::move(shape), req);
  param->initialize(std::make_shared<nn::constant>(value), contexts, 0);
  return param;
}

/// The first element of `array` that is not `expected`, described; empty when all are.
std::string mismatch(const ndarray& array, float expected) {
  auto values = array.to_vector<float>();
  for (std::size_t i = 0; i < values.size(); ++i)
    if (values[i] != expected)
      return "element " + std::to_string(i) + " of " + array.ctx().to_string() + " is " +
             std::to_string(values[i]) + ", expected " + std::to_string(expected);
  return {};
}

/// Every copy of `param` holds `expected` exactly.
bool all_copies_equal(nn::parameter& param, float expected) {
  for (auto& copy : param.list_data()) {
    auto found = mismatch(copy, expected);
    BOOST_TEST(found.empty(), param.name() << ": " << found);
    if (!found.empty())
      return false;
  }
  return true;
}

void fill_grads(nn::parameter& param, const std::vector<double>& per_context) {
  auto& grads = param.list_grad();
  BOOST_TEST_REQUIRE(grads.size() == per_context.size());
  for (std::size_t c = 0; c < grads.size(); ++c)
    grads[c].fill(per_context[c]);
}

std::unique_ptr<trainer> make_trainer(nn::parameter_list params, std::string_view opt,
                                      const optimizer_params& hyper, std::string_view type,
                                      std::optional<bool> update_on_kvstore = std::nullopt) {
  auto made = trainer::create(std::move(params), opt, hyper, type, update_on_kvstore);
  BOOST_TEST_REQUIRE(made.has_value(), (made ? "" : made.error().to_string()));
  return std::move(*made);
}

bool mentions(const status& outcome, const std::string& fragment) {
  return !outcome && outcome.error().message().find(fragment) != std::string::npos;
}

/// A `local` store that says it cannot run the optimizer: the update_on_kvstore table's last
/// rule, which no store of troupe's exercises.
class incapable_store final : public kvstore {
public:
  incapable_store() : inner_(kvstore::create("local").value()) {}
  using kvstore::init;
  using kvstore::pull;
  using kvstore::push;
  using kvstore::set_optimizer;
  const std::string& type() const noexcept override { return inner_->type(); }
  int rank() const noexcept override { return 0; }
  int num_workers() const noexcept override { return 1; }
  status init(std::span<const kv_key> keys, std::span<const ndarray> values) override {
    return inner_->init(keys, values);
  }
  status push(std::span<const kv_key> keys, std::span<const ndarray> values,
              int priority) override {
    return inner_->push(keys, values, priority);
  }
  status pull(std::span<const kv_key> keys, std::span<ndarray> outputs, int priority) override {
    return inner_->pull(keys, outputs, priority);
  }
  status set_optimizer(std::unique_ptr<optimizer>) override {
    return error{errc::not_supported, "incapable_store runs no optimizer"};
  }
  status set_updater(updater_function) override {
    return error{errc::not_supported, "incapable_store runs no updater"};
  }
  bool is_capable(std::string_view) const noexcept override { return false; }
  status save_optimizer_states(const std::string&, bool) const override {
    return error{errc::not_supported, "no states"};
  }
  status load_optimizer_states(const std::string&) override {
    return error{errc::not_supported, "no states"};
  }

private:
  std::unique_ptr<kvstore> inner_;
};

/// MXNet's Gluon-on-dist_sync check (tests/nightly/dist_sync_kvstore.py, test_gluon_trainer_*):
/// w starts at 1, every context of worker r has gradient r + 1, sgd with rate 1 and step(1):
/// after s steps every copy on every worker is 1 - s * contexts * n(n+1)/2. A frozen parameter
/// (grad_req null) stays as it was.
void check_gluon_dist_sync(std::uint32_t workers, int contexts, std::optional<bool> on_kvstore) {
  // A bigarray bound of 1000 splits `big` (2100 elements) over both servers.
  in_process_job job{"dist_sync", workers, 2, 2, 1000};
  problems seen;
  job.run([&](std::uint32_t rank, kvstore& kv) {
    auto w = make_param("w", {5}, cpus(contexts), 1.0);
    auto big = make_param("big", {3, 700}, cpus(contexts), 1.0);
    auto frozen = make_param("frozen", {2}, cpus(contexts), 7.0, grad_req::null);
    auto made = trainer::create({w, frozen, big}, "sgd", {{"learning_rate", 1.0}}, &kv, on_kvstore);
    if (!made) {
      seen.add("create: " + made.error().to_string());
      return;
    }
    auto& t = **made;
    const bool expected_on_kvstore = on_kvstore.value_or(true);
    if (t.update_on_kvstore() != expected_on_kvstore)
      seen.add("update_on_kvstore is " + std::to_string(t.update_on_kvstore()));
    const std::string who = "worker " + std::to_string(rank);
    for (int step = 1; step <= 2; ++step) {
      for (auto* param : {w.get(), big.get()})
        for (auto& grad : param->list_grad())
          grad.fill(rank + 1.0);
      if (!seen.check(t.step(1), who + " step " + std::to_string(step)))
        return;
      const auto expected =
          static_cast<float>(1.0 - step * contexts * workers * (workers + 1) / 2.0);
      for (auto* param : {w.get(), big.get()})
        for (auto& copy : param->list_data())
          if (auto found = mismatch(copy, expected); !found.empty())
            seen.add(who + " step " + std::to_string(step) + " " + param->name() + ": " + found);
      for (auto& copy : frozen->list_data())
        if (auto found = mismatch(copy, 7.0f); !found.empty())
          seen.add(who + " frozen: " + found);
    }
  });
  BOOST_TEST(seen.seen.empty(), "n=" << workers << " contexts=" << contexts
                                     << " update_on_kvstore=" << on_kvstore.value_or(true) << "\n"
                                     << seen.report());
}

/// Gradient of parameter `p` on context `c` of worker `rank` at step `s`: reproducible, and
/// different for every (p, c, rank, s).
ndarray gradient_at(const shape_vector& shape, int p, int c, int rank, int s, context ctx) {
  return ndarray::random_uniform(
      -1.0, 1.0, shape, static_cast<std::uint64_t>(1000 * s + 100 * rank + 10 * p + c), ctx);
}

/// Runs steps [first, last) of a fixed training run on `params` (batch size 3); the first
/// failing step's status. Safe on worker threads (no Boost.Test inside).
status run_steps(trainer& t, nn::parameter_list& params, int first, int last, int rank = 0) {
  for (int s = first; s < last; ++s) {
    for (std::size_t p = 0; p < params.size(); ++p) {
      auto& grads = params[p]->list_grad();
      for (std::size_t c = 0; c < grads.size(); ++c)
        gradient_at(params[p]->shape(), static_cast<int>(p), static_cast<int>(c), rank, s,
                    grads[c].ctx())
            .copy_to(grads[c]);
    }
    if (auto stepped = t.step(3); !stepped)
      return stepped;
  }
  return ok();
}

bool refused_with(const status& outcome, errc code) {
  return !outcome && outcome.error().code() == code;
}

nn::parameter_list seeded_params(int contexts) {
  nn::parameter_list params{make_param("w", {4, 3}, cpus(contexts), 0.0),
                            make_param("v", {7}, cpus(contexts), 0.0)};
  params[0]->set_data(ndarray::random_uniform(-1, 1, {4, 3}, 11));
  params[1]->set_data(ndarray::random_uniform(-1, 1, {7}, 12));
  return params;
}

std::vector<std::vector<float>> snapshot(const nn::parameter_list& params) {
  std::vector<std::vector<float>> values;
  for (const auto& param : params)
    for (auto& copy : param->list_data())
      values.push_back(copy.to_vector<float>());
  return values;
}

/// The parameters of a 12-16-8-4 MLP after `steps` steps of sgd (momentum 0.9) on a dist_sync job
/// of one worker (its lanes shared with no other worker: the overlap runs); bit patterns of every
/// value. Forward, backward and the trainer's step run as the engine installed when called
/// schedules them.
std::vector<std::vector<std::uint32_t>> mlp_after_steps(int steps, std::optional<bool> on_kvstore) {
  in_process_job job{"dist_sync", 1, 2, 2, 100};
  problems seen;
  std::vector<std::vector<std::uint32_t>> bits;
  job.run([&](std::uint32_t rank, kvstore& kv) {
    auto net = std::make_shared<nn::sequential>();
    net->add(std::make_shared<nn::dense>(16, "relu", true, 12, true, nullptr, "first_"));
    net->add(std::make_shared<nn::dense>(8, "relu", true, 16, true, nullptr, "second_"));
    net->add(std::make_shared<nn::dense>(4, "", true, 8, true, nullptr, "third_"));
    net->initialize(std::make_shared<nn::xavier>(), nn::default_contexts, 7);
    auto made = trainer::create(net->collect_params(), "sgd",
                                {{"learning_rate", 0.1}, {"momentum", 0.9}}, &kv, on_kvstore);
    if (!made) {
      seen.add("create: " + made.error().to_string());
      return;
    }
    for (int step = 0; step < steps; ++step) {
      const auto seed = static_cast<std::uint64_t>(1000 * rank + step);
      auto x = ndarray::random_uniform(-1, 1, {6, 12}, seed);
      std::vector<float> labels;
      for (int i = 0; i < 6; ++i)
        labels.push_back(static_cast<float>((i + step + static_cast<int>(rank)) % 4));
      ndarray loss;
      {
        autograd::record_scope record;
        loss = nd::softmax_cross_entropy((*net)(x), ndarray::from_values(labels, {6}));
      }
      autograd::backward(loss);
      if (!seen.check((**made).step(12),
                      "worker " + std::to_string(rank) + " step " + std::to_string(step)))
        return;
    }
    if (rank != 0)
      return;
    for (const auto& param : net->collect_params()) {
      const auto values = param->list_data().front().to_vector<float>();
      std::vector<std::uint32_t> pattern(values.size());
      std::memcpy(pattern.data(), values.data(), values.size() * sizeof(float));
      bits.push_back(std::move(pattern));
    }
  });
  BOOST_TEST(seen.seen.empty(), seen.report());
  return bits;
}
} // namespace

BOOST_AUTO_TEST_SUITE(trainer_as_gluon)

BOOST_AUTO_TEST_CASE(gluon_on_dist_sync_sums_the_gradients_of_every_worker) {
  for (std::uint32_t workers : {2u, 3u})
    for (std::optional<bool> on_kvstore :
         {std::optional<bool>{true}, std::optional<bool>{false}, std::optional<bool>{}})
      check_gluon_dist_sync(workers, 1, on_kvstore);
}

BOOST_AUTO_TEST_CASE(gluon_on_dist_sync_sums_over_the_contexts_of_each_worker_too) {
  check_gluon_dist_sync(2, 2, true);
  check_gluon_dist_sync(2, 2, false);
}

BOOST_AUTO_TEST_CASE(every_worker_starts_from_rank_zeros_values) {
  in_process_job job{"dist_sync", 3, 1};
  problems seen;
  job.run([&](std::uint32_t rank, kvstore& kv) {
    // Each worker initialises differently; the first step pulls rank 0's values first.
    auto w = make_param("w", {3}, cpus(1), 10.0 + rank);
    auto made = trainer::create({w}, "sgd", {{"learning_rate", 1.0}}, &kv, false);
    if (!made) {
      seen.add(made.error().to_string());
      return;
    }
    w->list_grad()[0].fill(0.0);
    if (!seen.check((*made)->step(1), "step"))
      return;
    if (auto found = mismatch(w->data(), 10.0f); !found.empty())
      seen.add("worker " + std::to_string(rank) + ": " + found);
  });
  BOOST_TEST(seen.seen.empty(), seen.report());
}

BOOST_AUTO_TEST_CASE(a_changed_batch_size_on_dist_with_update_on_kvstore_warns_once_per_change) {
  in_process_job job{"dist_sync", 2, 1};
  problems seen;
  std::vector<std::vector<std::string>> warnings(2);
  job.run([&](std::uint32_t rank, kvstore& kv) {
    auto w = make_param("w", {3}, cpus(1), 1.0);
    auto made = trainer::create({w}, "sgd", {{"learning_rate", 1.0}}, &kv, true);
    if (!made) {
      seen.add(made.error().to_string());
      return;
    }
    auto& t = **made;
    t.set_warning_handler([&, rank](const std::string& text) { warnings[rank].push_back(text); });
    // The servers keep the first step's rescale_grad (1/2): every step subtracts 2 * 1/2.
    float expected = 1.0f;
    for (std::int64_t batch : {2, 4, 4, 2, 8}) {
      w->list_grad()[0].fill(1.0);
      if (!seen.check(t.step(batch), "step"))
        return;
      expected -= 1.0f;
      if (auto found = mismatch(w->data(), expected); !found.empty())
        seen.add("batch " + std::to_string(batch) + ": " + found);
    }
    if (!refused_with(t.set_learning_rate(0.5), errc::not_supported))
      seen.add("set_learning_rate on dist + update_on_kvstore is not refused");
    if (!refused_with(t.set_lr_scheduler(nullptr), errc::not_supported))
      seen.add("set_lr_scheduler on dist + update_on_kvstore is not refused");
  });
  BOOST_TEST(seen.seen.empty(), seen.report());
  for (auto& list : warnings) {
    // 2 -> 4 warns, 4 -> 4 does not, 4 -> 2 is the servers' value, 2 -> 8 warns.
    BOOST_TEST(list.size() == 2u);
    if (!list.empty())
      BOOST_TEST(list[0].find("batch_size") != std::string::npos, list[0]);
  }
}

BOOST_AUTO_TEST_CASE(without_update_on_kvstore_a_changed_batch_size_rescales_at_once_on_dist) {
  in_process_job job{"dist_sync", 2, 1};
  problems seen;
  job.run([&](std::uint32_t, kvstore& kv) {
    auto w = make_param("w", {3}, cpus(1), 1.0);
    auto made = trainer::create({w}, "sgd", {{"learning_rate", 1.0}}, &kv, false);
    if (!made) {
      seen.add(made.error().to_string());
      return;
    }
    (*made)->set_warning_handler([&](const std::string& text) { seen.add("warned: " + text); });
    float expected = 1.0f;
    for (std::int64_t batch : {2, 4}) {
      w->list_grad()[0].fill(1.0);
      if (!seen.check((*made)->step(batch), "step"))
        return;
      expected -= 2.0f / static_cast<float>(batch); // the sum over 2 workers, rescaled
      if (auto found = mismatch(w->data(), expected); !found.empty())
        seen.add(found);
    }
    if (!(*made)->set_learning_rate(0.5))
      seen.add("set_learning_rate refused without update_on_kvstore");
  });
  BOOST_TEST(seen.seen.empty(), seen.report());
}

BOOST_AUTO_TEST_CASE(local_with_two_contexts_sums_their_gradients_and_keeps_the_copies_equal) {
  for (std::string_view type : {"local", "device"}) {
    for (std::optional<bool> on_kvstore :
         {std::optional<bool>{true}, std::optional<bool>{false}, std::optional<bool>{}}) {
      auto w = make_param("w", {2, 3}, cpus(2), 1.0);
      auto t = make_trainer({w}, "sgd", {{"learning_rate", 0.5}}, type, on_kvstore);
      BOOST_TEST(t->store() != nullptr);
      BOOST_TEST(t->update_on_kvstore() == on_kvstore.value_or(true));
      fill_grads(*w, {1.0, 3.0});
      BOOST_TEST_REQUIRE(t->step(1).has_value());
      BOOST_TEST(all_copies_equal(*w, 1.0f - 0.5f * 4.0f), type << " " << on_kvstore.value_or(2));
      fill_grads(*w, {-2.0, 0.0});
      BOOST_TEST_REQUIRE(t->step(1).has_value());
      BOOST_TEST(all_copies_equal(*w, -1.0f + 0.5f * 2.0f), type << " " << on_kvstore.value_or(2));
    }
  }
}

BOOST_AUTO_TEST_CASE(step_divides_the_gradient_by_the_batch_size_times_rescale_grad) {
  for (std::string_view type : {"none", "local"}) {
    for (bool on_kvstore : {true, false}) {
      const int contexts = type == "none" ? 1 : 2;
      auto w = make_param("w", {4}, cpus(contexts), 1.0);
      auto t = make_trainer({w}, "sgd", {{"learning_rate", 1.0}}, type, on_kvstore);
      fill_grads(*w, std::vector<double>(contexts, 8.0));
      BOOST_TEST_REQUIRE(t->step(4).has_value());
      // Summed over the contexts, then divided by the batch.
      BOOST_TEST(all_copies_equal(*w, 1.0f - 8.0f * contexts / 4.0f));
      BOOST_TEST(t->optimizer().rescale_grad() == 0.25);
      fill_grads(*w, std::vector<double>(contexts, 8.0));
      BOOST_TEST_REQUIRE(t->step(8).has_value());
      BOOST_TEST(all_copies_equal(*w, 1.0f - 8.0f * contexts * (1.0f / 4 + 1.0f / 8)));
    }
  }
  // The caller's rescale_grad is the scale: rescale_grad = scale / batch_size.
  auto w = make_param("w", {4}, cpus(1), 1.0);
  auto t = make_trainer({w}, "sgd", {{"learning_rate", 1.0}, {"rescale_grad", 0.5}}, "device");
  fill_grads(*w, {8.0});
  BOOST_TEST_REQUIRE(t->step(2).has_value());
  BOOST_TEST(all_copies_equal(*w, 1.0f - 8.0f * 0.5f / 2.0f));
  BOOST_TEST(mentions(t->step(0), "batch_size 0"));
}

BOOST_AUTO_TEST_CASE(a_single_context_with_a_non_dist_type_has_no_kvstore) {
  for (std::string_view type : {"device", "local", "", "none"}) {
    for (std::optional<bool> on_kvstore : {std::optional<bool>{true}, std::optional<bool>{}}) {
      auto w = make_param("w", {3}, cpus(1), 1.0);
      auto t = make_trainer({w}, "sgd", {{"learning_rate", 0.1}}, type, on_kvstore);
      // MXNet: no store for one device on one machine, and then no update on it either.
      BOOST_TEST(t->store() == nullptr);
      BOOST_TEST(!t->update_on_kvstore());
      fill_grads(*w, {2.0});
      BOOST_TEST_REQUIRE(t->step(1).has_value());
      BOOST_TEST(all_copies_equal(*w, 1.0f - 0.1f * 2.0f));
      // allreduce_grads has nothing to reduce; update() updates.
      BOOST_TEST(t->allreduce_grads().has_value());
      BOOST_TEST(t->update(2).has_value());
      BOOST_TEST(all_copies_equal(*w, 1.0f - 0.1f * 2.0f - 0.1f * 1.0f));
    }
  }
  // No store, several contexts: each context updates from its own gradient, unreduced.
  auto w = make_param("w", {3}, cpus(2), 1.0);
  auto t = make_trainer({w}, "sgd", {{"learning_rate", 1.0}}, "none");
  fill_grads(*w, {1.0, 2.0});
  BOOST_TEST_REQUIRE(t->step(1).has_value());
  BOOST_TEST(mismatch(w->data(context::cpu(0)), 0.0f).empty());
  BOOST_TEST(mismatch(w->data(context::cpu(1)), -1.0f).empty());
}

BOOST_AUTO_TEST_CASE(update_on_kvstore_follows_mxnets_table_and_its_errors) {
  // dist_async forces true, and a caller's false is an error.
  {
    in_process_job job{"dist_async", 1, 1};
    auto w = make_param("w", {3}, cpus(1), 1.0);
    auto refused = trainer::create({w}, "sgd", {}, job.workers[0].get(), false);
    BOOST_TEST_REQUIRE(!refused.has_value());
    BOOST_TEST(refused.error().message().find("async") != std::string::npos,
               refused.error().message());
    auto forced = trainer::create({w}, "sgd", {}, job.workers[0].get(), std::nullopt);
    BOOST_TEST_REQUIRE(forced.has_value());
    BOOST_TEST((*forced)->update_on_kvstore());
  }
  // A store that cannot run the optimizer: a caller's true is an error, none falls back to false.
  {
    auto w = make_param("w", {3}, cpus(2), 1.0);
    auto store = std::make_shared<incapable_store>();
    auto refused = trainer::create({w}, "sgd", {}, store, true);
    BOOST_TEST_REQUIRE(!refused.has_value());
    BOOST_TEST(refused.error().message().find("update_on_kvstore=False") != std::string::npos);
    auto fallback = trainer::create({w}, "sgd", {{"learning_rate", 1.0}}, store, std::nullopt);
    BOOST_TEST_REQUIRE(fallback.has_value());
    BOOST_TEST(!(*fallback)->update_on_kvstore());
    fill_grads(*w, {1.0, 2.0});
    BOOST_TEST_REQUIRE((*fallback)->step(1).has_value());
    BOOST_TEST(all_copies_equal(*w, -2.0f));
  }
  // An existing store is used even for one context.
  {
    auto w = make_param("w", {3}, cpus(1), 1.0);
    std::shared_ptr<kvstore> store = kvstore::create("local").value();
    auto t = trainer::create({w}, "sgd", {}, store, std::nullopt).value();
    BOOST_TEST(t->store() == store.get());
    BOOST_TEST(t->update_on_kvstore());
    auto none = trainer::create({w}, "sgd", {}, static_cast<kvstore*>(nullptr), true).value();
    BOOST_TEST(none->store() == nullptr);
  }
  // `local` with a parameter of more than 16M elements keeps the optimizer on the workers,
  // unless the caller says otherwise.
  {
    auto huge = make_param("huge", {16 * 1024 * 1024 + 1}, cpus(2), 0.0);
    BOOST_TEST(!make_trainer({huge}, "sgd", {}, "local")->update_on_kvstore());
    BOOST_TEST(make_trainer({huge}, "sgd", {}, "local", true)->update_on_kvstore());
    BOOST_TEST(make_trainer({huge}, "sgd", {}, "device")->update_on_kvstore());
  }
  // update() and allreduce_grads() are refused when the store updates the weights.
  {
    auto w = make_param("w", {3}, cpus(2), 1.0);
    auto t = make_trainer({w}, "sgd", {}, "local", true);
    auto update = t->update(1);
    BOOST_TEST_REQUIRE(!update.has_value());
    BOOST_TEST(update.error().code() == errc::invalid_argument);
    BOOST_TEST(mentions(update, "update() when parameters are updated on kvstore"));
    BOOST_TEST(mentions(t->allreduce_grads(), "allreduce_grads() when parameters are updated"));
  }
  // Without update_on_kvstore, allreduce_grads then update is step.
  {
    auto w = make_param("w", {3}, cpus(2), 1.0);
    auto t = make_trainer({w}, "sgd", {{"learning_rate", 1.0}}, "local", false);
    fill_grads(*w, {1.0, 2.0});
    BOOST_TEST_REQUIRE(t->allreduce_grads().has_value());
    for (auto& grad : w->list_grad())
      BOOST_TEST(mismatch(grad, 3.0f).empty());
    BOOST_TEST_REQUIRE(t->update(3).has_value());
    BOOST_TEST(all_copies_equal(*w, 0.0f));
  }
}

BOOST_AUTO_TEST_CASE(bad_parameters_stores_and_optimizers_are_errors_naming_them) {
  auto on_one = make_param("first", {3}, cpus(1), 1.0);
  auto on_two = make_param("second", {3}, cpus(2), 1.0);
  auto mixed = trainer::create({on_one, on_two}, "sgd");
  BOOST_TEST_REQUIRE(!mixed.has_value());
  BOOST_TEST(mixed.error().message().find("second") != std::string::npos);
  auto fresh = std::make_shared<nn::parameter>("fresh", shape_vector{3});
  BOOST_TEST(trainer::create({fresh}, "sgd").error().message().find("fresh") != std::string::npos);
  BOOST_TEST(!trainer::create({}, "sgd").has_value());
  BOOST_TEST(!trainer::create({on_one, on_one}, "sgd").has_value());
  BOOST_TEST(trainer::create({on_one}, "sgdd").error().message().find("sgdd") != std::string::npos);
  // A misspelt store type is an error even where no store would be made.
  BOOST_TEST(trainer::create({on_one}, "sgd", {}, "lcoal").error().message().find("lcoal") !=
             std::string::npos);
  auto scaled = make_param("scaled", {3}, cpus(1), 1.0);
  scaled->lr_mult = 0.5;
  auto refused = trainer::create({scaled}, "sgd");
  BOOST_TEST_REQUIRE(!refused.has_value());
  BOOST_TEST(refused.error().code() == errc::not_supported);
}

BOOST_AUTO_TEST_CASE(a_scheduler_sets_the_rate_of_each_update_from_the_update_count) {
  for (std::string_view type : {"none", "local"}) {
    for (bool on_kvstore : {true, false}) {
      const int contexts = type == "none" ? 1 : 2;
      auto w = make_param("w", {2}, cpus(contexts), 0.0);
      auto t = make_trainer({w}, "sgd", {{"learning_rate", 1.0}}, type, on_kvstore);
      // The rate halves every 2 updates: MXNet's FactorScheduler(step=2, factor=0.5).
      BOOST_TEST_REQUIRE(
          t->set_lr_scheduler(make_factor_scheduler(2, 0.5, 1e-8, 1.0).value()).has_value());
      auto reference = make_factor_scheduler(2, 0.5, 1e-8, 1.0).value();
      double expected = 0.0;
      for (int update = 1; update <= 6; ++update) {
        fill_grads(*w, std::vector<double>(contexts, 1.0 / contexts));
        BOOST_TEST_REQUIRE(t->step(1).has_value());
        expected -= (*reference)(update);
        BOOST_TEST(all_copies_equal(*w, static_cast<float>(expected)),
                   type << " " << on_kvstore << " update " << update);
      }
      BOOST_TEST(t->learning_rate() == (*reference)(6));
      BOOST_TEST(mentions(t->set_learning_rate(0.1), "lr_scheduler"));
      BOOST_TEST_REQUIRE(t->set_lr_scheduler(nullptr).has_value());
      BOOST_TEST_REQUIRE(t->set_learning_rate(0.25).has_value());
      BOOST_TEST(t->learning_rate() == 0.25);
      fill_grads(*w, std::vector<double>(contexts, 1.0 / contexts));
      BOOST_TEST_REQUIRE(t->step(1).has_value());
      BOOST_TEST(all_copies_equal(*w, static_cast<float>(expected - 0.25)));
    }
  }
}

BOOST_AUTO_TEST_CASE(training_continued_after_load_states_is_bit_identical_to_uninterrupted) {
  struct setup {
    std::string_view type;
    int contexts;
    std::optional<bool> on_kvstore;
  };
  const std::vector<std::pair<std::string, optimizer_params>> optimizers{
      {"sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}, {"wd", 0.01}}},
      {"adam", {{"learning_rate", 0.05}}}};
  for (const auto& [name, hyper] : optimizers) {
    for (auto [type, contexts, on_kvstore] :
         {setup{"device", 1, std::nullopt}, setup{"local", 2, true}, setup{"local", 2, false},
          setup{"device", 2, std::nullopt}}) {
      const std::string what = name + " on " + std::string(type) + " x" + std::to_string(contexts) +
                               " " + std::to_string(on_kvstore.value_or(true));
      temp_dir dir;
      const auto file = (dir / "trainer.states").string();

      auto straight = seeded_params(contexts);
      auto a = make_trainer(straight, name, hyper, type, on_kvstore);
      BOOST_TEST_REQUIRE(run_steps(*a, straight, 0, 3).has_value(), what);
      BOOST_TEST_REQUIRE(a->save_states(file).has_value(), what);
      auto at_save = snapshot(straight);
      BOOST_TEST_REQUIRE(run_steps(*a, straight, 3, 7).has_value(), what);

      auto resumed = seeded_params(contexts);
      for (std::size_t p = 0; p < resumed.size(); ++p)
        resumed[p]->set_data(ndarray::from_values(at_save[p * contexts], resumed[p]->shape()));
      auto b = make_trainer(resumed, name, hyper, type, on_kvstore);
      BOOST_TEST_REQUIRE(b->load_states(file).has_value(), what);
      BOOST_TEST_REQUIRE(run_steps(*b, resumed, 3, 7).has_value(), what);
      BOOST_TEST((snapshot(resumed) == snapshot(straight)), what);

      // Without the states the run differs: the test would notice a load that did nothing.
      auto forgetful = seeded_params(contexts);
      for (std::size_t p = 0; p < forgetful.size(); ++p)
        forgetful[p]->set_data(ndarray::from_values(at_save[p * contexts], forgetful[p]->shape()));
      auto c = make_trainer(forgetful, name, hyper, type, on_kvstore);
      BOOST_TEST_REQUIRE(run_steps(*c, forgetful, 3, 7).has_value(), what);
      BOOST_TEST((snapshot(forgetful) != snapshot(straight)), what);
    }
  }
}

BOOST_AUTO_TEST_CASE(load_states_errors_name_the_file) {
  temp_dir dir;
  auto w = make_param("w", {3}, cpus(1), 1.0);
  auto t = make_trainer({w}, "sgd", {}, "device");
  auto missing = t->load_states((dir / "missing.states").string());
  BOOST_TEST_REQUIRE(!missing.has_value());
  BOOST_TEST(missing.error().message().find("missing.states") != std::string::npos);
  auto garbage = dir.write("garbage.states", "not a state file");
  auto corrupt = t->load_states(garbage.string());
  BOOST_TEST_REQUIRE(!corrupt.has_value());
  BOOST_TEST(corrupt.error().message().find("garbage.states") != std::string::npos);
  auto unwritable = t->save_states((dir / "no" / "such" / "dir").string());
  BOOST_TEST_REQUIRE(!unwritable.has_value());
  BOOST_TEST(unwritable.error().message().find("no/such/dir") != std::string::npos);
}

BOOST_AUTO_TEST_CASE(dist_sync_with_update_on_kvstore_saves_and_loads_the_servers_states) {
  temp_dir dir;
  // The servers write under their checkpoint directory: the trainer names the file there.
  const std::string file = "servers.states";
  in_process_options servers;
  servers.checkpoint_dir = dir.path();
  const std::uint32_t workers = 2;
  const optimizer_params hyper{{"learning_rate", 0.05}};
  std::vector<std::vector<std::vector<float>>> straight(workers), at_save(workers),
      resumed(workers);
  problems seen;
  {
    in_process_job job{"dist_sync", workers, 2, servers};
    job.run([&](std::uint32_t rank, kvstore& kv) {
      auto params = seeded_params(1);
      auto t = trainer::create(params, "adam", hyper, &kv, true);
      if (!t) {
        seen.add(t.error().to_string());
        return;
      }
      const int r = static_cast<int>(rank);
      if (!seen.check(run_steps(**t, params, 0, 3, r), "steps 0-2"))
        return;
      // One worker saves; the barrier keeps the others from stepping before it has.
      if (rank == 0)
        seen.check((*t)->save_states(file), "save_states");
      seen.check(kv.barrier(), "barrier");
      at_save[rank] = snapshot(params);
      seen.check(run_steps(**t, params, 3, 6, r), "steps 3-5");
      straight[rank] = snapshot(params);
    });
  }
  {
    in_process_job job{"dist_sync", workers, 2, servers};
    job.run([&](std::uint32_t rank, kvstore& kv) {
      auto params = seeded_params(1);
      for (std::size_t p = 0; p < params.size(); ++p)
        params[p]->set_data(ndarray::from_values(at_save[rank][p], params[p]->shape()));
      auto t = trainer::create(params, "adam", hyper, &kv, true);
      if (!t) {
        seen.add(t.error().to_string());
        return;
      }
      if (seen.check((*t)->load_states(file), "load_states"))
        seen.check(run_steps(**t, params, 3, 6, static_cast<int>(rank)), "steps 3-5");
      resumed[rank] = snapshot(params);
    });
  }
  BOOST_TEST(seen.seen.empty(), seen.report());
  BOOST_TEST((resumed == straight));
}

BOOST_AUTO_TEST_CASE(overlapped_steps_leave_the_parameters_bit_for_bit_as_waiting_steps_do) {
  for (std::optional<bool> on_kvstore : {std::optional<bool>{true}, std::optional<bool>{false}}) {
    std::vector<std::vector<std::uint32_t>> waiting, overlapped;
    {
      // The naive engine: each step waits for every request before it returns.
      auto previous = engine::set_backend(nullptr);
      waiting = mlp_after_steps(6, on_kvstore);
      engine::set_backend(previous);
    }
    {
      // Lanes: backward runs behind the caller, pushes start as its gradients appear, and the
      // next forward waits on its lane for each parameter's pull.
      test::queued_engine lanes;
      overlapped = mlp_after_steps(6, on_kvstore);
    }
    BOOST_TEST_REQUIRE(waiting.size() == 6u); // 3 weights, 3 biases
    BOOST_TEST(waiting == overlapped, "update_on_kvstore=" << *on_kvstore);
    // The steps changed the parameters: the comparison is not between two initial states.
    auto again = engine::set_backend(nullptr);
    const auto fewer = mlp_after_steps(1, on_kvstore);
    engine::set_backend(again);
    BOOST_TEST(fewer != waiting);
  }
}

BOOST_AUTO_TEST_SUITE_END()
