// A server shard's logic driven directly, message by message, with no network and no actors:
// the sync round rule, replies held until their round, and bad requests answered with an error
// that names the key while the stored value stays as it was.

#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/server_shard.hpp"
#include "actors/wire_conversions.hpp"

using namespace troupe;

namespace {

/// A tensor chunk viewing a whole float32 array.
wire::tensor_chunk whole(const ndarray& array) {
  wire::tensor_chunk tensor;
  tensor.type = to_wire(array.dtype());
  tensor.shape.assign(array.shape().begin(), array.shape().end());
  tensor.total_bytes = array.nbytes();
  tensor.data = {static_cast<const std::byte*>(array.raw_data()), array.nbytes()};
  return tensor;
}

struct shard_fixture {
  std::vector<envelope> replies;
  shard_core shard{shard_options{0, 2, consistency::sync, 1 << 20}};

  void send(wire::message msg, const ndarray& keepalive = {}) {
    shard.handle(envelope{std::move(msg), keepalive.is_none() ? nullptr : keepalive.keepalive(), 7},
                 [this](envelope out) { replies.push_back(std::move(out)); });
  }
  template <class T>
  const T* last() const {
    return replies.empty() ? nullptr : std::get_if<T>(&replies.back().msg);
  }
  std::vector<float> stored(std::uint64_t key) const { return shard.value(key).to_vector<float>(); }
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
  BOOST_TEST(shard.completed_rounds(4) == 0u);
  BOOST_TEST(stored(4) == std::vector<float>(4, 9.0f));
  send(wire::push{4, 4, 1, 0, whole(second)}, second);
  BOOST_TEST(shard.completed_rounds(4) == 1u);
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
  BOOST_TEST(shard.completed_rounds(0) == 0u);
  send(wire::push{4, 0, 1, 0, whole(ones)}, ones);
  BOOST_TEST(shard.completed_rounds(0) == 1u);
  BOOST_TEST(stored(0) == std::vector<float>(3, 2.0f));
  send(wire::push{5, 0, 1, 1, whole(ones)}, ones);
  BOOST_TEST(shard.completed_rounds(0) == 2u);
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
  BOOST_TEST(shard.completed_rounds(2) == 3u);
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
