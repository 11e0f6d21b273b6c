// A server shard's logic driven directly, message by message, with no network and no actors:
// the sync round rule, replies held until their round, and bad requests answered with an error
// that names the key while the stored value stays as it was.

#include <atomic>
#include <cmath>
#include <cstring>
#include <fstream>
#include <limits>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <sys/mman.h>
#include <unistd.h>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/logic/wire_conversions.hpp"
#include "engine/gradient_compression.hpp"
#include "schema/chunking.hpp"
#include "tests/actors/logic/shard_driver.hpp"
#include "tests/engine/engine_test_support.hpp"

using namespace troupe;
using troupe::testing::quorum_of;
using troupe::testing::shard_driver;
using troupe::testing::whole;

namespace {

/// The shard tests' first fixture: two workers, dist_sync, replies kept in order.
struct shard_fixture : shard_driver {
  shard_fixture() : shard_driver(2) {}

  template <class T>
  const T* last() const {
    return replies.empty() ? nullptr : std::get_if<T>(&replies.back().msg);
  }
};

} // namespace

BOOST_FIXTURE_TEST_SUITE(server_shard_logic, shard_fixture)

BOOST_AUTO_TEST_CASE(a_round_completes_when_every_worker_has_pushed_and_replaces_the_value) {
  auto initial = ndarray::full({2, 2}, 9.0);
  send(wire::init{1, 4, whole(initial)}, initial);
  BOOST_TEST_REQUIRE(last<wire::ack>() != nullptr);
  BOOST_TEST(replies.back().connection == 7u);

  auto first = ndarray::full({2, 2}, 1.0), second = ndarray::full({2, 2}, 2.0);
  send(wire::pull_request{2, 4, 0, 1}); // round 1: not complete yet, so no reply
  send(wire::push{3, 4, 0, 0, whole(first)}, first);
  BOOST_TEST(last<wire::ack>()->request_id == 3u);
  BOOST_TEST(shard->completed_rounds(4) == 0u);
  BOOST_TEST(stored(4) == std::vector<float>(4, 9.0f));
  send(wire::push{4, 4, 1, 0, whole(second)}, second);
  BOOST_TEST(shard->completed_rounds(4) == 1u);
  BOOST_TEST(stored(4) == std::vector<float>(4, 3.0f));
  // The held pull is answered with round 1's value.
  bool answered = false;
  for (auto& reply : replies)
    if (auto* value = std::get_if<wire::pull_reply>(&reply.msg); value && value->request_id == 2) {
      answered = true;
      BOOST_TEST(value->round == 1u);
      BOOST_TEST(value->tensor.data.size() == 16u);
    }
  BOOST_TEST(answered);
}

BOOST_AUTO_TEST_CASE(a_push_for_the_next_round_waits_for_the_current_one) {
  auto initial = ndarray::zeros({3});
  send(wire::init{1, 0, whole(initial)}, initial);
  auto ones = ndarray::ones({3});
  send(wire::push{2, 0, 0, 0, whole(ones)}, ones);
  send(wire::push{3, 0, 0, 1, whole(ones)}, ones); // worker 0 is a round ahead
  BOOST_TEST(shard->completed_rounds(0) == 0u);
  send(wire::push{4, 0, 1, 0, whole(ones)}, ones);
  BOOST_TEST(shard->completed_rounds(0) == 1u);
  BOOST_TEST(stored(0) == std::vector<float>(3, 2.0f));
  send(wire::push{5, 0, 1, 1, whole(ones)}, ones);
  BOOST_TEST(shard->completed_rounds(0) == 2u);
}

BOOST_AUTO_TEST_CASE(bad_pushes_get_errors_naming_the_key_and_leave_the_value_alone) {
  auto initial = ndarray::full({2, 3}, 5.0);
  send(wire::init{1, 11, whole(initial)}, initial);

  auto wrong_shape = ndarray::ones({3, 2});
  send(wire::push{2, 11, 0, 0, whole(wrong_shape)}, wrong_shape);
  auto* shape_error = last<wire::error_reply>();
  BOOST_TEST_REQUIRE(shape_error != nullptr);
  BOOST_TEST((shape_error->code == wire::error_code::shape_mismatch));
  BOOST_TEST(shape_error->message.find("key 11") != std::string::npos);
  BOOST_TEST(shape_error->message.find("(3,2)") != std::string::npos);
  BOOST_TEST(*shape_error->key == 11u);

  auto wrong_type = ndarray::ones({2, 3}, context::cpu(), dtype::float16);
  send(wire::push{3, 11, 0, 0, whole(wrong_type)}, wrong_type);
  BOOST_TEST((last<wire::error_reply>()->code == wire::error_code::dtype_mismatch));

  auto ones = ndarray::ones({2, 3});
  send(wire::push{4, 99, 0, 0, whole(ones)}, ones);
  BOOST_TEST((last<wire::error_reply>()->code == wire::error_code::unknown_key));
  send(wire::push{5, 11, 7, 0, whole(ones)}, ones); // rank 7 in a job of 2 workers
  BOOST_TEST((last<wire::error_reply>()->code == wire::error_code::invalid_argument));
  send(wire::pull_request{6, 99, 0, 0});
  BOOST_TEST((last<wire::error_reply>()->code == wire::error_code::unknown_key));
  send(wire::init{7, 11, whole(initial)}, initial);
  BOOST_TEST((last<wire::error_reply>()->code == wire::error_code::already_initialized));

  send(wire::push{8, 11, 0, 0, whole(ones)}, ones);
  send(wire::push{9, 11, 0, 0, whole(ones)}, ones); // the same round twice
  BOOST_TEST((last<wire::error_reply>()->code == wire::error_code::invalid_argument));
  BOOST_TEST(stored(11) == std::vector<float>(6, 5.0f));
  send(wire::push{10, 11, 1, 0, whole(ones)}, ones);
  BOOST_TEST(stored(11) == std::vector<float>(6, 2.0f)); // still serving, rounds intact
  send(wire::push{11, 11, 1, 0, whole(ones)}, ones);     // a round from the past
  BOOST_TEST((last<wire::error_reply>()->code == wire::error_code::stale_round));
}

