// The distributed KVStore's rounds through the whole worker: requests that time out are cancelled,
// a push of higher priority overtakes the chunks of a large one held at its link,
// dist_sync rounds close with a quorum of workers (one of them frozen at a known round), and
// bounded staleness keeps every worker within s rounds of the slowest. W workers and S servers in
// one process (in_process_job), checked against closed forms.

#include <algorithm>
#include <atomic>
#include <chrono>
#include <mutex>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/send.hpp>

#include "actors/logic/key_placement.hpp"
#include "tests/actors/kvstore/array_checks.hpp"
#include "tests/actors/kvstore/in_process_job.hpp"
#include "tests/poll.hpp"

using namespace troupe;
using troupe::testing::all_equal;
using namespace std::chrono_literals;
using troupe::testing::in_process_job;
using troupe::testing::in_process_options;
using troupe::testing::problems;

namespace {

using hold_atom = caf::atom_constant<caf::atom("hold")>;
using release_atom = caf::atom_constant<caf::atom("release")>;

/// Between the servers and a worker: passes replies on, except that after (hold_atom) it keeps
/// every pull_reply until (release_atom), which sends the kept ones on, in order.
caf::behavior valve(caf::event_based_actor* self, caf::actor worker) {
  auto held = std::make_shared<std::vector<envelope>>();
  auto holding = std::make_shared<bool>(false);
  return {
      [=](envelope& reply) {
        if (*holding && std::holds_alternative<wire::pull_reply>(reply.msg))
          held->push_back(std::move(reply));
        else
          self->send(worker, std::move(reply));
      },
      [=](hold_atom) { *holding = true; },
      [=](release_atom) {
        *holding = false;
        for (auto& reply : *held)
          self->send(worker, std::move(reply));
        held->clear();
      },
  };
}

/// A key's frame as a link saw it: which key, where its chunk starts in the tensor, and whether
/// it came without a sender (from a caller's thread, worker_lane, not from the worker actor).
struct seen_frame {
  std::uint64_t key = 0;
  std::uint64_t offset = 0;
  bool from_caller = false;
};

/// Push frames as they reached a gate, in order (written on the gate's thread, read by the test
/// under the lock).
struct frame_log {
  std::mutex mutex;
  std::vector<seen_frame> frames;
};

/// Between a worker and its link to a server: passes requests on and notes each push chunk,
/// except that after (hold_atom) it keeps every request, and their keepalives with them, until
/// (release_atom), which passes the kept ones on, in order, and lets the rest through. Dies with
/// its link. Untyped, so that it takes hold and release besides what a link takes.
caf::behavior request_gate(caf::event_based_actor* self, link_actor link,
                           std::shared_ptr<frame_log> log) {
  self->link_to(link);
  auto held = std::make_shared<std::vector<envelope>>();
  auto holding = std::make_shared<bool>(false);
  auto pass = [self, link](envelope& request) { self->send(link, std::move(request)); };
  return {
      [=](envelope& request) {
        if (const auto* push = std::get_if<wire::push>(&request.msg)) {
          std::lock_guard lock{log->mutex};
          log->frames.push_back({push->key, push->tensor.offset, !self->current_sender()});
        }
        if (*holding)
          held->push_back(std::move(request));
        else
          pass(request);
      },
      [=](stop_atom) {
        self->send(link, stop_atom::value);
        self->quit();
      },
      [](caf::get_atom) { return std::string{"gate"}; },
      [=](hold_atom) { *holding = true; },
      [=](release_atom) {
        *holding = false;
        for (auto& request : *held)
          pass(request);
        held->clear();
      },
  };
}

} // namespace

BOOST_AUTO_TEST_SUITE(dist_kvstore_requests)

