// The shard as an actor and the server node around it, driven through a scoped_actor: replies go
// to the reply_sink a request names, only the shard's own tick expires pulls, the node fans
// sync_settings out to every shard and answers once, broadcasts membership, sums the shards'
// counters.

#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <optional>
#include <set>
#include <thread>

#include <boost/test/unit_test.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/server_node.hpp"
#include "tests/actors/logic/shard_driver.hpp"
#include "tests/poll.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::testing::whole;
using troupe::testing::with_lost_workers;

namespace {

struct actor_fixture {
  caf::actor_system_config config;
  caf::actor_system system{config};
  caf::scoped_actor self{system};
  reply_sink sink = caf::actor_cast<reply_sink>(caf::actor{self});

  /// The next envelope the test receives, waiting at most 10 s.
  std::optional<envelope> next_reply() {
    std::optional<envelope> got;
    self->receive([&](envelope& reply) { got = std::move(reply); },
                  caf::after(std::chrono::seconds{10}) >> [] {});
    return got;
  }

  /// Whether an envelope arrives within `wait` (for checking that none does).
  bool any_reply_within(std::chrono::milliseconds wait) {
    bool got = false;
    self->receive([&](envelope&) { got = true; }, caf::after(wait) >> [] {});
    return got;
  }

  shard_stats stats_of(const shard_actor& shard) {
    shard_stats stats;
    self->request(shard, 10s, stats_atom::value)
        .receive([&](const shard_stats& answer) { stats = answer; },
                 [&](const caf::error& failure) {
                   BOOST_FAIL("no stats: " << caf::to_string(failure));
                 });
    return stats;
  }
};

template <class T>
const T* as(const std::optional<envelope>& reply) {
  return reply ? std::get_if<T>(&reply->msg) : nullptr;
}

} // namespace

BOOST_FIXTURE_TEST_SUITE(server_actors, actor_fixture)

BOOST_AUTO_TEST_CASE(the_shard_actor_answers_through_the_reply_sink_on_the_requests_connection) {
  shard_options options;
  options.num_workers = 1;
  auto shard = spawn_server_shard(system, options);
  auto initial = ndarray::ones({2});
  self->send(shard, envelope{wire::init{1, 4, whole(initial)}, initial.keepalive(), 3}, sink);
  auto reply = next_reply();
  BOOST_TEST_REQUIRE(as<wire::ack>(reply) != nullptr);
  BOOST_TEST(reply->connection == 3u);
  auto two = ndarray::full({2}, 2.0);
  self->send(shard, envelope{wire::push{2, 4, 0, 0, whole(two)}, two.keepalive(), 3}, sink);
  auto pushed = next_reply();
  BOOST_TEST_REQUIRE(as<wire::ack>(pushed) != nullptr);
  BOOST_TEST(as<wire::ack>(pushed)->round == 1u);
  BOOST_TEST(stats_of(shard).updates == 1u);
  caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
}

BOOST_AUTO_TEST_CASE(a_lane_answers_a_small_request_on_the_takers_thread_and_hands_the_rest_on) {
  shard_options options;
  options.num_workers = 1;
  auto lane = std::make_shared<shard_lane>(true);
  auto shard = spawn_server_shard(system, options, lane);
  stats_of(shard); // the actor has started: its core is in the lane
  auto small = ndarray::ones({4});
  BOOST_TEST(lane->take(envelope{wire::init{1, 4, whole(small)}, small.keepalive(), 3}, sink));
  auto reply = next_reply();
  BOOST_TEST_REQUIRE(as<wire::ack>(reply) != nullptr);
  BOOST_TEST(reply->connection == 3u);

  // A key above answer_here_bytes is the actor's, and answered all the same.
  auto big = ndarray::ones({static_cast<std::int64_t>(shard_lane::answer_here_bytes / 4 + 2)});
  BOOST_TEST(!lane->take(envelope{wire::init{2, 5, whole(big)}, big.keepalive(), 3}, sink));
  BOOST_TEST(as<wire::ack>(next_reply()) != nullptr);

  // While the shard is busy (another thread holds its core) a small request is handed on too,
  // without waiting for it.
  std::promise<void> holding, release;
  auto released = release.get_future();
  std::thread busy{[&] {
    lane->with_core([&](shard_core&) {
      holding.set_value();
      released.wait();
    });
  }};
  holding.get_future().wait();
  auto two = ndarray::full({4}, 2.0);
  const bool here =
      lane->take(envelope{wire::push{3, 4, 0, 0, whole(two)}, two.keepalive(), 3}, sink);
  release.set_value();
  busy.join();
  BOOST_TEST(!here);
  auto pushed = next_reply();
  BOOST_TEST_REQUIRE(as<wire::ack>(pushed) != nullptr);
  BOOST_TEST(as<wire::ack>(pushed)->round == 1u);

  // Idle again: a pull of round 1 is answered here, with the pushed value. The ack above comes
  // from inside the actor's turn, which may still hold the lane for a moment (and its timer may
  // take it later), so the test asks again, each time with a new pull that the actor answers if
  // the lane hands it on, until one is answered here.
  stats_of(shard); // the actor has finished the push's turn
  bool answered_here = false;
  std::optional<envelope> pulled;
  for (std::uint64_t id = 4; id < 104 && !answered_here; ++id) {
    answered_here = lane->take(envelope{wire::pull_request{id, 4, 0, 1, 0}, nullptr, 3}, sink);
    pulled = next_reply();
  }
  BOOST_TEST(answered_here);
  BOOST_TEST_REQUIRE(as<wire::pull_reply>(pulled) != nullptr);
  const auto& bytes = as<wire::pull_reply>(pulled)->tensor.data;
  BOOST_TEST_REQUIRE(bytes.size() == 4 * sizeof(float));
  float first = 0;
  std::memcpy(&first, bytes.data(), sizeof first);
  BOOST_TEST(first == 2.0f);
  caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
}

