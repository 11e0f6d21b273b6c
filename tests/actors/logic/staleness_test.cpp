// Bounded staleness (dist_async with max_staleness = s), through a shard_core driven message by
// message: pushes are applied at once, a pull for round t waits exactly until every live worker
// has pushed t - s times, a worker marked lost stops being waited for, no worker gets more than s
// pushes ahead of the slowest (instrumented), and s = 0 gives dist_sync's values.

#include <algorithm>
#include <optional>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "tests/actors/logic/shard_driver.hpp"

using namespace troupe;
using troupe::testing::shard_driver;
using troupe::testing::with_lost_workers;

namespace {

constexpr std::uint64_t key = 3;
constexpr std::int64_t elements = 2;

sync_policy staleness(std::int64_t s) {
  sync_policy policy;
  policy.mode = consistency::async;
  policy.max_staleness = s;
  return policy;
}

/// MXNet's nightly set-up: the `test` optimizer with rescale_grad 2, the key initialised to ones,
/// worker w pushing w + 1 every round.
struct nightly_job : shard_driver {
  ndarray initial = ndarray::ones({elements});
  std::vector<ndarray> values;
  bool initialised = false;

  nightly_job(std::uint32_t workers, sync_policy policy) : shard_driver(workers, policy) {
    send(wire::set_optimizer{1, "test", {{"rescale_grad", 2.0}}});
    initialised = init(key, initial);
    for (std::uint32_t w = 0; w < workers; ++w)
      values.push_back(ndarray::full({elements}, w + 1.0));
  }
};

/// One simulated worker: the rounds it has pushed and the pull it waits on.
struct simulated_worker {
  std::uint64_t pushed = 0;
  std::optional<std::uint64_t> waiting;
};

} // namespace

BOOST_AUTO_TEST_SUITE(shard_staleness)