/// A pull of a `shape` key whose reply is held back past its timeout, then released.
void check_held_pull_leaves_its_output_untouched(const shape_vector& shape) {
  caf::actor gate;
  in_process_options options;
  options.timeout = 300ms;
  options.reply_path = [&gate](caf::actor_system& system, std::uint32_t, const caf::actor& worker) {
    gate = system.spawn(valve, worker);
    return gate;
  };
  auto job = std::make_unique<in_process_job>("dist_sync", 1, 1, options);
  auto& kv = *job->workers[0];

  BOOST_TEST_REQUIRE(kv.init(3, ndarray::ones(shape)).has_value());
  caf::anon_send(gate, hold_atom::value);
  auto out = ndarray::full(shape, -7.0f);
  const auto started = std::chrono::steady_clock::now();
  auto timed_out = kv.pull(3, out);
  BOOST_TEST_REQUIRE(!timed_out.has_value());
  BOOST_TEST((timed_out.error().code() == errc::timeout), timed_out.error().to_string());
  BOOST_TEST(timed_out.error().message().find("pull of key 3") != std::string::npos,
             timed_out.error().message());
  // Its 300 ms timeout ended it, not the held reply (which never comes): a generous bound.
  BOOST_TEST((std::chrono::steady_clock::now() - started < 20s));

  // An abandoned request is cancelled too: its caller dropped it without waiting.
  auto abandoned_out = ndarray::full(shape, -9.0f);
  {
    std::vector<ndarray> outputs{abandoned_out};
    auto dropped = kv.pull_async(std::vector<kv_key>{std::int64_t{3}}, outputs);
  }

  caf::anon_send(gate, release_atom::value);
  // The worker handles the late replies before this pull's, which proves they were dropped.
  auto fresh = ndarray::zeros(shape);
  BOOST_TEST_REQUIRE(kv.pull(3, fresh).has_value());
  BOOST_TEST(all_equal(fresh, 1.0f));
  BOOST_TEST(all_equal(out, -7.0f));
  BOOST_TEST(all_equal(abandoned_out, -9.0f));
  // And the store goes on: a round, then its value.
  BOOST_TEST_REQUIRE(kv.push(3, ndarray::full(shape, 5.0f)).has_value());
  BOOST_TEST_REQUIRE(kv.pull(3, fresh).has_value());
  BOOST_TEST(all_equal(fresh, 5.0f));
}

BOOST_AUTO_TEST_CASE(a_pull_whose_reply_is_held_past_its_timeout_leaves_its_output_untouched) {
  check_held_pull_leaves_its_output_untouched({4, 4});
}

// 4 MiB in four 1 MiB chunks: a reply this large is copied on the worker's copier, off the I/O
// thread (actors/kv_worker.cpp), and must be cancelled just the same.
BOOST_AUTO_TEST_CASE(a_large_pull_held_past_its_timeout_leaves_its_output_untouched) {
  check_held_pull_leaves_its_output_untouched({1024, 1024});
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

struct quorum_case {
  std::uint32_t workers;
  std::uint32_t quorum;
  bool rescale = false;
};

std::string describe(const quorum_case& c) {
  return "W=" + std::to_string(c.workers) + " K=" + std::to_string(c.quorum) +
         (c.rescale ? " rescaled" : "");
}

/// MXNet's dist_sync check with a quorum: keys initialised to ones, the `test` optimizer with
/// rescale_grad 2, worker r pushes ones*(r+1). The workers push one after the other in rank order,
/// so the first K live ranks close each round and the others arrive late; with K < W rank 0 is
/// frozen (stops pushing and pulling) from round `frozen_from` on. After round i every live worker
/// pulls 1 + 2 sum_{rounds} scale * sum_{first K live ranks} (r + 1).
void check_quorum(const quorum_case& c) {
  BOOST_TEST_CONTEXT(describe(c)) {
    constexpr int rounds = 5;
    constexpr int frozen_from = 2;
    const bool freeze = c.quorum < c.workers;
    in_process_options options;
    options.quorum = c.quorum;
    options.rescale_quorum = c.rescale;
    options.bigarray_bound = 1000; // both keys are split over both servers
    options.chunk_bytes = 4096;    // and every key travels in several chunks
    in_process_job job{"dist_sync", c.workers, 2, options};
    const std::vector<shape_vector> shapes = {{3, 700}, {2500}};
    std::vector<kv_key> keys = {std::int64_t{4}, std::int64_t{9}};
    problems seen;
    job.run([&](std::uint32_t, kvstore& kv) {
      std::vector<ndarray> initial;
      for (const auto& shape : shapes)
        initial.push_back(ndarray::ones(shape));
      if (seen.check(kv.init(keys, initial), "init"))
        (void)seen.check(kv.set_optimizer("test", {{"rescale_grad", 2.0}}), "set_optimizer");
    });
    BOOST_TEST_REQUIRE(seen.seen.empty(), seen.report());

    const double scale = c.rescale ? double(c.workers) / c.quorum : 1.0;
    double expected = 1;
    std::uint64_t late = 0;
    for (int round = 0; round < rounds; ++round) {
      std::vector<std::uint32_t> live;
      for (std::uint32_t rank = 0; rank < c.workers; ++rank)
        if (!(freeze && rank == 0 && round >= frozen_from))
          live.push_back(rank);
      for (auto rank : live)
        for (std::size_t k = 0; k < keys.size(); ++k)
          BOOST_TEST_REQUIRE(
              job.workers[rank]->push(keys[k], ndarray::full(shapes[k], rank + 1.0f)).has_value());
      double sum = 0;
      for (std::uint32_t i = 0; i < c.quorum; ++i)
        sum += live[i] + 1;
      expected += 2 * scale * sum;
      late += live.size() - c.quorum;
      for (auto rank : live)
        for (std::size_t k = 0; k < keys.size(); ++k) {
          auto out = ndarray::zeros(shapes[k]);
          BOOST_TEST_REQUIRE(job.workers[rank]->pull(keys[k], out).has_value());
          BOOST_TEST(all_equal(out, static_cast<float>(expected)),
                     "rank " << rank << " key " << to_string(keys[k]) << " round " << round << ": "
                             << out.to_vector<float>()[0] << ", expected " << expected);
        }
    }
    // Every late push was dropped and counted once per ps-key it touched (both keys are split
    // over the two servers), and every ps-key was updated once per round.
    std::uint64_t ps_keys = 0;
    for (std::size_t k = 0; k < keys.size(); ++k)
      ps_keys += place_key(static_cast<std::uint64_t>(std::get<std::int64_t>(keys[k])),
                           element_count(shapes[k]), 2, options.bigarray_bound)
                     .size();
    BOOST_TEST(ps_keys == 4u);
    const auto stats = job.stats();
    BOOST_TEST(stats.late_pushes_dropped == late * ps_keys);
    BOOST_TEST(stats.updates == rounds * ps_keys);
  }
}

} // namespace

