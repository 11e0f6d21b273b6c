// dist_sync with a quorum, through a shard_core driven message by message: a round closes with
// the first K workers whose every byte has arrived, its update uses exactly their sum (checked
// against the closed form with the `test` optimizer and in replace mode), the pushes that did not
// make it are acknowledged as dropped, counted, and never reach a later round; rescale_quorum
// scales the sum by N / K. A worker that leaves the job (the membership table marks it left)
// counts until its last push, and the rounds after it close with the workers still in.

#include <numeric>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "tests/actors/logic/shard_driver.hpp"

using namespace troupe;
using troupe::testing::quorum_of;
using troupe::testing::shard_driver;
using troupe::testing::with_left_workers;

namespace {

constexpr std::uint64_t key = 42;
constexpr std::int64_t elements = 6;
constexpr std::size_t chunk_bytes = 8; // three chunks per push

/// Worker w's push in round i: distinct per worker and per round, so that a push applied to the
/// wrong round shows.
float contribution(std::uint32_t worker, std::uint64_t round) {
  return static_cast<float>(worker + 1) + 10.0f * static_cast<float>(round);
}

/// The quorums the sweep tries for n workers: 1, n - 1 and n, each once.
std::vector<std::uint32_t> quorums_for(std::uint32_t workers) {
  std::vector<std::uint32_t> quorums{1};
  if (workers - 1 > 1)
    quorums.push_back(workers - 1);
  if (workers > 1)
    quorums.push_back(workers);
  return quorums;
}

} // namespace

BOOST_AUTO_TEST_SUITE(shard_quorum)

BOOST_AUTO_TEST_CASE(a_round_sums_exactly_the_first_k_workers_to_push_every_byte) {
  constexpr std::uint64_t rounds = 3;
  for (std::uint32_t workers : {2u, 3u, 5u})
    for (auto quorum : quorums_for(workers))
      for (bool with_optimizer : {true, false}) {
        BOOST_TEST_CONTEXT("N = " << workers << ", K = " << quorum
                                  << (with_optimizer ? ", test optimizer" : ", replace")) {
          shard_driver job{workers, quorum_of(quorum)};
          if (with_optimizer)
            job.send(wire::set_optimizer{1, "test", {{"rescale_grad", 2.0}}});
          auto initial = ndarray::ones({elements});
          BOOST_TEST_REQUIRE(job.init(key, initial));
          float expected = 1.0f;
          for (std::uint64_t round = 0; round < rounds; ++round) {
            // The order in which workers finish changes every round; the last one starts first
            // and finishes last, so with K < N part of its push is there before the round
            // closes without it.
            std::vector<std::uint32_t> order(workers);
            for (std::uint32_t j = 0; j < workers; ++j)
              order[j] = static_cast<std::uint32_t>((j + round) % workers);
            auto straggler = order.back();
            std::vector<ndarray> values;
            std::vector<std::vector<wire::message>> chunks;
            std::vector<std::uint64_t> ids;
            for (std::uint32_t w = 0; w < workers; ++w) {
              values.push_back(ndarray::full({elements}, contribution(w, round)));
              ids.push_back(job.next_id++);
              chunks.push_back(
                  shard_driver::push_chunks(ids[w], key, w, round, values[w], chunk_bytes));
            }
            auto pull = job.pull(key, order.front(), round + 1);
            job.send(chunks[straggler][0], values[straggler].keepalive());
            for (std::size_t c = 0; c < 3; ++c)
              for (std::uint32_t j = 0; j + 1 < workers; ++j)
                job.send(chunks[order[j]][c], values[order[j]].keepalive());
            for (std::size_t c = 1; c < 3; ++c)
              job.send(chunks[straggler][c], values[straggler].keepalive());

            float sum = 0;
            for (std::uint32_t j = 0; j < quorum; ++j)
              sum += contribution(order[j], round);
            expected = with_optimizer ? expected + 2.0f * sum : sum;
            BOOST_TEST(job.stored(key) == std::vector<float>(elements, expected),
                       boost::test_tools::per_element());
            BOOST_TEST(job.shard->completed_rounds(key) == round + 1);
            auto pulled = job.pulled(pull);
            BOOST_TEST_REQUIRE(pulled.has_value());
            BOOST_TEST(*pulled == std::vector<float>(elements, expected),
                       boost::test_tools::per_element());
            for (std::uint32_t j = 0; j < workers; ++j) {
              auto* ack = job.ack(ids[order[j]]);
              BOOST_TEST_REQUIRE(ack != nullptr);
              BOOST_TEST(ack->dropped == (j >= quorum));
              if (j >= quorum)
                BOOST_TEST(ack->round == round + 1);
            }
          }
          BOOST_TEST(job.shard->dropped_pushes(key) == (workers - quorum) * rounds);
          BOOST_TEST(job.shard->stats().late_pushes_dropped == (workers - quorum) * rounds);
          BOOST_TEST(job.shard->stats().updates == rounds);
          BOOST_TEST(job.shard->stats().requests_refused == 0u);
        }
      }
}