BOOST_AUTO_TEST_CASE(a_pull_waits_exactly_until_the_slowest_live_worker_pushed_t_minus_s_times) {
  for (std::int64_t s : {0, 1, 3}) {
    BOOST_TEST_CONTEXT("s = " << s) {
      shard_driver job{3, staleness(s)};
      auto initial = ndarray::zeros({elements});
      BOOST_TEST_REQUIRE(job.init(key, initial));
      auto one = ndarray::ones({elements});
      // Worker 0 pushes s + 3 times, then pulls round t = s + 3: it needs every worker at 3.
      auto t = static_cast<std::uint64_t>(s) + 3;
      for (std::uint64_t round = 0; round < t; ++round)
        job.push(key, 0, round, one);
      auto pull = job.pull(key, 0, t);
      std::vector<std::uint64_t> pushed{t, 0, 0};
      // Workers 1 and 2 catch up one push at a time, 2 lagging; the pull is answered at exactly
      // the push that brings the slower of them to t - s.
      for (std::uint32_t step = 0; step < 6; ++step) {
        std::uint32_t worker = step % 2 == 0 ? 1 : 2;
        job.push(key, worker, pushed[worker]++, one);
        auto slowest = std::min(pushed[1], pushed[2]);
        BOOST_TEST(job.pulled(pull).has_value() == (slowest >= t - static_cast<std::uint64_t>(s)),
                   "after push " << step);
      }
      BOOST_TEST(job.replies_to(pull) == 1u);
      BOOST_TEST(job.value_reply(pull)->round == t + 6);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_membership_update_marking_a_worker_lost_releases_the_pulls_that_wait) {
  shard_driver job{3, staleness(1)};
  job.send(wire::set_optimizer{1, "test", {{"rescale_grad", 1.0}}});
  auto initial = ndarray::zeros({elements});
  BOOST_TEST_REQUIRE(job.init(key, initial));
  auto one = ndarray::ones({elements});
  for (std::uint64_t round = 0; round < 3; ++round) {
    job.push(key, 0, round, one);
    job.push(key, 1, round, one);
  }
  auto pull = job.pull(key, 0, 3); // needs worker 2 at 2 pushes; it has none
  BOOST_TEST(!job.pulled(pull).has_value());
  job.shard->on_membership(with_lost_workers(3, {}));
  BOOST_TEST(!job.pulled(pull).has_value());
  job.shard->on_membership(with_lost_workers(3, {2}));
  BOOST_TEST_REQUIRE(job.pulled(pull).has_value());
  BOOST_TEST(*job.pulled(pull) == std::vector<float>(elements, 6.0f),
             boost::test_tools::per_element());
  // A worker that is lost is not waited for by later pulls either.
  job.push(key, 0, 3, one);
  job.push(key, 1, 3, one);
  auto later = job.pull(key, 1, 4);
  BOOST_TEST(job.pulled(later).has_value());
}

BOOST_AUTO_TEST_CASE(no_worker_gets_more_than_s_pushes_ahead_of_the_slowest_live_worker) {
  constexpr std::uint64_t rounds = 12;
  for (std::uint32_t workers : {2u, 3u, 5u})
    for (std::int64_t s : {0, 1, 3}) {
      BOOST_TEST_CONTEXT("W = " << workers << ", s = " << s) {
        nightly_job job{workers, staleness(s)};
        BOOST_TEST_REQUIRE(job.initialised);
        // Every worker pushes and then pulls the round after; the last worker acts only every
        // third step, the others whenever their pull has been answered: they try to run ahead.
        std::vector<simulated_worker> sim(workers);
        std::uint32_t step = 0;
        auto finished = [&] {
          for (auto& worker : sim)
            if (worker.pushed < rounds || worker.waiting)
              return false;
          return true;
        };
        for (; !finished() && step < 10'000; ++step)
          for (std::uint32_t w = 0; w < workers; ++w) {
            auto& worker = sim[w];
            if (w == workers - 1 && step % 3 != 0)
              continue;
            if (worker.waiting) {
              if (!job.pulled(*worker.waiting))
                continue;
              worker.waiting.reset();
            }
            if (worker.pushed == rounds)
              continue;
            job.push(key, w, worker.pushed, job.values[w]);
            ++worker.pushed;
            worker.waiting = job.pull(key, w, worker.pushed);
          }
        BOOST_TEST_REQUIRE(finished());
        auto lead = job.shard->stats().max_lead;
        BOOST_TEST(lead <= static_cast<std::uint64_t>(s));
        // The fast workers did get s ahead: the bound is what held them back.
        BOOST_TEST(lead == static_cast<std::uint64_t>(s));
        float total = 0;
        for (std::uint32_t w = 0; w < workers; ++w)
          total += static_cast<float>(w + 1);
        BOOST_TEST(job.stored(key) == std::vector<float>(elements, 1.0f + 2.0f * rounds * total),
                   boost::test_tools::per_element());
        BOOST_TEST(job.shard->stats().updates == rounds * workers);
      }
    }
}

BOOST_AUTO_TEST_CASE(staleness_zero_gives_dist_syncs_values_where_plain_async_does_not) {
  constexpr std::uint64_t rounds = 4;
  for (std::uint32_t workers : {2u, 3u, 5u}) {
    BOOST_TEST_CONTEXT("W = " << workers) {
      // Each worker pushes its round and pulls the next at once, before the others push: dist_sync
      // holds the pull for the round, s = 0 for the slowest worker, plain async not at all.
      auto run = [&](sync_policy policy) {
        nightly_job job{workers, policy};
        BOOST_REQUIRE(job.initialised);
        std::vector<std::uint64_t> pulls;
        for (std::uint64_t round = 0; round < rounds; ++round)
          for (std::uint32_t j = 0; j < workers; ++j) {
            auto w = static_cast<std::uint32_t>((j + round) % workers);
            job.push(key, w, round, job.values[w]);
            pulls.push_back(job.pull(key, w, round + 1));
          }
        std::vector<float> seen;
        for (auto id : pulls) {
          auto pulled = job.pulled(id);
          BOOST_REQUIRE(pulled.has_value());
          seen.push_back(pulled->front());
        }
        return seen;
      };
      auto sync = run(sync_policy{});
      auto ssp = run(staleness(0));
      auto async = run(staleness(-1));
      // MXNet's closed form: after round i the value is n(n+1)(i+1) + 1, for every pull of it.
      std::vector<float> closed_form;
      for (std::uint64_t round = 0; round < rounds; ++round)
        for (std::uint32_t j = 0; j < workers; ++j)
          closed_form.push_back(static_cast<float>(workers * (workers + 1) * (round + 1) + 1));
      BOOST_TEST(sync == closed_form, boost::test_tools::per_element());
      BOOST_TEST(ssp == closed_form, boost::test_tools::per_element());
      BOOST_TEST(async != closed_form);
    }
  }
}

BOOST_AUTO_TEST_CASE(a_worker_that_joins_is_counted_from_the_slowest_workers_pushes) {
  shard_options room;
  room.max_workers = 3;
  shard_driver job{2, staleness(1), room};
  auto initial = ndarray::zeros({elements});
  BOOST_TEST_REQUIRE(job.init(key, initial));
  auto one = ndarray::ones({elements});
  // Workers 0 and 1 push 5 and 4 times; then worker 2 joins, its own numbers starting at 0.
  for (std::uint64_t round = 0; round < 5; ++round)
    job.push(key, 0, round, one);
  for (std::uint64_t round = 0; round < 4; ++round)
    job.push(key, 1, round, one);
  job.shard->on_membership(with_lost_workers(3, {}));
  // Worker 0's pull for round 6 needs every live worker at 5: worker 1's fifth push, and the
  // joiner counted from 4 (the slowest when it joined) plus one push of its own.
  const auto pull = job.pull(key, 0, 6);
  job.push(key, 1, 4, one);
  BOOST_TEST(!job.pulled(pull).has_value());
  BOOST_TEST(job.ack(job.push(key, 2, 0, one)) != nullptr);
  BOOST_TEST(job.pulled(pull).has_value());
  // The joiner's own pull for its round 2 is its round 6 of the job: it waits for workers 0 and
  // 1 to be at 5 (they are).
  BOOST_TEST(job.pulled(job.pull(key, 2, 2)).has_value());
  BOOST_TEST(!job.pulled(job.pull(key, 2, 3)).has_value());
}

BOOST_AUTO_TEST_SUITE_END()
