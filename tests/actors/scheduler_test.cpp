// The control plane (actors/scheduler, actors/node_agent) over real BASP connections on loopback,
// in one process: the scheduler lives in one actor system, the nodes in another, so every
// control message crosses the middleman as it would between processes. ps-lite's rules are
// checked with numbers: ranks in arrival order per role, node ids 8+2r / 9+2r, one key range per
// server, group barriers, kStopServer once every worker is done, and a lost node named by role
// and rank to every survivor. Every wait is bounded.

#include <arpa/inet.h>
#include <chrono>
#include <future>
#include <memory>
#include <netinet/in.h>
#include <optional>
#include <string>
#include <sys/socket.h>
#include <thread>
#include <unistd.h>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/after.hpp>
#include <caf/exit_reason.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/send.hpp>

#include "actors/protocols.hpp"
#include "actors/node_agent.hpp"
#include "actors/scheduler.hpp"

using namespace troupe;
using namespace std::chrono_literals;

namespace {

/// Short heartbeats, so that the failure paths run in about a second.
constexpr auto heartbeat = 100ms;
constexpr auto peer_timeout = 1s;

struct test_config : caf::actor_system_config {
  test_config() {
    load<caf::io::middleman>();
    configure_failure_detection(*this, heartbeat, peer_timeout);
  }
};

/// One "process": a config and the actor system built from it (which keeps a reference to it).
struct node_process {
  test_config cfg;
  caf::actor_system sys{cfg};
};

using join_result = result<std::unique_ptr<node_agent>>;

/// A job: the scheduler in one actor system, its nodes in another.
struct job_fixture {
  node_process scheduler_side;
  node_process node_side;
  std::optional<scheduler_handle> scheduler;
  const std::string job_id = "job-a";
  const std::string token = "secret";

  /// A scheduler still running when a case ends (a failed check) must not hold up the actor
  /// system's destructor, which waits for every actor.
  ~job_fixture() {
    if (scheduler)
      scheduler->stop();
  }

  void start(std::uint32_t servers, std::uint32_t workers,
             std::chrono::milliseconds startup_timeout = 10s, std::uint16_t port = 0) {
    scheduler_options options;
    options.port = port;
    options.num_servers = servers;
    options.num_workers = workers;
    options.job_id = job_id;
    options.auth_token = token;
    options.startup_timeout = startup_timeout;
    options.peer_timeout = peer_timeout;
    options.heartbeat_interval = heartbeat;
    options.drain_timeout = 5s;
    auto spawned = spawn_scheduler(scheduler_side.sys, options);
    if (!spawned)
      BOOST_FAIL(spawned.error().to_string());
    scheduler.emplace(std::move(spawned).value());
  }

  agent_options options_for(wire::role role, std::uint16_t data_port = 0) const {
    return options_for(scheduler->port(), role, data_port);
  }

  agent_options options_for(std::uint16_t scheduler_port, wire::role role,
                            std::uint16_t data_port = 0) const {
    agent_options options;
    options.scheduler_port = scheduler_port;
    options.role = role;
    options.job_id = job_id;
    options.auth_token = token;
    options.data_port = data_port;
    options.startup_timeout = 10s;
    options.heartbeat_interval = heartbeat;
    options.peer_timeout = peer_timeout;
    return options;
  }

  std::future<join_result> join_async(agent_options options) {
    return std::async(std::launch::async,
                      [this, options] { return node_agent::join(node_side.sys, options); });
  }

  /// Joins `servers` servers and `workers` workers concurrently; all must be admitted.
  std::vector<std::unique_ptr<node_agent>> join_all(std::uint32_t servers, std::uint32_t workers) {
    std::vector<std::future<join_result>> pending;
    for (std::uint32_t i = 0; i < servers; ++i)
      pending.push_back(join_async(options_for(wire::role::server)));
    for (std::uint32_t i = 0; i < workers; ++i)
      pending.push_back(join_async(options_for(wire::role::worker)));
    return admitted(pending);
  }