BOOST_AUTO_TEST_CASE(a_value_a_reply_still_reads_is_never_overwritten) {
  auto initial = ndarray::zeros({4});
  send(wire::init{1, 2, whole(initial)}, initial);
  auto ones = ndarray::ones({4});
  send(wire::push{2, 2, 0, 0, whole(ones)}, ones);
  send(wire::push{3, 2, 1, 0, whole(ones)}, ones);
  send(wire::pull_request{4, 2, 0, 1});
  auto* held = last<wire::pull_reply>();
  BOOST_TEST_REQUIRE(held != nullptr);
  auto held_bytes = held->tensor.data;
  auto threes = ndarray::full({4}, 3.0);
  send(wire::push{5, 2, 0, 1, whole(threes)}, threes);
  send(wire::push{6, 2, 1, 1, whole(threes)}, threes);
  send(wire::push{7, 2, 0, 2, whole(threes)}, threes); // round 3 would reuse round 1's buffer
  send(wire::push{8, 2, 1, 2, whole(threes)}, threes);
  // The reply of round 1 (kept alive by its envelope) still shows round 1's sum.
  std::vector<float> seen(4);
  std::memcpy(seen.data(), held_bytes.data(), 16);
  BOOST_TEST(seen == std::vector<float>(4, 2.0f));
  BOOST_TEST(stored(2) == std::vector<float>(4, 6.0f));
  BOOST_TEST(shard->completed_rounds(2) == 3u);
}

BOOST_AUTO_TEST_CASE(an_unknown_optimizer_is_refused_and_a_known_one_updates_once_per_round) {
  send(wire::set_optimizer{1, "sgdd", {}});
  BOOST_TEST((last<wire::error_reply>()->code == wire::error_code::invalid_argument));
  send(wire::set_optimizer{2, "test", {{"rescale_grad", 2.0}}});
  BOOST_TEST(last<wire::ack>()->request_id == 2u);
  auto initial = ndarray::ones({2});
  send(wire::init{3, 5, whole(initial)}, initial);
  auto one = ndarray::full({2}, 1.0), two = ndarray::full({2}, 2.0);
  send(wire::push{4, 5, 0, 0, whole(one)}, one);
  send(wire::push{5, 5, 1, 0, whole(two)}, two);
  BOOST_TEST(stored(5) == std::vector<float>(2, 7.0f)); // 1 + 2 * (1 + 2)
}

BOOST_AUTO_TEST_SUITE_END()

// --- bounds, settings and failures
// -----------------------------------------------------------------

namespace {

constexpr std::uint64_t key = 4;

/// A tensor chunk of `frame`'s floats [from, to) as part of a tensor of frame->size() floats.
wire::tensor_chunk slice_of(const std::shared_ptr<std::vector<float>>& frame, std::size_t from,
                            std::size_t to) {
  wire::tensor_chunk tensor;
  tensor.shape = {static_cast<std::int64_t>(frame->size())};
  tensor.total_bytes = frame->size() * sizeof(float);
  tensor.offset = from * sizeof(float);
  tensor.data = std::as_bytes(std::span{*frame}.subspan(from, to - from));
  return tensor;
}

bool names(const wire::error_reply* error, const std::string& part) {
  return error != nullptr && error->message.find(part) != std::string::npos;
}

/// An optimizer whose every update throws.
struct exploding_optimizer : optimizer {
  exploding_optimizer() : optimizer("exploding", {}) {}
  std::size_t state_count() const noexcept override { return 0; }
  void apply(float*, const float*, std::span<float* const>, std::size_t,
             std::int64_t) const override {
    throw std::runtime_error("the optimizer exploded");
  }
};

shard_options with_exploding_optimizer() {
  shard_options options;
  options.make_optimizer =
      [](std::string_view name,
         const optimizer_params& params) -> result<std::unique_ptr<optimizer>> {
    if (name == "exploding")
      return std::unique_ptr<optimizer>{std::make_unique<exploding_optimizer>()};
    return optimizer::create(name, params);
  };
  return options;
}

} // namespace

BOOST_AUTO_TEST_SUITE(server_shard_bounds)

BOOST_AUTO_TEST_CASE(max_rounds_ahead_defers_up_to_m_rounds_and_refuses_a_push_beyond) {
  shard_driver job{2, quorum_of(2, 2)};
  auto initial = ndarray::zeros({3});
  BOOST_TEST_REQUIRE(job.init(key, initial));
  std::vector<ndarray> w0;
  for (int round = 0; round < 4; ++round)
    w0.push_back(ndarray::full({3}, 1.0 + round));
  auto r0 = job.push(key, 0, 0, w0[0]);
  auto r1 = job.push(key, 0, 1, w0[1]);
  auto r2 = job.push(key, 0, 2, w0[2]);
  auto r3 = job.push(key, 0, 3, w0[3]);
  BOOST_TEST(job.ack(r0) != nullptr);
  BOOST_TEST(job.replies_to(r1) == 0u); // deferred: answered when round 1 takes it
  BOOST_TEST(job.replies_to(r2) == 0u);
  auto* beyond = job.error(r3);
  BOOST_TEST_REQUIRE(beyond != nullptr);
  BOOST_TEST((beyond->code == wire::error_code::invalid_argument));
  BOOST_TEST(names(beyond, "for round 3 from worker 0: round 0 is being collected"));
  BOOST_TEST(names(beyond, "at most 2 rounds ahead"));
  auto ten = ndarray::full({3}, 10.0);
  job.push(key, 1, 0, ten);
  BOOST_TEST(job.stored(key) == std::vector<float>(3, 11.0f), boost::test_tools::per_element());
  BOOST_TEST_REQUIRE(job.ack(r1) != nullptr); // round 1 opened and took it
  BOOST_TEST(job.ack(r1)->round == 1u);
  job.push(key, 1, 1, ten);
  BOOST_TEST(job.stored(key) == std::vector<float>(3, 12.0f), boost::test_tools::per_element());
  BOOST_TEST(job.ack(r2) != nullptr);
  job.push(key, 1, 2, ten);
  BOOST_TEST(job.stored(key) == std::vector<float>(3, 13.0f), boost::test_tools::per_element());
  BOOST_TEST(job.shard->completed_rounds(key) == 3u);
  BOOST_TEST(job.shard->stats().requests_refused == 1u);
}

BOOST_AUTO_TEST_CASE(deferred_staged_and_summed_chunks_hold_no_frame_buffer) {
  for (std::uint32_t quorum : {2u, 3u}) {
    BOOST_TEST_CONTEXT("quorum " << quorum << " of 3") {
      shard_driver job{3, quorum_of(quorum)};
      auto initial = ndarray::zeros({4});
      BOOST_TEST_REQUIRE(job.init(key, initial));
      // Worker 0: the first half of round 0 (staged with quorum 2, summed with quorum 3).
      auto frame = std::make_shared<std::vector<float>>(4, 1.0f);
      job.send(wire::push{1, key, 0, 0, slice_of(frame, 0, 2)}, frame);
      BOOST_TEST(frame.use_count() == 1);
      // Worker 1: rounds 1 and 2 ahead, deferred; one of them in two chunks.
      auto later = std::make_shared<std::vector<float>>(4, 2.0f);
      job.send(wire::push{2, key, 1, 1, slice_of(later, 0, 4)}, later);
      job.send(wire::push{3, key, 1, 2, slice_of(later, 0, 2)}, later);
      job.send(wire::push{3, key, 1, 2, slice_of(later, 2, 4)}, later);
      BOOST_TEST(later.use_count() == 1);
      BOOST_TEST(job.replies.size() == 1u); // the init's ack only: nothing refused
    }
  }
}

