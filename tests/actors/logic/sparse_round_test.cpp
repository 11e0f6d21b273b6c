// A row_sparse key on a server shard (shard_core over sparse_round), message by message: rounds of
// rows, quorum and early pushes, row-sparse pulls, and the requests it must refuse without
// changing anything.

#include <cstring>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/logic/shard_checkpoint.hpp"
#include "tests/actors/logic/shard_driver.hpp"

using namespace troupe;
using troupe::testing::quorum_of;
using troupe::testing::shard_driver;
using troupe::testing::whole;

namespace {

/// A row-sparse push of `values` into rows `rows` of key `key`.
struct row_push {
  std::vector<std::int64_t> rows;
  ndarray values;

  wire::tensor_chunk tensor() const {
    auto t = whole(values);
    t.row_sparse = true;
    t.row_ids = std::as_bytes(std::span{rows});
    return t;
  }
};

row_push rows_of(std::vector<std::int64_t> rows, std::int64_t width, float value) {
  auto count = static_cast<std::int64_t>(rows.size());
  return {std::move(rows), ndarray::full({count, width}, value)};
}

/// Inits row_sparse key `key` with `value`.
bool init_rows(shard_driver& d, std::uint64_t key, const ndarray& value) {
  const auto id = d.next_id++;
  d.send(wire::init{id, key, whole(value), true}, value.keepalive());
  return d.ack(id) != nullptr;
}

std::uint64_t push_rows(shard_driver& d, std::uint64_t key, std::uint32_t sender,
                        std::uint64_t round, const row_push& push) {
  const auto id = d.next_id++;
  d.send(wire::push{id, key, sender, round, push.tensor()}, push.values.keepalive());
  return id;
}

std::uint64_t pull_rows(shard_driver& d, std::uint64_t key, std::uint32_t sender,
                        std::uint64_t round, const std::vector<std::int64_t>& rows) {
  const auto id = d.next_id++;
  wire::pull_request request{id, key, sender, round, 0};
  request.row_sparse = true;
  request.row_ids = std::as_bytes(std::span{rows});
  d.send(request);
  return id;
}

} // namespace

BOOST_AUTO_TEST_SUITE(row_sparse_keys_on_a_shard)

BOOST_AUTO_TEST_CASE(a_round_sums_the_rows_of_every_worker_and_pulls_get_the_rows_asked) {
  shard_driver d{3};
  BOOST_TEST_REQUIRE(init_rows(d, 4, ndarray::ones({5, 2})));
  // No optimizer: the round's sum becomes the key, zero where no worker pushed.
  const auto a = rows_of({0, 3}, 2, 1), b = rows_of({3}, 2, 2), c = rows_of({}, 2, 0);
  BOOST_TEST(d.ack(push_rows(d, 4, 0, 0, a)) != nullptr);
  const auto waiting = pull_rows(d, 4, 0, 1, {1, 3});
  BOOST_TEST(d.replies_to(waiting) == 0u); // the round is open
  BOOST_TEST(d.ack(push_rows(d, 4, 1, 0, b)) != nullptr);
  BOOST_TEST(d.ack(push_rows(d, 4, 2, 0, c)) != nullptr); // no rows: still the worker's push
  BOOST_TEST(d.shard->completed_rounds(4) == 1u);
  BOOST_TEST(d.stored(4) == (std::vector<float>{1, 1, 0, 0, 0, 0, 3, 3, 0, 0}),
             boost::test_tools::per_element());
  const auto* reply = d.value_reply(waiting);
  BOOST_TEST_REQUIRE(reply != nullptr);
  BOOST_TEST((reply->tensor.shape == wire::tensor_shape{2, 2}));
  BOOST_TEST(testing::floats_of(reply->tensor) == (std::vector<float>{0, 0, 3, 3}),
             boost::test_tools::per_element());
  const auto none = pull_rows(d, 4, 0, 1, {});
  BOOST_TEST_REQUIRE(d.value_reply(none) != nullptr);
  BOOST_TEST((d.value_reply(none)->tensor.shape == wire::tensor_shape{0, 2}));
}