constexpr std::size_t gated_chunk_bytes = 64 << 10;

/// dist_sync, one worker and one server, whose worker reaches the server through a request_gate
/// (`gate`, noting push frames in `log`), chunks of gated_chunk_bytes and a window of two; key 9
/// (8 chunks) and key 0 (4 floats) initialised to zeros.
std::unique_ptr<in_process_job> gated_job(caf::actor& gate, const std::shared_ptr<frame_log>& log) {
  in_process_options options;
  options.shards = 1;
  options.chunk_bytes = gated_chunk_bytes;
  options.send_window_bytes = 2 * gated_chunk_bytes;
  options.request_path = [&gate, log](caf::actor_system& system, std::uint32_t, std::uint32_t,
                                      const link_actor& link) {
    gate = system.spawn(request_gate, link, log);
    return caf::actor_cast<link_actor>(gate);
  };
  auto job = std::make_unique<in_process_job>("dist_sync", 1, 1, options);
  auto& kv = *job->workers[0];
  BOOST_TEST_REQUIRE(
      kv.init(9, ndarray::zeros({8 * gated_chunk_bytes / sizeof(float)})).has_value());
  BOOST_TEST_REQUIRE(kv.init(0, ndarray::zeros({4})).has_value());
  return job;
}

/// Through the whole worker and a real shard: a large push of low priority is under way, held at
/// its link with a window's worth of chunks handed over, when a small push of higher priority is
/// made; released, the link sees the small push before the large one's remaining chunks, or after
/// them when both have the same priority (the control).
std::vector<seen_frame> frames_of_a_large_push_then_a_small_one(int large_priority) {
  constexpr std::size_t chunk = gated_chunk_bytes;
  caf::actor gate;
  auto log = std::make_shared<frame_log>();
  auto job = gated_job(gate, log);
  auto& kv = *job->workers[0];
  const shape_vector large_shape{8 * chunk / sizeof(float)}; // 8 chunks

  caf::anon_send(gate, hold_atom::value);
  const auto large = ndarray::ones(large_shape);
  const auto small = ndarray::ones({4});
  std::vector<kv_key> large_key{std::int64_t{9}}, small_key{std::int64_t{0}};
  auto slow = kv.push_async(large_key, std::span{&large, 1}, large_priority);
  auto urgent = kv.push_async(small_key, std::span{&small, 1}, 0);
  // Both calls are in the worker's mailbox before any frame can leave the gate, so before any
  // receipt: what the link sees next is the send queue's choice alone.
  caf::anon_send(gate, release_atom::value);
  BOOST_TEST_REQUIRE(urgent.wait().has_value());
  BOOST_TEST_REQUIRE(slow.wait().has_value());
  // And the values are right: one round each.
  auto out = ndarray::zeros(large_shape);
  BOOST_TEST_REQUIRE(kv.pull(9, out).has_value());
  BOOST_TEST(all_equal(out, 1.0f));
  std::lock_guard lock{log->mutex};
  return log->frames;
}