  static std::vector<std::unique_ptr<node_agent>>
  admitted(std::vector<std::future<join_result>>& pending) {
    std::vector<std::unique_ptr<node_agent>> agents;
    for (auto& future : pending) {
      auto joined = future.get();
      if (!joined)
        BOOST_FAIL("join failed: " + joined.error().to_string());
      agents.push_back(std::move(joined).value());
    }
    return agents;
  }
};

node_agent* find(const std::vector<std::unique_ptr<node_agent>>& agents, wire::role role,
                 std::uint32_t rank) {
  for (const auto& agent : agents)
    if (agent->role() == role && agent->rank() == rank)
      return agent.get();
  BOOST_FAIL("no " << wire::to_string(role) << " of rank " << rank);
  return nullptr;
}

/// A loopback port nobody listens on (the OS's pick, released again).
std::uint16_t unused_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  BOOST_TEST_REQUIRE(fd >= 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  const bool bound = ::bind(fd, reinterpret_cast<sockaddr*>(&address), length) == 0 &&
                     ::getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) == 0;
  ::close(fd);
  BOOST_TEST_REQUIRE(bound);
  return ntohs(address.sin_port);
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// The message `listener` receives within `timeout`: "stop", "peer_lost: <text>" or "" (none).
std::string next_notice(caf::scoped_actor& listener, std::chrono::milliseconds timeout) {
  std::string notice;
  listener->receive([&](stop_atom) { notice = "stop"; },
                    [&](peer_lost_atom, const std::string& text) { notice = "peer_lost: " + text; },
                    caf::after(timeout) >> [] {});
  return notice;
}

/// Sends a raw control frame to the scheduler as `self` and decodes the reply.
std::optional<wire::message> ask_raw(caf::scoped_actor& self, const caf::actor& scheduler,
                                     std::vector<char> frame) {
  self->send(scheduler, control_atom::value, std::move(frame));
  std::optional<wire::message> reply;
  self->receive(
      [&](control_atom, const std::vector<char>& bytes) {
        auto decoded = decode_control(bytes);
        if (decoded)
          reply = decoded->msg;
      },
      caf::after(std::chrono::seconds{5}) >> [] {});
  return reply;
}

} // namespace

BOOST_AUTO_TEST_SUITE(scheduler_control_plane)

BOOST_AUTO_TEST_CASE(membership_key_ranges_are_ps_lites_server_ranges_without_gaps_between) {
  for (std::uint32_t servers : {1u, 2u, 3u, 7u, 1000u}) {
    BOOST_TEST_CONTEXT(servers << " servers") {
      const auto ranges = membership_key_ranges(servers);
      BOOST_TEST_REQUIRE(ranges.size() == servers);
      BOOST_TEST(ranges.front().begin == 0u);
      // ps-lite's last range ends at kMaxKey/S*S: fewer than S keys short of the top.
      BOOST_TEST(ranges.back().end == max_key / servers * servers);
      BOOST_TEST(max_key - ranges.back().end < servers);
      for (std::uint32_t i = 0; i < servers; ++i) {
        BOOST_TEST(ranges[i].begin == max_key / servers * i); // GetServerKeyRanges
        BOOST_TEST(ranges[i].server_rank == i);
        BOOST_TEST(ranges[i].shard_index == 0u);
        BOOST_TEST(ranges[i].begin < ranges[i].end);
        if (i + 1 < servers)
          BOOST_TEST(ranges[i].end == ranges[i + 1].begin);
      }
    }
  }
}

BOOST_FIXTURE_TEST_CASE(ranks_follow_arrival_order_per_role_and_node_ids_follow_ps_lite,
                        job_fixture) {
  start(2, 3);
  // Arrival order: server A, worker A, worker B, server B, worker C; the data port tells them
  // apart. Spaced out so that each registration lands before the next one starts.
  const std::vector<std::pair<wire::role, std::uint16_t>> arrivals{{wire::role::server, 7000},
                                                                   {wire::role::worker, 7100},
                                                                   {wire::role::worker, 7101},
                                                                   {wire::role::server, 7001},
                                                                   {wire::role::worker, 7102}};
  std::vector<std::future<join_result>> pending;
  for (const auto& [role, port] : arrivals) {
    pending.push_back(join_async(options_for(role, port)));
    std::this_thread::sleep_for(150ms);
  }
  const auto agents = admitted(pending);
  const std::vector<std::pair<std::uint32_t, std::uint32_t>> expected{
      {0, 8}, {0, 9}, {1, 11}, {1, 10}, {2, 13}}; // (rank, node id) per arrival
  for (std::size_t i = 0; i < agents.size(); ++i) {
    BOOST_TEST_CONTEXT("arrival " << i) {
      BOOST_TEST((agents[i]->role() == arrivals[i].first));
      BOOST_TEST(agents[i]->rank() == expected[i].first);
      BOOST_TEST(agents[i]->node_id() == expected[i].second);
    }
  }
}