BOOST_AUTO_TEST_CASE(a_waiting_pull_expires_with_its_request_and_is_dropped_without_a_reply) {
  shard_options options;
  options.pull_timeout = std::chrono::milliseconds{200};
  shard_driver job{2, {}, options};
  auto initial = ndarray::zeros({2});
  BOOST_TEST_REQUIRE(job.init(key, initial));
  auto named = job.pull(key, 0, 1, 50);  // expires at 50 ms
  auto unnamed = job.pull(key, 1, 1, 0); // the shard's own bound: 200 ms
  auto one = ndarray::ones({2});
  auto pushpull = job.pushpull(key, 0, 0, one, 120);
  BOOST_TEST(job.shard->waiting_pulls(key) == 3u);
  job.now += std::chrono::milliseconds{49};
  BOOST_TEST(job.shard->expire_pulls() == 0u);
  job.now += std::chrono::milliseconds{1};
  BOOST_TEST(job.shard->expire_pulls() == 1u);
  job.now += std::chrono::milliseconds{70};
  BOOST_TEST(job.shard->expire_pulls() == 1u);
  BOOST_TEST(job.shard->waiting_pulls(key) == 1u);
  job.now += std::chrono::milliseconds{80};
  BOOST_TEST(job.shard->expire_pulls() == 1u);
  BOOST_TEST(job.shard->waiting_pulls(key) == 0u);
  job.push(key, 1, 0, one);
  BOOST_TEST(job.shard->completed_rounds(key) == 1u);
  BOOST_TEST(job.replies_to(named) == 0u);
  BOOST_TEST(job.replies_to(unnamed) == 0u);
  BOOST_TEST(job.replies_to(pushpull) == 0u);
  BOOST_TEST(job.shard->stats().pulls_expired == 3u);
}

BOOST_AUTO_TEST_CASE(a_worker_may_have_at_most_max_rounds_ahead_plus_one_pulls_of_a_key_waiting) {
  shard_driver job{2, quorum_of(2, 2)};
  auto initial = ndarray::zeros({2});
  BOOST_TEST_REQUIRE(job.init(key, initial));
  for (int i = 0; i < 3; ++i)
    job.pull(key, 0, 1);
  auto fourth = job.pull(key, 0, 1);
  BOOST_TEST((job.error(fourth) != nullptr &&
              job.error(fourth)->code == wire::error_code::invalid_argument));
  BOOST_TEST(names(job.error(fourth), "3 of its pulls of the key are waiting already"));
  auto one = ndarray::ones({2});
  auto pushpull = job.pushpull(key, 0, 0, one);
  BOOST_TEST(names(job.error(pushpull), "3 of its pulls of the key are waiting already"));
  auto other = job.pull(key, 1, 1); // another worker's pulls are its own
  BOOST_TEST(job.replies_to(other) == 0u);
  // The refused pushpull left the round alone: worker 0 pushes round 0 as usual.
  job.push(key, 0, 0, one);
  job.push(key, 1, 0, one);
  BOOST_TEST(job.shard->completed_rounds(key) == 1u);
  BOOST_TEST(job.pulled(other).has_value());
  BOOST_TEST(job.shard->waiting_pulls(key) == 0u);
}

BOOST_AUTO_TEST_CASE(sync_settings_are_checked_and_change_only_before_any_init) {
  shard_driver job{2};
  using wire::consistency_mode;
  job.send(wire::sync_settings{1, consistency_mode::sync, 0, false, -1, 2});
  BOOST_TEST(names(job.error(1), "quorum 0 for a job of 2 workers (1..2)"));
  job.send(wire::sync_settings{2, consistency_mode::sync, 3, false, -1, 2});
  BOOST_TEST(names(job.error(2), "quorum 3"));
  job.send(wire::sync_settings{3, consistency_mode::sync, 2, false, 1, 2});
  BOOST_TEST(names(job.error(3), "max_staleness 1 with dist_sync"));
  job.send(wire::sync_settings{4, consistency_mode::async, 2, false, -2, 2});
  BOOST_TEST(names(job.error(4), "max_staleness -2"));
  job.send(wire::sync_settings{5, consistency_mode::sync, 2, false, -1, 0});
  BOOST_TEST(names(job.error(5), "max_rounds_ahead 0"));
  job.send(wire::sync_settings{6, consistency_mode::sync, 1, true, -1, 3});
  BOOST_TEST(job.ack(6) != nullptr);
  BOOST_TEST((job.shard->policy() == sync_policy{consistency::sync, 1, true, -1, 3}));
  auto initial = ndarray::zeros({2});
  BOOST_TEST_REQUIRE(job.init(key, initial));
  job.send(wire::sync_settings{7, consistency_mode::async, 2, false, 0, 2});
  BOOST_TEST(names(job.error(7), "after key 4 was initialised"));
  job.send(wire::sync_settings{8, consistency_mode::sync, 1, true, -1, 3}); // the same: fine
  BOOST_TEST(job.ack(8) != nullptr);
  BOOST_TEST(job.shard->stats().requests_refused == 6u);
}

BOOST_AUTO_TEST_CASE(the_older_mode_commands_set_the_mode_with_every_default) {
  shard_driver job{3};
  job.send(wire::command{1, wire::command_kind::async_mode, ""});
  BOOST_TEST(job.ack(1) != nullptr);
  BOOST_TEST((job.shard->policy() == sync_policy{consistency::async, 3, false, -1, 2}));
  job.send(wire::command{2, wire::command_kind::sync_mode, ""});
  BOOST_TEST((job.shard->policy() == sync_policy{consistency::sync, 3, false, -1, 2}));
  auto initial = ndarray::zeros({2});
  BOOST_TEST_REQUIRE(job.init(key, initial));
  job.send(wire::command{3, wire::command_kind::sync_mode, ""});
  BOOST_TEST(job.ack(3) != nullptr);
  job.send(wire::command{4, wire::command_kind::async_mode, ""});
  BOOST_TEST(names(job.error(4), "the settings change only before any init"));
}

