// A key's dist_sync round object driven alone, with no shard and no actors: chunks of any size
// summed as they arrive, a quorum that leaves unfinished pushes out of the sum, early pushes kept
// (copied) for their round and let in in arrival order, and every refusal naming the values.

#include <cstring>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/logic/sync_round.hpp"

using namespace troupe;

namespace {

constexpr std::size_t elements = 8; // 32 bytes of float32

ndarray filled(float value) {
  return ndarray::full({static_cast<std::int64_t>(elements)}, value);
}

/// Bytes [from, to) of `value` as a chunk of `sender`'s push `id` for `round`.
push_chunk part(std::uint64_t id, std::uint32_t sender, std::uint64_t round, const ndarray& value,
                std::size_t from = 0, std::size_t to = elements * sizeof(float)) {
  auto* bytes = static_cast<const std::byte*>(value.raw_data());
  return push_chunk{id, sender, round, from, {bytes + from, to - from}};
}

sync_round make_round(std::uint32_t workers, std::uint32_t quorum, std::uint32_t ahead = 2) {
  return sync_round{filled(0), sync_round_options{9, workers, quorum, ahead}};
}

std::vector<float> all(float value) {
  return std::vector<float>(elements, value);
}

} // namespace

BOOST_AUTO_TEST_SUITE(sync_round_alone)

BOOST_AUTO_TEST_CASE(a_round_of_every_worker_sums_chunks_of_any_size_as_they_arrive) {
  auto round = make_round(3, 3);
  auto one = filled(1), two = filled(2), three = filled(3);
  BOOST_TEST((round.add(part(1, 0, 0, one, 0, 8)).fate == chunk_fate::taken));
  BOOST_TEST((round.add(part(2, 1, 0, two, 0, 16)).fate == chunk_fate::taken));
  BOOST_TEST((round.add(part(3, 2, 0, three)).fate == chunk_fate::completed));
  BOOST_TEST((round.add(part(2, 1, 0, two, 16, 32)).fate == chunk_fate::completed));
  BOOST_TEST(!round.quorum_reached());
  BOOST_TEST((round.add(part(1, 0, 0, one, 8, 32)).fate == chunk_fate::completed));
  BOOST_TEST_REQUIRE(round.quorum_reached());
  BOOST_TEST(round.sum().to_vector<float>() == all(6), boost::test_tools::per_element());
  round.close();
  BOOST_TEST(round.completed() == 1u);
  BOOST_TEST(!round.quorum_reached());
}