BOOST_FIXTURE_TEST_CASE(every_node_receives_the_same_membership_with_every_node_and_key_range,
                        job_fixture) {
  start(2, 2);
  std::vector<std::future<join_result>> pending;
  pending.push_back(join_async(options_for(wire::role::server, 7000)));
  pending.push_back(join_async(options_for(wire::role::server, 7001)));
  pending.push_back(join_async(options_for(wire::role::worker)));
  pending.push_back(join_async(options_for(wire::role::worker)));
  const auto agents = admitted(pending);

  const auto table = agents.front()->membership();
  for (const auto& agent : agents)
    BOOST_TEST((agent->membership() == table));
  BOOST_TEST(table.epoch == 1u);
  BOOST_TEST(table.num_servers == 2u);
  BOOST_TEST(table.num_workers == 2u);
  BOOST_TEST_REQUIRE(table.nodes.size() == 5u); // the scheduler, 2 servers, 2 workers
  const std::vector<std::uint32_t> ids{1, 8, 9, 10, 11};
  for (std::size_t i = 0; i < ids.size(); ++i)
    BOOST_TEST(table.nodes[i].node_id == ids[i]);
  BOOST_TEST((table.nodes[0].node_role == wire::role::scheduler));
  for (const auto& agent : agents) {
    const auto row = std::find_if(table.nodes.begin(), table.nodes.end(),
                                  [&](const auto& n) { return n.node_id == agent->node_id(); });
    BOOST_TEST_REQUIRE((row != table.nodes.end()));
    BOOST_TEST((row->node_role == agent->role()));
    BOOST_TEST(row->rank == agent->rank());
    BOOST_TEST(row->host == "127.0.0.1");
    BOOST_TEST(row->alive);
    if (agent->role() == wire::role::server)
      BOOST_TEST((row->data_port == 7000 || row->data_port == 7001));
  }
  BOOST_TEST((table.key_ranges == membership_key_ranges(2)));
  BOOST_TEST(table.key_ranges[0].end == table.key_ranges[1].begin);
}

BOOST_FIXTURE_TEST_CASE(nodes_started_before_the_scheduler_join_once_it_listens, job_fixture) {
  const std::uint16_t port = unused_port();
  // Nobody there: join gives up after its startup timeout.
  auto hurried = options_for(port, wire::role::worker);
  hurried.startup_timeout = 300ms;
  const auto started = std::chrono::steady_clock::now();
  const auto nobody = node_agent::join(node_side.sys, hurried);
  BOOST_TEST_REQUIRE(!nobody.has_value());
  BOOST_TEST((nobody.error().code() == errc::timeout));
  BOOST_TEST(contains(nobody.error().message(),
                      "could not reach the scheduler at 127.0.0.1:" + std::to_string(port)));
  BOOST_TEST((std::chrono::steady_clock::now() - started < 2s));

  // Processes start in any order: these keep retrying until the scheduler listens.
  std::vector<std::future<join_result>> pending;
  pending.push_back(join_async(options_for(port, wire::role::server)));
  pending.push_back(join_async(options_for(port, wire::role::worker)));
  std::this_thread::sleep_for(300ms);
  start(1, 1, 10s, port);
  BOOST_TEST(scheduler->port() == port);
  const auto agents = admitted(pending);
  BOOST_TEST(agents.size() == 2u);
}

BOOST_FIXTURE_TEST_CASE(
    registrations_with_a_wrong_job_id_or_a_bad_token_are_rejected_with_the_reason, job_fixture) {
  start(1, 1);
  auto wrong_job = options_for(wire::role::worker);
  wrong_job.job_id = "job-b";
  auto joined = node_agent::join(node_side.sys, wrong_job);
  BOOST_TEST_REQUIRE(!joined.has_value());
  BOOST_TEST((joined.error().code() == errc::invalid_argument));
  BOOST_TEST(contains(joined.error().message(), "registration rejected (wrong_job)"));
  BOOST_TEST(contains(joined.error().message(), "job-b"));

  auto bad_token = options_for(wire::role::server);
  bad_token.auth_token = "guess";
  joined = node_agent::join(node_side.sys, bad_token);
  BOOST_TEST_REQUIRE(!joined.has_value());
  BOOST_TEST((joined.error().code() == errc::invalid_argument));
  BOOST_TEST(contains(joined.error().message(), "registration rejected (bad_token)"));
  BOOST_TEST(!contains(joined.error().message(), "secret"));

  // The rejections took no rank: the job still starts with rank 0 of each role.
  const auto agents = join_all(1, 1);
  for (const auto& agent : agents)
    BOOST_TEST(agent->rank() == 0u);
  BOOST_TEST(!scheduler->outcome().has_value());
}

