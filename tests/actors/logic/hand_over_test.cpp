// Elastic servers at the shard: key ranges handed from one shard to another
// (shard_core::hand_over / take_over), driven message by message. What the worker does is played
// by hand: a push whose round had not completed, and a request the old shard did not answer or
// refused as moved, go again to the new one.
// The values are checked bit for bit against a shard that kept every key all along.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/logic/key_placement.hpp"
#include "actors/logic/shard_checkpoint.hpp"
#include "schema/chunking.hpp"
#include "tests/actors/logic/shard_driver.hpp"

using namespace troupe;
using troupe::testing::shard_driver;

namespace {

constexpr std::uint32_t ranges = 2;
/// A key of range 0, which stays, and one of range 1, which moves.
constexpr std::uint64_t staying = 5;
const std::uint64_t moving = max_key / ranges + 5;

shard_options placed(std::uint32_t server_rank, std::uint32_t max_workers = 0) {
  shard_options options;
  options.num_servers = 2;
  options.server_rank = server_rank;
  options.num_ranges = ranges;
  options.max_workers = max_workers;
  return options;
}

sync_policy async_policy() {
  sync_policy policy;
  policy.mode = wire::consistency_mode::async;
  return policy;
}

/// The gradient worker `w` pushes in round `r`: different per worker and round, so that a push
/// applied twice or lost changes the value.
ndarray gradient(std::uint32_t w, std::uint64_t r) {
  std::vector<float> values(6);
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = 0.25f * static_cast<float>(w + 1) + 0.01f * static_cast<float>(r * 7 + i);
  return ndarray::from_values(values, {2, 3});
}

wire::set_optimizer momentum_sgd(std::uint64_t id) {
  return wire::set_optimizer{id, "sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}, {"wd", 0.01}}};
}

bool accepted(const status& outcome) {
  return static_cast<bool>(outcome);
}

bool moved(const wire::error_reply* refusal) {
  return refusal != nullptr && refusal->code == wire::error_code::moved &&
         refusal->message.find("key range 1") != std::string::npos;
}

} // namespace

BOOST_AUTO_TEST_SUITE(hand_over_of_key_ranges)

BOOST_AUTO_TEST_CASE(sgd_with_momentum_goes_on_bit_for_bit_on_the_shard_that_takes_the_range) {
  shard_driver old_shard(2, {}, placed(0)), new_shard(2, {}, placed(1)), fixed(2, {}, placed(0));
  auto initial = ndarray::full({2, 3}, 1.0);
  for (auto* shard : {&old_shard, &fixed}) {
    shard->send(momentum_sgd(shard->next_id++));
    BOOST_TEST_REQUIRE(shard->init(moving, initial));
    BOOST_TEST_REQUIRE(shard->init(staying, initial));
  }
  auto both_push = [](shard_driver& shard, std::uint64_t key, std::uint64_t round) {
    for (std::uint32_t w = 0; w < 2; ++w)
      BOOST_TEST_REQUIRE(shard.ack(shard.push(key, w, round, gradient(w, round))) != nullptr);
  };
  for (std::uint64_t round = 0; round < 3; ++round)
    for (auto* shard : {&old_shard, &fixed})
      for (auto key : {moving, staying})
        both_push(*shard, key, round);

  // Round 3 is being collected: worker 0 has pushed it (acked, with the 3 rounds completed as
  // its durable round: it keeps a copy), and round 4 (deferred), and waits on a pull of round 5.
  const auto acked = old_shard.push(moving, 0, 3, gradient(0, 3));
  BOOST_TEST_REQUIRE(old_shard.ack(acked) != nullptr);
  BOOST_TEST(old_shard.ack(acked)->durable == 3u);
  const auto deferred = old_shard.push(moving, 0, 4, gradient(0, 4));
  const auto waiting_pull = old_shard.pull(moving, 0, 5);
  auto handed = old_shard.shard->hand_over({1});
  BOOST_TEST_REQUIRE(handed.has_value());
  BOOST_TEST(old_shard.replies_to(deferred) == 0u, "a deferred push leaves unanswered");
  BOOST_TEST(old_shard.replies_to(waiting_pull) == 0u, "a waiting pull leaves unanswered");
  BOOST_TEST_REQUIRE(handed->keys.size() == 1u);
  BOOST_TEST(handed->keys[0].ps_key == moving);
  BOOST_TEST(handed->keys[0].completed == 3u, "the round being collected is not carried");
  BOOST_TEST(handed->optimizer_states.has_value());
  BOOST_TEST(old_shard.shard->value(moving).is_none(), "the old shard keeps nothing of it");

  // The old shard refuses the key from now on (moved), its other range goes on.
  BOOST_TEST(moved(old_shard.error(old_shard.push(moving, 1, 4, gradient(1, 4)))));
  BOOST_TEST(moved(old_shard.error(old_shard.pull(moving, 1, 4))));
  both_push(old_shard, staying, 3);

  // The hand-over travels as a file's bytes would.
  auto carried = decode_snapshot(encode_snapshot(*handed), "hand-over");
  BOOST_TEST_REQUIRE(carried.has_value(), (carried ? std::string{} : carried.error().message()));
  BOOST_TEST_REQUIRE(accepted(new_shard.shard->take_over(*carried)));
  BOOST_TEST(new_shard.shard->completed_rounds(moving) == 3u);
  BOOST_TEST(!accepted(new_shard.shard->take_over(*carried)), "a key held already is refused");

  // The workers send again what the old shard held of rounds 3 and 4: worker 0's kept push of
  // round 3 and its deferred one, marked resent, and worker 1's refused push.
  auto resent = [&](std::uint32_t w, std::uint64_t round) {
    const auto id = new_shard.next_id++;
    auto g = gradient(w, round);
    new_shard.send(wire::push{id, moving, w, round, troupe::testing::whole(g), true}, g);
    BOOST_TEST_REQUIRE(new_shard.ack(id) != nullptr);
  };
  resent(0, 3);
  resent(1, 3);
  resent(0, 4);
  BOOST_TEST_REQUIRE(new_shard.ack(new_shard.push(moving, 1, 4, gradient(1, 4))) != nullptr);
  both_push(fixed, moving, 3);
  both_push(fixed, moving, 4);
  BOOST_TEST(new_shard.stored(moving) == fixed.stored(moving));
  // A push sent again whose round the new shard holds already is acked, not applied.
  resent(0, 3);
  BOOST_TEST(new_shard.stored(moving) == fixed.stored(moving));
  for (std::uint64_t round = 5; round < 8; ++round) {
    both_push(new_shard, moving, round);
    both_push(fixed, moving, round);
    BOOST_TEST((new_shard.stored(moving) == fixed.stored(moving)), "round " << round);
  }
  const auto pulled = new_shard.pulled(new_shard.pull(moving, 0, 8));
  BOOST_TEST_REQUIRE(pulled.has_value());
  BOOST_TEST(*pulled == fixed.stored(moving));
  both_push(fixed, staying, 3);
  BOOST_TEST(old_shard.stored(staying) == fixed.stored(staying));
}

BOOST_AUTO_TEST_CASE(in_dist_async_every_push_is_applied_once_across_the_hand_over) {
  shard_driver old_shard(2, async_policy(), placed(0)), new_shard(2, async_policy(), placed(1));
  // The test optimizer adds each push to the value: a push applied twice or lost shows.
  old_shard.send(wire::set_optimizer{old_shard.next_id++, "test", {{"rescale_grad", 1.0}}});
  auto zeros = ndarray::zeros({2, 3});
  BOOST_TEST_REQUIRE(old_shard.init(moving, zeros));
  std::vector<float> expected(6, 0.0f);
  auto add = [&](std::uint32_t w, std::uint64_t r) {
    auto g = gradient(w, r).to_vector<float>();
    for (std::size_t i = 0; i < expected.size(); ++i)
      expected[i] += g[i];
  };
  for (std::uint64_t seq = 0; seq < 3; ++seq)
    for (std::uint32_t w = 0; w < 2; ++w) {
      BOOST_TEST_REQUIRE(old_shard.ack(old_shard.push(moving, w, seq, gradient(w, seq))) !=
                         nullptr);
      add(w, seq);
    }
  // Worker 1's push 3 is under way, its first chunk in, when the range leaves.
  auto under_way = gradient(1, 3);
  auto chunks = shard_driver::push_chunks(old_shard.next_id++, moving, 1, 3, under_way, 8);
  old_shard.send(chunks[0], under_way);
  auto handed = old_shard.shard->hand_over({1});
  BOOST_TEST_REQUIRE(handed.has_value());
  BOOST_TEST(moved(old_shard.error(wire::request_id_of(chunks[0]))) == false);
  old_shard.send(chunks[1], under_way);
  BOOST_TEST(moved(old_shard.error(wire::request_id_of(chunks[1]))));
  BOOST_TEST_REQUIRE(accepted(new_shard.shard->take_over(*handed)));

  // Worker 0 had its push 2 acked, yet sends it again (the table reached it before the ack): it
  // is acknowledged and not applied. Worker 1's push 3 goes whole to the new shard.
  new_shard.send(
      wire::push{new_shard.next_id++, moving, 0, 2, troupe::testing::whole(gradient(0, 2)), true},
      gradient(0, 2));
  BOOST_TEST_REQUIRE(new_shard.ack(new_shard.next_id - 1) != nullptr);
  BOOST_TEST_REQUIRE(new_shard.ack(new_shard.push(moving, 1, 3, under_way)) != nullptr);
  add(1, 3);
  BOOST_TEST_REQUIRE(new_shard.ack(new_shard.push(moving, 0, 3, gradient(0, 3))) != nullptr);
  add(0, 3);
  BOOST_TEST(new_shard.stored(moving) == expected);
  BOOST_TEST(new_shard.shard->completed_rounds(moving) == 8u);
  // A push replayed without being marked resent is refused as from the past.
  BOOST_TEST(new_shard.error(new_shard.push(moving, 1, 0, gradient(1, 0))) != nullptr);
  BOOST_TEST(new_shard.stored(moving) == expected);
}

BOOST_AUTO_TEST_CASE(a_worker_that_joined_keeps_its_first_round_on_the_new_shard) {
  // Worker 2 joins while worker 0 has pushed round 1: it counts from round 2 on.
  shard_driver old_shard(2, {}, placed(0, 3)), new_shard(2, {}, placed(1, 3));
  BOOST_TEST_REQUIRE(old_shard.init(moving, ndarray::zeros({2, 3})));
  for (std::uint32_t w = 0; w < 2; ++w)
    old_shard.push(moving, w, 0, gradient(w, 0));
  old_shard.push(moving, 0, 1, gradient(0, 1));
  wire::membership table;
  table.epoch = 2;
  for (std::uint32_t w = 0; w < 3; ++w) {
    wire::node_info node;
    node.node_role = wire::role::worker;
    node.rank = w;
    node.alive = true;
    table.nodes.push_back(node);
  }
  old_shard.shard->on_membership(table);
  new_shard.shard->on_membership(table);
  // Round 1 is being collected when the key leaves: it completes on the new shard.
  auto handed = old_shard.shard->hand_over({1});
  BOOST_TEST_REQUIRE(handed.has_value());
  BOOST_TEST_REQUIRE(handed->keys.size() == 1u);
  BOOST_TEST_REQUIRE(handed->keys[0].joined.size() == 1u);
  BOOST_TEST(handed->keys[0].joined[0].worker == 2u);
  BOOST_TEST(handed->keys[0].joined[0].round == 2u);
  BOOST_TEST_REQUIRE(accepted(new_shard.shard->take_over(*handed)));
  auto again = gradient(0, 1);
  new_shard.send(wire::push{new_shard.next_id++, moving, 0, 1, troupe::testing::whole(again), true},
                 again);
  new_shard.push(moving, 1, 1, gradient(1, 1));
  BOOST_TEST(new_shard.shard->completed_rounds(moving) == 2u);
  // Round 2 waits for the joiner too.
  new_shard.push(moving, 0, 2, gradient(0, 2));
  new_shard.push(moving, 1, 2, gradient(1, 2));
  BOOST_TEST(new_shard.shard->completed_rounds(moving) == 2u);
  new_shard.push(moving, 2, 2, gradient(2, 2));
  BOOST_TEST(new_shard.shard->completed_rounds(moving) == 3u);
}

BOOST_AUTO_TEST_CASE(a_hand_over_or_take_over_that_does_not_fit_is_refused_and_changes_nothing) {
  shard_driver old_shard(2, {}, placed(0)), other(2, async_policy(), placed(1));
  BOOST_TEST_REQUIRE(old_shard.init(moving, ndarray::ones({2, 3})));
  BOOST_TEST(!old_shard.shard->hand_over({2}).has_value(), "range beyond job.max_servers");
  BOOST_TEST(!old_shard.shard->hand_over({}).has_value(), "no range");
  BOOST_TEST(old_shard.stored(moving) == std::vector<float>(6, 1.0f));

  auto handed = old_shard.shard->hand_over({1});
  BOOST_TEST_REQUIRE(handed.has_value());
  // A shard with keys of another policy refuses it.
  BOOST_TEST_REQUIRE(other.init(staying, ndarray::ones({2, 3})));
  auto refusal = other.shard->take_over(*handed);
  BOOST_TEST(!accepted(refusal));
  BOOST_TEST(refusal.error().message().find("sync policy") != std::string::npos,
             refusal.error().message());
  BOOST_TEST(other.shard->value(moving).is_none());
  // ... and so does one of another placement.
  shard_driver elsewhere(3, {}, placed(1));
  refusal = elsewhere.shard->take_over(*handed);
  BOOST_TEST(!accepted(refusal));
  BOOST_TEST(refusal.error().message().find("workers 2 (here 3)") != std::string::npos,
             refusal.error().message());
  // A key of a range the hand-over does not hold.
  auto wrong = *handed;
  wrong.ranges = {0};
  shard_driver empty(2, {}, placed(1));
  refusal = empty.shard->take_over(wrong);
  BOOST_TEST(!accepted(refusal));
  BOOST_TEST(refusal.error().message().find("does not hold") != std::string::npos,
             refusal.error().message());
  BOOST_TEST(empty.shard->value(moving).is_none());
  // The range can come back to the shard it left.
  BOOST_TEST_REQUIRE(accepted(old_shard.shard->take_over(*handed)));
  BOOST_TEST(old_shard.ack(old_shard.push(moving, 0, 0, gradient(0, 0))) != nullptr);
}

BOOST_AUTO_TEST_CASE(a_hand_over_arrives_as_range_data_chunks_and_is_acked_once_taken) {
  shard_driver old_shard(2, {}, placed(0)), new_shard(2, {}, placed(1));
  auto value = ndarray::full({2, 3}, 2.5);
  BOOST_TEST_REQUIRE(old_shard.init(moving, value));
  auto handed = old_shard.shard->hand_over({1});
  BOOST_TEST_REQUIRE(handed.has_value());
  const auto encoded = encode_hand_over(*handed);
  BOOST_TEST(encoded.words.size() % 8 == 0u);
  BOOST_TEST(encoded.words.size() - encoded.bytes < 8u);
  wire::chunker chunks{range_data_of(41, 0, encoded), 64};
  BOOST_TEST_REQUIRE(chunks.chunk_count() > 2u);
  // A chunk out of order is refused, and the hand-over starts again from its first chunk.
  new_shard.send(chunks.chunk(1));
  BOOST_TEST_REQUIRE(new_shard.error(41) != nullptr);
  new_shard.replies.clear();
  for (std::size_t c = 0; c < chunks.chunk_count(); ++c) {
    BOOST_TEST(new_shard.ack(41) == nullptr);
    new_shard.send(chunks.chunk(c));
  }
  BOOST_TEST_REQUIRE(new_shard.ack(41) != nullptr);
  BOOST_TEST(new_shard.stored(moving) == std::vector<float>(6, 2.5f));
  // The same again is refused (the key is held here now), and so is one for another shard.
  new_shard.replies.clear();
  wire::chunker again{range_data_of(42, 0, encoded), std::size_t{1} << 20};
  new_shard.send(again.chunk(0));
  BOOST_TEST_REQUIRE(new_shard.error(42) != nullptr);
  BOOST_TEST(new_shard.error(42)->message.find("held here already") != std::string::npos);
  wire::chunker elsewhere{range_data_of(43, 1, encoded), std::size_t{1} << 20};
  new_shard.send(elsewhere.chunk(0));
  BOOST_TEST_REQUIRE(new_shard.error(43) != nullptr);
  BOOST_TEST(new_shard.stored(moving) == std::vector<float>(6, 2.5f));
}

BOOST_AUTO_TEST_SUITE_END()
