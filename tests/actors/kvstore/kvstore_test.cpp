// The KVStore's local and device modes against MXNet's semantics, with closed forms
// (tests/python/unittest/test_kvstore.py and tests/nightly/test_kvstore.py of MXNet 1.x).

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/config/config.hpp"
#include "actors/kvstore/kvstore.hpp"
#include "engine/comm.hpp"
#include "engine/gradient_compression.hpp"
#include "tests/actors/kvstore/array_checks.hpp"

using namespace troupe;
using troupe::testing::all_equal;

namespace {

const std::vector<std::string> local_types{"local", "device"};

std::unique_ptr<kvstore> make(const std::string& type) {
  auto created = kvstore::create(type);
  BOOST_TEST_REQUIRE(created.has_value());
  return std::move(*created);
}

std::vector<context> cpu_contexts(int count) {
  std::vector<context> contexts;
  for (int i = 0; i < count; ++i)
    contexts.push_back(context::cpu(i));
  return contexts;
}

/// A file name of this test process's own, removed by the destructor.
struct temporary_path {
  std::string path =
      (std::filesystem::temp_directory_path() /
       ("troupe-kvstore-test-" + std::to_string(::getpid()) + "-" + std::to_string(counter++)))
          .string();
  ~temporary_path() { std::remove(path.c_str()); }
  static inline int counter = 0;
};

} // namespace

BOOST_AUTO_TEST_SUITE(kvstore_local_modes)

BOOST_AUTO_TEST_CASE(create_reports_the_type_it_was_given_and_a_single_worker) {
  for (std::string type : {"local", "device", "local_allreduce_cpu", "local_allreduce_device"}) {
    auto kv = make(type);
    BOOST_TEST(kv->type() == type);
    BOOST_TEST(kv->rank() == 0);
    BOOST_TEST(kv->num_workers() == 1);
    BOOST_TEST(kv->is_capable("optimizer"));
    BOOST_TEST(!kv->is_capable("teleportation"));
  }
}

BOOST_AUTO_TEST_CASE(a_local_gather_at_barrier_returns_the_callers_values_and_refuses_too_many) {
  auto kv = kvstore::create("local").value();
  const std::vector<double> mine{1.5, 2.5};
  auto gathered = kv->gather_at_barrier(mine);
  BOOST_TEST_REQUIRE(gathered.has_value());
  BOOST_TEST_REQUIRE(gathered->size() == 1u);
  BOOST_TEST(gathered->front() == mine, boost::test_tools::per_element());
  const std::vector<double> too_many(kvstore::max_gathered_values + 1, 0.0);
  auto refused = kv->gather_at_barrier(too_many);
  BOOST_TEST_REQUIRE(!refused.has_value());
  BOOST_TEST((refused.error().code() == errc::invalid_argument));
}

BOOST_AUTO_TEST_CASE(create_rejects_an_unknown_type_naming_it) {
  auto created = kvstore::create("locall");
  BOOST_TEST_REQUIRE(!created.has_value());
  BOOST_TEST(created.error().code() == errc::invalid_argument);
  BOOST_TEST(created.error().message().find("'locall'") != std::string::npos);
  // A distributed type needs a job to join: without DMLC_* settings the error says which.
  if (std::getenv("DMLC_PS_ROOT_PORT") == nullptr) {
    auto dist = kvstore::create("dist_sync");
    BOOST_TEST_REQUIRE(!dist.has_value());
    BOOST_TEST(dist.error().message().find("DMLC_PS_ROOT_PORT") != std::string::npos,
               dist.error().message());
  }
}

BOOST_AUTO_TEST_CASE(create_with_cluster_flags_reads_them_over_the_environment) {
  // Flags beat the environment, so these cases hold whatever DMLC_* the tests run under; none
  // of them reaches the network.
  config_overrides as_server;
  as_server.set("job.role", "server");
  auto serving = kvstore::create("dist_sync", as_server);
  BOOST_TEST_REQUIRE(!serving.has_value());
  BOOST_TEST(serving.error().code() == errc::invalid_argument);
  BOOST_TEST(serving.error().message().find("names the role server (DMLC_ROLE") !=
                 std::string::npos,
             serving.error().message());
  BOOST_TEST(serving.error().message().find("serve_if_node_role") != std::string::npos);

  config_overrides bad_quorum;
  bad_quorum.set("sync.quorum", "none");
  auto bad = kvstore::create("dist_async", bad_quorum);
  BOOST_TEST_REQUIRE(!bad.has_value());
  BOOST_TEST(bad.error().message().find("--quorum must be a positive integer, got \"none\"") !=
                 std::string::npos,
             bad.error().message());
  // The local types have no cluster to configure.
  BOOST_TEST(kvstore::create("local", bad_quorum).has_value());
}

