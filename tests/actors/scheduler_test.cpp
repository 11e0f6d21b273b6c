// The control plane (actors/scheduler, actors/node_agent, actors/job_barrier) over real framed
// connections on loopback, in one process: the scheduler lives in one actor system, the nodes in
// another, so every control message crosses a socket as a frame, as between processes. Some
// cases drive the scheduler's port by hand: raw bytes on a TCP socket, or a framed client whose
// frames the test writes. ps-lite's rules are checked with numbers: ranks in arrival order per
// role, node ids 8+2r / 9+2r, one key range per server, group barriers, kStopServer once every
// live worker is done, a lost node named by role and rank to every survivor, and with a quorum K
// of N workers, losses up to N - K that the job survives. Every wait is bounded.

#include <arpa/inet.h>
#include <chrono>
#include <cstring>
#include <future>
#include <memory>
#include <netinet/in.h>
#include <optional>
#include <poll.h>
#include <regex>
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

#include "actors/data_link.hpp"
#include "actors/logic/node_identity.hpp"
#include "actors/logic/wire_conversions.hpp"
#include "actors/node_agent.hpp"
#include "actors/protocols.hpp"
#include "actors/scheduler.hpp"
#include "schema/codec.hpp"
#include "tests/poll.hpp"
#include "tests/raw_peer.hpp"
#include "tests/stderr_capture.hpp"
#include "tests/tls_certs.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using troupe::testing::raw_peer;

namespace {

/// Short heartbeats, so that the failure paths run in about a second.
constexpr auto heartbeat = 100ms;
constexpr auto peer_timeout = 1s;

struct test_config : caf::actor_system_config {
  test_config() { load<caf::io::middleman>(); }
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
  /// Every link runs TLS with the job's certificates (tests/tls_certs.hpp), set before start().
  bool tls = false;

  /// The job's credentials for `role`, when tls is on.
  std::shared_ptr<const tls_credentials> credentials(node_role role) const {
    if (!tls)
      return nullptr;
    const auto& certs = testing::job_certs();
    const std::string name(to_string(role));
    auto loaded = tls_credentials::load(certs.ca(), certs.cert(name), certs.key(name), role);
    BOOST_TEST_REQUIRE(loaded.has_value(), (loaded ? std::string() : loaded.error().message()));
    return *loaded;
  }

  /// A scheduler still running when a case ends (a failed check) must not hold up the actor
  /// system's destructor, which waits for every actor.
  /// scheduler_options::server_rejoin, set before start().
  std::chrono::milliseconds server_rejoin{0};
  /// scheduler_options::secret, set before start(); empty: the scheduler draws one.
  job_secret secret;

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
    options.tls = credentials(node_role::scheduler);
    options.startup_timeout = startup_timeout;
    options.peer_timeout = peer_timeout;
    options.heartbeat_interval = heartbeat;
    options.drain_timeout = 5s;
    options.server_rejoin = server_rejoin;
    options.secret = secret;
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
    options.tls = credentials(from_wire(role));
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

  /// Starts a job of `servers` and `workers` and joins every node; with a `quorum`, worker rank
  /// 0 then sets it.
  std::vector<std::unique_ptr<node_agent>> running_job(std::uint32_t servers, std::uint32_t workers,
                                                       std::optional<std::uint32_t> quorum = {});

  /// The workers of `ranks` pass a barrier of the worker group together.
  static void pass_worker_barrier(const std::vector<std::unique_ptr<node_agent>>& agents,
                                  const std::vector<std::uint32_t>& ranks);

  /// The workers of `ranks` say done, every server is told to stop, every node leaves: the job's
  /// outcome.
  job_outcome finish(std::vector<std::unique_ptr<node_agent>>& agents,
                     const std::vector<std::uint32_t>& ranks);

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

/// "membership epoch E, lost: 11 13" for a table; the node ids of the rows not alive, and
/// ", left: 9" when some rows left.
std::string describe_table(const wire::membership& table) {
  std::string text = "membership epoch " + std::to_string(table.epoch) + ", lost:";
  std::string left;
  for (const auto& node : table.nodes) {
    if (!node.alive)
      text += " " + std::to_string(node.node_id);
    if (node.left)
      left += " " + std::to_string(node.node_id);
  }
  return left.empty() ? text : text + ", left:" + left;
}

/// The message `listener` receives within `timeout`: "stop", "peer_lost: <text>",
/// "membership epoch E, lost: ..." or "" (none).
std::string next_notice(caf::scoped_actor& listener, std::chrono::milliseconds timeout) {
  std::string notice;
  listener->receive([&](stop_atom) { notice = "stop"; },
                    [&](peer_lost_atom, const std::string& text) { notice = "peer_lost: " + text; },
                    [&](const wire::membership& table) { notice = describe_table(table); },
                    caf::after(timeout) >> [] {});
  return notice;
}

job_listener as_listener(caf::scoped_actor& listener) {
  return caf::actor_cast<job_listener>(listener);
}

/// A control connection to the scheduler driven by hand: frames the test writes, and the frames
/// that come back (heartbeats skipped).
class framed_client {
public:
  /// `tls`: the link's TLS, none by default.
  framed_client(caf::actor_system& sys, std::uint16_t port, const std::string& token,
                link_tls tls = {})
      : self_{sys} {
    data_link_options options;
    options.tuning =
        control_link_tuning(max_control_frame_bytes, logger{}, link_secret(token), std::move(tls));
    auto link =
        connect_data_link(sys, "127.0.0.1", port, caf::actor_cast<caf::actor>(self_), options);
    BOOST_TEST_REQUIRE(link.has_value());
    link_ = *link;
  }
  ~framed_client() { caf::anon_send(link_, stop_atom::value); }
  framed_client(const framed_client&) = delete;
  framed_client& operator=(const framed_client&) = delete;

  void send(wire::message msg) { self_->send(link_, envelope{std::move(msg), nullptr, 0}); }