BOOST_FIXTURE_TEST_CASE(a_node_beyond_the_configured_counts_is_rejected_as_role_full, job_fixture) {
  start(1, 2);
  const auto agents = join_all(1, 2);
  for (auto role : {wire::role::worker, wire::role::server}) {
    auto joined = node_agent::join(node_side.sys, options_for(role));
    BOOST_TEST_REQUIRE(!joined.has_value());
    BOOST_TEST((joined.error().code() == errc::invalid_argument));
    BOOST_TEST(contains(joined.error().message(), "registration rejected (role_full)"));
  }
  // The job runs on: a barrier of everyone still completes.
  std::vector<std::future<status>> barriers;
  for (const auto& agent : agents)
    barriers.push_back(
        std::async(std::launch::async, [&agent] { return agent->barrier(wire::group::all, 5s); }));
  for (auto& barrier : barriers)
    BOOST_TEST(barrier.get().has_value());
}

BOOST_FIXTURE_TEST_CASE(bad_frames_and_requests_from_strangers_get_error_replies_not_a_crash,
                        job_fixture) {
  start(1, 1);
  auto remote = node_side.sys.middleman().remote_actor("127.0.0.1", scheduler->port());
  BOOST_TEST_REQUIRE(static_cast<bool>(remote));
  caf::scoped_actor stranger{node_side.sys};

  auto reply = ask_raw(stranger, *remote, std::vector<char>(24, '\x5a'));
  BOOST_TEST_REQUIRE(reply.has_value());
  BOOST_TEST_REQUIRE(std::holds_alternative<wire::error_reply>(*reply));
  BOOST_TEST((std::get<wire::error_reply>(*reply).code == wire::error_code::bad_frame));

  wire::registration old_version;
  old_version.request_id = 7;
  old_version.protocol_version = 99;
  old_version.job_id = job_id;
  old_version.auth_token = token;
  old_version.host = "127.0.0.1";
  reply = ask_raw(stranger, *remote, encode_control(old_version));
  BOOST_TEST_REQUIRE(reply.has_value());
  BOOST_TEST_REQUIRE(std::holds_alternative<wire::admission>(*reply));
  const auto& admission = std::get<wire::admission>(*reply);
  BOOST_TEST(admission.request_id == 7u);
  BOOST_TEST_REQUIRE(std::holds_alternative<wire::rejected>(admission.outcome));
  BOOST_TEST((std::get<wire::rejected>(admission.outcome).reason ==
              wire::reject_reason::protocol_version));

  reply = ask_raw(stranger, *remote, encode_control(wire::barrier{3, 1, wire::group::workers, 9}));
  BOOST_TEST_REQUIRE(reply.has_value());
  BOOST_TEST_REQUIRE(std::holds_alternative<wire::error_reply>(*reply));
  BOOST_TEST(std::get<wire::error_reply>(*reply).request_id == 3u);
  BOOST_TEST((std::get<wire::error_reply>(*reply).code == wire::error_code::not_admitted));

  // Nothing changed: the job starts as configured.
  const auto agents = join_all(1, 1);
  BOOST_TEST(agents.size() == 2u);
  BOOST_TEST(!scheduler->outcome().has_value());
}