BOOST_AUTO_TEST_CASE(acks_carry_the_completed_rounds_or_applied_pushes_as_the_workers_credit) {
  shard_driver sync{2};
  auto initial = ndarray::zeros({2});
  BOOST_TEST_REQUIRE(sync.init(key, initial));
  auto one = ndarray::ones({2});
  auto first = sync.push(key, 0, 0, one);
  auto closing = sync.push(key, 1, 0, one);
  auto next = sync.push(key, 0, 1, one);
  BOOST_TEST(sync.ack(first)->round == 0u);
  BOOST_TEST(sync.ack(closing)->round == 1u);
  BOOST_TEST(sync.ack(next)->round == 1u);
  BOOST_TEST(!sync.ack(closing)->dropped);

  shard_driver async{2, sync_policy{consistency::async, 0, false, -1, 2}};
  BOOST_TEST_REQUIRE(async.init(key, initial));
  async.push(key, 0, 0, one);
  auto second = async.push(key, 0, 1, one);
  BOOST_TEST(async.ack(second)->round == 2u);
}

BOOST_AUTO_TEST_CASE(an_exception_from_the_optimizer_becomes_an_error_reply_and_the_round_closes) {
  shard_driver job{2, {}, with_exploding_optimizer()};
  job.send(wire::set_optimizer{1, "exploding", {}});
  BOOST_TEST_REQUIRE(job.ack(1) != nullptr);
  auto initial = ndarray::ones({2});
  BOOST_TEST_REQUIRE(job.init(key, initial));
  auto pull = job.pull(key, 0, 1);
  auto two = ndarray::full({2}, 2.0);
  auto first = job.push(key, 0, 0, two);
  auto closing = job.pushpull(key, 1, 0, two);
  BOOST_TEST(job.ack(first) != nullptr);
  auto* failed = job.error(closing);
  BOOST_TEST_REQUIRE(failed != nullptr);
  BOOST_TEST((failed->code == wire::error_code::internal));
  BOOST_TEST(
      names(failed, "update of key 4 with the sum of round 0 failed: the optimizer exploded"));
  BOOST_TEST(job.replies_to(closing) == 1u); // the error instead of the pull half
  BOOST_TEST(job.shard->completed_rounds(key) == 1u);
  BOOST_TEST(job.stored(key) == std::vector<float>(2, 1.0f), boost::test_tools::per_element());
  BOOST_TEST(job.pulled(pull).has_value()); // nobody waits forever
  BOOST_TEST(job.shard->stats().updates == 0u);
}

BOOST_AUTO_TEST_CASE(a_deferred_push_that_completes_a_failing_round_gets_the_error) {
  shard_driver job{2, quorum_of(1), with_exploding_optimizer()};
  job.send(wire::set_optimizer{1, "exploding", {}});
  auto initial = ndarray::ones({2});
  BOOST_TEST_REQUIRE(job.init(key, initial));
  auto two = ndarray::full({2}, 2.0);
  auto deferred = job.push(key, 1, 1, two);
  auto closing = job.push(key, 0, 0, two);
  BOOST_TEST(names(job.error(closing), "round 0 failed"));
  BOOST_TEST(names(job.error(deferred), "round 1 failed"));
  BOOST_TEST(job.replies_to(deferred) == 1u);
  BOOST_TEST(job.shard->completed_rounds(key) == 2u);
}