  /// The next frame other than a heartbeat within `timeout`; nullopt when none came.
  std::optional<wire::message> next(std::chrono::milliseconds timeout = 5s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (;;) {
      const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left <= 0ms)
        return std::nullopt;
      std::optional<wire::message> got;
      bool over = false;
      self_->receive([&](envelope& frame) { got = std::move(frame.msg); },
                     [&](link_down_atom, std::uint64_t, const std::string&) { over = true; },
                     caf::after(left) >> [&] { over = true; });
      if (over)
        return std::nullopt;
      if (!std::holds_alternative<wire::heartbeat>(*got))
        return got;
    }
  }

  /// A registration for this job, as a node would send it.
  static wire::registration registration(const std::string& job_id, wire::role role,
                                         std::uint16_t port) {
    wire::registration reg;
    reg.request_id = 1;
    reg.node_role = role;
    reg.job_id = job_id;
    reg.host = "127.0.0.1";
    reg.port = port;
    return reg;
  }

private:
  caf::scoped_actor self_;
  caf::actor link_;
};

/// Checks that `reply` is an error_reply with `code`, and returns it.
wire::error_reply expect_error(const std::optional<wire::message>& reply, wire::error_code code) {
  BOOST_TEST_REQUIRE(reply.has_value());
  BOOST_TEST_REQUIRE(std::holds_alternative<wire::error_reply>(*reply),
                     "a " << wire::kind_name(*reply) << " instead of an error_reply");
  const auto& err = std::get<wire::error_reply>(*reply);
  BOOST_TEST((err.code == code), err.message);
  return err;
}

/// Checks that `reply` is an admission that rejected the node for `reason`, and returns it.
wire::rejected expect_rejected(const std::optional<wire::message>& reply,
                               wire::reject_reason reason) {
  BOOST_TEST_REQUIRE(reply.has_value());
  BOOST_TEST_REQUIRE(std::holds_alternative<wire::admission>(*reply),
                     "a " << wire::kind_name(*reply) << " instead of an admission");
  const auto& outcome = std::get<wire::admission>(*reply).outcome;
  BOOST_TEST_REQUIRE(std::holds_alternative<wire::rejected>(outcome));
  const auto& rejected = std::get<wire::rejected>(outcome);
  BOOST_TEST((rejected.reason == reason), rejected.detail);
  return rejected;
}

/// Worker rank 0's sync settings with quorum `quorum`.
wire::sync_settings settings_with_quorum(std::uint32_t quorum) {
  wire::sync_settings settings;
  settings.quorum = quorum;
  return settings;
}

std::vector<std::unique_ptr<node_agent>>
job_fixture::running_job(std::uint32_t servers, std::uint32_t workers,
                         std::optional<std::uint32_t> quorum) {
  start(servers, workers);
  auto agents = join_all(servers, workers);
  if (quorum) {
    const auto set =
        find(agents, wire::role::worker, 0)->send_sync_settings(settings_with_quorum(*quorum), 5s);
    BOOST_TEST_REQUIRE(set.has_value(), set.error().to_string());
  }
  return agents;
}

void job_fixture::pass_worker_barrier(const std::vector<std::unique_ptr<node_agent>>& agents,
                                      const std::vector<std::uint32_t>& ranks) {
  std::vector<std::future<status>> waiting;
  for (std::uint32_t rank : ranks)
    waiting.push_back(std::async(std::launch::async, [&agents, rank] {
      return find(agents, wire::role::worker, rank)->barrier(wire::group::workers, 5s);
    }));
  for (auto& barrier : waiting) {
    const auto passed = barrier.get();
    BOOST_TEST(passed.has_value(), (passed ? std::string{} : passed.error().to_string()));
  }
}

job_outcome job_fixture::finish(std::vector<std::unique_ptr<node_agent>>& agents,
                                const std::vector<std::uint32_t>& ranks) {
  for (std::uint32_t rank : ranks)
    BOOST_TEST(find(agents, wire::role::worker, rank)->notify_done(5s).has_value());
  for (const auto& agent : agents)
    if (agent->role() == wire::role::server)
      BOOST_TEST(agent->wait_for_stop(5s).has_value());
  agents.clear();
  auto outcome = scheduler->wait(5s);
  BOOST_TEST_REQUIRE(outcome.has_value());
  return *outcome;
}

} // namespace

BOOST_AUTO_TEST_SUITE(scheduler_control_plane)

BOOST_AUTO_TEST_CASE(the_scheduler_binds_node_bind_and_tells_nodes_its_host) {
  node_process side;
  scheduler_options options;
  options.host = "127.0.0.1";
  options.bind = "127.0.0.3";
  options.job_id = "bind";
  auto spawned = spawn_scheduler(side.sys, options);
  if (!spawned)
    BOOST_FAIL(spawned.error().to_string());
  const auto port = spawned->port();
  BOOST_TEST(raw_peer(port, "127.0.0.3").connected);
  BOOST_TEST(!raw_peer(port, "127.0.0.1").connected);
  spawned->stop();
}