/// Where the small push (ps-key of key 0) stands among the pushes' frames, and how many frames of
/// the large one there are.
std::pair<std::size_t, std::size_t> small_push_position(const std::vector<seen_frame>& frames) {
  std::size_t large = 0, position = frames.size();
  const auto large_key = frames.empty() ? 0 : frames.front().key;
  for (std::size_t i = 0; i < frames.size(); ++i)
    if (frames[i].key == large_key)
      ++large;
    else
      position = i;
  return {position, large};
}

BOOST_AUTO_TEST_SUITE(dist_kvstore_send_queue)

BOOST_AUTO_TEST_CASE(a_small_push_of_higher_priority_overtakes_a_large_push_held_at_its_link) {
  const auto frames = frames_of_a_large_push_then_a_small_one(-9);
  const auto [position, large] = small_push_position(frames);
  BOOST_TEST_REQUIRE(large == 8u);
  BOOST_TEST_REQUIRE(frames.size() == 9u);
  // Two chunks of the large push were with the link when the small push came: it goes next.
  BOOST_TEST(position == 2u);
  for (std::size_t i = 0, offset = 0; i < frames.size(); ++i)
    if (i != position) {
      BOOST_TEST(frames[i].offset == offset); // the large push's chunks stay in order
      offset += 64 << 10;
    }
}

BOOST_AUTO_TEST_CASE(at_equal_priority_a_small_push_waits_behind_a_large_push_held_at_its_link) {
  const auto frames = frames_of_a_large_push_then_a_small_one(0);
  const auto [position, large] = small_push_position(frames);
  BOOST_TEST_REQUIRE(large == 8u);
  BOOST_TEST(position == 8u);
}

