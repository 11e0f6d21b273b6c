// job_barriers (actors/job_barrier.hpp) without CAF or a network: which arrivals a barrier
// releases, when, and what a loss changes, with the counts of the group's live members.

#include <algorithm>
#include <variant>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/job_barrier.hpp"

using namespace troupe;

namespace {

/// Members are numbered as the scheduler numbers them; here servers come first.
barrier_arrival arrival(std::uint32_t member, wire::role role, std::uint64_t barrier_id,
                        std::uint8_t group = wire::group::workers) {
  barrier_arrival a;
  a.group = group;
  a.barrier_id = barrier_id;
  a.member = member;
  a.member_role = role;
  a.request_id = 100 + member;
  a.connection = member + 1;
  return a;
}

barrier_arrival worker(std::uint32_t member, std::uint64_t barrier_id,
                       std::uint8_t group = wire::group::workers) {
  return arrival(member, wire::role::worker, barrier_id, group);
}

/// The members an arrive() released, sorted; fails the test on a refusal.
std::vector<std::uint32_t>
released(const std::variant<job_barriers::released, job_barriers::refusal>& outcome) {
  if (const auto* refused = std::get_if<job_barriers::refusal>(&outcome))
    BOOST_FAIL("refused: " + refused->why);
  std::vector<std::uint32_t> members;
  for (const auto& a : std::get<job_barriers::released>(outcome))
    members.push_back(a.member);
  std::sort(members.begin(), members.end());
  return members;
}

std::vector<std::uint32_t> members_of(const job_barriers::released& arrivals) {
  std::vector<std::uint32_t> members;
  for (const auto& a : arrivals)
    members.push_back(a.member);
  std::sort(members.begin(), members.end());
  return members;
}

using members = std::vector<std::uint32_t>;

} // namespace

BOOST_AUTO_TEST_SUITE(job_barrier)