BOOST_AUTO_TEST_CASE(in_dist_async_a_push_whose_update_throws_is_refused_and_not_counted) {
  shard_driver job{1, sync_policy{consistency::async, 0, false, -1, 2}, with_exploding_optimizer()};
  job.send(wire::set_optimizer{1, "exploding", {}});
  auto initial = ndarray::ones({2});
  BOOST_TEST_REQUIRE(job.init(key, initial));
  auto two = ndarray::full({2}, 2.0);
  auto push = job.push(key, 0, 0, two);
  BOOST_TEST(names(job.error(push), "update of key 4 with a push of worker 0 failed"));
  BOOST_TEST(job.shard->completed_rounds(key) == 0u);
  BOOST_TEST(job.stored(key) == std::vector<float>(2, 1.0f), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(
    an_allocation_that_fails_becomes_an_error_reply_and_an_oversized_init_is_refused) {
  // A chunk of a tensor of 2^48 floats (1 PiB): more than any machine can allocate.
  std::vector<float> bytes(2, 1.0f);
  wire::tensor_chunk huge;
  huge.shape = {std::int64_t{1} << 48};
  huge.total_bytes = std::uint64_t{1} << 50;
  huge.data = std::as_bytes(std::span{bytes});

  shard_options unbounded;
  unbounded.max_value_bytes = std::uint64_t{1} << 62;
  shard_driver job{1, {}, unbounded};
  job.send(wire::init{1, key, huge});
  auto* failed = job.error(1);
  BOOST_TEST_REQUIRE(failed != nullptr);
  BOOST_TEST((failed->code == wire::error_code::internal));
  BOOST_TEST(names(failed, "init request 1 of key 4 failed on server shard 0"));
  BOOST_TEST(job.shard->value(key).is_none());
  auto initial = ndarray::ones({2});
  BOOST_TEST(job.init(key, initial)); // the shard goes on

  shard_driver bounded{1};
  bounded.send(wire::init{1, key, huge});
  BOOST_TEST((bounded.error(1) != nullptr &&
              bounded.error(1)->code == wire::error_code::invalid_argument));
  BOOST_TEST(names(bounded.error(1), "tensor of 1125899906842624 bytes, limit 4294967296 "
                                     "(data.max_value_bytes)"));
}

BOOST_AUTO_TEST_CASE(inits_beyond_the_servers_key_budget_are_refused_and_shards_share_it) {
  // Two shards of one server share a budget of 100 floats' worth.
  shard_options options;
  options.store_bytes = std::make_shared<std::atomic<std::uint64_t>>(0);
  options.max_store_bytes = 400;
  shard_driver first{1, {}, options};
  shard_driver second{1, {}, options};
  BOOST_TEST_REQUIRE(first.init(1, ndarray::ones({60})));
  second.send(wire::init{2, 2, whole(ndarray::ones({50}))});
  auto* refused = second.error(2);
  BOOST_TEST_REQUIRE(refused != nullptr);
  BOOST_TEST((refused->code == wire::error_code::invalid_argument));
  BOOST_TEST(names(refused, "init of key 2: its 200 bytes would take this server's keys from 240 "
                            "to more than their budget of 400 bytes (data.max_store_bytes)"));
  BOOST_TEST(second.shard->value(2).is_none());
  BOOST_TEST(second.init(3, ndarray::ones({40}))); // what is left still fits
  BOOST_TEST(options.store_bytes->load() == 400u);
  // A declared size near 2^64 cannot wrap the count around.
  std::vector<float> some(2, 1.0f);
  wire::tensor_chunk huge;
  huge.type = wire::dtype::float64;
  huge.shape = {std::int64_t{1} << 60};
  huge.total_bytes = std::uint64_t{1} << 63;
  huge.data = std::as_bytes(std::span{some});
  shard_options unbounded_values = options;
  unbounded_values.max_value_bytes = std::numeric_limits<std::uint64_t>::max();
  shard_driver third{1, {}, unbounded_values};
  third.send(wire::init{4, 4, huge});
  BOOST_TEST(names(third.error(4), "data.max_store_bytes"));
  BOOST_TEST(options.store_bytes->load() == 400u);
}

namespace {

/// Rounds of pushes of one key: round r, worker w pushes the value pushes[r][w] in every element
/// (a missing worker pushes nothing).
using round_values = std::vector<std::vector<std::optional<double>>>;

/// Trains `key` of `type` through a shard of `workers` with `policy` and the test optimizer
/// (multi_precision as given), pushes cut in chunks of `chunk_bytes`; returns the stored values.
std::vector<float> train_rounds(dtype type, bool multi_precision, std::uint32_t workers,
                                sync_policy policy, const round_values& pushes,
                                std::size_t chunk_bytes) {
  shard_driver job{workers, policy};
  job.send(wire::set_optimizer{1, "test", {{"multi_precision", multi_precision ? 1.0 : 0.0}}});
  BOOST_TEST_REQUIRE(job.ack(1) != nullptr);
  BOOST_TEST_REQUIRE(job.init(key, ndarray::ones({16}, context::cpu(), type)));
  std::vector<ndarray> held; // the pushed values stay alive while their frames view them
  for (std::uint64_t round = 0; round < pushes.size(); ++round)
    for (std::uint32_t worker = 0; worker < pushes[round].size(); ++worker) {
      if (!pushes[round][worker])
        continue;
      held.push_back(ndarray::full({16}, *pushes[round][worker], context::cpu(), type));
      for (auto& chunk :
           shard_driver::push_chunks(job.next_id++, key, worker, round, held.back(), chunk_bytes))
        job.send(std::move(chunk), held.back());
    }
  BOOST_TEST(job.shard->completed_rounds(key) == pushes.size());
  return job.shard->value(key).as_type(dtype::float32).to_vector<float>();
}

/// `values` rounded to float16 and back.
std::vector<float> rounded_to_half(const std::vector<float>& values) {
  return ndarray::from_values(values, {static_cast<std::int64_t>(values.size())})
      .as_type(dtype::float16)
      .as_type(dtype::float32)
      .to_vector<float>();
}

} // namespace

BOOST_AUTO_TEST_CASE(under_multi_precision_a_round_of_float16_pushes_is_summed_in_float32) {
  // 1024 + 0.5 and -1024 + 0.25 are exact in float32 and not in float16: with the sum rounded to
  // float16 first, the key would end at 4.125, not 4.875.
  const round_values two{{1024, 0.5}, {-1024, 0.25}, {3, 0.125}};
  const round_values two_of_three{
      {1024, 0.5, std::nullopt}, {0.25, std::nullopt, -1024}, {std::nullopt, 3, 0.125}};
  struct setting {
    std::string what;
    std::uint32_t workers;
    sync_policy policy;
    const round_values* pushes;
    std::size_t chunk_bytes;
  };
  for (const auto& [what, workers, policy, pushes, chunk_bytes] :
       std::vector<setting>{{"all workers, whole pushes", 2, {}, &two, 1 << 20},
                            {"all workers, chunks of 8 bytes", 2, {}, &two, 8},
                            {"a quorum of 2 of 3", 3, quorum_of(2), &two_of_three, 1 << 20},
                            {"a quorum of 2 of 3, chunks", 3, quorum_of(2), &two_of_three, 8}}) {
    auto reference = train_rounds(dtype::float32, false, workers, policy, *pushes, chunk_bytes);
    BOOST_TEST((reference == std::vector<float>(16, 4.875f)), what);
    auto mixed = train_rounds(dtype::float16, true, workers, policy, *pushes, chunk_bytes);
    BOOST_TEST((mixed == rounded_to_half(reference)), what);
    auto plain = train_rounds(dtype::float16, false, workers, policy, *pushes, chunk_bytes);
    BOOST_TEST((plain != rounded_to_half(reference)), what);
  }
}

namespace {

/// A push of `value` quantized by `rule` with `residual`, whole: the packed bytes, kept alive by
/// the returned array.
struct packed_push {
  std::vector<std::byte> packed;
  std::vector<float> dense; // what the packed bytes stand for
  wire::tensor_chunk tensor(const ndarray& like, const gradient_compression& rule) const {
    wire::tensor_chunk t;
    t.type = to_wire(like.dtype());
    t.shape.assign(like.shape().begin(), like.shape().end());
    t.total_bytes = like.nbytes();
    t.data = packed;
    t.compression = {to_wire(rule.type), rule.threshold, static_cast<std::uint64_t>(like.size())};
    return t;
  }
};

packed_push pack(const gradient_compression& rule, const ndarray& value,
                 std::vector<float>& residual) {
  packed_push out;
  const auto n = static_cast<std::size_t>(value.size());
  out.packed.resize(packed_bytes(rule.type, n));
  quantize(rule, value.dtype(), value.raw_data(), residual.data(), out.packed.data(), n);
  auto dense = ndarray::zeros(value.shape(), context::cpu(), value.dtype());
  dequantize(rule, value.dtype(), out.packed.data(), dense.raw_data(), n);
  out.dense = dense.as_type(dtype::float32).to_vector<float>();
  return out;
}

} // namespace

BOOST_AUTO_TEST_CASE(compressed_pushes_are_summed_as_the_values_they_stand_for) {
  // 40 elements (not a whole number of words) per push, 2 workers, 3 rounds: the stored value
  // after each round is the sum of what each worker's packed push stands for, whole or in chunks
  // of one word, in float32 and float16, for both rules.
  for (const auto type : {dtype::float32, dtype::float16})
    for (const auto& rule : {gradient_compression::make("2bit", 0.25).value(),
                             gradient_compression::make("1bit", 0.0).value()})
      for (const std::size_t chunk_bytes : {std::size_t{4} << 10, std::size_t{8}}) {
        BOOST_TEST_CONTEXT(to_string(type)
                           << ", " << rule.describe() << ", chunks of " << chunk_bytes) {
          shard_driver job{2};
          BOOST_TEST_REQUIRE(job.init(key, ndarray::zeros({5, 8}, context::cpu(), type)));
          std::vector<std::vector<float>> residual(2, std::vector<float>(40, 0.0f));
          std::vector<packed_push> held;
          held.reserve(6);
          for (std::uint64_t round = 0; round < 3; ++round) {
            std::vector<float> expected(40, 0.0f);
            for (std::uint32_t worker = 0; worker < 2; ++worker) {
              std::vector<float> gradient(40);
              for (std::size_t i = 0; i < 40; ++i)
                gradient[i] =
                    0.1f * static_cast<float>((i * 7 + worker * 3 + round * 5) % 13) - 0.6f;
              const auto value = ndarray::from_values(gradient, {5, 8}).as_type(type);
              held.push_back(pack(rule, value, residual[worker]));
              for (std::size_t i = 0; i < 40; ++i)
                expected[i] += held.back().dense[i];
              wire::chunker chunks{
                  wire::push{job.next_id++, key, worker, round, held.back().tensor(value, rule)},
                  chunk_bytes};
              for (std::size_t c = 0; c < chunks.chunk_count(); ++c)
                job.send(chunks.chunk(c));
            }
            BOOST_TEST_REQUIRE(job.shard->completed_rounds(key) == round + 1);
            const auto stored = job.shard->value(key).as_type(dtype::float32).to_vector<float>();
            const auto want = ndarray::from_values(expected, {5, 8})
                                  .as_type(type)
                                  .as_type(dtype::float32)
                                  .to_vector<float>();
            BOOST_TEST(stored == want, boost::test_tools::per_element());
          }
          for (const auto& reply : job.replies)
            BOOST_TEST(!std::holds_alternative<wire::error_reply>(reply.msg));
        }
      }
}

BOOST_AUTO_TEST_CASE(a_compressed_push_that_does_not_fit_its_key_is_refused_and_changes_nothing) {
  shard_driver job{1};
  BOOST_TEST_REQUIRE(job.init(key, ndarray::ones({40})));
  BOOST_TEST_REQUIRE(job.init(key + 1, ndarray::ones({40}, context::cpu(), dtype::int32)));
  std::vector<std::byte> packed(12);
  auto tensor_of = [&](dtype type, std::uint64_t elements, std::size_t bytes, float threshold) {
    wire::tensor_chunk t;
    t.type = to_wire(type);
    t.shape = {40};
    t.total_bytes = 40 * size_of(type);
    t.data = std::span<const std::byte>(packed).first(bytes);
    t.compression = {wire::compression_type::two_bit, threshold, elements};
    return t;
  };
  struct bad {
    const char* what;
    std::uint64_t key;
    wire::tensor_chunk tensor;
  };
  for (const auto& [what, target, tensor] : std::vector<bad>{
           {"more elements than the key holds", key, tensor_of(dtype::float32, 41, 12, 0.5f)},
           {"a packed length that is not the elements'", key,
            tensor_of(dtype::float32, 40, 8, 0.5f)},
           {"a threshold of 0", key, tensor_of(dtype::float32, 40, 12, 0.0f)},
           {"an int32 key", key + 1, tensor_of(dtype::int32, 40, 12, 0.5f)}}) {
    const auto id = job.next_id++;
    job.send(wire::push{id, target, 0, 0, tensor});
    const auto* refused = job.error(id);
    BOOST_TEST_REQUIRE(refused != nullptr, what);
    BOOST_TEST(refused->message.find("key " + std::to_string(target)) != std::string::npos,
               what << ": " << refused->message);
  }
  BOOST_TEST(job.stored(key) == std::vector<float>(40, 1.0f), boost::test_tools::per_element());
  BOOST_TEST(job.shard->completed_rounds(key) == 0u);
  // A compressed init is refused too: an init carries the value itself.
  const auto id = job.next_id++;
  job.send(wire::init{id, key + 2, tensor_of(dtype::float32, 40, 12, 0.5f)});
  BOOST_TEST_REQUIRE(job.error(id) != nullptr);
}

BOOST_AUTO_TEST_SUITE_END()

// --- inits under way: memory follows bytes -----------------------------------------------------

namespace {

constexpr std::size_t page_bytes = 4096;
/// A transparent huge page, which the system may commit for a first touch instead of a page.
constexpr std::size_t huge_page_bytes = std::size_t{2} << 20;

/// Bytes of [data, data + bytes) in memory now (mincore), whole pages counted.
std::size_t resident_bytes_of(const void* data, std::size_t bytes) {
  auto begin = reinterpret_cast<std::uintptr_t>(data) / page_bytes * page_bytes;
  auto end = reinterpret_cast<std::uintptr_t>(data) + bytes;
  std::vector<unsigned char> in_memory((end - begin + page_bytes - 1) / page_bytes);
  BOOST_TEST_REQUIRE(::mincore(reinterpret_cast<void*>(begin), end - begin, in_memory.data()) == 0);
  return page_bytes *
         static_cast<std::size_t>(std::count_if(in_memory.begin(), in_memory.end(),
                                                [](unsigned char p) { return p & 1; }));
}

/// This process's resident memory (/proc/self/statm).
std::size_t process_resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  std::size_t total_pages = 0, resident_pages = 0;
  statm >> total_pages >> resident_pages;
  return resident_pages * static_cast<std::size_t>(::sysconf(_SC_PAGESIZE));
}

/// The first `floats` floats of a float32 value of `declared` bytes, as its first chunk.
wire::tensor_chunk first_chunk_of(std::uint64_t declared, const std::vector<float>& floats) {
  wire::tensor_chunk tensor;
  tensor.shape = {static_cast<std::int64_t>(declared / sizeof(float))};
  tensor.total_bytes = declared;
  tensor.data = std::as_bytes(std::span{floats});
  return tensor;
}

/// A value of `floats` floats 0, 1, 2, ... and a shard that shares a key budget of
/// `budget` bytes with nobody, dropping inits that stall for 30 s.
struct init_fixture {
  explicit init_fixture(std::size_t floats, std::uint64_t budget = std::uint64_t{1} << 30)
      : value(std::make_shared<std::vector<float>>(floats)), job(1, {}, options(budget)) {
    for (std::size_t i = 0; i < floats; ++i)
      (*value)[i] = static_cast<float>(i);
  }

  static shard_options options(std::uint64_t budget) {
    shard_options out;
    out.store_bytes = std::make_shared<std::atomic<std::uint64_t>>(0);
    out.max_store_bytes = budget;
    out.stalled_init = std::chrono::seconds{30};
    return out;
  }
  std::uint64_t budget_in_use() const { return job.shard->stats().store_bytes; }

  /// Sends init request `id` of `key` with floats [from, to) of the value, by connection `by`.
  void send_part(std::uint64_t id, std::size_t from, std::size_t to,
                 std::uint64_t by = shard_driver::connection) {
    job.send_by(by, wire::init{id, key, slice_of(value, from, to)}, value);
  }

  std::shared_ptr<std::vector<float>> value;
  shard_driver job;
};

constexpr std::size_t mib_of_floats = (std::size_t{1} << 20) / sizeof(float);

} // namespace

BOOST_AUTO_TEST_SUITE(server_shard_inits_under_way)

BOOST_AUTO_TEST_CASE(a_short_init_that_declares_4_gib_commits_about_its_own_bytes) {
  // Issue 22: about 100 bytes that declare a 4 GiB value made the shard allocate and touch
  // 4 GiB at once (measured before the change: the driving process grew by 4.3 GB).
  shard_options budget = init_fixture::options(std::uint64_t{8} << 30);
  shard_driver job{1, {}, budget};
  const std::uint64_t declared = std::uint64_t{4} << 30;
  const std::vector<float> first(16, 1.5f);
  const auto before = process_resident_bytes();
  job.send(wire::init{1, key, first_chunk_of(declared, first)});

  // Accepted as an init under way: no reply yet, the budget holds the declared size.
  BOOST_TEST(job.replies.empty());
  const auto stats = job.shard->stats();
  BOOST_TEST(stats.inits_under_way == 1u);
  BOOST_TEST(stats.store_bytes == declared);
  BOOST_TEST(budget.store_bytes->load() == declared);
  const auto buffer = job.shard->value(key);
  BOOST_TEST_REQUIRE(buffer.nbytes() == declared);
  // The pages committed: the one the 64 bytes went to (a huge page, where the system gives them).
  const auto resident = resident_bytes_of(buffer.raw_data(), buffer.nbytes());
  BOOST_TEST(resident >= page_bytes);
  BOOST_TEST(resident <= huge_page_bytes);
  BOOST_TEST(process_resident_bytes() < before + (std::size_t{64} << 20),
             "from " << before << " to " << process_resident_bytes() << " bytes");

  // The value is not readable until every byte has arrived.
  job.send(wire::pull_request{2, key, 0, 0});
  BOOST_TEST(names(job.error(2), "pull of key 4, which was never initialised"));
}

BOOST_AUTO_TEST_CASE(a_value_that_arrives_in_chunks_commits_as_they_fill_it_and_ends_exact) {
  init_fixture init{4 * mib_of_floats};
  auto& job = init.job;
  init.send_part(1, 0, mib_of_floats);
  const auto buffer = job.shard->value(key);
  const auto after_one = resident_bytes_of(buffer.raw_data(), buffer.nbytes());
  BOOST_TEST(after_one >= (std::size_t{1} << 20));
  BOOST_TEST(after_one <= (std::size_t{1} << 20) + huge_page_bytes);
  init.send_part(1, mib_of_floats, 3 * mib_of_floats);
  const auto after_three = resident_bytes_of(buffer.raw_data(), buffer.nbytes());
  BOOST_TEST(after_three >= (std::size_t{3} << 20));
  BOOST_TEST(after_three <= (std::size_t{3} << 20) + huge_page_bytes);
  BOOST_TEST(job.replies.empty());
  init.send_part(1, 3 * mib_of_floats, 4 * mib_of_floats);
  BOOST_TEST_REQUIRE(job.ack(1) != nullptr);
  BOOST_TEST(job.shard->stats().inits_under_way == 0u);
  BOOST_TEST(job.stored(key) == *init.value);
  // Served and updated like any value.
  auto pull = job.pull(key, 0, 0);
  auto* reply = job.value_reply(pull);
  BOOST_TEST_REQUIRE(reply != nullptr);
  BOOST_TEST(reply->tensor.total_bytes == (std::uint64_t{4} << 20));
  auto ones = ndarray::ones({static_cast<std::int64_t>(4 * mib_of_floats)});
  job.push(key, 0, 0, ones);
  BOOST_TEST(job.shard->completed_rounds(key) == 1u);
  BOOST_TEST(job.stored(key) == ones.to_vector<float>());
}

BOOST_AUTO_TEST_CASE(an_unfinished_init_is_dropped_with_its_budget_when_its_connection_closes) {
  init_fixture init{4 * mib_of_floats};
  auto& job = init.job;
  init.send_part(1, 0, mib_of_floats);
  BOOST_TEST(init.budget_in_use() == (std::uint64_t{4} << 20));
  BOOST_TEST(job.shard->on_connection_closed(shard_driver::connection + 1) == 0u);
  BOOST_TEST(job.shard->stats().inits_under_way == 1u);

  BOOST_TEST(job.shard->on_connection_closed(shard_driver::connection) == 1u);
  const auto stats = job.shard->stats();
  BOOST_TEST(stats.inits_under_way == 0u);
  BOOST_TEST(stats.inits_dropped == 1u);
  BOOST_TEST(stats.store_bytes == 0u);
  BOOST_TEST(job.shard->value(key).is_none());
  // As if never begun: its next chunk starts nothing, and a new init of the key, of another
  // shape, is taken.
  init.send_part(2, mib_of_floats, 2 * mib_of_floats);
  BOOST_TEST(names(job.error(2), "init of key 4: chunk at byte 1048576, expected byte 0"));
  BOOST_TEST(job.shard->value(key).is_none());
  BOOST_TEST(job.init(key, ndarray::full({3}, 2.0)));
  BOOST_TEST(job.stored(key) == std::vector<float>(3, 2.0f));
  BOOST_TEST(init.budget_in_use() == 12u);
}

BOOST_AUTO_TEST_CASE(an_unfinished_init_that_stalls_is_dropped_and_one_that_progresses_is_not) {
  init_fixture init{4 * mib_of_floats};
  auto& job = init.job;
  init.send_part(1, 0, mib_of_floats);
  job.now += std::chrono::seconds{20};
  init.send_part(1, mib_of_floats, 2 * mib_of_floats);
  job.now += std::chrono::seconds{20};
  BOOST_TEST(job.shard->drop_stalled_inits() == 0u); // its last chunk came 20 s ago
  job.now += std::chrono::seconds{10};
  BOOST_TEST(job.shard->drop_stalled_inits() == 1u);
  BOOST_TEST(job.shard->stats().inits_dropped == 1u);
  BOOST_TEST(init.budget_in_use() == 0u);
  BOOST_TEST(job.shard->value(key).is_none());
  init.send_part(2, 0, 4 * mib_of_floats);
  BOOST_TEST(job.ack(2) != nullptr);
  BOOST_TEST(job.stored(key) == *init.value);
  // A whole value is never dropped.
  job.now += std::chrono::minutes{5};
  BOOST_TEST(job.shard->drop_stalled_inits() == 0u);
  BOOST_TEST(job.shard->on_connection_closed(shard_driver::connection) == 0u);
  BOOST_TEST(job.stored(key) == *init.value);
}

BOOST_AUTO_TEST_CASE(another_connection_cannot_continue_an_unfinished_init) {
  init_fixture init{4 * mib_of_floats};
  auto& job = init.job;
  init.send_part(1, 0, mib_of_floats);
  init.send_part(2, mib_of_floats, 4 * mib_of_floats, shard_driver::connection + 1);
  BOOST_TEST(names(job.error(2), "init of key 4: another connection began it (1048576 of "
                                 "4194304 bytes arrived); only that one may continue it"));
  BOOST_TEST(job.ack(2) == nullptr);
  BOOST_TEST(job.shard->stats().inits_under_way == 1u);
  // Its own connection finishes it, exactly.
  init.send_part(1, mib_of_floats, 4 * mib_of_floats);
  BOOST_TEST_REQUIRE(job.ack(1) != nullptr);
  BOOST_TEST(job.stored(key) == *init.value);
}

BOOST_AUTO_TEST_CASE(an_inits_chunks_come_in_order_and_a_refused_one_changes_nothing) {
  init_fixture init{4 * mib_of_floats};
  auto& job = init.job;
  init.send_part(1, 0, mib_of_floats);
  init.send_part(2, 2 * mib_of_floats, 3 * mib_of_floats); // skips a MiB
  BOOST_TEST(names(job.error(2), "chunk at byte 2097152, expected byte 1048576 (an init's chunks "
                                 "come in order, once)"));
  init.send_part(3, 0, mib_of_floats); // again
  BOOST_TEST(names(job.error(3), "chunk at byte 0, expected byte 1048576"));
  init.send_part(1, mib_of_floats, 4 * mib_of_floats);
  BOOST_TEST_REQUIRE(job.ack(1) != nullptr);
  BOOST_TEST(job.stored(key) == *init.value);
}

BOOST_AUTO_TEST_CASE(inits_under_way_count_in_the_key_budget_and_its_refusal_names_the_key) {
  init_fixture init{4 * mib_of_floats, std::uint64_t{5} << 20};
  auto& job = init.job;
  init.send_part(1, 0, mib_of_floats);
  auto other = std::make_shared<std::vector<float>>(2 * mib_of_floats, 1.0f);
  job.send(wire::init{2, key + 1, slice_of(other, 0, 1024)}, other);
  BOOST_TEST(names(job.error(2), "init of key 5: its 2097152 bytes would take this server's keys "
                                 "from 4194304 to more than their budget of 5242880 bytes "
                                 "(data.max_store_bytes)"));
  BOOST_TEST(job.shard->on_connection_closed(shard_driver::connection) == 1u);
  job.send(wire::init{3, key + 1, slice_of(other, 0, 1024)}, other);
  BOOST_TEST(job.error(3) == nullptr);
  BOOST_TEST(init.budget_in_use() == (std::uint64_t{2} << 20));
}

BOOST_AUTO_TEST_CASE(a_closed_connection_takes_its_workers_unfinished_pushes_with_it) {
  // dist_async: worker 0's push is cut off after its first chunk.
  shard_driver job{2, sync_policy{consistency::async, 0, false, -1, 2}};
  auto initial = ndarray::zeros({1024});
  BOOST_TEST_REQUIRE(job.init(key, initial));
  auto ones = ndarray::ones({1024});
  auto chunks = shard_driver::push_chunks(50, key, 0, 0, ones, 1024);
  BOOST_TEST_REQUIRE(chunks.size() == 4u);
  job.send(chunks[0], ones);
  // While its connection is open the push must go on where it stopped: it blocks the key.
  auto twos = ndarray::full({1024}, 2.0);
  auto blocked = job.push(key, 0, 0, twos);
  BOOST_TEST(names(job.error(blocked), "chunk at byte 0, expected byte 1024"));
  // Its connection closes: the worker's next push of the key starts afresh.
  job.shard->on_connection_closed(shard_driver::connection);
  job.send_by(shard_driver::connection + 2, wire::push{51, key, 0, 0, whole(twos)},
              twos.keepalive());
  BOOST_TEST(job.ack(51) != nullptr);
  BOOST_TEST(job.stored(key) == std::vector<float>(1024, 2.0f));
  // Another worker's pushes by another connection were never touched.
  job.send_by(shard_driver::connection + 3, wire::push{52, key, 1, 0, whole(ones)},
              ones.keepalive());
  BOOST_TEST(job.ack(52) != nullptr);
  BOOST_TEST(job.shard->completed_rounds(key) == 2u);
}

BOOST_AUTO_TEST_SUITE_END()

// --- the update on a GPU ---------------------------------------------------------------------

namespace {

/// The stored values of `key` after three sync rounds of two workers with an SGD-with-momentum
/// optimizer, the update on `device`.
std::vector<float> values_after_three_rounds(context device) {
  shard_options options;
  options.update_device = device;
  shard_driver job{2, {}, options};
  job.send(wire::set_optimizer{1, "sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}}});
  BOOST_TEST_REQUIRE(job.ack(1) != nullptr);
  BOOST_TEST_REQUIRE(job.init(key, ndarray::random_uniform(-1.0, 1.0, {1000}, 7)));
  for (std::uint64_t round = 0; round < 3; ++round)
    for (std::uint32_t worker = 0; worker < 2; ++worker)
      job.push(key, worker, round, ndarray::random_uniform(-1.0, 1.0, {1000}, 10 * round + worker));
  BOOST_TEST(job.shard->value(key).ctx() == context::cpu()); // pulls are answered from the host
  return job.stored(key);
}

} // namespace

BOOST_AUTO_TEST_SUITE(server_shard_update_on_a_gpu,
                      *boost::unit_test::precondition(troupe::test::gpu_present))

BOOST_AUTO_TEST_CASE(a_shard_updating_on_a_gpu_stores_what_the_host_update_stores) {
  const auto on_host = values_after_three_rounds(context::cpu());
  const auto on_gpu = values_after_three_rounds(context::gpu(0));
  BOOST_TEST_REQUIRE(on_gpu.size() == on_host.size());
  for (std::size_t i = 0; i < on_host.size(); ++i)
    BOOST_TEST(std::abs(on_gpu[i] - on_host[i]) <= 1e-5f * (1.0f + std::abs(on_host[i])),
               "element " << i << ": gpu " << on_gpu[i] << ", host " << on_host[i]);
}

BOOST_AUTO_TEST_SUITE_END()