/// A small call runs on the caller's thread only when nothing is queued for its server: made
/// after the worker actor took a large push whose chunks wait at the link, it is not sent from the
/// caller's thread and keeps its place behind them; on an idle link the same call is (the
/// control: the caller's path is real).
BOOST_AUTO_TEST_CASE(a_small_push_on_the_callers_thread_never_overtakes_queued_chunks) {
  auto log = std::make_shared<frame_log>();
  caf::actor gate;
  auto job = gated_job(gate, log);
  auto& kv = *job->workers[0];
  const shape_vector large_shape{8 * gated_chunk_bytes / sizeof(float)}; // 8 chunks
  const auto small = ndarray::ones({4});
  std::vector<kv_key> small_key{std::int64_t{0}};

  // The control: on an idle link a small push leaves from the caller's thread.
  BOOST_TEST_REQUIRE(kv.push_async(small_key, std::span{&small, 1}, 0).wait().has_value());
  {
    std::lock_guard lock{log->mutex};
    BOOST_TEST_REQUIRE(log->frames.size() == 1u);
    BOOST_TEST(log->frames[0].from_caller);
    log->frames.clear();
  }

  caf::anon_send(gate, hold_atom::value);
  const auto large = ndarray::ones(large_shape);
  std::vector<kv_key> large_key{std::int64_t{9}};
  auto slow = kv.push_async(large_key, std::span{&large, 1}, 0);
  // The worker took the large push (too large for the caller's thread): a window of its chunks
  // reached the gate, the other six wait in the send queue.
  BOOST_TEST_REQUIRE(troupe::testing::poll_until(
                         [&] {
                           std::lock_guard lock{log->mutex};
                           return log->frames.size() >= 2;
                         },
                         std::chrono::seconds{30}),
                     "the large push's first chunks never reached the link");
  auto urgent = kv.push_async(small_key, std::span{&small, 1}, 0);
  caf::anon_send(gate, release_atom::value);
  BOOST_TEST_REQUIRE(urgent.wait().has_value());
  BOOST_TEST_REQUIRE(slow.wait().has_value());
  {
    std::lock_guard lock{log->mutex};
    const auto [position, chunks] = small_push_position(log->frames);
    BOOST_TEST_REQUIRE(chunks == 8u);
    BOOST_TEST_REQUIRE(log->frames.size() == 9u);
    BOOST_TEST(position == 8u);
    BOOST_TEST(!log->frames[position].from_caller);
  }
  // And the values are right: the small key has both rounds' pushes (no optimizer: the round's
  // sum replaces the value).
  auto out = ndarray::zeros({4});
  BOOST_TEST_REQUIRE(kv.pull(0, out).has_value());
  BOOST_TEST(all_equal(out, 1.0f));
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(dist_sync_with_a_quorum)

BOOST_AUTO_TEST_CASE(rounds_close_with_the_first_k_workers_and_a_frozen_one_does_not_stop_them) {
  for (std::uint32_t workers : {2u, 3u, 5u}) {
    std::vector<std::uint32_t> quorums = {1, workers - 1, workers};
    quorums.erase(std::unique(quorums.begin(), quorums.end()), quorums.end());
    for (auto quorum : quorums)
      check_quorum({workers, quorum});
  }
}

BOOST_AUTO_TEST_CASE(rescale_quorum_scales_a_rounds_sum_by_n_over_k) {
  check_quorum({3, 2, true});
  check_quorum({5, 1, true});
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(dist_async_with_bounded_staleness)

/// Worker 0 is slow (it starts once the others are s rounds ahead, and sleeps in every step); the
/// others pushpull as fast as they can. With staleness s no push arrives more than s rounds ahead
/// of the slowest live worker (the shards' instrument), and the fast workers do run ahead that
/// far; the value after everyone's rounds is exactly async's sum.
BOOST_AUTO_TEST_CASE(no_worker_gets_more_than_s_rounds_ahead_of_the_slowest) {
  for (std::uint32_t workers : {2u, 3u, 5u})
    for (std::int64_t staleness : {0, 1, 3}) {
      BOOST_TEST_CONTEXT("W=" << workers << " s=" << staleness) {
        constexpr int rounds = 10;
        in_process_options options;
        options.max_staleness = staleness;
        in_process_job job{"dist_async", workers, 2, options};
        const shape_vector shape{64};
        problems seen;
        job.run([&](std::uint32_t rank, kvstore& kv) {
          if (!seen.check(kv.init(7, ndarray::ones(shape)), "init") ||
              !seen.check(kv.set_optimizer("test", {{"rescale_grad", 2.0}}), "set_optimizer"))
            return;
          auto out = ndarray::zeros(shape);
          if (rank == 0) {
            // An event, not a pause: worker 0 pushes only once the shards have seen the fast
            // workers run as far ahead of it as allowed, so that the bound is reached however
            // loaded the machine is.
            (void)troupe::testing::poll_until(
                [&] { return job.stats().max_lead >= static_cast<std::uint64_t>(staleness); }, 30s);
          }
          for (int round = 0; round < rounds; ++round) {
            if (rank == 0)
              std::this_thread::sleep_for(5ms);
            if (!seen.check(kv.pushpull(7, ndarray::full(shape, rank + 1.0f), out), "pushpull"))
              return;
          }
          (void)seen.check(kv.barrier(), "barrier");
          if (seen.check(kv.pull(7, out), "final pull")) {
            const double expected = 1 + 2.0 * rounds * workers * (workers + 1) / 2;
            if (!all_equal(out, static_cast<float>(expected)))
              seen.add("rank " + std::to_string(rank) + ": " +
                       std::to_string(out.to_vector<float>()[0]) + ", expected " +
                       std::to_string(expected));
          }
        });
        BOOST_TEST_REQUIRE(seen.seen.empty(), seen.report());
        const auto lead = job.stats().max_lead;
        BOOST_TEST(lead <= static_cast<std::uint64_t>(staleness));
        BOOST_TEST(lead == static_cast<std::uint64_t>(staleness),
                   "the fast workers never ran ahead as far as allowed: " << lead);
      }
    }
}

BOOST_AUTO_TEST_SUITE_END()