BOOST_AUTO_TEST_CASE(only_the_shards_own_tick_expires_pulls) {
  auto clock_ms = std::make_shared<std::atomic<std::int64_t>>(0);
  auto with_sweep = [&](std::chrono::milliseconds interval) {
    shard_options options;
    options.num_workers = 2;
    options.sweep_interval = interval;
    options.clock = [clock_ms] {
      return shard_clock::time_point{std::chrono::milliseconds{clock_ms->load()}};
    };
    auto shard = spawn_server_shard(system, options);
    auto initial = ndarray::ones({2});
    self->send(shard, envelope{wire::init{1, 4, whole(initial)}, initial.keepalive(), 0}, sink);
    BOOST_TEST(as<wire::ack>(next_reply()) != nullptr);
    self->send(shard, envelope{wire::pull_request{2, 4, 0, 1, 10}, nullptr, 0}, sink);
    // Answered after the pull (one sender's messages keep their order): the pull is waiting,
    // with its expiry taken from the clock as it is now.
    BOOST_TEST(stats_of(shard).pulls_expired == 0u);
    return shard;
  };
  auto idle = with_sweep(std::chrono::hours{1});
  auto sweeping = with_sweep(5ms);
  clock_ms->store(1000); // both pulls have expired by the shards' clock
  // A tick from anyone else is ignored: the request after it sees nothing expired.
  self->send(idle, tick_atom::value);
  BOOST_TEST(stats_of(idle).pulls_expired == 0u);
  // The shard's own tick comes every 5 ms; wait for it (bounded) by asking for the count.
  auto deadline = std::chrono::steady_clock::now() + 10s;
  std::uint64_t expired = 0;
  while (expired == 0 && std::chrono::steady_clock::now() < deadline) {
    expired = stats_of(sweeping).pulls_expired;
    if (expired == 0)
      self->receive(caf::after(5ms) >> [] {});
  }
  BOOST_TEST(expired == 1u);
  BOOST_TEST(!any_reply_within(50ms)); // expired pulls get no reply
  caf::anon_send_exit(idle, caf::exit_reason::user_shutdown);
  caf::anon_send_exit(sweeping, caf::exit_reason::user_shutdown);
}