BOOST_AUTO_TEST_CASE(a_worker_barrier_releases_every_arrival_when_the_last_worker_arrives) {
  for (std::uint32_t workers : {1u, 2u, 3u, 5u}) {
    BOOST_TEST_CONTEXT(workers << " workers") {
      job_barriers book{1, workers};
      BOOST_TEST(book.expected(wire::group::workers) == workers);
      for (std::uint64_t id = 1; id <= 2; ++id) {
        for (std::uint32_t w = 1; w < workers; ++w)
          BOOST_TEST(released(book.arrive(worker(w, id))).empty());
        members all(workers);
        for (std::uint32_t w = 0; w < workers; ++w)
          all[w] = w;
        BOOST_TEST(released(book.arrive(worker(0, id))) == all);
        BOOST_TEST(book.pending() == 0u);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_release_echoes_each_members_request_id_and_connection) {
  job_barriers book{1, 2};
  BOOST_TEST(released(book.arrive(worker(3, 1))).empty());
  auto outcome = book.arrive(worker(4, 1));
  BOOST_TEST_REQUIRE(std::holds_alternative<job_barriers::released>(outcome));
  for (const auto& a : std::get<job_barriers::released>(outcome)) {
    BOOST_TEST(a.request_id == 100u + a.member);
    BOOST_TEST(a.connection == a.member + 1u);
    BOOST_TEST(a.barrier_id == 1u);
  }
}

BOOST_AUTO_TEST_CASE(a_barrier_of_every_group_waits_for_servers_and_workers_but_not_the_scheduler) {
  job_barriers book{2, 2};
  BOOST_TEST(book.expected(wire::group::all) == 4u);
  BOOST_TEST(book.expected(wire::group::scheduler) == 0u);
  BOOST_TEST(book.expected(wire::group::servers | wire::group::scheduler) == 2u);
  BOOST_TEST(released(book.arrive(arrival(0, wire::role::server, 1, wire::group::all))).empty());
  BOOST_TEST(released(book.arrive(arrival(1, wire::role::server, 1, wire::group::all))).empty());
  BOOST_TEST(released(book.arrive(worker(2, 1, wire::group::all))).empty());
  // A barrier of another group with the same id is another barrier.
  BOOST_TEST(released(book.arrive(worker(2, 1))).empty());
  BOOST_TEST(book.pending() == 2u);
  BOOST_TEST((released(book.arrive(worker(3, 1, wire::group::all))) == members{0, 1, 2, 3}));
  BOOST_TEST(book.pending() == 1u);
}

BOOST_AUTO_TEST_CASE(a_second_arrival_at_one_barrier_is_refused_and_changes_nothing) {
  job_barriers book{1, 2};
  BOOST_TEST(released(book.arrive(worker(1, 1))).empty());
  const auto again = book.arrive(worker(1, 1));
  BOOST_TEST_REQUIRE(std::holds_alternative<job_barriers::refusal>(again));
  BOOST_TEST(std::get<job_barriers::refusal>(again).why ==
             "already arrived at barrier 1 of group 4");
  BOOST_TEST((released(book.arrive(worker(2, 1))) == members{1, 2}));
}

BOOST_AUTO_TEST_CASE(a_member_may_wait_at_a_bounded_number_of_barriers_at_once) {
  job_barriers book{1, 2};
  for (std::uint64_t id = 1; id <= max_pending_barriers_per_member; ++id)
    BOOST_TEST(released(book.arrive(worker(1, id))).empty());
  const auto one_more = book.arrive(worker(1, max_pending_barriers_per_member + 1));
  BOOST_TEST_REQUIRE(std::holds_alternative<job_barriers::refusal>(one_more));
  BOOST_TEST(book.pending() == max_pending_barriers_per_member);
}

BOOST_AUTO_TEST_CASE(losing_a_worker_releases_the_barriers_it_held_up_and_later_ones_skip_it) {
  job_barriers book{1, 3};
  BOOST_TEST(released(book.arrive(worker(1, 1))).empty());
  BOOST_TEST(released(book.arrive(worker(3, 1))).empty());
  BOOST_TEST(released(book.arrive(worker(1, 1, wire::group::all))).empty());
  const auto done = book.lose(2, wire::role::worker);
  // Barrier 1 of the workers completes; the barrier of every group still waits for the server
  // and worker 3.
  BOOST_TEST_REQUIRE(done.size() == 1u);
  BOOST_TEST((members_of(done.front()) == members{1, 3}));
  BOOST_TEST(book.expected(wire::group::workers) == 2u);
  BOOST_TEST(book.pending() == 1u);
  BOOST_TEST(released(book.arrive(worker(1, 2))).empty());
  BOOST_TEST((released(book.arrive(worker(3, 2))) == members{1, 3}));
  // Losing it again changes nothing; its arrivals are refused.
  BOOST_TEST(book.lose(2, wire::role::worker).empty());
  BOOST_TEST(book.expected(wire::group::workers) == 2u);
  BOOST_TEST(std::holds_alternative<job_barriers::refusal>(book.arrive(worker(2, 3))));
}

BOOST_AUTO_TEST_CASE(a_worker_that_joins_is_waited_for_from_its_first_barrier_on) {
  job_barriers book{1, 2}; // server 0, workers 1 and 2
  BOOST_TEST(released(book.arrive(worker(1, 3))).empty());
  // Worker 3 joins with its first workers' barrier at 4: barrier 3 does not wait for it.
  std::vector<std::uint64_t> first(8, 1);
  first[wire::group::workers] = 4;
  book.join(3, first);
  BOOST_TEST(book.expected(wire::group::workers, 3) == 2u);
  BOOST_TEST(book.expected(wire::group::workers, 4) == 3u);
  BOOST_TEST((released(book.arrive(worker(2, 3))) == members{1, 2}));
  BOOST_TEST(released(book.arrive(worker(1, 4))).empty());
  BOOST_TEST(released(book.arrive(worker(2, 4))).empty());
  BOOST_TEST((released(book.arrive(worker(3, 4))) == members{1, 2, 3}));
  // Its loss releases what it held up, and takes nothing from the first workers' count.
  BOOST_TEST(released(book.arrive(worker(1, 5))).empty());
  BOOST_TEST(released(book.arrive(worker(2, 5))).empty());
  const auto done = book.lose(3, wire::role::worker);
  BOOST_TEST_REQUIRE(done.size() == 1u);
  BOOST_TEST((members_of(done.front()) == members{1, 2}));
  BOOST_TEST(book.expected(wire::group::workers) == 2u);
}

BOOST_AUTO_TEST_CASE(
    a_worker_that_joins_at_a_barrier_is_taken_in_by_the_next_workers_barrier_past_the_start) {
  job_barriers book{1, 2}; // server 0, workers 1 and 2
  std::vector<std::uint64_t> first(8, 1);
  first[wire::group::workers] = 2;
  book.join_at_next_barrier(3, first);
  // It is expected nowhere until a barrier takes it in; its arrival waits, whatever its id.
  BOOST_TEST(book.expected(wire::group::workers) == 2u);
  BOOST_TEST(released(book.arrive(worker(3, 2))).empty());
  // A second arrival before that, or one at another group, is refused.
  BOOST_TEST(std::holds_alternative<job_barriers::refusal>(book.arrive(worker(3, 3))));
  // The end of the others' init (a start barrier) does not take it in.
  auto start = [](std::uint32_t member, std::uint64_t id) {
    auto a = worker(member, id);
    a.start = true;
    return a;
  };
  BOOST_TEST(released(book.arrive(start(1, 1))).empty());
  BOOST_TEST((released(book.arrive(start(2, 1))) == members{1, 2}));
  // The next barrier of the workers does: its arrival comes with the others', numbered as
  // theirs, marked as the one that joins.
  BOOST_TEST(released(book.arrive(worker(1, 2))).empty());
  const auto taken = book.arrive(worker(2, 2));
  BOOST_TEST_REQUIRE(std::holds_alternative<job_barriers::released>(taken));
  const auto& arrivals = std::get<job_barriers::released>(taken);
  BOOST_TEST((members_of(arrivals) == members{1, 2, 3}));
  for (const auto& a : arrivals) {
    BOOST_TEST(a.barrier_id == 2u);
    BOOST_TEST(a.joins == (a.member == 3));
  }
  // From the next barrier on it is waited for like every worker.
  BOOST_TEST(book.expected(wire::group::workers, 3) == 3u);
  BOOST_TEST(released(book.arrive(worker(1, 3))).empty());
  BOOST_TEST(released(book.arrive(worker(2, 3))).empty());
  BOOST_TEST((released(book.arrive(worker(3, 3))) == members{1, 2, 3}));
}

BOOST_AUTO_TEST_CASE(a_worker_waiting_to_join_at_a_barrier_that_is_lost_changes_nothing) {
  job_barriers book{1, 2};
  book.join_at_next_barrier(3, std::vector<std::uint64_t>(8, 1));
  BOOST_TEST(released(book.arrive(worker(3, 1))).empty());
  BOOST_TEST(book.lose(3, wire::role::worker).empty());
  BOOST_TEST(book.expected(wire::group::workers) == 2u);
  BOOST_TEST(released(book.arrive(worker(1, 1))).empty());
  const auto done = book.arrive(worker(2, 1));
  BOOST_TEST((released(done) == members{1, 2}));
  for (const auto& a : std::get<job_barriers::released>(done))
    BOOST_TEST(!a.joins);
}

BOOST_AUTO_TEST_CASE(a_lost_members_earlier_arrivals_no_longer_count) {
  job_barriers book{1, 3};
  BOOST_TEST(released(book.arrive(worker(1, 1))).empty());
  BOOST_TEST(released(book.arrive(worker(2, 1))).empty());
  // Worker 2 arrived and is then lost: two live workers remain and only one has arrived.
  BOOST_TEST(book.lose(2, wire::role::worker).empty());
  BOOST_TEST(book.pending() == 1u);
  BOOST_TEST((released(book.arrive(worker(3, 1))) == members{1, 3}));
}

BOOST_AUTO_TEST_SUITE_END()