BOOST_FIXTURE_TEST_CASE(a_worker_barrier_stays_pending_until_the_last_worker_arrives, job_fixture) {
  start(1, 3);
  const auto agents = join_all(1, 3);
  auto* server = find(agents, wire::role::server, 0);
  for (int round = 0; round < 2; ++round) {
    BOOST_TEST_CONTEXT("round " << round) {
      std::vector<std::future<status>> early;
      for (std::uint32_t rank : {0u, 1u})
        early.push_back(std::async(std::launch::async, [&, rank] {
          return find(agents, wire::role::worker, rank)->barrier(wire::group::workers, 5s);
        }));
      for (auto& barrier : early)
        BOOST_TEST((barrier.wait_for(300ms) == std::future_status::timeout));
      BOOST_TEST(
          find(agents, wire::role::worker, 2)->barrier(wire::group::workers, 5s).has_value());
      for (auto& barrier : early)
        BOOST_TEST(barrier.get().has_value());
    }
  }
  // ps-lite's startup barrier: servers, workers and the scheduler (which is always there).
  std::vector<std::future<status>> everyone;
  for (const auto& agent : agents)
    everyone.push_back(
        std::async(std::launch::async, [&agent] { return agent->barrier(wire::group::all, 5s); }));
  for (auto& barrier : everyone)
    BOOST_TEST(barrier.get().has_value());
  // A node cannot join a barrier of a group it is not in.
  const auto refused = server->barrier(wire::group::workers, 1s);
  BOOST_TEST_REQUIRE(!refused.has_value());
  BOOST_TEST((refused.error().code() == errc::invalid_argument));
}

BOOST_FIXTURE_TEST_CASE(a_job_that_never_completes_registration_fails_naming_the_missing_roles,
                        job_fixture) {
  start(2, 2, 500ms);
  const auto joined = node_agent::join(node_side.sys, options_for(wire::role::server));
  const std::string text = "1 of 2 servers and 0 of 2 workers registered after 500 ms";
  BOOST_TEST_REQUIRE(!joined.has_value());
  BOOST_TEST((joined.error().code() == errc::timeout));
  BOOST_TEST(joined.error().message() == text);
  const auto outcome = scheduler->wait(5s);
  BOOST_TEST_REQUIRE(outcome.has_value());
  BOOST_TEST_REQUIRE(!outcome->has_value());
  BOOST_TEST((outcome->error().code() == errc::timeout));
  BOOST_TEST(outcome->error().message() == text);
}

BOOST_FIXTURE_TEST_CASE(when_every_worker_is_done_the_servers_stop_and_the_job_succeeds,
                        job_fixture) {
  start(2, 2);
  auto agents = join_all(2, 2);
  caf::scoped_actor listener{node_side.sys};
  find(agents, wire::role::server, 0)->subscribe(caf::actor_cast<caf::actor>(listener));

  // The first worker finishes and leaves: not a loss, and the servers keep serving.
  auto* first = find(agents, wire::role::worker, 0);
  BOOST_TEST(first->notify_done(5s).has_value());
  std::erase_if(agents, [&](const auto& agent) { return agent.get() == first; });
  const auto early = find(agents, wire::role::server, 1)->wait_for_stop(300ms);
  BOOST_TEST_REQUIRE(!early.has_value());
  BOOST_TEST((early.error().code() == errc::timeout));
  BOOST_TEST(!scheduler->outcome().has_value());

  BOOST_TEST(find(agents, wire::role::worker, 1)->notify_done(5s).has_value());
  for (std::uint32_t rank : {0u, 1u})
    BOOST_TEST(find(agents, wire::role::server, rank)->wait_for_stop(5s).has_value());
  BOOST_TEST(next_notice(listener, 5s) == "stop");
  agents.clear(); // the servers (and the last worker) leave
  const auto outcome = scheduler->wait(5s);
  BOOST_TEST_REQUIRE(outcome.has_value());
  BOOST_TEST(outcome->has_value());
}