BOOST_AUTO_TEST_CASE(a_server_node_fans_settings_out_and_broadcasts_membership_to_every_shard) {
  server_node_options options;
  options.num_workers = 2;
  options.shards = 3;
  server_node node{system, options};
  auto ask = [&](wire::message msg, std::shared_ptr<const void> keepalive = nullptr) {
    envelope request{std::move(msg), std::move(keepalive), 9};
    self->send(node.route(request), request, sink);
    return next_reply();
  };
  auto settings = ask(wire::sync_settings{7, wire::consistency_mode::async, 2, false, 0, 2});
  BOOST_TEST_REQUIRE(as<wire::ack>(settings) != nullptr);
  BOOST_TEST(as<wire::ack>(settings)->request_id == 7u);
  BOOST_TEST(settings->connection == 9u);
  BOOST_TEST(!any_reply_within(50ms)); // one answer for the three shards
  auto refused = ask(wire::sync_settings{8, wire::consistency_mode::async, 5, false, 0, 2});
  BOOST_TEST_REQUIRE(as<wire::error_reply>(refused) != nullptr);
  BOOST_TEST(as<wire::error_reply>(refused)->request_id == 8u);

  // Keys 10, 11 and 12 live on three different shards; each is now dist_async with s = 0.
  auto initial = ndarray::zeros({2});
  for (std::uint64_t key : {10u, 11u, 12u})
    BOOST_TEST_REQUIRE(
        as<wire::ack>(ask(wire::init{key, key, whole(initial)}, initial.keepalive())) != nullptr);
  auto one = ndarray::ones({2});
  BOOST_TEST(as<wire::ack>(ask(wire::push{20, 10, 0, 0, whole(one)}, one.keepalive())) != nullptr);
  BOOST_TEST(as<wire::ack>(ask(wire::push{21, 12, 0, 0, whole(one)}, one.keepalive())) != nullptr);
  for (std::uint64_t key : {10u, 12u}) {
    envelope pull{wire::pull_request{30 + key, key, 0, 1, 0}, nullptr, 9};
    self->send(node.route(pull), pull, sink);
  }
  BOOST_TEST(!any_reply_within(50ms)); // worker 1 has not pushed: both pulls wait
  node.broadcast(with_lost_workers(2, {1}));
  std::set<std::uint64_t> answered;
  for (int i = 0; i < 2; ++i) {
    auto reply = next_reply();
    if (auto* value = as<wire::pull_reply>(reply))
      answered.insert(value->request_id);
  }
  BOOST_TEST((answered == std::set<std::uint64_t>{40, 42}));

  auto totals = node.stats(10s);
  BOOST_TEST_REQUIRE(totals.has_value());
  BOOST_TEST(totals->updates == 2u);
  BOOST_TEST(totals->requests_refused == 3u); // the bad settings, by each shard
  BOOST_TEST(totals->max_lead == 0u);         // each push found worker 0 level with worker 1
}

BOOST_AUTO_TEST_CASE(frames_a_server_never_takes_are_routed_to_nobody_and_requests_to_their_actor) {
  server_node_options options;
  options.shards = 2;
  server_node node{system, options};
  auto route = [&](wire::message msg) { return node.route(envelope{std::move(msg), nullptr, 1}); };
  for (auto msg : std::vector<wire::message>{
           wire::ack{5}, wire::heartbeat{1, 2, 3},
           wire::admission{6, wire::admitted{0, 8, {}, false, {}}},
           wire::barrier{7, 1, wire::group::workers, 0, {}},
           wire::error_reply{8, std::nullopt, wire::error_code::internal, "x"}})
    BOOST_TEST(!route(msg), wire::kind_name(msg));
  BOOST_TEST(static_cast<bool>(
      route(wire::sync_settings{7, wire::consistency_mode::async, 1, false, 0, 2})));
  BOOST_TEST((route(wire::pull_request{1, 3, 0, 0, 0}) ==
              caf::actor_cast<request_handler>(node.shards()[shard_of(3, 2)])));
}

BOOST_AUTO_TEST_CASE(a_shard_that_dies_is_reported_and_a_normal_shutdown_is_not) {
  std::promise<std::string> reported;
  auto told = reported.get_future();
  std::atomic<int> reports{0};
  // Every shard's exit handler holds a copy of on_shard_failure, and so of `witness`: once the
  // last of them has run and been released, every report that could come has come.
  std::weak_ptr<const int> handlers;
  {
    auto witness = std::make_shared<const int>(0);
    handlers = witness;
    server_node_options options;
    options.shards = 3;
    options.on_shard_failure = [&, witness](const std::string& why) {
      if (reports++ == 0)
        reported.set_value(why);
    };
    server_node node{system, options};
    caf::anon_send_exit(node.shards()[1], caf::exit_reason::kill);
    BOOST_TEST_REQUIRE((told.wait_for(10s) == std::future_status::ready));
    const auto why = told.get();
    BOOST_TEST(why.find("shard 1 of this server failed") != std::string::npos, why);
  } // the node's own shutdown of the other two is no failure
  BOOST_TEST_REQUIRE(troupe::testing::poll_until([&] { return handlers.expired(); }, 30s),
                     "the shards' exit handlers did not run within 30 s");
  BOOST_TEST(reports.load() == 1);
}

BOOST_AUTO_TEST_SUITE_END()