BOOST_AUTO_TEST_CASE(more_key_ranges_than_servers_are_held_round_robin) {
  const auto ranges = membership_key_ranges(2, 5);
  BOOST_TEST_REQUIRE(ranges.size() == 5u);
  for (std::uint32_t r = 0; r < 5; ++r) {
    BOOST_TEST(ranges[r].begin == max_key / 5 * r);
    BOOST_TEST(ranges[r].end == max_key / 5 * (r + 1));
    BOOST_TEST(ranges[r].server_rank == r % 2);
  }
  // Fewer ranges than servers means one per server.
  BOOST_TEST((membership_key_ranges(3, 1) == membership_key_ranges(3)));
}

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
  // Arrival order: server A, worker A, worker B, server B, worker C; each registers once the
  // previous one has its admission, so the order is the test's.
  const std::vector<std::pair<wire::role, std::uint16_t>> arrivals{{wire::role::server, 7000},
                                                                   {wire::role::worker, 7100},
                                                                   {wire::role::worker, 7101},
                                                                   {wire::role::server, 7001},
                                                                   {wire::role::worker, 7102}};
  const std::vector<std::pair<std::uint32_t, std::uint32_t>> expected{
      {0, 8}, {0, 9}, {1, 11}, {1, 10}, {2, 13}}; // (rank, node id) per arrival
  std::vector<std::unique_ptr<framed_client>> nodes;
  for (std::size_t i = 0; i < arrivals.size(); ++i) {
    BOOST_TEST_CONTEXT("arrival " << i) {
      nodes.push_back(std::make_unique<framed_client>(node_side.sys, scheduler->port(), token));
      nodes.back()->send(
          framed_client::registration(job_id, arrivals[i].first, arrivals[i].second));
      const auto reply = nodes.back()->next();
      BOOST_TEST_REQUIRE(reply.has_value());
      BOOST_TEST_REQUIRE(std::holds_alternative<wire::admission>(*reply));
      const auto& outcome = std::get<wire::admission>(*reply).outcome;
      BOOST_TEST_REQUIRE(std::holds_alternative<wire::admitted>(outcome));
      BOOST_TEST(std::get<wire::admitted>(outcome).rank == expected[i].first);
      BOOST_TEST(std::get<wire::admitted>(outcome).node_id == expected[i].second);
    }
  }
  // The last admission started the job: every node gets the table of epoch 1.
  for (auto& node : nodes) {
    const auto table = node->next();
    BOOST_TEST_REQUIRE(table.has_value());
    BOOST_TEST_REQUIRE(std::holds_alternative<wire::membership>(*table));
    BOOST_TEST(std::get<wire::membership>(*table).epoch == 1u);
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

BOOST_FIXTURE_TEST_CASE(an_agent_facing_a_refusing_port_gives_up_after_its_connect_timeout,
                        job_fixture) {
  const std::uint16_t port = unused_port();
  auto hurried = options_for(port, wire::role::worker);
  hurried.connect_timeout = 1s;
  hurried.startup_timeout = 60s;
  const auto started = std::chrono::steady_clock::now();
  const auto nobody = node_agent::join(node_side.sys, hurried);
  const auto took = std::chrono::steady_clock::now() - started;
  BOOST_TEST_REQUIRE(!nobody.has_value());
  BOOST_TEST((nobody.error().code() == errc::timeout));
  const auto& text = nobody.error().message();
  BOOST_TEST(contains(text, "could not reach the scheduler at 127.0.0.1:" + std::to_string(port)),
             text);
  // The agent's own clock: at least about the timeout ("1s", "1012ms" or, a tick short of it,
  // "999ms"); a loaded machine may run its last attempt late.
  BOOST_TEST(std::regex_search(text, std::regex{"tried for ([0-9]+s|[0-9]{4,}ms|9[5-9][0-9]ms)"}),
             text);
  BOOST_TEST(contains(text, "connect timeout 1s"), text);
  BOOST_TEST(contains(text, "last: "), text);
  // Backoff: 50 ms doubling, so 6 or 7 attempts fit in a second (not hundreds).
  BOOST_TEST(!contains(text, "(1 attempts"), text);
  // It gave up at its connect timeout, not at the startup timeout of 60 s.
  BOOST_TEST((took >= 1s && took < 30s));
}

BOOST_FIXTURE_TEST_CASE(nodes_started_before_the_scheduler_join_once_it_listens, job_fixture) {
  const std::uint16_t port = unused_port();
  // Processes start in any order: these keep retrying until the scheduler listens. Each says in
  // a debug line when the port refused it; the scheduler starts once both have been refused.
  testing::stderr_capture log;
  std::vector<std::future<join_result>> pending;
  for (const auto role : {wire::role::server, wire::role::worker}) {
    auto options = options_for(port, role);
    options.log = logger(std::string{"early "} + std::string{wire::to_string(role)}, 2);
    options.connect_timeout = 60s;
    options.startup_timeout = 60s;
    pending.push_back(join_async(options));
  }
  const std::string refused = ": the scheduler at 127.0.0.1:" + std::to_string(port) + " refused";
  auto both_refused = [&] {
    const auto text = log.text();
    return contains(text, "early server" + refused) && contains(text, "early worker" + refused);
  };
  const bool refused_both = troupe::testing::poll_until(both_refused, 30s);
  log.restore();
  BOOST_TEST_REQUIRE(refused_both, log.text());
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

  // A wrong token fails the control connection's handshake: the scheduler never reads the
  // registration, and the node is told that it was refused, and why, not that the scheduler was
  // lost. Neither token appears in the message.
  auto bad_token = options_for(wire::role::server);
  bad_token.auth_token = "guess";
  joined = node_agent::join(node_side.sys, bad_token);
  BOOST_TEST_REQUIRE(!joined.has_value());
  BOOST_TEST((joined.error().code() == errc::invalid_argument), joined.error().message());
  BOOST_TEST(contains(joined.error().message(),
                      "refused by the scheduler at 127.0.0.1:" + std::to_string(scheduler->port()) +
                          ": the job token is wrong"),
             joined.error().message());
  BOOST_TEST(contains(joined.error().message(), "proof of the job token is wrong"));
  BOOST_TEST(!contains(joined.error().message(), "lost"));
  BOOST_TEST(!contains(joined.error().message(), "secret"));
  BOOST_TEST(!contains(joined.error().message(), "guess"));

  // The rejections took no rank: the job still starts with rank 0 of each role.
  const auto agents = join_all(1, 1);
  for (const auto& agent : agents)
    BOOST_TEST(agent->rank() == 0u);
  BOOST_TEST(!scheduler->outcome().has_value());
}

BOOST_FIXTURE_TEST_CASE(a_node_beyond_the_configured_counts_is_rejected_as_role_full, job_fixture) {
  const auto agents = running_job(1, 2);
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

BOOST_FIXTURE_TEST_CASE(under_tls_a_node_is_admitted_only_in_the_role_its_certificate_names,
                        job_fixture) {
  tls = true;
  start(1, 1);
  // The certificates are the job's, so TLS lets them in; the roles they claim are not theirs.
  const std::pair<node_role, wire::role> liars[] = {{node_role::worker, wire::role::server},
                                                    {node_role::server, wire::role::worker}};
  for (const auto& [certified, claimed] : liars) {
    BOOST_TEST_CONTEXT("a " << to_string(certified) << " certificate registering as a "
                            << wire::to_string(claimed)) {
      framed_client liar{node_side.sys,
                         scheduler->port(),
                         token,
                         {credentials(certified), {node_role::scheduler}}};
      liar.send(framed_client::registration(
          job_id, claimed, static_cast<std::uint16_t>(claimed == wire::role::server ? 7000 : 0)));
      const auto rejected = expect_rejected(liar.next(), wire::reject_reason::wrong_role);
      const std::string says = "it registers as a " + std::string{wire::to_string(claimed)} +
                               ", but its TLS certificate is for a " +
                               std::string{to_string(certified)};
      BOOST_TEST(contains(rejected.detail, says), rejected.detail);
    }
  }
  // An agent refuses to join in a role its own certificate does not name, before connecting.
  auto mismatched = options_for(wire::role::server);
  mismatched.tls = credentials(node_role::worker);
  auto refused = node_agent::join(node_side.sys, mismatched);
  BOOST_TEST_REQUIRE(!refused.has_value());
  BOOST_TEST(
      contains(refused.error().message(), "is for a worker, but this node joins as a server"),
      refused.error().message());

  // Nothing changed: the job starts as configured, with every rank free.
  const auto agents = join_all(1, 1);
  for (const auto& agent : agents)
    BOOST_TEST(agent->rank() == 0u);
  BOOST_TEST(!scheduler->outcome().has_value());
}

BOOST_FIXTURE_TEST_CASE(garbage_and_an_oversized_length_prefix_close_the_connection_after_an_error,
                        job_fixture) {
  start(1, 1);
  // 24 bytes of 0x5a: a length prefix of 0x5a5a5a5a5a5a5a5a, far above the cap.
  // A 1 GiB prefix: a multiple of 8, but above the cap, checked before anything is allocated.
  for (const auto& bytes :
       {std::vector<std::byte>(24, std::byte{0x5a}), raw_peer::prefix_bytes(1ull << 30)}) {
    raw_peer stranger{scheduler->port()};
    BOOST_TEST_REQUIRE(stranger.connected);
    BOOST_TEST_REQUIRE(stranger.send(bytes));
    const auto [reply, closed] = stranger.read_until_closed(5s);
    BOOST_TEST(closed);
    const auto err = expect_error(raw_peer::first_frame(reply), wire::error_code::bad_frame);
    BOOST_TEST(contains(err.message, "frame_too_large"), err.message);
  }
  // A well-formed frame with a value the protocol forbids (a quorum of 0): an error, and the
  // connection serves on, since the stream is still in step: a registration of an old protocol
  // version on it is answered.
  raw_peer stranger{scheduler->port()};
  BOOST_TEST_REQUIRE(stranger.connected);
  // Every connection opens with the link handshake (window 0: no flow control asked of the
  // scheduler), which proves the job token.
  BOOST_TEST_REQUIRE(stranger.handshake(0, token).has_value());
  BOOST_TEST_REQUIRE(stranger.send(wire::encode(settings_with_quorum(0)).flatten()));
  wire::registration old_version = framed_client::registration(job_id, wire::role::worker, 0);
  old_version.request_id = 7;
  old_version.protocol_version = 99;
  BOOST_TEST_REQUIRE(stranger.send(wire::encode(old_version).flatten()));
  const auto [replies, closed] = stranger.read_until_closed(1s);
  BOOST_TEST(!closed);
  std::vector<wire::message> answers;
  for (auto& frame : raw_peer::frames(replies))
    if (!wire::is_link_control(frame))
      answers.push_back(frame);
  BOOST_TEST_REQUIRE(answers.size() == 2u);
  expect_error(answers[0], wire::error_code::bad_frame);
  BOOST_TEST_REQUIRE(std::holds_alternative<wire::admission>(answers[1]));
  BOOST_TEST(std::get<wire::admission>(answers[1]).request_id == 7u);

  // Nothing changed: the job starts as configured.
  const auto agents = join_all(1, 1);
  BOOST_TEST(agents.size() == 2u);
  BOOST_TEST(!scheduler->outcome().has_value());
}

BOOST_FIXTURE_TEST_CASE(an_admission_gives_each_node_its_own_secret_sealed_under_its_control_link,
                        job_fixture) {
  secret = job_secret{wire::link_digest{0x42, 0x17, 0x99}};
  start(1, 2);
  std::promise<job_secret> told;
  auto server = options_for(wire::role::server, 7000);
  server.on_job_secret = [&told](const job_secret& given) { told.set_value(given); };
  std::vector<std::future<join_result>> pending;
  pending.push_back(join_async(server));
  for (int i = 0; i < 2; ++i)
    pending.push_back(join_async(options_for(wire::role::worker)));
  const auto agents = admitted(pending);
  // A worker holds its own key K(worker, rank), derived from the token and the job secret.
  for (std::uint32_t rank : {0u, 1u}) {
    const auto& key = find(agents, wire::role::worker, rank)->key();
    BOOST_TEST_REQUIRE(!key.empty());
    const auto expected =
        derive_node_key(link_secret(token), secret, {wire::role::worker, rank}).reveal();
    BOOST_TEST((key.reveal() == expected), "worker " << rank);
  }
  BOOST_TEST((find(agents, wire::role::worker, 0)->key().reveal() !=
              find(agents, wire::role::worker, 1)->key().reveal()));
  // A server holds no key of its own but the job secret, told before join() returned.
  BOOST_TEST(find(agents, wire::role::server, 0)->key().empty());
  auto given = told.get_future();
  BOOST_TEST_REQUIRE((given.wait_for(0s) == std::future_status::ready));
  BOOST_TEST((given.get().reveal() == secret.reveal()));
}

BOOST_FIXTURE_TEST_CASE(a_registration_on_a_control_link_that_made_no_key_exchange_is_rejected,
                        job_fixture) {
  start(1, 1);
  // The token's handshake without a key share: nothing to seal the node's secret under.
  raw_peer plain{scheduler->port()};
  BOOST_TEST_REQUIRE(plain.handshake(0, token).has_value());
  BOOST_TEST_REQUIRE(plain.send(
      wire::encode(framed_client::registration(job_id, wire::role::worker, 0)).flatten()));
  const auto rejected =
      expect_rejected(plain.receive_reply(), wire::reject_reason::protocol_version);
  BOOST_TEST(contains(rejected.detail, "made no key exchange"), rejected.detail);
  // It took no rank: the job starts with rank 0 of each role.
  const auto agents = join_all(1, 1);
  for (const auto& agent : agents)
    BOOST_TEST(agent->rank() == 0u);
}

BOOST_FIXTURE_TEST_CASE(frames_before_registration_and_bad_registrations_get_error_replies,
                        job_fixture) {
  start(1, 1);
  framed_client stranger{node_side.sys, scheduler->port(), token};

  stranger.send(wire::barrier{3, 1, wire::group::workers, 9, {}});
  auto err = expect_error(stranger.next(), wire::error_code::not_admitted);
  BOOST_TEST(err.request_id == 3u);
  stranger.send(wire::command{4, wire::command_kind::stop, {}});
  BOOST_TEST(expect_error(stranger.next(), wire::error_code::not_admitted).request_id == 4u);
  stranger.send(settings_with_quorum(1));
  expect_error(stranger.next(), wire::error_code::not_admitted);

  auto old_version = framed_client::registration(job_id, wire::role::worker, 0);
  old_version.request_id = 7;
  old_version.protocol_version = 99;
  stranger.send(old_version);
  auto reply = stranger.next();
  BOOST_TEST_REQUIRE(reply.has_value());
  BOOST_TEST_REQUIRE(std::holds_alternative<wire::admission>(*reply));
  const auto& admission = std::get<wire::admission>(*reply);
  BOOST_TEST(admission.request_id == 7u);
  BOOST_TEST_REQUIRE(std::holds_alternative<wire::rejected>(admission.outcome));
  BOOST_TEST((std::get<wire::rejected>(admission.outcome).reason ==
              wire::reject_reason::protocol_version));

  auto long_host = framed_client::registration(job_id, wire::role::worker, 0);
  long_host.host = std::string(4000, 'h');
  stranger.send(long_host);
  err = expect_error(stranger.next(), wire::error_code::invalid_argument);
  BOOST_TEST(contains(err.message, "4000 bytes"), err.message);

  // Nothing changed: the job starts as configured, with every rank free.
  const auto agents = join_all(1, 1);
  for (const auto& agent : agents)
    BOOST_TEST(agent->rank() == 0u);
  BOOST_TEST(!scheduler->outcome().has_value());
}

BOOST_FIXTURE_TEST_CASE(a_worker_barrier_stays_pending_until_the_last_worker_arrives, job_fixture) {
  const auto agents = running_job(1, 3);
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

BOOST_FIXTURE_TEST_CASE(a_gathering_barrier_gives_every_worker_every_workers_values_by_rank,
                        job_fixture) {
  const auto agents = running_job(1, 3);
  using gathered = result<std::vector<wire::gathered_values>>;
  std::vector<std::future<gathered>> waits;
  // Worker 1 shares nothing; the others their rank times 10 (worker 2 two values).
  for (std::uint32_t rank : {2u, 0u, 1u})
    waits.push_back(std::async(std::launch::async, [&, rank]() -> gathered {
      std::vector<double> values;
      if (rank == 0)
        values = {0.5};
      if (rank == 2)
        values = {20.0, 21.0};
      return find(agents, wire::role::worker, rank)
          ->barrier_gather(wire::group::workers, values, 5s);
    }));
  const std::vector<wire::gathered_values> expected{{wire::role::worker, 0, {0.5}},
                                                    {wire::role::worker, 2, {20.0, 21.0}}};
  for (auto& wait : waits) {
    auto got = wait.get();
    BOOST_TEST_REQUIRE(got.has_value());
    BOOST_TEST((*got == expected));
  }
  // More than the wire carries is refused before anything is sent.
  const std::vector<double> too_many(wire::max_barrier_values + 1, 1.0);
  auto refused =
      find(agents, wire::role::worker, 0)->barrier_gather(wire::group::workers, too_many, 1s);
  BOOST_TEST_REQUIRE(!refused.has_value());
  BOOST_TEST((refused.error().code() == errc::invalid_argument));
}

BOOST_FIXTURE_TEST_CASE(a_job_that_never_completes_registration_fails_naming_the_missing_roles,
                        job_fixture) {
  start(2, 2, 500ms);
  const auto joined = node_agent::join(node_side.sys, options_for(wire::role::server));
  const std::string text = "1 of 2 servers and 0 of 2 workers registered after 500ms";
  BOOST_TEST_REQUIRE(!joined.has_value());
  BOOST_TEST((joined.error().code() == errc::timeout));
  BOOST_TEST(joined.error().message() == text);
  const auto outcome = scheduler->wait(5s);
  BOOST_TEST_REQUIRE(outcome.has_value());
  BOOST_TEST((outcome->end == job_end::failed));
  BOOST_TEST_REQUIRE(outcome->failure.has_value());
  BOOST_TEST((outcome->failure->code() == errc::timeout));
  BOOST_TEST(outcome->failure->message() == text);
}

BOOST_FIXTURE_TEST_CASE(when_every_worker_is_done_the_servers_stop_and_the_job_succeeds,
                        job_fixture) {
  auto agents = running_job(2, 2);
  caf::scoped_actor listener{node_side.sys};
  find(agents, wire::role::server, 0)->subscribe(as_listener(listener));

  // The first worker finishes and leaves: not a loss, and the servers keep serving; they get a
  // table that lists it left.
  auto* first = find(agents, wire::role::worker, 0);
  BOOST_TEST(first->notify_done(5s, 3).has_value());
  BOOST_TEST(next_notice(listener, 5s) == "membership epoch 2, lost:, left: 9");
  std::erase_if(agents, [&](const auto& agent) { return agent.get() == first; });
  const auto early = find(agents, wire::role::server, 1)->wait_for_stop(300ms);
  BOOST_TEST_REQUIRE(!early.has_value());
  BOOST_TEST((early.error().code() == errc::timeout));
  BOOST_TEST(!scheduler->outcome().has_value());

  BOOST_TEST(find(agents, wire::role::worker, 1)->notify_done(5s, 4).has_value());
  for (std::uint32_t rank : {0u, 1u})
    BOOST_TEST(find(agents, wire::role::server, rank)->wait_for_stop(5s).has_value());
  BOOST_TEST(next_notice(listener, 5s) == "stop");
  agents.clear(); // the servers (and the last worker) leave
  const auto outcome = scheduler->wait(5s);
  BOOST_TEST_REQUIRE(outcome.has_value());
  BOOST_TEST((outcome->end == job_end::finished));
  BOOST_TEST(outcome->workers_finished == 2u);
  BOOST_TEST(outcome->lost_workers.empty());
  BOOST_TEST(outcome->as_status().has_value());
  BOOST_TEST(contains(outcome->summary, "2 of 2 workers finished (rank 0, 1); left early: worker "
                                        "0 (node 9) after 3 of 4 rounds, "),
             outcome->summary);
  BOOST_TEST(contains(outcome->summary, " after the job started; 0 lost"), outcome->summary);
}

BOOST_FIXTURE_TEST_CASE(a_killed_worker_is_reported_to_every_survivor_by_role_and_rank,
                        job_fixture) {
  const auto agents = running_job(1, 3);
  caf::scoped_actor listener{node_side.sys};
  auto* server = find(agents, wire::role::server, 0);
  server->subscribe(as_listener(listener));
  std::vector<std::future<status>> waiting;
  for (std::uint32_t rank : {0u, 2u})
    waiting.push_back(std::async(std::launch::async, [&, rank] {
      return find(agents, wire::role::worker, rank)->barrier(wire::group::workers, 10s);
    }));

  caf::anon_send_exit(find(agents, wire::role::worker, 1)->actor(), caf::exit_reason::kill);
  const std::string lost = "worker 1 (node 11) was lost";
  // Bounded waits, generous for a loaded machine: what matters is that nobody waits for ever.
  for (auto& barrier : waiting) {
    BOOST_TEST_REQUIRE((barrier.wait_for(20s) == std::future_status::ready));
    const auto outcome = barrier.get();
    BOOST_TEST_REQUIRE(!outcome.has_value());
    BOOST_TEST((outcome.error().code() == errc::peer_lost));
    BOOST_TEST(contains(outcome.error().message(), lost), outcome.error().message());
  }
  const auto notice = next_notice(listener, 5s);
  BOOST_TEST(contains(notice, "peer_lost: " + lost), notice);
  // Every later call fails the same way, at once.
  const auto later = server->wait_for_stop(5s);
  BOOST_TEST_REQUIRE(!later.has_value());
  BOOST_TEST(contains(later.error().message(), lost));
  const auto outcome = scheduler->wait(5s);
  BOOST_TEST_REQUIRE(outcome.has_value());
  BOOST_TEST((outcome->end == job_end::failed));
  BOOST_TEST((outcome->failure->code() == errc::peer_lost));
  BOOST_TEST(contains(outcome->failure->message(), lost));
  BOOST_TEST(contains(outcome->summary, "the job failed (" + lost), outcome->summary);
}

BOOST_FIXTURE_TEST_CASE(a_server_that_reports_a_failure_fails_the_job_at_once_naming_why,
                        job_fixture) {
  const auto agents = running_job(1, 2);
  auto* server = find(agents, wire::role::server, 0);
  caf::anon_send(server->actor(), failed_atom::value,
                 std::string("shard 1 of this server failed: out of memory"));
  const std::string lost =
      "server 0 (node 8) was lost: it reported a failure: shard 1 of this server failed: out of "
      "memory";
  const auto outcome = scheduler->wait(5s);
  BOOST_TEST_REQUIRE(outcome.has_value());
  BOOST_TEST((outcome->end == job_end::failed));
  BOOST_TEST(contains(outcome->failure->message(), lost), outcome->failure->message());
  const auto heard = find(agents, wire::role::worker, 1)->barrier(wire::group::workers, 5s);
  BOOST_TEST_REQUIRE(!heard.has_value());
  BOOST_TEST(contains(heard.error().message(), lost), heard.error().message());
}

BOOST_FIXTURE_TEST_CASE(a_node_that_falls_silent_is_declared_lost_after_the_peer_timeout,
                        job_fixture) {
  start(1, 2);
  // The silent worker's connection stays open; only its agent stops sending, as a frozen
  // process would.
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
  BOOST_TEST((outcome->end == job_end::failed));
  BOOST_TEST((outcome->failure->code() == errc::peer_lost));
  BOOST_TEST(contains(outcome->failure->message(), lost), outcome->failure->message());
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
  const auto agents = running_job(1, 2);
  auto* server = find(agents, wire::role::server, 0);
  auto barrier = std::async(std::launch::async, [&] {
    return find(agents, wire::role::worker, 0)->barrier(wire::group::workers, 10s);
  });
  auto stop = std::async(std::launch::async, [&] { return server->wait_for_stop(10s); });
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
  BOOST_TEST((outcome->end == job_end::failed && outcome->failure->code() == errc::peer_lost));
}

BOOST_FIXTURE_TEST_CASE(sync_settings_come_from_worker_rank_0_with_a_quorum_within_the_workers,
                        job_fixture) {
  const auto agents = running_job(1, 3);
  for (auto* other : {find(agents, wire::role::server, 0), find(agents, wire::role::worker, 2)}) {
    const auto refused = other->send_sync_settings(settings_with_quorum(2), 5s);
    BOOST_TEST_REQUIRE(!refused.has_value());
    BOOST_TEST((refused.error().code() == errc::invalid_argument));
    BOOST_TEST(contains(refused.error().message(),
                        "not from " + std::string{wire::to_string(other->role())} + " " +
                            std::to_string(other->rank()) + " (node " +
                            std::to_string(other->node_id()) + ")"),
               refused.error().message());
  }
  auto* rank0 = find(agents, wire::role::worker, 0);
  const auto none = rank0->send_sync_settings(settings_with_quorum(0), 5s);
  BOOST_TEST_REQUIRE(!none.has_value());
  BOOST_TEST((none.error().code() == errc::invalid_argument));
  const auto too_many = rank0->send_sync_settings(settings_with_quorum(4), 5s);
  BOOST_TEST_REQUIRE(!too_many.has_value());
  BOOST_TEST((too_many.error().code() == errc::invalid_argument));
  BOOST_TEST(contains(too_many.error().message(), "a quorum of 4 is outside 1..3"),
             too_many.error().message());
  BOOST_TEST(rank0->send_sync_settings(settings_with_quorum(3), 5s).has_value());
  BOOST_TEST(!scheduler->outcome().has_value());
}

BOOST_FIXTURE_TEST_CASE(
    with_a_quorum_a_lost_worker_is_marked_not_alive_and_the_survivors_barrier_completes,
    job_fixture) {
  auto agents = running_job(1, 3, 2);
  std::vector<std::unique_ptr<caf::scoped_actor>> listeners;
  for (auto* subscriber : {find(agents, wire::role::server, 0), find(agents, wire::role::worker, 0),
                           find(agents, wire::role::worker, 2)}) {
    listeners.push_back(std::make_unique<caf::scoped_actor>(node_side.sys));
    subscriber->subscribe(as_listener(*listeners.back()));
  }
  // Workers 0 and 2 wait at a barrier that worker 1 never reaches.
  std::vector<std::future<status>> waiting;
  for (std::uint32_t rank : {0u, 2u})
    waiting.push_back(std::async(std::launch::async, [&, rank] {
      return find(agents, wire::role::worker, rank)->barrier(wire::group::workers, 10s);
    }));
  for (auto& barrier : waiting)
    BOOST_TEST((barrier.wait_for(300ms) == std::future_status::timeout));

  caf::anon_send_exit(find(agents, wire::role::worker, 1)->actor(), caf::exit_reason::kill);
  // Every subscriber hears of the new table, worker 1 (node 11) not alive; nobody of a failure.
  for (auto& listener : listeners)
    BOOST_TEST(next_notice(*listener, 5s) == "membership epoch 2, lost: 11");
  // The loss released the barrier it held up, and later barriers wait for the live workers only.
  for (auto& barrier : waiting) {
    BOOST_TEST_REQUIRE((barrier.wait_for(5s) == std::future_status::ready));
    BOOST_TEST(barrier.get().has_value());
  }
  pass_worker_barrier(agents, {0, 2});
  BOOST_TEST(!scheduler->outcome().has_value());

  // The live workers finish: the servers stop and the job ends with the loss in its outcome.
  const auto outcome = finish(agents, {0, 2});
  BOOST_TEST((outcome.end == job_end::finished_with_losses));
  BOOST_TEST(outcome.as_status().has_value());
  BOOST_TEST(outcome.workers_finished == 2u);
  BOOST_TEST_REQUIRE(outcome.lost_workers.size() == 1u);
  const auto& lost = outcome.lost_workers.front();
  BOOST_TEST(lost.rank == 1u);
  BOOST_TEST(lost.node_id == 11u);
  BOOST_TEST(lost.why == "its control connection closed");
  BOOST_TEST(contains(outcome.summary, "2 of 3 workers finished (rank 0, 2); 1 lost (quorum 2): "
                                       "worker 1 (node 11) "),
             outcome.summary);
  BOOST_TEST(contains(outcome.summary, "after the job started: its control connection closed"),
             outcome.summary);
}

BOOST_FIXTURE_TEST_CASE(with_a_quorum_a_silent_worker_is_dropped_and_told_so_and_the_job_goes_on,
                        job_fixture) {
  start(1, 3);
  // Worker rank 0 sends the sync settings, then falls silent (no heartbeats) with its connection
  // open, as a frozen process would. Its settings frame comes before its silence, so the quorum
  // is known before the peer timeout can pass.
  auto silent = options_for(wire::role::worker);
  silent.rank_hint = 0;
  silent.heartbeat_interval = 1h;
  silent.peer_timeout = 2h;
  std::vector<std::future<join_result>> pending;
  pending.push_back(join_async(options_for(wire::role::server)));
  pending.push_back(join_async(silent));
  for (std::int32_t rank : {1, 2}) { // every rank asked for, so none depends on arrival order
    auto speaking = options_for(wire::role::worker);
    speaking.rank_hint = rank;
    pending.push_back(join_async(speaking));
  }
  auto agents = admitted(pending);
  auto* quiet = find(agents, wire::role::worker, 0);
  std::vector<std::unique_ptr<caf::scoped_actor>> listeners;
  for (auto* subscriber : {find(agents, wire::role::server, 0), find(agents, wire::role::worker, 1),
                           find(agents, wire::role::worker, 2)}) {
    listeners.push_back(std::make_unique<caf::scoped_actor>(node_side.sys));
    subscriber->subscribe(as_listener(*listeners.back()));
  }
  BOOST_TEST_REQUIRE(quiet->send_sync_settings(settings_with_quorum(2), 5s).has_value());

  for (auto& listener : listeners)
    BOOST_TEST(next_notice(*listener, 5s) == "membership epoch 2, lost: 9");
  // The silent worker, were it to wake up, learns that it was dropped.
  const auto woken = quiet->barrier(wire::group::workers, 5s);
  BOOST_TEST_REQUIRE(!woken.has_value());
  BOOST_TEST((woken.error().code() == errc::peer_lost));
  BOOST_TEST(contains(woken.error().message(), "worker 0 (node 9) was lost: nothing heard from it"),
             woken.error().message());
  // The others go on: a barrier of the live workers, done, stop.
  pass_worker_barrier(agents, {1, 2});
  const auto outcome = finish(agents, {1, 2});
  BOOST_TEST((outcome.end == job_end::finished_with_losses));
  BOOST_TEST_REQUIRE(outcome.lost_workers.size() == 1u);
  BOOST_TEST(outcome.lost_workers.front().node_id == 9u);
  BOOST_TEST(contains(outcome.lost_workers.front().why, "nothing heard from it for"),
             outcome.lost_workers.front().why);
}

BOOST_FIXTURE_TEST_CASE(losing_more_workers_than_the_quorum_allows_fails_the_job_naming_the_node,
                        job_fixture) {
  const auto agents = running_job(1, 3, 2);
  caf::scoped_actor listener{node_side.sys};
  find(agents, wire::role::server, 0)->subscribe(as_listener(listener));

  caf::anon_send_exit(find(agents, wire::role::worker, 1)->actor(), caf::exit_reason::kill);
  BOOST_TEST(next_notice(listener, 5s) == "membership epoch 2, lost: 11");
  caf::anon_send_exit(find(agents, wire::role::worker, 2)->actor(), caf::exit_reason::kill);
  const std::string lost = "worker 2 (node 13) was lost";
  const auto notice = next_notice(listener, 5s);
  BOOST_TEST(contains(notice, "peer_lost: " + lost), notice);
  const auto call = find(agents, wire::role::worker, 0)->barrier(wire::group::workers, 5s);
  BOOST_TEST_REQUIRE(!call.has_value());
  BOOST_TEST((call.error().code() == errc::peer_lost));
  BOOST_TEST(contains(call.error().message(), lost), call.error().message());
  const auto outcome = scheduler->wait(5s);
  BOOST_TEST_REQUIRE(outcome.has_value());
  BOOST_TEST((outcome->end == job_end::failed));
  BOOST_TEST(contains(outcome->failure->message(), lost), outcome->failure->message());
  BOOST_TEST(outcome->lost_workers.size() == 2u);
}

BOOST_FIXTURE_TEST_CASE(a_lost_server_fails_the_job_whatever_the_quorum, job_fixture) {
  const auto agents = running_job(1, 2, 1);
  caf::anon_send_exit(find(agents, wire::role::server, 0)->actor(), caf::exit_reason::kill);
  const auto outcome = scheduler->wait(5s);
  BOOST_TEST_REQUIRE(outcome.has_value());
  BOOST_TEST((outcome->end == job_end::failed));
  BOOST_TEST(contains(outcome->failure->message(), "server 0 (node 8) was lost"),
             outcome->failure->message());
  const auto call = find(agents, wire::role::worker, 1)->barrier(wire::group::workers, 5s);
  BOOST_TEST_REQUIRE(!call.has_value());
  BOOST_TEST(contains(call.error().message(), "server 0 (node 8) was lost"),
             call.error().message());
}

BOOST_FIXTURE_TEST_CASE(a_lost_server_s_rank_waits_for_a_recovering_server_which_every_node_sees,
                        job_fixture) {
  server_rejoin = 10s;
  const auto agents = running_job(2, 1);
  caf::scoped_actor listener{node_side.sys};
  find(agents, wire::role::worker, 0)->subscribe(as_listener(listener));
  caf::anon_send_exit(find(agents, wire::role::server, 1)->actor(), caf::exit_reason::kill);
  BOOST_TEST(next_notice(listener, 5s) == "membership epoch 2, lost: 10");

  // Only the lost rank takes a recovering server; a server that does not say it recovers finds
  // every rank taken.
  auto other = options_for(wire::role::server, 4000);
  other.rank_hint = 0;
  other.recovering = true;
  auto refused = node_agent::join(node_side.sys, other);
  BOOST_TEST_REQUIRE(!refused.has_value());
  BOOST_TEST(contains(refused.error().message(), "server rank 0 is not waiting"),
             refused.error().message());
  auto plain = options_for(wire::role::server, 4001);
  plain.rank_hint = 1;
  BOOST_TEST(!node_agent::join(node_side.sys, plain).has_value());

  auto recovering = options_for(wire::role::server, 4002);
  recovering.rank_hint = 1;
  recovering.recovering = true;
  auto back = node_agent::join(node_side.sys, recovering);
  BOOST_TEST_REQUIRE(back.has_value(), (back ? std::string{} : back.error().to_string()));
  BOOST_TEST((*back)->rank() == 1u);
  BOOST_TEST((*back)->node_id() == 10u);
  std::optional<wire::membership> table;
  listener->receive([&](const wire::membership& t) { table = t; },
                    caf::after(std::chrono::milliseconds{5000}) >> [] {});
  BOOST_TEST_REQUIRE(table.has_value());
  BOOST_TEST(table->epoch == 3u);
  for (const auto& node : table->nodes) {
    BOOST_TEST(node.alive);
    if (node.node_id == 10u)
      BOOST_TEST(node.data_port == 4002u);
  }
  BOOST_TEST(!scheduler->outcome().has_value());
  // The job ends as usual: the worker is done, the recovered server is told to stop.
  BOOST_TEST(find(agents, wire::role::worker, 0)->notify_done(5s).has_value());
  BOOST_TEST((*back)->wait_for_stop(5s).has_value());
}

BOOST_FIXTURE_TEST_CASE(a_lost_server_that_does_not_rejoin_in_time_fails_the_job_naming_it,
                        job_fixture) {
  server_rejoin = 500ms;
  const auto agents = running_job(1, 2);
  const auto killed = std::chrono::steady_clock::now();
  caf::anon_send_exit(find(agents, wire::role::server, 0)->actor(), caf::exit_reason::kill);
  const auto outcome = scheduler->wait(5s);
  BOOST_TEST_REQUIRE(outcome.has_value());
  BOOST_TEST((std::chrono::steady_clock::now() - killed >= 500ms));
  BOOST_TEST((outcome->end == job_end::failed));
  BOOST_TEST(contains(outcome->failure->message(), "server 0 (node 8) was lost"),
             outcome->failure->message());
  BOOST_TEST(contains(outcome->failure->message(), "did not rejoin within 500ms"),
             outcome->failure->message());
  const auto call = find(agents, wire::role::worker, 1)->barrier(wire::group::workers, 5s);
  BOOST_TEST_REQUIRE(!call.has_value());
  BOOST_TEST(contains(call.error().message(), "did not rejoin"), call.error().message());
}

BOOST_AUTO_TEST_SUITE_END()