BOOST_FIXTURE_TEST_CASE(a_killed_worker_is_reported_to_every_survivor_by_role_and_rank,
                        job_fixture) {
  start(1, 3);
  const auto agents = join_all(1, 3);
  caf::scoped_actor listener{node_side.sys};
  auto* server = find(agents, wire::role::server, 0);
  server->subscribe(caf::actor_cast<caf::actor>(listener));
  std::vector<std::future<status>> waiting;
  for (std::uint32_t rank : {0u, 2u})
    waiting.push_back(std::async(std::launch::async, [&, rank] {
      return find(agents, wire::role::worker, rank)->barrier(wire::group::workers, 10s);
    }));
  std::this_thread::sleep_for(100ms);

  const auto killed = std::chrono::steady_clock::now();
  caf::anon_send_exit(find(agents, wire::role::worker, 1)->actor(), caf::exit_reason::kill);
  const std::string lost = "worker 1 (node 11) was lost";
  for (auto& barrier : waiting) {
    BOOST_TEST_REQUIRE((barrier.wait_for(5s) == std::future_status::ready));
    const auto outcome = barrier.get();
    BOOST_TEST_REQUIRE(!outcome.has_value());
    BOOST_TEST((outcome.error().code() == errc::peer_lost));
    BOOST_TEST(contains(outcome.error().message(), lost), outcome.error().message());
  }
  BOOST_TEST((std::chrono::steady_clock::now() - killed < 3s));
  const auto notice = next_notice(listener, 5s);
  BOOST_TEST(contains(notice, "peer_lost: " + lost), notice);
  // Every later call fails the same way, at once.
  const auto later = server->wait_for_stop(5s);
  BOOST_TEST_REQUIRE(!later.has_value());
  BOOST_TEST(contains(later.error().message(), lost));
  const auto outcome = scheduler->wait(5s);
  BOOST_TEST_REQUIRE(outcome.has_value());
  BOOST_TEST_REQUIRE(!outcome->has_value());
  BOOST_TEST((outcome->error().code() == errc::peer_lost));
  BOOST_TEST(contains(outcome->error().message(), lost));
}

BOOST_FIXTURE_TEST_CASE(a_node_that_falls_silent_is_declared_lost_after_the_peer_timeout,
                        job_fixture) {
  start(1, 2);
  // The silent worker's connection stays open (the middleman's own heartbeats keep it up); only
  // its agent stops sending, as a frozen process would.
  auto silent = options_for(wire::role::worker);
  silent.heartbeat_interval = 1h;
  silent.peer_timeout = 2h;
  std::vector<std::future<join_result>> pending;
  pending.push_back(join_async(options_for(wire::role::server)));
  pending.push_back(join_async(options_for(wire::role::worker)));
  pending.push_back(join_async(silent));
  const auto agents = admitted(pending);
  const auto& quiet = agents[2];
  const std::string lost = "worker " + std::to_string(quiet->rank()) + " (node " +
                           std::to_string(quiet->node_id()) + ") was lost: nothing heard from it";
  const auto outcome = scheduler->wait(5s);
  BOOST_TEST_REQUIRE(outcome.has_value());
  BOOST_TEST_REQUIRE(!outcome->has_value());
  BOOST_TEST((outcome->error().code() == errc::peer_lost));
  BOOST_TEST(contains(outcome->error().message(), lost), outcome->error().message());
  // The survivor and the silent node itself (were it to wake up) hear the same.
  for (node_agent* agent : {agents[1].get(), quiet.get()}) {
    const auto outcome = agent->barrier(wire::group::workers, 5s);
    BOOST_TEST_REQUIRE(!outcome.has_value());
    BOOST_TEST((outcome.error().code() == errc::peer_lost));
    BOOST_TEST(contains(outcome.error().message(), lost), outcome.error().message());
  }
}

BOOST_FIXTURE_TEST_CASE(when_the_scheduler_is_lost_every_waiting_call_returns_peer_lost,
                        job_fixture) {
  start(1, 2);
  const auto agents = join_all(1, 2);
  auto* server = find(agents, wire::role::server, 0);
  auto barrier = std::async(std::launch::async, [&] {
    return find(agents, wire::role::worker, 0)->barrier(wire::group::workers, 10s);
  });
  auto stop = std::async(std::launch::async, [&] { return server->wait_for_stop(10s); });
  std::this_thread::sleep_for(100ms);
  scheduler->stop();
  for (auto* call : {&barrier, &stop}) {
    BOOST_TEST_REQUIRE((call->wait_for(5s) == std::future_status::ready));
    const auto outcome = call->get();
    BOOST_TEST_REQUIRE(!outcome.has_value());
    BOOST_TEST((outcome.error().code() == errc::peer_lost));
    BOOST_TEST(contains(outcome.error().message(), "scheduler (node 1) was lost"),
               outcome.error().message());
  }
  const auto outcome = scheduler->wait(1s);
  BOOST_TEST_REQUIRE(outcome.has_value());
  BOOST_TEST((!outcome->has_value() && outcome->error().code() == errc::peer_lost));
}

BOOST_AUTO_TEST_SUITE_END()