BOOST_AUTO_TEST_CASE(a_pull_after_init_returns_the_initial_value) {
  for (auto& type : local_types) {
    auto kv = make(type);
    BOOST_TEST_REQUIRE(kv->init(3, ndarray::full({4, 4}, 4.0)).has_value());
    auto out = ndarray::zeros({4, 4});
    BOOST_TEST_REQUIRE(kv->pull(3, out).has_value());
    BOOST_TEST(all_equal(out, 4.0f));
  }
}

BOOST_AUTO_TEST_CASE(a_push_without_an_optimizer_replaces_the_stored_value) {
  for (auto& type : local_types) {
    auto kv = make(type);
    BOOST_TEST_REQUIRE(kv->init(3, ndarray::full({2, 3}, 4.0)).has_value());
    BOOST_TEST_REQUIRE(kv->push(3, ndarray::ones({2, 3})).has_value());
    auto out = ndarray::zeros({2, 3});
    BOOST_TEST_REQUIRE(kv->pull(3, out).has_value());
    BOOST_TEST(all_equal(out, 1.0f));
  }
}

BOOST_AUTO_TEST_CASE(a_push_of_a_list_of_four_ones_gives_four) {
  for (auto& type : local_types) {
    auto kv = make(type);
    BOOST_TEST_REQUIRE(kv->init("1", ndarray::zeros({5})).has_value());
    std::vector<ndarray> values;
    for (auto ctx : cpu_contexts(4))
      values.push_back(ndarray::ones({5}, ctx));
    BOOST_TEST_REQUIRE(kv->push("1", values).has_value());
    std::vector<ndarray> outs{ndarray::zeros({5}, context::cpu(0)),
                              ndarray::zeros({5}, context::cpu(2))};
    BOOST_TEST_REQUIRE(kv->pull("1", outs).has_value());
    BOOST_TEST(all_equal(outs[0], 4.0f));
    BOOST_TEST(all_equal(outs[1], 4.0f));
  }
}