BOOST_AUTO_TEST_CASE(rescale_quorum_multiplies_the_sum_by_n_over_k_and_nothing_else_does) {
  for (bool rescale : {true, false})
    for (bool with_optimizer : {true, false}) {
      BOOST_TEST_CONTEXT((rescale ? "rescaled, " : "not rescaled, ")
                         << (with_optimizer ? "test optimizer" : "replace")) {
        shard_driver job{3, quorum_of(2, 2, rescale)};
        if (with_optimizer)
          job.send(wire::set_optimizer{1, "test", {{"rescale_grad", 2.0}}});
        auto initial = ndarray::ones({elements});
        BOOST_TEST_REQUIRE(job.init(key, initial));
        auto one = ndarray::full({elements}, 1.0), two = ndarray::full({elements}, 2.0);
        job.push(key, 0, 0, one);
        job.push(key, 1, 0, two);
        // (1 + 2) * 3 / 2 = 4.5 rescaled; with `test`, the value becomes 1 + 2 * sum.
        float sum = rescale ? 4.5f : 3.0f;
        BOOST_TEST(job.stored(key) ==
                       std::vector<float>(elements, with_optimizer ? 1.0f + 2.0f * sum : sum),
                   boost::test_tools::per_element());
      }
    }
}

BOOST_AUTO_TEST_CASE(a_late_pushpull_is_answered_at_once_with_the_value_of_the_closed_round) {
  shard_driver job{3, quorum_of(2)};
  auto initial = ndarray::zeros({elements});
  BOOST_TEST_REQUIRE(job.init(key, initial));
  auto one = ndarray::full({elements}, 1.0), two = ndarray::full({elements}, 2.0);
  auto late = ndarray::full({elements}, 100.0);
  job.push(key, 0, 0, one);
  job.push(key, 1, 0, two);
  auto pushpull = job.pushpull(key, 2, 0, late);
  auto* reply = job.value_reply(pushpull);
  BOOST_TEST_REQUIRE(reply != nullptr);
  BOOST_TEST(reply->round == 1u);
  BOOST_TEST(testing::floats_of(reply->tensor) == std::vector<float>(elements, 3.0f),
             boost::test_tools::per_element());
  BOOST_TEST(job.shard->dropped_pushes(key) == 1u);
  // The worker that was late takes part in the next round like any other.
  job.push(key, 2, 1, late);
  job.push(key, 0, 1, one);
  BOOST_TEST(job.stored(key) == std::vector<float>(elements, 101.0f),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(after_a_worker_leaves_rounds_close_with_the_workers_still_in) {
  shard_driver d{3}; // no optimizer: each round's sum becomes the value
  auto one = ndarray::full({elements}, 1.0f), two = ndarray::full({elements}, 2.0f),
       four = ndarray::full({elements}, 4.0f);
  BOOST_TEST_REQUIRE(d.init(key, one));
  // Round 0: workers 0 and 1 push, worker 2 never does; a pull for round 1 waits.
  BOOST_TEST(d.ack(d.push(key, 0, 0, one)) != nullptr);
  BOOST_TEST(d.ack(d.push(key, 1, 0, two)) != nullptr);
  const auto waiting = d.pull(key, 0, 1);
  BOOST_TEST(d.replies_to(waiting) == 0u);
  // Worker 2 leaves: round 0 closes with the two pushes it has, and the pull is answered.
  d.shard->on_membership(with_left_workers(3, {2}));
  BOOST_TEST(d.shard->completed_rounds(key) == 1u);
  BOOST_TEST(*d.pulled(waiting) == std::vector<float>(elements, 3.0f),
             boost::test_tools::per_element());
  // Round 1 needs workers 0 and 1 only; worker 2's push is refused, naming the leave, and
  // changes nothing.
  const auto refused = d.push(key, 2, 1, four);
  BOOST_TEST_REQUIRE(d.error(refused) != nullptr);
  BOOST_TEST(d.error(refused)->message.find("worker 2 left the job") != std::string::npos);
  BOOST_TEST(d.ack(d.push(key, 0, 1, two)) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(key) == 1u);
  BOOST_TEST(d.ack(d.push(key, 1, 1, two)) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(key) == 2u);
  BOOST_TEST(d.stored(key) == std::vector<float>(elements, 4.0f), boost::test_tools::per_element());
  // A key initialised after the leave closes its rounds without worker 2 from round 0 on, and
  // the same table again changes nothing.
  d.shard->on_membership(with_left_workers(3, {2}));
  BOOST_TEST_REQUIRE(d.init(key + 1, one));
  BOOST_TEST(d.ack(d.push(key + 1, 0, 0, one)) != nullptr);
  BOOST_TEST(d.ack(d.push(key + 1, 1, 0, four)) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(key + 1) == 1u);
  BOOST_TEST(d.stored(key + 1) == std::vector<float>(elements, 5.0f),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_worker_that_joins_counts_from_the_first_round_no_push_has_reached) {
  shard_options room;
  room.max_workers = 4;
  shard_driver d{2, {}, room}; // no optimizer: each round's sum becomes the value
  auto one = ndarray::full({elements}, 1.0f), two = ndarray::full({elements}, 2.0f),
       four = ndarray::full({elements}, 4.0f);
  BOOST_TEST_REQUIRE(d.init(key, one));
  // Before any table lists it, rank 2 is no member: its push and its pull are refused.
  const auto outsider = d.push(key, 2, 0, four);
  BOOST_TEST_REQUIRE(d.error(outsider) != nullptr);
  BOOST_TEST(d.error(outsider)->message.find("worker rank 2 is not a member") != std::string::npos);
  const auto beyond = d.pull(key, 4, 0);
  BOOST_TEST_REQUIRE(d.error(beyond) != nullptr);
  BOOST_TEST(d.error(beyond)->message.find("beyond the job's 4 worker ranks") != std::string::npos);
  // Round 0 closes with workers 0 and 1; worker 0 has pushed round 1 already.
  BOOST_TEST(d.ack(d.push(key, 0, 0, one)) != nullptr);
  BOOST_TEST(d.ack(d.push(key, 1, 0, two)) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(key) == 1u);
  BOOST_TEST(d.ack(d.push(key, 0, 1, one)) != nullptr);
  // Worker 2 joins: round 1 has bytes already, so it counts from round 2 on.
  d.shard->on_membership(with_left_workers(3, {}));
  const auto first = d.pull(key, 2, 0);
  BOOST_TEST(d.replies_to(first) == 0u); // waits for the rounds before its first
  const auto early = d.push(key, 2, 1, four);
  BOOST_TEST_REQUIRE(d.error(early) != nullptr);
  BOOST_TEST(d.error(early)->message.find("joined the job at round 2") != std::string::npos);
  BOOST_TEST(d.ack(d.push(key, 1, 1, two)) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(key) == 2u); // round 1 closed without it
  BOOST_TEST_REQUIRE(d.value_reply(first) != nullptr);
  BOOST_TEST(d.value_reply(first)->round == 2u);
  BOOST_TEST(*d.pulled(first) == std::vector<float>(elements, 3.0f),
             boost::test_tools::per_element());
  // Round 2 waits for all three.
  BOOST_TEST(d.ack(d.push(key, 0, 2, one)) != nullptr);
  BOOST_TEST(d.ack(d.push(key, 1, 2, two)) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(key) == 2u);
  BOOST_TEST(d.ack(d.push(key, 2, 2, four)) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(key) == 3u);
  BOOST_TEST(d.stored(key) == std::vector<float>(elements, 7.0f), boost::test_tools::per_element());
  // A key initialised after the join counts it from its round 0.
  BOOST_TEST_REQUIRE(d.init(key + 1, one));
  BOOST_TEST(d.ack(d.push(key + 1, 0, 0, one)) != nullptr);
  BOOST_TEST(d.ack(d.push(key + 1, 1, 0, one)) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(key + 1) == 0u);
  BOOST_TEST(d.ack(d.push(key + 1, 2, 0, two)) != nullptr);
  BOOST_TEST(d.stored(key + 1) == std::vector<float>(elements, 4.0f),
             boost::test_tools::per_element());
  // Worker 2 leaves after its push of round 3, worker 0 before pushing it: round 3 closes with
  // workers 1 and 2.
  BOOST_TEST(d.ack(d.push(key, 2, 3, four)) != nullptr);
  d.shard->on_membership(with_left_workers(3, {0, 2}));
  BOOST_TEST(d.ack(d.push(key, 1, 3, two)) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(key) == 4u);
  BOOST_TEST(d.stored(key) == std::vector<float>(elements, 6.0f), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_quorum_below_n_tolerates_as_many_losses_after_workers_join) {
  // Three workers, quorum 2 (one loss tolerated); a fourth joins: its rounds close with 3 of 4.
  shard_options room;
  room.max_workers = 4;
  shard_driver d{3, quorum_of(2), room};
  auto one = ndarray::full({elements}, 1.0f);
  BOOST_TEST_REQUIRE(d.init(key, one));
  d.shard->on_membership(with_left_workers(4, {}));
  BOOST_TEST(d.ack(d.push(key, 3, 0, one)) != nullptr);
  BOOST_TEST(d.ack(d.push(key, 0, 0, one)) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(key) == 0u);
  BOOST_TEST(d.ack(d.push(key, 1, 0, one)) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(key) == 1u);
  BOOST_TEST(d.stored(key) == std::vector<float>(elements, 3.0f), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_worker_that_leaves_with_a_push_in_the_open_round_still_counts_in_it) {
  shard_driver d{2};
  auto one = ndarray::full({elements}, 1.0f), two = ndarray::full({elements}, 2.0f);
  BOOST_TEST_REQUIRE(d.init(key, one));
  // Worker 0 pushed rounds 0 and 1 (the second waits for its round), then leaves: both rounds
  // still hold its push, and from round 2 on worker 1 closes them alone.
  BOOST_TEST(d.ack(d.push(key, 0, 0, one)) != nullptr);
  const auto early = d.push(key, 0, 1, one);
  d.shard->on_membership(with_left_workers(2, {0}));
  BOOST_TEST(d.shard->completed_rounds(key) == 0u);
  BOOST_TEST(d.ack(d.push(key, 1, 0, two)) != nullptr);
  BOOST_TEST(d.ack(early) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(key) == 1u);
  BOOST_TEST(d.ack(d.push(key, 1, 1, two)) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(key) == 2u);
  BOOST_TEST(d.stored(key) == std::vector<float>(elements, 3.0f), boost::test_tools::per_element());
  BOOST_TEST(d.ack(d.push(key, 1, 2, two)) != nullptr);
  BOOST_TEST(d.shard->completed_rounds(key) == 3u);
  BOOST_TEST(d.stored(key) == std::vector<float>(elements, 2.0f), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