BOOST_AUTO_TEST_CASE(with_a_quorum_below_n_an_unfinished_push_stays_out_of_the_sum_and_is_dropped) {
  auto round = make_round(3, 2);
  auto one = filled(1), two = filled(2), hundred = filled(100);
  BOOST_TEST((round.add(part(3, 2, 0, hundred, 0, 16)).fate == chunk_fate::taken));
  BOOST_TEST((round.add(part(1, 0, 0, one)).fate == chunk_fate::completed));
  BOOST_TEST((round.add(part(2, 1, 0, two, 0, 8)).fate == chunk_fate::taken));
  BOOST_TEST((round.add(part(2, 1, 0, two, 8, 32)).fate == chunk_fate::completed));
  BOOST_TEST_REQUIRE(round.quorum_reached());
  BOOST_TEST(round.sum().to_vector<float>() == all(3), boost::test_tools::per_element());
  round.close();
  // Worker 2's remaining bytes come after the round closed: taken as late, dropped when whole.
  BOOST_TEST((round.add(part(3, 2, 0, hundred, 16, 24)).fate == chunk_fate::late));
  BOOST_TEST((round.add(part(3, 2, 0, hundred, 24, 32)).fate == chunk_fate::dropped));
  BOOST_TEST(round.dropped() == 1u);
  // A late push that starts over is refused, not counted twice.
  BOOST_TEST(round.add(part(4, 2, 0, hundred, 8, 32)).refused());
  BOOST_TEST(round.dropped() == 1u);
  // The next round starts empty: worker 2's bytes never reach it.
  BOOST_TEST((round.add(part(5, 2, 1, two)).fate == chunk_fate::completed));
  BOOST_TEST((round.add(part(6, 0, 1, one)).fate == chunk_fate::completed));
  BOOST_TEST(round.sum().to_vector<float>() == all(3), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(deferred_pushes_enter_their_round_in_arrival_order_and_late_ones_drop) {
  auto round = make_round(2, 1);
  auto one = filled(1), ten = filled(10), twenty = filled(20);
  std::vector<std::string> answers;
  auto answer = [&](std::string who) {
    return [&answers, who](const push_outcome& how) {
      answers.push_back(who + (how.dropped ? " dropped" : " entered"));
    };
  };
  BOOST_TEST((round.defer(part(1, 1, 1, twenty), answer("w1r1")).fate == chunk_fate::deferred));
  BOOST_TEST((round.defer(part(2, 0, 1, ten), answer("w0r1")).fate == chunk_fate::deferred));
  BOOST_TEST(round.deferred() == 2u);
  BOOST_TEST((round.add(part(3, 0, 0, one)).fate == chunk_fate::completed));
  BOOST_TEST(round.sum().to_vector<float>() == all(1), boost::test_tools::per_element());
  round.close();
  // Worker 1's push came first, so it alone completes round 1.
  for (auto& admitted : round.admit_deferred())
    admitted.answer({admitted.dropped, std::nullopt});
  BOOST_TEST_REQUIRE(round.quorum_reached());
  BOOST_TEST(round.sum().to_vector<float>() == all(20), boost::test_tools::per_element());
  round.close();
  for (auto& admitted : round.admit_deferred())
    admitted.answer({admitted.dropped, std::nullopt});
  BOOST_TEST(answers == (std::vector<std::string>{"w1r1 entered", "w0r1 dropped"}),
             boost::test_tools::per_element());
  BOOST_TEST(round.deferred() == 0u);
  BOOST_TEST(round.dropped() == 1u);
}

BOOST_AUTO_TEST_CASE(a_deferred_push_is_a_copy_of_its_chunks) {
  auto round = make_round(2, 2);
  auto source = filled(5);
  BOOST_TEST((round.defer(part(1, 0, 1, source, 0, 16), {}).fate == chunk_fate::deferred));
  BOOST_TEST((round.defer(part(1, 0, 1, source, 16, 32), {}).fate == chunk_fate::deferred));
  // The frame the chunks came in is reused for something else; the round kept its own copy.
  std::memset(source.raw_data(), 0xff, source.nbytes());
  auto one = filled(1), two = filled(2);
  round.add(part(2, 0, 0, one));
  round.add(part(3, 1, 0, two));
  round.close();
  BOOST_TEST(round.admit_deferred().size() == 1u);
  BOOST_TEST((round.add(part(4, 1, 1, two)).fate == chunk_fate::completed));
  BOOST_TEST(round.sum().to_vector<float>() == all(7), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_push_more_than_max_rounds_ahead_is_refused_naming_the_rounds) {
  auto round = make_round(2, 2, 2);
  auto one = filled(1);
  BOOST_TEST((round.defer(part(1, 0, 1, one), {}).fate == chunk_fate::deferred));
  BOOST_TEST((round.defer(part(2, 0, 2, one), {}).fate == chunk_fate::deferred));
  auto beyond = round.defer(part(3, 0, 3, one), {});
  BOOST_TEST_REQUIRE(beyond.refused());
  BOOST_TEST((beyond.code == wire::error_code::invalid_argument));
  BOOST_TEST(beyond.problem.find("key 9 for round 3 from worker 0") != std::string::npos);
  BOOST_TEST(beyond.problem.find("round 0 is being collected") != std::string::npos);
  BOOST_TEST(beyond.problem.find("at most 2 rounds ahead") != std::string::npos);
  BOOST_TEST(round.deferred() == 2u);
}

BOOST_AUTO_TEST_CASE(a_worker_gets_one_push_per_round_now_or_deferred) {
  auto round = make_round(2, 2);
  auto one = filled(1);
  BOOST_TEST((round.add(part(1, 0, 0, one)).fate == chunk_fate::completed));
  auto again = round.add(part(2, 0, 0, one));
  BOOST_TEST(again.refused());
  BOOST_TEST(again.problem.find("twice") != std::string::npos);
  BOOST_TEST((round.defer(part(3, 0, 1, one, 0, 16), {}).fate == chunk_fate::deferred));
  BOOST_TEST(round.defer(part(4, 0, 1, one, 16, 32), {}).refused()); // another request id
  BOOST_TEST(round.deferred() == 1u);
}

BOOST_AUTO_TEST_CASE(chunks_out_of_order_or_past_the_end_are_refused_and_change_nothing) {
  auto round = make_round(1, 1);
  auto one = filled(1);
  auto gap = round.add(part(1, 0, 0, one, 8, 32));
  BOOST_TEST(gap.refused());
  BOOST_TEST(gap.problem.find("chunk at byte 8, expected byte 0") != std::string::npos);
  std::vector<float> longer(elements + 2, 1.0f);
  push_chunk too_long{2, 0, 0, 0, std::as_bytes(std::span{longer})};
  auto past = round.add(too_long);
  BOOST_TEST(past.refused());
  BOOST_TEST(past.problem.find("more bytes than the value's 32") != std::string::npos);
  BOOST_TEST(!round.quorum_reached());
  BOOST_TEST((round.add(part(3, 0, 0, one)).fate == chunk_fate::completed));
}

BOOST_AUTO_TEST_CASE(with_every_worker_in_the_quorum_a_push_for_a_closed_round_is_stale) {
  auto round = make_round(1, 1);
  auto one = filled(1);
  round.add(part(1, 0, 0, one));
  round.close();
  auto stale = round.add(part(2, 0, 0, one));
  BOOST_TEST((stale.code == wire::error_code::stale_round));
  BOOST_TEST(stale.problem.find("1 rounds are complete") != std::string::npos);
  BOOST_TEST(round.dropped() == 0u);
}

BOOST_AUTO_TEST_CASE(a_forgotten_workers_unfinished_pushes_leave_and_its_whole_deferred_one_stays) {
  auto round = make_round(3, 2);
  auto one = filled(1), two = filled(2), hundred = filled(100);
  BOOST_TEST((round.add(part(1, 2, 0, hundred, 0, 16)).fate == chunk_fate::taken));
  BOOST_TEST((round.defer(part(2, 2, 1, two), {}).fate == chunk_fate::deferred));
  BOOST_TEST((round.defer(part(3, 2, 2, hundred, 0, 8), {}).fate == chunk_fate::deferred));
  BOOST_TEST(round.deferred() == 2u);
  BOOST_TEST(round.collecting());
  // Worker 2's connection closed.
  round.forget_unfinished(2);
  BOOST_TEST(round.deferred() == 1u);
  BOOST_TEST(!round.collecting());
  // Its push of round 0 starts afresh (before, byte 16 was expected), and the cut-off bytes
  // never reach the sum.
  BOOST_TEST((round.add(part(4, 2, 0, two)).fate == chunk_fate::completed));
  BOOST_TEST((round.add(part(5, 0, 0, one)).fate == chunk_fate::completed));
  BOOST_TEST_REQUIRE(round.quorum_reached());
  BOOST_TEST(round.sum().to_vector<float>() == all(3), boost::test_tools::per_element());
  round.close();
  // The whole push it deferred for round 1 enters.
  BOOST_TEST(round.admit_deferred().size() == 1u);
  BOOST_TEST(round.deferred() == 0u);
  BOOST_TEST((round.add(part(6, 1, 1, one)).fate == chunk_fate::completed));
  BOOST_TEST(round.sum().to_vector<float>() == all(3), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(with_every_worker_in_the_quorum_a_push_under_way_is_in_the_sum_and_stays) {
  auto round = make_round(2, 2);
  auto one = filled(1), two = filled(2);
  BOOST_TEST((round.add(part(1, 0, 0, one, 0, 16)).fate == chunk_fate::taken));
  round.forget_unfinished(0);
  BOOST_TEST(round.collecting());
  BOOST_TEST((round.add(part(1, 0, 0, one, 16, 32)).fate == chunk_fate::completed));
  BOOST_TEST((round.add(part(2, 1, 0, two)).fate == chunk_fate::completed));
  BOOST_TEST(round.sum().to_vector<float>() == all(3), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_worker_that_leaves_counts_until_its_last_push_and_rounds_close_without_it) {
  auto round = make_round(3, 3);
  auto one = filled(1), two = filled(2), four = filled(4);
  // Round 0: workers 0 and 1 have pushed; worker 2, which has pushed round 0 too and round 1
  // ahead, leaves: it counts in rounds 0 and 1 only.
  BOOST_TEST((round.add(part(1, 0, 0, one)).fate == chunk_fate::completed));
  BOOST_TEST((round.add(part(2, 2, 0, four)).fate == chunk_fate::completed));
  BOOST_TEST((round.defer(part(3, 2, 1, four), {}).fate == chunk_fate::deferred));
  BOOST_TEST(round.retire(2) == 2u);
  BOOST_TEST(round.retire(2) == 2u); // a second leave changes nothing
  BOOST_TEST(round.round_members() == 3u);
  BOOST_TEST(!round.quorum_reached());
  BOOST_TEST((round.add(part(4, 1, 0, two)).fate == chunk_fate::completed));
  BOOST_TEST_REQUIRE(round.quorum_reached());
  BOOST_TEST(round.sum().to_vector<float>() == all(7), boost::test_tools::per_element());
  round.close();
  BOOST_TEST(round.admit_deferred().size() == 1u);
  BOOST_TEST((round.add(part(5, 0, 1, one)).fate == chunk_fate::completed));
  BOOST_TEST((round.add(part(6, 1, 1, two)).fate == chunk_fate::completed));
  BOOST_TEST_REQUIRE(round.quorum_reached());
  BOOST_TEST(round.sum().to_vector<float>() == all(7), boost::test_tools::per_element());
  round.close();
  // Round 2 waits for workers 0 and 1 only; a push from worker 2 is refused, naming the leave.
  BOOST_TEST(round.round_members() == 2u);
  BOOST_TEST(round.round_quorum() == 2u);
  auto refused = round.add(part(7, 2, 2, four));
  BOOST_TEST(refused.refused());
  BOOST_TEST(refused.problem.find("worker 2 left the job") != std::string::npos);
  BOOST_TEST(refused.problem.find("from round 2 on") != std::string::npos);
  BOOST_TEST(round.defer(part(8, 2, 3, four), {}).refused());
  BOOST_TEST((round.add(part(9, 0, 2, one)).fate == chunk_fate::completed));
  BOOST_TEST(!round.quorum_reached());
  BOOST_TEST((round.add(part(10, 1, 2, two)).fate == chunk_fate::completed));
  BOOST_TEST_REQUIRE(round.quorum_reached());
  BOOST_TEST(round.sum().to_vector<float>() == all(3), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_leave_can_complete_the_round_being_collected) {
  auto round = make_round(3, 3);
  auto one = filled(1), two = filled(2);
  BOOST_TEST((round.add(part(1, 0, 0, one)).fate == chunk_fate::completed));
  BOOST_TEST((round.add(part(2, 1, 0, two)).fate == chunk_fate::completed));
  // Worker 2 never pushed round 0: the round closes without it once it leaves.
  BOOST_TEST(round.retire(2) == 0u);
  BOOST_TEST_REQUIRE(round.quorum_reached());
  BOOST_TEST(round.sum().to_vector<float>() == all(3), boost::test_tools::per_element());
  round.close();
  // Everyone else leaves too: a round with no member never closes.
  BOOST_TEST(round.retire(0) == 1u);
  BOOST_TEST(round.retire(1) == 1u);
  BOOST_TEST(round.round_members() == 0u);
  BOOST_TEST(!round.quorum_reached());
}

BOOST_AUTO_TEST_CASE(a_quorum_below_n_keeps_the_losses_it_tolerates_as_workers_leave) {
  // N = 4, K = 3: one loss tolerated. After two workers leave, 2 are in and 1 of them closes a
  // round; after the first leaves, 3 are in and 2 close one.
  auto round = make_round(4, 3);
  BOOST_TEST(round.round_quorum() == 3u);
  round.retire(3);
  BOOST_TEST(round.round_members() == 3u);
  BOOST_TEST(round.round_quorum() == 2u);
  round.retire(2);
  BOOST_TEST(round.round_quorum() == 1u);
  auto five = filled(5);
  BOOST_TEST((round.add(part(1, 0, 0, five)).fate == chunk_fate::completed));
  BOOST_TEST_REQUIRE(round.quorum_reached());
  BOOST_TEST(round.sum().to_vector<float>() == all(5), boost::test_tools::per_element());
  // round_membership alone: K = N means every worker still in.
  round_membership every{5, 5};
  every.retire(1, 3);
  every.retire(4, 1);
  BOOST_TEST(every.members(0) == 5u);
  BOOST_TEST(every.quorum(0) == 5u);
  BOOST_TEST(every.members(1) == 4u);
  BOOST_TEST(every.quorum(2) == 4u);
  BOOST_TEST(every.quorum(3) == 3u);
  BOOST_TEST(every.counts(1, 2));
  BOOST_TEST(!every.counts(1, 3));
}

BOOST_AUTO_TEST_SUITE_END()