BOOST_AUTO_TEST_CASE(
    the_test_optimizer_over_n_contexts_gives_one_plus_n_times_n_plus_one_per_round) {
  // Context d pushes ones*(d+1); `test` with rescale_grad = 2 adds 2 * n(n+1)/2 per round.
  for (auto& type : local_types) {
    for (int n = 1; n <= 4; ++n) {
      for (shape_vector shape : {shape_vector{0}, shape_vector{1}, shape_vector{2, 3},
                                 shape_vector{1000}, shape_vector{1000, 1000}}) {
        auto kv = make(type);
        BOOST_TEST_REQUIRE(kv->set_optimizer("test", {{"rescale_grad", 2.0}}).has_value());
        BOOST_TEST_REQUIRE(kv->init(7, ndarray::ones(shape)).has_value());
        std::vector<ndarray> values;
        for (auto ctx : cpu_contexts(n))
          values.push_back(ndarray::full(shape, ctx.id + 1.0, ctx));
        auto out = ndarray::zeros(shape, context::cpu(n - 1));
        for (int round = 0; round < 3; ++round) {
          BOOST_TEST_REQUIRE(kv->push(7, values).has_value());
          BOOST_TEST_REQUIRE(kv->pull(7, out).has_value());
          float expected = 1.0f + static_cast<float>(n * (n + 1) * (round + 1));
          BOOST_TEST(all_equal(out, expected), type << " n=" << n << " shape "
                                                    << shape_to_string(shape) << " round " << round
                                                    << ": expected " << expected);
        }
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_custom_updater_accumulates_every_push) {
  // MXNet's test_updater: local += recv, four devices per push.
  for (auto& type : local_types) {
    auto kv = make(type);
    BOOST_TEST_REQUIRE(kv->init(3, ndarray::zeros({4, 4})).has_value());
    std::vector<kv_key> seen;
    BOOST_TEST_REQUIRE(
        kv->set_updater([&](const kv_key& key, const ndarray& received, ndarray& stored) {
            seen.push_back(key);
            stored += received.copy_to(stored.ctx());
          }).has_value());
    std::vector<ndarray> values;
    for (auto ctx : cpu_contexts(4))
      values.push_back(ndarray::ones({4, 4}, ctx));
    auto out = ndarray::zeros({4, 4});
    for (int push = 1; push <= 4; ++push) {
      BOOST_TEST_REQUIRE(kv->push(3, values).has_value());
      BOOST_TEST_REQUIRE(kv->pull(3, out).has_value());
      BOOST_TEST(all_equal(out, 4.0f * push));
    }
    BOOST_TEST(seen.size() == 4u);
    BOOST_TEST((seen[0] == kv_key{3}));
  }
}

BOOST_AUTO_TEST_CASE(a_batch_push_groups_repeated_keys_into_one_list) {
  auto kv = make("local");
  std::vector<kv_key> keys{5, 9};
  std::vector<ndarray> initial{ndarray::zeros({3}), ndarray::zeros({2})};
  BOOST_TEST_REQUIRE(kv->init(keys, initial).has_value());
  std::vector<kv_key> pushed_keys{5, 9, 5, 5};
  std::vector<ndarray> values{ndarray::full({3}, 1.0), ndarray::full({2}, 10.0),
                              ndarray::full({3}, 2.0), ndarray::full({3}, 3.0)};
  BOOST_TEST_REQUIRE(kv->push(pushed_keys, values).has_value());
  std::vector<ndarray> outs{ndarray::zeros({3}), ndarray::zeros({2})};
  BOOST_TEST_REQUIRE(kv->pull(keys, outs).has_value());
  BOOST_TEST(all_equal(outs[0], 6.0f));
  BOOST_TEST(all_equal(outs[1], 10.0f));
}

BOOST_AUTO_TEST_CASE(pushpull_and_broadcast_combine_their_two_steps) {
  for (auto& type : local_types) {
    auto kv = make(type);
    std::vector<ndarray> outs{ndarray::zeros({2, 2}, context::cpu(0)),
                              ndarray::zeros({2, 2}, context::cpu(1))};
    BOOST_TEST_REQUIRE(kv->broadcast("w", ndarray::full({2, 2}, 3.0), outs).has_value());
    BOOST_TEST(all_equal(outs[0], 3.0f));
    BOOST_TEST(all_equal(outs[1], 3.0f));
    std::vector<ndarray> grads{ndarray::full({2, 2}, 1.0, context::cpu(0)),
                               ndarray::full({2, 2}, 2.0, context::cpu(1))};
    BOOST_TEST_REQUIRE(kv->pushpull("w", grads, outs).has_value());
    BOOST_TEST(all_equal(outs[0], 3.0f));
    BOOST_TEST(all_equal(outs[1], 3.0f));
  }
}

BOOST_AUTO_TEST_CASE(float16_keys_sum_exactly) {
  for (auto& type : local_types) {
    auto kv = make(type);
    BOOST_TEST_REQUIRE(kv->set_optimizer("test", {{"rescale_grad", 2.0}}).has_value());
    BOOST_TEST_REQUIRE(
        kv->init(1, ndarray::ones({3, 5}, context::cpu(), dtype::float16)).has_value());
    std::vector<ndarray> values;
    for (auto ctx : cpu_contexts(3))
      values.push_back(ndarray::full({3, 5}, ctx.id + 1.0, ctx, dtype::float16));
    auto out = ndarray::zeros({3, 5}, context::cpu(), dtype::float16);
    for (int round = 0; round < 4; ++round) {
      BOOST_TEST_REQUIRE(kv->push(1, values).has_value());
      BOOST_TEST_REQUIRE(kv->pull(1, out).has_value());
      BOOST_TEST(all_equal(out, 1.0f + 12.0f * (round + 1)));
    }
  }
}

BOOST_AUTO_TEST_CASE(device_mode_sums_on_one_of_the_pushing_devices) {
  auto created = kvstore::create("device");
  BOOST_TEST_REQUIRE(created.has_value());
  auto& kv = **created;
  BOOST_TEST_REQUIRE(kv.init(0, ndarray::zeros({8})).has_value());
  std::vector<ndarray> values{ndarray::full({8}, 1.0, context::cpu(2)),
                              ndarray::full({8}, 2.0, context::cpu(3))};
  BOOST_TEST_REQUIRE(kv.push(0, values).has_value());
  auto out = ndarray::zeros({8}, context::cpu(5));
  BOOST_TEST_REQUIRE(kv.pull(0, out).has_value());
  BOOST_TEST(all_equal(out, 3.0f));
}

BOOST_AUTO_TEST_CASE(merge_buffers_of_the_device_reduction_spread_over_the_devices) {
  comm_device reduction;
  std::vector<ndarray> values{ndarray::ones({1000}, context::cpu(0)),
                              ndarray::ones({1000}, context::cpu(1))};
  (void)reduction.reduce(0, values);
  (void)reduction.reduce(1, values);
  BOOST_TEST(reduction.merge_context(0) != reduction.merge_context(1));
  BOOST_TEST(all_equal(reduction.reduce(1, values), 2.0f));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(kvstore_bad_input)

BOOST_AUTO_TEST_CASE(an_unknown_key_is_an_error_naming_the_key) {
  for (auto& type : local_types) {
    auto kv = make(type);
    BOOST_TEST_REQUIRE(kv->init(1, ndarray::ones({2})).has_value());
    auto out = ndarray::zeros({2});
    auto pulled = kv->pull(42, out);
    BOOST_TEST_REQUIRE(!pulled.has_value());
    BOOST_TEST(pulled.error().code() == errc::unknown_key);
    BOOST_TEST(pulled.error().message().find("42") != std::string::npos);
    auto pushed = kv->push(42, ndarray::ones({2}));
    BOOST_TEST_REQUIRE(!pushed.has_value());
    BOOST_TEST(pushed.error().code() == errc::unknown_key);
    BOOST_TEST(all_equal(out, 0.0f));
  }
}

BOOST_AUTO_TEST_CASE(a_wrong_shape_names_the_key_and_both_shapes_and_changes_nothing) {
  for (auto& type : local_types) {
    auto kv = make(type);
    BOOST_TEST_REQUIRE(kv->init(9, ndarray::full({2, 3}, 5.0)).has_value());
    auto pushed = kv->push(9, {ndarray::ones({2, 3}), ndarray::ones({3, 2})});
    BOOST_TEST_REQUIRE(!pushed.has_value());
    BOOST_TEST(pushed.error().code() == errc::shape_mismatch);
    auto& message = pushed.error().message();
    BOOST_TEST(message.find("key 9") != std::string::npos, message);
    BOOST_TEST(message.find("(3,2)") != std::string::npos, message);
    BOOST_TEST(message.find("(2,3)") != std::string::npos, message);

    auto wrong_out = ndarray::zeros({6});
    auto pulled = kv->pull(9, wrong_out);
    BOOST_TEST_REQUIRE(!pulled.has_value());
    BOOST_TEST(pulled.error().code() == errc::shape_mismatch);

    auto out = ndarray::zeros({2, 3});
    BOOST_TEST_REQUIRE(kv->pull(9, out).has_value());
    BOOST_TEST(all_equal(out, 5.0f));
  }
}

BOOST_AUTO_TEST_CASE(a_wrong_dtype_names_the_key_and_both_dtypes_and_changes_nothing) {
  auto kv = make("local");
  BOOST_TEST_REQUIRE(kv->set_optimizer("sgd", {{"learning_rate", 0.1}}).has_value());
  BOOST_TEST_REQUIRE(kv->init("bias", ndarray::full({4}, 5.0)).has_value());
  auto pushed = kv->push("bias", ndarray::ones({4}, context::cpu(), dtype::float16));
  BOOST_TEST_REQUIRE(!pushed.has_value());
  BOOST_TEST(pushed.error().code() == errc::dtype_mismatch);
  BOOST_TEST(pushed.error().message().find("'bias'") != std::string::npos);
  BOOST_TEST(pushed.error().message().find("float16") != std::string::npos);
  BOOST_TEST(pushed.error().message().find("float32") != std::string::npos);
  auto out = ndarray::zeros({4});
  BOOST_TEST_REQUIRE(kv->pull("bias", out).has_value());
  BOOST_TEST(all_equal(out, 5.0f));
}

BOOST_AUTO_TEST_CASE(int_and_string_keys_cannot_be_mixed) {
  auto kv = make("local");
  BOOST_TEST_REQUIRE(kv->init(1, ndarray::ones({2})).has_value());
  auto mixed = kv->init("one", ndarray::ones({2}));
  BOOST_TEST_REQUIRE(!mixed.has_value());
  BOOST_TEST(mixed.error().code() == errc::key_type_mix);
  auto out = ndarray::zeros({2});
  auto pulled = kv->pull("one", out);
  BOOST_TEST_REQUIRE(!pulled.has_value());
  BOOST_TEST(pulled.error().code() == errc::key_type_mix);

  std::vector<kv_key> both{7, "seven"};
  std::vector<ndarray> values{ndarray::ones({1}), ndarray::ones({1})};
  auto fresh = make("local");
  auto batch = fresh->init(both, values);
  BOOST_TEST_REQUIRE(!batch.has_value());
  BOOST_TEST(batch.error().code() == errc::key_type_mix);
  auto probe = ndarray::zeros({1});
  BOOST_TEST(!fresh->pull(7, probe).has_value()); // nothing of the bad batch was initialised
}

BOOST_AUTO_TEST_CASE(empty_lists_and_count_mismatches_are_errors) {
  auto kv = make("local");
  BOOST_TEST_REQUIRE(kv->init(1, ndarray::ones({2})).has_value());
  std::vector<ndarray> none;
  auto pushed = kv->push(1, std::span<const ndarray>{none});
  BOOST_TEST_REQUIRE(!pushed.has_value());
  BOOST_TEST(pushed.error().code() == errc::empty_list);
  auto pulled = kv->pull(1, std::span<ndarray>{none});
  BOOST_TEST_REQUIRE(!pulled.has_value());
  BOOST_TEST(pulled.error().code() == errc::empty_list);
  std::vector<kv_key> keys{1, 1};
  std::vector<ndarray> one{ndarray::ones({2})};
  auto counted = kv->push(keys, one);
  BOOST_TEST_REQUIRE(!counted.has_value());
  BOOST_TEST(counted.error().code() == errc::invalid_argument);
}

BOOST_AUTO_TEST_CASE(a_key_can_be_initialised_only_once) {
  auto kv = make("local");
  BOOST_TEST_REQUIRE(kv->init(1, ndarray::full({2}, 2.0)).has_value());
  auto again = kv->init(1, ndarray::full({2}, 3.0));
  BOOST_TEST_REQUIRE(!again.has_value());
  BOOST_TEST(again.error().code() == errc::already_initialized);
  auto out = ndarray::zeros({2});
  BOOST_TEST_REQUIRE(kv->pull(1, out).has_value());
  BOOST_TEST(all_equal(out, 2.0f));
}

BOOST_AUTO_TEST_CASE(a_bad_key_in_a_batch_push_updates_no_key_of_the_batch) {
  auto kv = make("local");
  std::vector<kv_key> keys{1, 2};
  std::vector<ndarray> initial{ndarray::full({2}, 7.0), ndarray::full({2}, 7.0)};
  BOOST_TEST_REQUIRE(kv->init(keys, initial).has_value());
  std::vector<kv_key> pushed_keys{1, 3};
  std::vector<ndarray> values{ndarray::ones({2}), ndarray::ones({2})};
  BOOST_TEST(!kv->push(pushed_keys, values).has_value());
  auto out = ndarray::zeros({2});
  BOOST_TEST_REQUIRE(kv->pull(1, out).has_value());
  BOOST_TEST(all_equal(out, 7.0f));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(kvstore_optimizer_states)

BOOST_AUTO_TEST_CASE(saved_optimizer_states_restore_training_bit_for_bit) {
  for (std::string name : {"sgd", "nag", "adam", "rmsprop", "adagrad"}) {
    optimizer_params params{{"learning_rate", 0.05}, {"wd", 0.001}};
    if (name == "sgd" || name == "nag")
      params["momentum"] = 0.9;
    auto grad_of_round = [](int round) {
      return ndarray::random_normal(0.0, 1.0, {64, 3}, static_cast<std::uint64_t>(round));
    };
    temporary_path states;
    auto weight = ndarray::zeros({64, 3});

    auto first = make("local");
    BOOST_TEST_REQUIRE(first->set_optimizer(name, params).has_value());
    BOOST_TEST_REQUIRE(first->init(0, ndarray::random_uniform(-1, 1, {64, 3}, 7)).has_value());
    for (int round = 0; round < 3; ++round)
      BOOST_TEST_REQUIRE(first->push(0, grad_of_round(round)).has_value());
    BOOST_TEST_REQUIRE(first->save_optimizer_states(states.path).has_value());
    BOOST_TEST_REQUIRE(first->pull(0, weight).has_value());
    auto weight_at_save = weight.copy();
    for (int round = 3; round < 6; ++round)
      BOOST_TEST_REQUIRE(first->push(0, grad_of_round(round)).has_value());
    auto expected = ndarray::zeros({64, 3});
    BOOST_TEST_REQUIRE(first->pull(0, expected).has_value());

    auto second = make("local");
    BOOST_TEST_REQUIRE(second->set_optimizer(name, params).has_value());
    BOOST_TEST_REQUIRE(second->init(0, weight_at_save).has_value());
    BOOST_TEST_REQUIRE(second->load_optimizer_states(states.path).has_value());
    for (int round = 3; round < 6; ++round)
      BOOST_TEST_REQUIRE(second->push(0, grad_of_round(round)).has_value());
    auto resumed = ndarray::zeros({64, 3});
    BOOST_TEST_REQUIRE(second->pull(0, resumed).has_value());
    BOOST_TEST(expected.to_vector<float>() == resumed.to_vector<float>(), name);
  }
}

BOOST_AUTO_TEST_CASE(loading_states_of_another_optimizer_or_a_broken_file_is_an_error) {
  temporary_path states;
  auto kv = make("local");
  BOOST_TEST_REQUIRE(kv->set_optimizer("adam").has_value());
  BOOST_TEST_REQUIRE(kv->init(0, ndarray::ones({4})).has_value());
  BOOST_TEST_REQUIRE(kv->push(0, ndarray::ones({4})).has_value());
  BOOST_TEST_REQUIRE(kv->save_optimizer_states(states.path).has_value());

  auto other = make("local");
  BOOST_TEST_REQUIRE(other->set_optimizer("sgd").has_value());
  auto wrong = other->load_optimizer_states(states.path);
  BOOST_TEST_REQUIRE(!wrong.has_value());
  BOOST_TEST(wrong.error().message().find("adam") != std::string::npos);

  auto missing = kv->load_optimizer_states(states.path + ".absent");
  BOOST_TEST_REQUIRE(!missing.has_value());
  BOOST_TEST(missing.error().code() == errc::io_error);

  std::filesystem::resize_file(states.path, std::filesystem::file_size(states.path) - 5);
  auto truncated = kv->load_optimizer_states(states.path);
  BOOST_TEST_REQUIRE(!truncated.has_value());
  BOOST_TEST(truncated.error().code() == errc::corrupt_data);

  auto without_optimizer = make("local");
  BOOST_TEST(!without_optimizer->save_optimizer_states(states.path).has_value());
}

BOOST_AUTO_TEST_CASE(states_saved_for_another_shape_are_refused_and_the_store_goes_on) {
  // Saved for a (2,3) key, loaded where key 0 has 12 elements: refused at the load, naming both
  // shapes, and the store's own state and values are untouched.
  temporary_path states;
  auto small = make("local");
  BOOST_TEST_REQUIRE(small->set_optimizer("sgd", {{"momentum", 0.9}}).has_value());
  BOOST_TEST_REQUIRE(small->init(0, ndarray::ones({2, 3})).has_value());
  BOOST_TEST_REQUIRE(small->push(0, ndarray::ones({2, 3})).has_value());
  BOOST_TEST_REQUIRE(small->save_optimizer_states(states.path).has_value());

  auto kv = make("local");
  BOOST_TEST_REQUIRE(kv->set_optimizer("sgd", {{"momentum", 0.9}}).has_value());
  BOOST_TEST_REQUIRE(kv->init(0, ndarray::ones({12})).has_value());
  auto refused = kv->load_optimizer_states(states.path);
  BOOST_TEST_REQUIRE(!refused.has_value());
  BOOST_TEST(refused.error().code() == errc::shape_mismatch);
  BOOST_TEST(refused.error().message().find("has shape (2,3), the weight here (12,)") !=
                 std::string::npos,
             refused.error().message());
  BOOST_TEST_REQUIRE(kv->push(0, ndarray::ones({12})).has_value());
  auto value = ndarray::zeros({12});
  BOOST_TEST_REQUIRE(kv->pull(0, value).has_value());
  BOOST_TEST(value.to_vector<float>() == std::vector<float>(12, 0.99f),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(kvstore_gradient_compression)

BOOST_AUTO_TEST_CASE(device_quantizes_each_pushed_value_with_its_own_residual) {
  // MXNet's CommDevice::ReduceCompressed: each value of a pushed list is quantized with the
  // residual of its position, and the store sums what the packed values stand for.
  const auto rule = gradient_compression::make("2bit", 0.5).value();
  auto kv = kvstore::create("device").value();
  BOOST_TEST_REQUIRE(kv->set_gradient_compression(rule).has_value());
  const std::int64_t n = 37;
  BOOST_TEST_REQUIRE(kv->init(3, ndarray::ones({n})).has_value());
  std::vector<std::vector<float>> residual(2, std::vector<float>(n, 0.0f));
  for (int round = 0; round < 4; ++round) {
    std::vector<ndarray> values;
    std::vector<float> expected(n, 0.0f);
    for (std::size_t d = 0; d < 2; ++d) {
      std::vector<float> gradient(n);
      for (std::int64_t j = 0; j < n; ++j)
        gradient[j] = 0.1f * static_cast<float>((j * 3 + d * 5 + round * 7) % 11) - 0.5f;
      values.push_back(
          ndarray::from_values(gradient, {n}).copy_to(context::cpu(static_cast<int>(d))));
      std::vector<std::byte> packed(packed_bytes(rule.type, n));
      quantize(rule, dtype::float32, gradient.data(), residual[d].data(), packed.data(), n);
      std::vector<float> stands_for(n);
      dequantize(rule, dtype::float32, packed.data(), stands_for.data(), n);
      for (std::int64_t j = 0; j < n; ++j)
        expected[j] += stands_for[j];
    }
    BOOST_TEST_REQUIRE(kv->push(3, values).has_value());
    auto out = ndarray::zeros({n});
    BOOST_TEST_REQUIRE(kv->pull(3, out).has_value());
    BOOST_TEST(out.to_vector<float>() == expected, boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(local_refuses_compression_as_mxnet_does_and_bad_settings_name_the_value) {
  auto local = kvstore::create("local").value();
  auto refused = local->set_gradient_compression("2bit", 0.5);
  BOOST_TEST_REQUIRE(!refused.has_value());
  BOOST_TEST(refused.error().code() == errc::not_supported);
  BOOST_TEST(refused.error().message().find("local") != std::string::npos);
  auto device = kvstore::create("device").value();
  auto unknown = device->set_gradient_compression("4bit");
  BOOST_TEST_REQUIRE(!unknown.has_value());
  BOOST_TEST(unknown.error().message().find("'4bit'") != std::string::npos);
  BOOST_TEST(!device->set_gradient_compression("1bit", -1.0).has_value());
  // "none" turns it off: pushes are summed exactly again.
  BOOST_TEST_REQUIRE(device->set_gradient_compression("2bit").has_value());
  BOOST_TEST_REQUIRE(device->set_gradient_compression("none").has_value());
  BOOST_TEST_REQUIRE(device->init(1, ndarray::zeros({3})).has_value());
  BOOST_TEST_REQUIRE(device->push(1, ndarray::full({3}, 0.3)).has_value());
  auto out = ndarray::zeros({3});
  BOOST_TEST_REQUIRE(device->pull(1, out).has_value());
  BOOST_TEST(out.to_vector<float>() == std::vector<float>(3, 0.3f),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(kvstore_row_sparse_local)

BOOST_AUTO_TEST_CASE(pushed_rows_are_summed_and_row_sparse_pull_fills_the_rows_asked) {
  // The closed form with the workers as a pushed list: value w holds w + 1 in row
  // w % rows; key initialised to ones, the test optimizer with rescale_grad 2. After round i a
  // requested row r holds 1 + sum over w with w % rows == r of 2 (w + 1) (i + 1); rows not asked
  // for read 0.
  const std::int64_t rows = 3, width = 4, values = 5;
  for (const auto* type : {"local", "device"})
    for (auto dt : {dtype::float32, dtype::float16}) {
      BOOST_TEST_CONTEXT(type << " " << to_string(dt)) {
        auto kv = kvstore::create(type).value();
        auto ones = row_sparse_array::from_dense(ndarray::ones({rows, width}, context::cpu(), dt));
        BOOST_TEST_REQUIRE(kv->init("embedding", ones.value()).has_value());
        BOOST_TEST_REQUIRE(kv->set_optimizer("test", {{"rescale_grad", 2.0}}).has_value());
        for (int round = 0; round < 3; ++round) {
          std::vector<row_sparse_array> pushed;
          std::vector<kv_key> names;
          for (std::int64_t w = 0; w < values; ++w) {
            auto row = ndarray::full({1, width}, static_cast<double>(w + 1), context::cpu(), dt);
            pushed.push_back(
                row_sparse_array::from_rows(row, std::vector<std::int64_t>{w % rows}, {rows, width})
                    .value());
            names.push_back("embedding");
          }
          BOOST_TEST_REQUIRE(kv->push(names, pushed).has_value());
          // Unsorted, repeated, float ids of two axes: rows 0 and 2.
          const auto ids = ndarray::from_values({2, 0, 2, 2}, {2, 2});
          row_sparse_array out;
          BOOST_TEST_REQUIRE(kv->row_sparse_pull("embedding", out, ids).has_value());
          BOOST_TEST(out.indices() == (std::vector<std::int64_t>{0, 2}),
                     boost::test_tools::per_element());
          const auto dense = out.to_dense().as_type(dtype::float32).to_vector<float>();
          for (std::int64_t r = 0; r < rows; ++r) {
            float expected = 0;
            if (r != 1) {
              expected = 1;
              for (std::int64_t w = r; w < values; w += rows)
                expected += 2.0f * static_cast<float>(w + 1) * static_cast<float>(round + 1);
            }
            for (std::int64_t c = 0; c < width; ++c)
              BOOST_TEST(dense[static_cast<std::size_t>(r * width + c)] == expected,
                         "round " << round << " row " << r);
          }
        }
        row_sparse_array none_asked;
        BOOST_TEST_REQUIRE(
            kv->row_sparse_pull("embedding", none_asked, ndarray::zeros({0})).has_value());
        BOOST_TEST(none_asked.stored_rows() == 0u);
        BOOST_TEST((none_asked.shape() == shape_vector{rows, width}));
      }
    }
}

BOOST_AUTO_TEST_CASE(sgd_moves_only_the_pushed_rows_and_without_an_optimizer_the_sum_replaces) {
  auto kv = kvstore::create("local").value();
  BOOST_TEST_REQUIRE(
      kv->init(0, row_sparse_array::from_dense(ndarray::ones({4, 2})).value()).has_value());
  BOOST_TEST_REQUIRE(kv->set_optimizer("sgd", {{"learning_rate", 0.5}, {"wd", 0.1}}).has_value());
  auto grad =
      row_sparse_array::from_rows(ndarray::ones({1, 2}), std::vector<std::int64_t>{1}, {4, 2})
          .value();
  BOOST_TEST_REQUIRE(kv->push(0, grad).has_value());
  row_sparse_array out;
  BOOST_TEST_REQUIRE(
      kv->row_sparse_pull(0, out, ndarray::from_values({0, 1, 2, 3}, {4})).has_value());
  // Row 1: 1 - 0.5 (1 + 0.1 x 1) = 0.45; lazy_update leaves the others (wd would move them).
  BOOST_TEST(out.to_dense().to_vector<float>() ==
                 (std::vector<float>{1, 1, 0.45f, 0.45f, 1, 1, 1, 1}),
             boost::test_tools::per_element());

  auto plain = kvstore::create("local").value();
  BOOST_TEST_REQUIRE(
      plain->init(0, row_sparse_array::from_dense(ndarray::ones({4, 2})).value()).has_value());
  BOOST_TEST_REQUIRE(plain->push(0, grad).has_value());
  BOOST_TEST_REQUIRE(plain->row_sparse_pull(0, out, ndarray::from_values({0, 1}, {2})).has_value());
  BOOST_TEST(out.to_dense().to_vector<float>() == (std::vector<float>{0, 0, 1, 1, 0, 0, 0, 0}),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(mixing_dense_and_row_sparse_calls_and_bad_row_ids_are_named) {
  auto kv = kvstore::create("local").value();
  BOOST_TEST_REQUIRE(
      kv->init("table", row_sparse_array::from_dense(ndarray::ones({4, 2})).value()).has_value());
  BOOST_TEST_REQUIRE(kv->init("bias", ndarray::ones({2})).has_value());
  auto out = ndarray::zeros({4, 2});
  auto pulled = kv->pull("table", out);
  BOOST_TEST_REQUIRE(!pulled.has_value());
  BOOST_TEST(pulled.error().message().find("row_sparse_pull") != std::string::npos,
             pulled.error().message());
  BOOST_TEST(!kv->push("table", ndarray::ones({4, 2})).has_value());
  row_sparse_array rows;
  auto dense_key = kv->row_sparse_pull("bias", rows, ndarray::zeros({1}));
  BOOST_TEST_REQUIRE(!dense_key.has_value());
  BOOST_TEST(dense_key.error().message().find("'bias'") != std::string::npos);
  auto outside = kv->row_sparse_pull("table", rows, ndarray::from_values({4}, {1}));
  BOOST_TEST_REQUIRE(!outside.has_value());
  BOOST_TEST(outside.error().message() ==
             "row_sparse_pull of key 'table': row_ids: row id 4 is outside [0, 4)");
  auto wrong_shape =
      kv->push("table", row_sparse_array::from_rows(ndarray::ones({1, 3}),
                                                    std::vector<std::int64_t>{0}, {4, 3})
                            .value());
  BOOST_TEST_REQUIRE(!wrong_shape.has_value());
  BOOST_TEST(wrong_shape.error().code() == errc::shape_mismatch);
  // Nothing changed the table.
  BOOST_TEST_REQUIRE(
      kv->row_sparse_pull("table", rows, ndarray::from_values({0, 1, 2, 3}, {4})).has_value());
  BOOST_TEST(rows.to_dense().to_vector<float>() == std::vector<float>(8, 1.0f),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