BOOST_AUTO_TEST_CASE(the_test_optimizer_updates_with_the_sum_and_early_pushes_wait_their_round) {
  shard_driver d{2};
  BOOST_TEST_REQUIRE(init_rows(d, 1, ndarray::ones({4, 1})));
  const auto id = d.next_id++;
  d.send(wire::set_optimizer{id, "test", {{"rescale_grad", 2.0}}});
  BOOST_TEST_REQUIRE(d.ack(id) != nullptr);
  // Worker 0 runs a round ahead: its round-1 push waits until round 0 closes.
  BOOST_TEST(d.ack(push_rows(d, 1, 0, 0, rows_of({1}, 1, 1))) != nullptr);
  const auto early = push_rows(d, 1, 0, 1, rows_of({1, 2}, 1, 1));
  BOOST_TEST(d.replies_to(early) == 0u);
  BOOST_TEST(d.ack(push_rows(d, 1, 1, 0, rows_of({1}, 1, 2))) != nullptr);
  BOOST_TEST(d.stored(1) == (std::vector<float>{1, 7, 1, 1}), boost::test_tools::per_element());
  BOOST_TEST(d.ack(early) != nullptr);
  BOOST_TEST(d.ack(push_rows(d, 1, 1, 1, rows_of({2}, 1, 3))) != nullptr);
  BOOST_TEST(d.stored(1) == (std::vector<float>{1, 9, 9, 1}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(with_a_quorum_a_late_push_is_dropped_and_counted) {
  shard_driver d{3, quorum_of(2)};
  BOOST_TEST_REQUIRE(init_rows(d, 2, ndarray::ones({3, 1})));
  BOOST_TEST(d.ack(push_rows(d, 2, 0, 0, rows_of({0}, 1, 1))) != nullptr);
  BOOST_TEST(d.ack(push_rows(d, 2, 1, 0, rows_of({0}, 1, 1))) != nullptr);
  const auto* late = d.ack(push_rows(d, 2, 2, 0, rows_of({1}, 1, 5)));
  BOOST_TEST_REQUIRE(late != nullptr);
  BOOST_TEST(late->dropped);
  BOOST_TEST(d.shard->dropped_pushes(2) == 1u);
  BOOST_TEST(d.stored(2) == (std::vector<float>{2, 0, 0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(bad_rows_and_calls_of_the_wrong_kind_are_refused_and_change_nothing) {
  shard_driver d{2};
  BOOST_TEST_REQUIRE(init_rows(d, 6, ndarray::ones({4, 2})));
  BOOST_TEST_REQUIRE(d.init(7, ndarray::ones({4, 2})));
  auto refused = [&](std::uint64_t id, wire::error_code code, const std::string& words) {
    const auto* error = d.error(id);
    BOOST_TEST_REQUIRE(error != nullptr, "request " << id << " was not refused");
    BOOST_TEST((error->code == code), error->message);
    BOOST_TEST(error->message.find(words) != std::string::npos, error->message);
  };
  refused(push_rows(d, 6, 0, 0, rows_of({2, 1}, 2, 1)), wire::error_code::invalid_argument,
          "does not follow 2");
  refused(push_rows(d, 6, 0, 0, rows_of({4}, 2, 1)), wire::error_code::invalid_argument,
          "row id 4 (at position 0) is outside [0, 4)");
  refused(push_rows(d, 6, 0, 0, rows_of({-1}, 2, 1)), wire::error_code::invalid_argument,
          "outside [0, 4)");
  refused(push_rows(d, 6, 0, 0, rows_of({1}, 3, 1)), wire::error_code::shape_mismatch,
          "rows of shape (1,3)");
  // Ids that do not match the rows: two ids for one row.
  auto short_push = rows_of({1}, 2, 1);
  std::vector<std::int64_t> two{1, 2};
  auto tensor = short_push.tensor();
  tensor.row_ids = std::as_bytes(std::span{two});
  const auto mismatch = d.next_id++;
  d.send(wire::push{mismatch, 6, 0, 0, tensor}, short_push.values.keepalive());
  refused(mismatch, wire::error_code::invalid_argument, "16 bytes of row ids");
  refused(push_rows(d, 7, 0, 0, rows_of({1}, 2, 1)), wire::error_code::invalid_argument,
          "the key is dense");
  auto dense = ndarray::ones({4, 2});
  refused(d.push(6, 0, 0, dense), wire::error_code::invalid_argument,
          "takes row-sparse pushes only");
  refused(d.pull(6, 0, 0), wire::error_code::invalid_argument, "row_sparse_pull");
  refused(pull_rows(d, 7, 0, 0, {1}), wire::error_code::invalid_argument, "the key is dense");
  refused(pull_rows(d, 6, 0, 0, {3, 3}), wire::error_code::invalid_argument, "does not follow 3");
  refused(push_rows(d, 6, 5, 0, rows_of({1}, 2, 1)), wire::error_code::invalid_argument,
          "worker rank 5");
  BOOST_TEST(d.shard->completed_rounds(6) == 0u);
  BOOST_TEST(d.stored(6) == std::vector<float>(8, 1.0f), boost::test_tools::per_element());
  // A worker's second push of a round.
  BOOST_TEST(d.ack(push_rows(d, 6, 0, 0, rows_of({1}, 2, 1))) != nullptr);
  refused(push_rows(d, 6, 0, 0, rows_of({2}, 2, 1)), wire::error_code::invalid_argument,
          "pushed this round twice");
  refused(push_rows(d, 6, 0, 9, rows_of({2}, 2, 1)), wire::error_code::invalid_argument,
          "max_rounds_ahead");
}

BOOST_AUTO_TEST_CASE(dist_async_applies_each_push_of_rows_once) {
  sync_policy async;
  async.mode = consistency::async;
  shard_driver d{2, async};
  BOOST_TEST_REQUIRE(init_rows(d, 3, ndarray::ones({3, 1})));
  const auto id = d.next_id++;
  d.send(wire::set_optimizer{id, "test", {{"rescale_grad", 2.0}}});
  BOOST_TEST_REQUIRE(d.ack(id) != nullptr);
  BOOST_TEST(d.ack(push_rows(d, 3, 0, 0, rows_of({0, 2}, 1, 1))) != nullptr);
  BOOST_TEST(d.ack(push_rows(d, 3, 1, 0, rows_of({2}, 1, 1))) != nullptr);
  BOOST_TEST(d.ack(push_rows(d, 3, 0, 1, rows_of({2}, 1, 1))) != nullptr);
  BOOST_TEST(d.stored(3) == (std::vector<float>{3, 1, 7}), boost::test_tools::per_element());
  // A replay of a push had already: refused, not applied again.
  BOOST_TEST(d.error(push_rows(d, 3, 0, 1, rows_of({2}, 1, 1))) != nullptr);
  BOOST_TEST(d.stored(3) == (std::vector<float>{3, 1, 7}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_checkpoint_keeps_the_key_row_sparse) {
  shard_driver d{1};
  BOOST_TEST_REQUIRE(init_rows(d, 8, ndarray::ones({3, 1})));
  BOOST_TEST(d.ack(push_rows(d, 8, 0, 0, rows_of({1}, 1, 4))) != nullptr);
  const auto bytes = encode_snapshot(d.shard->snapshot(snapshot_kind::checkpoint, true));
  auto saved = decode_snapshot(bytes, "test");
  BOOST_TEST_REQUIRE(saved.has_value());
  BOOST_TEST_REQUIRE(saved->keys.size() == 1u);
  BOOST_TEST(saved->keys[0].row_sparse);
  shard_driver restored{1};
  BOOST_TEST_REQUIRE(restored.shard->restore(*saved).has_value());
  BOOST_TEST(restored.shard->completed_rounds(8) == 1u);
  BOOST_TEST(restored.ack(push_rows(restored, 8, 0, 1, rows_of({2}, 1, 5))) != nullptr);
  BOOST_TEST(restored.stored(8) == (std::vector<float>{0, 0, 5}), boost::test_tools::per_element());
  BOOST_TEST(restored.error(restored.pull(8, 0, 2)) != nullptr); // dense pull refused
}

BOOST_AUTO_TEST_CASE(after_a_worker_leaves_a_row_sparse_round_closes_with_the_workers_still_in) {
  shard_driver d{3};
  BOOST_TEST_REQUIRE(init_rows(d, 4, ndarray::ones({3, 1})));
  BOOST_TEST(d.ack(push_rows(d, 4, 0, 0, rows_of({0}, 1, 1))) != nullptr);
  BOOST_TEST(d.ack(push_rows(d, 4, 1, 0, rows_of({0, 2}, 1, 2))) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(4) == 0u);
  d.shard->on_membership(testing::with_left_workers(3, {2}));
  BOOST_TEST(d.shard->completed_rounds(4) == 1u);
  BOOST_TEST(d.stored(4) == (std::vector<float>{3, 0, 2}), boost::test_tools::per_element());
  const auto refused = push_rows(d, 4, 2, 1, rows_of({1}, 1, 5));
  BOOST_TEST_REQUIRE(d.error(refused) != nullptr);
  BOOST_TEST(d.error(refused)->message.find("worker 2 left the job") != std::string::npos);
  BOOST_TEST(d.ack(push_rows(d, 4, 0, 1, rows_of({1}, 1, 1))) != nullptr);
  BOOST_TEST(d.ack(push_rows(d, 4, 1, 1, rows_of({1}, 1, 1))) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(4) == 2u);
  BOOST_TEST(d.stored(4) == (std::vector<float>{0, 2, 0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_worker_that_joins_counts_in_a_row_sparse_key_from_the_next_open_round) {
  shard_options room;
  room.max_workers = 3;
  shard_driver d{2, {}, room};
  BOOST_TEST_REQUIRE(init_rows(d, 4, ndarray::ones({3, 1})));
  // Worker 0 has pushed round 0 when worker 2 joins: it counts from round 1.
  BOOST_TEST(d.ack(push_rows(d, 4, 0, 0, rows_of({0}, 1, 1))) != nullptr);
  d.shard->on_membership(testing::with_left_workers(3, {}));
  const auto early = push_rows(d, 4, 2, 0, rows_of({1}, 1, 5));
  BOOST_TEST_REQUIRE(d.error(early) != nullptr);
  BOOST_TEST(d.error(early)->message.find("joined the job at round 1") != std::string::npos);
  BOOST_TEST(d.ack(push_rows(d, 4, 1, 0, rows_of({2}, 1, 2))) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(4) == 1u);
  BOOST_TEST(d.stored(4) == (std::vector<float>{1, 0, 2}), boost::test_tools::per_element());
  // Round 1 waits for all three.
  BOOST_TEST(d.ack(push_rows(d, 4, 0, 1, rows_of({0}, 1, 1))) != nullptr);
  BOOST_TEST(d.ack(push_rows(d, 4, 1, 1, rows_of({0}, 1, 1))) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(4) == 1u);
  BOOST_TEST(d.ack(push_rows(d, 4, 2, 1, rows_of({1}, 1, 5))) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(4) == 2u);
  BOOST_TEST(d.stored(4) == (std::vector<float>{2, 5, 0}), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
