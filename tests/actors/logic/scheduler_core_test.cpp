// The scheduler's rules (actors/logic/scheduler_core.hpp) driven directly, frame by frame, with a
// clock the test moves: no actor system, no sockets, no waiting. Each case checks the frames the
// core asks to send, to whom, and the job's end, against ps-lite's rules: ranks in arrival order
// per role, node ids 8+2r / 9+2r, the membership table once every node is in, losses within and
// beyond the quorum, a lost server's rank kept open for its recovery, drain and finalize, and
// registrations from nodes that do not belong.

#include <chrono>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/logic/node_identity.hpp"
#include "actors/logic/scheduler_core.hpp"
#include "tests/actors/logic/core_clock.hpp"
#include "tests/actors/logic/test_digests.hpp"
#include "tests/tls_certs.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using clock_type = scheduler_core::clock;
using troupe::testing::core_clock;
using troupe::testing::digest_of;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// A scheduler core and the nodes' control connections, driven by hand. Connection c's session
/// key is c's own bytes, so that a test can open what was sealed for it.
struct scheduler_driver : core_clock<scheduler_core::actions, clock_type> {
  scheduler_options options;
  std::optional<scheduler_core> core;

  scheduler_driver() {
    options.job_id = "job-a";
    options.auth_token = "token";
    options.secret = job_secret{digest_of(0xA5)};
    // Long enough that no case's clock makes a node silent unless it means to.
    options.peer_timeout = 30s;
    options.startup_timeout = 10s;
    options.drain_timeout = 5s;
  }

  static session_key session_of(std::uint64_t connection) {
    return session_key{digest_of(connection)};
  }

  void start(std::uint32_t servers, std::uint32_t workers) {
    options.num_servers = servers;
    options.num_workers = workers;
    core.emplace(options, now);
  }

  /// A frame from `connection`, `after` the last call.
  const scheduler_core::actions& frame(std::uint64_t connection, wire::message msg,
                                       std::chrono::milliseconds elapsed = 0ms) {
    return after(elapsed, [&](auto at) { return core->on_frame(connection, msg, at); });
  }
  const scheduler_core::actions& close(std::uint64_t connection) {
    last = core->on_closed(connection, now);
    return last;
  }
  const scheduler_core::actions& tick(std::chrono::milliseconds elapsed) {
    return after(elapsed, [&](auto at) { return core->on_tick(at); });
  }

  static wire::registration registration(wire::role role, std::uint16_t port,
                                         std::int32_t rank_hint = -1) {
    wire::registration reg;
    reg.request_id = 1;
    reg.node_role = role;
    reg.job_id = "job-a";
    reg.host = "127.0.0.1";
    reg.port = port;
    reg.rank_hint = rank_hint;
    return reg;
  }

  /// Opens `connection` (its handshake's key exchange) and registers a node of `role` on it whose
  /// data port is 1000 + connection: the core's answer to it.
  wire::admission join(std::uint64_t connection, wire::role role, std::int32_t rank_hint = -1) {
    core->on_authenticated(connection, session_of(connection));
    frame(connection, registration(role, static_cast<std::uint16_t>(1000 + connection), rank_hint));
    return admission_to(connection);
  }

  /// Joins `servers` servers on connections 1.. and `workers` workers after them; each must be
  /// admitted. The job runs.
  void run_job(std::uint32_t servers, std::uint32_t workers) {
    start(servers, workers);
    for (std::uint32_t i = 0; i < servers + workers; ++i) {
      const auto got = join(i + 1, i < servers ? wire::role::server : wire::role::worker);
      BOOST_TEST_REQUIRE(std::holds_alternative<wire::admitted>(got.outcome));
    }
    BOOST_TEST_REQUIRE((core->phase() == scheduler_phase::running));
  }

  /// The frames of the last call to `connection`, in order.
  std::vector<wire::message> frames_to(std::uint64_t connection) const {
    std::vector<wire::message> frames;
    for (const auto& action : last)
      if (const auto* out = std::get_if<scheduler_core::control_frame>(&action);
          out && out->connection == connection)
        frames.push_back(out->msg);
    return frames;
  }

  /// The last call's only frame of kind T to `connection`.
  template <class T>
  T only_to(std::uint64_t connection) const {
    std::optional<T> found;
    for (const auto& msg : frames_to(connection))
      if (const auto* typed = std::get_if<T>(&msg)) {
        BOOST_TEST_REQUIRE(!found.has_value(), "two " << wire::kind_name(msg) << " frames");
        found = *typed;
      }
    BOOST_TEST_REQUIRE(found.has_value(), "no such frame to connection " << connection);
    return *found;
  }

  wire::admission admission_to(std::uint64_t connection) const {
    return only_to<wire::admission>(connection);
  }

  /// How many of the last call's frames are of kind T.
  template <class T>
  std::size_t count() const {
    std::size_t n = 0;
    for (const auto& action : last)
      if (const auto* out = std::get_if<scheduler_core::control_frame>(&action))
        n += std::holds_alternative<T>(out->msg) ? 1 : 0;
    return n;
  }

  /// The job's end, which must be the last call's last action.
  job_outcome ended() const {
    BOOST_TEST_REQUIRE(!last.empty());
    const auto* end = std::get_if<scheduler_core::job_ended>(&last.back());
    BOOST_TEST_REQUIRE(end != nullptr, "the last action is not the job's end");
    BOOST_TEST(core->ended());
    return end->outcome;
  }
};

wire::rejected expect_rejected(const wire::admission& admission, wire::reject_reason reason) {
  const auto* rejected = std::get_if<wire::rejected>(&admission.outcome);
  BOOST_TEST_REQUIRE(rejected != nullptr, "admitted instead of rejected");
  BOOST_TEST((rejected->reason == reason), rejected->detail);
  return *rejected;
}

wire::admitted expect_admitted(const wire::admission& admission) {
  const auto* admitted = std::get_if<wire::admitted>(&admission.outcome);
  if (admitted == nullptr)
    BOOST_FAIL("rejected: " << std::get<wire::rejected>(admission.outcome).detail);
  return *admitted;
}

const wire::node_info& row(const wire::membership& table, std::uint32_t node_id) {
  for (const auto& node : table.nodes)
    if (node.node_id == node_id)
      return node;
  BOOST_FAIL("no node " << node_id << " in the table");
  return table.nodes.front();
}

wire::sync_settings quorum_of(std::uint32_t quorum, std::uint64_t request_id = 7) {
  wire::sync_settings settings;
  settings.request_id = request_id;
  settings.quorum = quorum;
  return settings;
}

wire::command done(std::uint64_t request_id = 9, std::uint64_t rounds = 0) {
  return wire::command{request_id, wire::command_kind::stop, {}, false, rounds};
}

} // namespace

BOOST_FIXTURE_TEST_SUITE(scheduler_logic, scheduler_driver)

BOOST_AUTO_TEST_CASE(ranks_follow_arrival_order_per_role_and_a_free_rank_hint_is_honoured) {
  start(2, 3);
  // Arrival order: worker (asks for 2), server, worker, server, worker.
  BOOST_TEST(expect_admitted(join(1, wire::role::worker, 2)).rank == 2u);
  BOOST_TEST(expect_admitted(join(2, wire::role::server)).rank == 0u);
  const auto worker_0 = expect_admitted(join(3, wire::role::worker));
  BOOST_TEST(worker_0.rank == 0u);
  BOOST_TEST(worker_0.node_id == worker_node_id(0));
  BOOST_TEST(worker_0.node_id == 9u);
  // Rank 1 is free: asking for it (or nothing) gets it; the table is not out before the last.
  const auto server_1 = expect_admitted(join(4, wire::role::server, 1));
  BOOST_TEST(server_1.rank == 1u);
  BOOST_TEST(server_1.node_id == 10u);
  BOOST_TEST(count<wire::membership>() == 0u);
  BOOST_TEST((core->phase() == scheduler_phase::registering));
  // The last worker asks for rank 0, which is taken: it gets the lowest free one.
  const auto worker_1 = expect_admitted(join(5, wire::role::worker, 0));
  BOOST_TEST(worker_1.rank == 1u);
  BOOST_TEST(worker_1.node_id == 11u);

  // Every node now has the same table, epoch 1: the scheduler and five nodes, alive, by node id,
  // one key range per server.
  BOOST_TEST((core->phase() == scheduler_phase::running));
  BOOST_TEST(count<wire::membership>() == 5u);
  const auto table = only_to<wire::membership>(5);
  for (std::uint64_t c = 1; c <= 5; ++c)
    BOOST_TEST((only_to<wire::membership>(c) == table));
  BOOST_TEST(table.epoch == 1u);
  BOOST_TEST(table.num_servers == 2u);
  BOOST_TEST(table.num_workers == 3u);
  std::vector<std::uint32_t> ids;
  for (const auto& node : table.nodes) {
    ids.push_back(node.node_id);
    BOOST_TEST(node.alive);
  }
  BOOST_TEST(ids == (std::vector<std::uint32_t>{1, 8, 9, 10, 11, 13}));
  BOOST_TEST(row(table, 13).data_port == 1001u); // worker 2 came first, on connection 1
  BOOST_TEST((table.key_ranges == membership_key_ranges(2)));
}

BOOST_AUTO_TEST_CASE(an_admission_seals_each_node_its_own_secret_under_its_connection_s_key) {
  start(1, 1);
  const auto server = expect_admitted(join(1, wire::role::server));
  const auto worker = expect_admitted(join(2, wire::role::worker));
  const wire::node_identity server_id{wire::role::server, 0}, worker_id{wire::role::worker, 0};
  BOOST_TEST_REQUIRE(server.secret.has_value());
  BOOST_TEST_REQUIRE(worker.secret.has_value());
  // The server gets the job secret, the worker its node key, each only under its own session.
  const auto job = unseal_secret(session_of(1), *server.secret, server_id, server.node_id);
  BOOST_TEST_REQUIRE(job.has_value());
  BOOST_TEST((*job == options.secret.reveal()));
  const auto key = unseal_secret(session_of(2), *worker.secret, worker_id, worker.node_id);
  BOOST_TEST_REQUIRE(key.has_value());
  BOOST_TEST(
      (*key ==
       derive_node_key(link_secret(options.auth_token), options.secret, worker_id).reveal()));
  BOOST_TEST(!unseal_secret(session_of(1), *worker.secret, worker_id, worker.node_id));
  BOOST_TEST((*key != *job));
}

BOOST_AUTO_TEST_CASE(registrations_that_do_not_belong_are_rejected_naming_why_and_take_no_rank) {
  start(1, 2);
  auto reg = registration(wire::role::worker, 2000);
  core->on_authenticated(10, session_of(10));

  reg.job_id = "job-b";
  frame(10, reg);
  BOOST_TEST(
      contains(expect_rejected(admission_to(10), wire::reject_reason::wrong_job).detail, "job-b"));
  reg.job_id = "job-a";
  reg.protocol_version = wire::protocol_version + 1;
  frame(10, reg);
  expect_rejected(admission_to(10), wire::reject_reason::protocol_version);
  reg.protocol_version = wire::protocol_version;
  reg.node_role = wire::role::scheduler;
  frame(10, reg);
  BOOST_TEST(contains(expect_rejected(admission_to(10), wire::reject_reason::role_full).detail,
                      "exactly one scheduler"));
  reg.node_role = wire::role::worker;
  reg.host = std::string(max_host_bytes + 1, 'h');
  frame(10, reg);
  const auto too_long = only_to<wire::error_reply>(10);
  BOOST_TEST((too_long.code == wire::error_code::invalid_argument));
  BOOST_TEST(contains(too_long.message, std::to_string(max_host_bytes + 1) + " bytes"));
  // A connection whose handshake made no key exchange cannot be sealed a secret.
  reg.host = "127.0.0.1";
  frame(11, reg);
  BOOST_TEST(
      contains(expect_rejected(admission_to(11), wire::reject_reason::protocol_version).detail,
               "no key exchange"));
  // Anything but a registration before one.
  frame(12, wire::barrier{5, 1, wire::group::workers, 9, {}});
  const auto unregistered = only_to<wire::error_reply>(12);
  BOOST_TEST((unregistered.code == wire::error_code::not_admitted));
  BOOST_TEST(unregistered.request_id == 5u);

  // None of that took a rank; connection 10 is now admitted as worker 0 and cannot register
  // again, nor can another node claim its data port.
  BOOST_TEST(expect_admitted(join(10, wire::role::worker)).rank == 0u);
  frame(10, registration(wire::role::worker, 3000));
  BOOST_TEST(contains(expect_rejected(admission_to(10), wire::reject_reason::duplicate).detail,
                      "already registered as worker 0 (node 9)"));
  core->on_authenticated(13, session_of(13));
  frame(13, registration(wire::role::server, 1010));
  BOOST_TEST(contains(expect_rejected(admission_to(13), wire::reject_reason::duplicate).detail,
                      "127.0.0.1:1010 is already registered by worker 0"));
  BOOST_TEST(expect_admitted(join(14, wire::role::worker, 7)).rank == 1u); // hint out of range
  BOOST_TEST(expect_admitted(join(15, wire::role::server)).rank == 0u);
  BOOST_TEST((core->phase() == scheduler_phase::running));

  // More nodes than the job has.
  BOOST_TEST(
      contains(expect_rejected(join(16, wire::role::worker), wire::reject_reason::role_full).detail,
               "all 2 worker ranks are taken"));
  BOOST_TEST(
      contains(expect_rejected(join(17, wire::role::server), wire::reject_reason::role_full).detail,
               "all 1 server rank is taken"));
  // A node of the job that misbehaves: a barrier of a group it is not in, or sent in another
  // node's name, and a frame the scheduler does not take.
  frame(14, wire::barrier{21, 1, wire::group::servers, 11, {}});
  BOOST_TEST(contains(only_to<wire::error_reply>(14).message,
                      "worker 1 (node 11) is not a member of barrier group 2"));
  frame(14, wire::barrier{22, 1, wire::group::workers, 9, {}});
  BOOST_TEST(contains(only_to<wire::error_reply>(14).message, "barrier sent as node 9"));
  frame(14, wire::barrier{23, 1, 0x10, 11, {}});
  BOOST_TEST(contains(only_to<wire::error_reply>(14).message, "not a union of"));
  frame(14, wire::membership{});
  BOOST_TEST((only_to<wire::error_reply>(14).code == wire::error_code::unsupported));
  // A server's done asks to leave (elastic servers): the job's only server may not.
  frame(15, done(25));
  BOOST_TEST(contains(only_to<wire::error_reply>(15).message,
                      "cannot leave: no other server would hold its key ranges"));
  BOOST_TEST(actions_of<scheduler_core::barrier_entry>().empty());
  // The job runs on: a worker barrier is handed to the job barriers.
  frame(14, wire::barrier{26, 1, wire::group::workers, 11, {0.5}});
  const auto entries = actions_of<scheduler_core::barrier_entry>();
  BOOST_TEST_REQUIRE(entries.size() == 1u);
  BOOST_TEST(entries[0].member_rank == 1u);
  BOOST_TEST(entries[0].request_id == 26u);
  BOOST_TEST(entries[0].connection == 14u);
  BOOST_TEST(entries[0].values == std::vector<double>{0.5});
  BOOST_TEST(!core->ended());
}

BOOST_AUTO_TEST_CASE(under_tls_a_node_registers_only_in_the_role_its_certificate_names) {
  const auto& certs = testing::job_certs();
  auto loaded = tls_credentials::load(certs.ca(), certs.cert("scheduler"), certs.key("scheduler"),
                                      node_role::scheduler);
  BOOST_TEST_REQUIRE(loaded.has_value());
  options.tls = *loaded;
  start(1, 1);
  BOOST_TEST(
      contains(expect_rejected(join(1, wire::role::worker), wire::reject_reason::wrong_role).detail,
               "no TLS certificate"));
  core->on_certified(2, wire::role::server);
  BOOST_TEST(
      contains(expect_rejected(join(2, wire::role::worker), wire::reject_reason::wrong_role).detail,
               "its TLS certificate is for a server"));
  // The control case: the role it is certified for.
  BOOST_TEST(expect_admitted(join(2, wire::role::server)).rank == 0u);
}

BOOST_AUTO_TEST_CASE(a_worker_lost_within_the_quorum_is_dropped_and_the_job_goes_on_without_it) {
  run_job(1, 3);
  frame(2, quorum_of(2));
  BOOST_TEST(only_to<wire::ack>(2).request_id == 7u);
  BOOST_TEST(core->quorum() == 2u);

  close(4); // worker 2
  BOOST_TEST(!core->ended());
  BOOST_TEST((core->phase() == scheduler_phase::running));
  // The barriers stop waiting for it; every other node gets epoch 2 listing it not alive.
  const auto gone = actions_of<scheduler_core::barrier_member_gone>();
  BOOST_TEST_REQUIRE(gone.size() == 1u);
  BOOST_TEST((gone[0].member_role == wire::role::worker));
  BOOST_TEST(gone[0].member == 3u); // its index: the fourth node admitted
  BOOST_TEST(frames_to(4).empty());
  for (std::uint64_t c = 1; c <= 3; ++c) {
    const auto table = only_to<wire::membership>(c);
    BOOST_TEST(table.epoch == 2u);
    BOOST_TEST(!row(table, worker_node_id(2)).alive);
    BOOST_TEST(row(table, worker_node_id(1)).alive);
  }

  // The survivors finish: the servers are stopped, and the job ends with the loss named.
  frame(2, done(31));
  BOOST_TEST(only_to<wire::ack>(2).request_id == 31u);
  BOOST_TEST(count<wire::command>() == 0u);
  frame(3, done(32));
  BOOST_TEST((core->phase() == scheduler_phase::draining));
  BOOST_TEST((only_to<wire::command>(1).kind == wire::command_kind::stop));
  close(2);
  close(3);
  BOOST_TEST(last.empty()); // workers that said done leave as expected
  close(1);
  const auto outcome = ended();
  BOOST_TEST((outcome.end == job_end::finished_with_losses));
  BOOST_TEST(outcome.workers_finished == 2u);
  BOOST_TEST_REQUIRE(outcome.lost_workers.size() == 1u);
  BOOST_TEST(outcome.lost_workers[0].rank == 2u);
  BOOST_TEST(outcome.lost_workers[0].why == "its control connection closed");
  // Rank 0 said done before rank 1, after as many rounds: the summary does not call it early.
  BOOST_TEST(contains(outcome.summary, "2 of 3 workers finished (rank 0, 1); 1 lost (quorum 2)"));
  BOOST_TEST(contains(outcome.summary, "worker 2 (node 13)"));
}

BOOST_AUTO_TEST_CASE(a_worker_lost_beyond_the_quorum_fails_the_job_telling_every_node_who) {
  run_job(1, 3);
  frame(2, quorum_of(2));
  close(3); // worker 1: within the quorum
  BOOST_TEST(!core->ended());
  // A quorum that the losses already break is refused.
  frame(2, quorum_of(3, 8));
  BOOST_TEST(contains(only_to<wire::error_reply>(2).message, "1 workers already lost"));
  BOOST_TEST(core->quorum() == 2u);

  close(4); // worker 2: one too many
  const auto outcome = ended();
  BOOST_TEST((outcome.end == job_end::failed));
  BOOST_TEST_REQUIRE(outcome.failure.has_value());
  BOOST_TEST((outcome.failure->code() == errc::peer_lost));
  BOOST_TEST(contains(outcome.failure->message(), "worker 2 (node 13) was lost"));
  BOOST_TEST(outcome.lost_workers.size() == 2u);
  // The survivors hear why, unasked; the nodes already gone do not.
  for (std::uint64_t c : {1u, 2u}) {
    const auto notice = only_to<wire::error_reply>(c);
    BOOST_TEST(notice.request_id == 0u);
    BOOST_TEST((notice.code == wire::error_code::lost_peer));
    BOOST_TEST(contains(notice.message, "worker 2 (node 13) was lost"));
  }
  BOOST_TEST(frames_to(3).empty());
  BOOST_TEST(frames_to(4).empty());
  // Nothing happens after the end.
  BOOST_TEST(tick(10s).empty());
  BOOST_TEST(close(1).empty());
}

BOOST_AUTO_TEST_CASE(with_the_default_quorum_any_lost_worker_fails_the_job) {
  run_job(1, 2);
  close(3);
  const auto outcome = ended();
  BOOST_TEST((outcome.end == job_end::failed));
  BOOST_TEST(contains(outcome.failure->message(), "worker 1 (node 11) was lost"));
}

BOOST_AUTO_TEST_CASE(a_node_is_lost_after_the_peer_timeout_of_silence_and_any_frame_keeps_it) {
  options.peer_timeout = 1s;
  run_job(1, 2);
  frame(2, quorum_of(1));
  // Heartbeats go to every node; silence up to the peer timeout is no loss.
  tick(600ms);
  BOOST_TEST(count<wire::heartbeat>() == 3u);
  frame(2, wire::heartbeat{9, 1, 0}, 300ms);
  frame(1, wire::heartbeat{8, 1, 0});
  BOOST_TEST(last.empty());
  tick(400ms); // worker 1 silent for 1.3 s: lost within the quorum
  BOOST_TEST(!core->ended());
  BOOST_TEST(only_to<wire::error_reply>(3).message ==
             "worker 1 (node 11) was lost: nothing heard from it for 1300ms (peer timeout "
             "1s); the job goes on without it");
  BOOST_TEST(only_to<wire::membership>(2).epoch == 2u);
  BOOST_TEST(count<wire::heartbeat>() == 2u); // not to the lost one
  // A frozen worker that wakes up is told it was dropped; its heartbeats get nothing.
  frame(3, wire::barrier{40, 1, wire::group::workers, 11, {}});
  const auto dropped = only_to<wire::error_reply>(3);
  BOOST_TEST((dropped.code == wire::error_code::lost_peer));
  BOOST_TEST(dropped.request_id == 40u);
  BOOST_TEST(frame(3, wire::heartbeat{11, 2, 0}).empty());
  BOOST_TEST(actions_of<scheduler_core::barrier_entry>().empty());

  // The server falls silent too: that fails the job.
  tick(900ms);
  const auto outcome = ended();
  BOOST_TEST(contains(outcome.failure->message(), "server 0 (node 8) was lost: nothing heard"));
}

BOOST_AUTO_TEST_CASE(a_lost_server_fails_the_job_whatever_the_quorum_without_server_rejoin) {
  run_job(2, 2);
  frame(3, quorum_of(1));
  close(2);
  const auto outcome = ended();
  BOOST_TEST((outcome.end == job_end::failed));
  BOOST_TEST(contains(outcome.failure->message(), "server 1 (node 10) was lost"));
  BOOST_TEST(outcome.lost_workers.empty());
  BOOST_TEST((only_to<wire::error_reply>(4).code == wire::error_code::lost_peer));
}

BOOST_AUTO_TEST_CASE(a_server_that_reports_a_failure_fails_the_job_naming_why) {
  run_job(1, 1);
  frame(1, wire::error_reply{0, std::nullopt, wire::error_code::internal, "shard 3 died"});
  const auto outcome = ended();
  BOOST_TEST(contains(outcome.failure->message(),
                      "server 0 (node 8) was lost: it reported a failure: shard 3 died"));
  // A worker's unasked error is only logged.
  run_job(1, 1);
  frame(2, wire::error_reply{0, std::nullopt, wire::error_code::internal, "oops"});
  BOOST_TEST(last.empty());
  BOOST_TEST(!core->ended());
}

BOOST_AUTO_TEST_CASE(with_server_rejoin_a_lost_server_s_rank_waits_for_a_recovering_server) {
  options.server_rejoin = 3s;
  run_job(2, 2);
  close(1); // server 0
  BOOST_TEST(!core->ended());
  BOOST_TEST(actions_of<scheduler_core::barrier_member_gone>().empty()); // barriers wait for it
  for (std::uint64_t c = 2; c <= 4; ++c) {
    const auto table = only_to<wire::membership>(c);
    BOOST_TEST(table.epoch == 2u);
    BOOST_TEST(!row(table, server_node_id(0)).alive);
  }

  // Only a server, for the rank that waits, may take it.
  core->on_authenticated(20, session_of(20));
  auto recovering = registration(wire::role::worker, 4000, 0);
  recovering.recovering = true;
  frame(20, recovering);
  BOOST_TEST(contains(expect_rejected(admission_to(20), wire::reject_reason::role_full).detail,
                      "only a server recovers"));
  recovering.node_role = wire::role::server;
  recovering.rank_hint = 1;
  frame(20, recovering);
  BOOST_TEST(contains(expect_rejected(admission_to(20), wire::reject_reason::role_full).detail,
                      "server rank 1 is not waiting"));
  recovering.rank_hint = 0;
  recovering.port = 1002; // server 1's address
  frame(20, recovering);
  expect_rejected(admission_to(20), wire::reject_reason::duplicate);

  // The control case: server 0 back at a new address, 2 s later, keeps its rank and node id.
  recovering.port = 4000;
  frame(20, recovering, 2s);
  const auto back = expect_admitted(admission_to(20));
  BOOST_TEST(back.rank == 0u);
  BOOST_TEST(back.node_id == server_node_id(0));
  for (std::uint64_t c : {20u, 2u, 3u, 4u}) {
    const auto table = only_to<wire::membership>(c);
    BOOST_TEST(table.epoch == 3u);
    BOOST_TEST(row(table, server_node_id(0)).alive);
    BOOST_TEST(row(table, server_node_id(0)).data_port == 4000u);
  }
  // Its rank no longer waits: the deadline passes without consequence, and the job finishes.
  tick(2s);
  BOOST_TEST(!core->ended());
  frame(3, done());
  frame(4, done());
  BOOST_TEST((only_to<wire::command>(20).kind == wire::command_kind::stop));
  BOOST_TEST(frames_to(1).empty());
  close(2);
  close(20);
  BOOST_TEST((ended().end == job_end::finished));
}

BOOST_AUTO_TEST_CASE(a_lost_server_that_does_not_rejoin_in_time_fails_the_job_naming_it) {
  options.server_rejoin = 3s;
  run_job(1, 1);
  close(1);
  tick(2900ms);
  BOOST_TEST(!core->ended());
  BOOST_TEST(count<wire::heartbeat>() == 1u);
  tick(100ms);
  const auto outcome = ended();
  BOOST_TEST(contains(outcome.failure->message(),
                      "server 0 (node 8) was lost: its control connection closed; it did not "
                      "rejoin within 3s (timeouts.server_rejoin)"));
  BOOST_TEST(contains(only_to<wire::error_reply>(2).message, "did not rejoin"));
}

BOOST_AUTO_TEST_CASE(a_server_lost_before_the_job_runs_fails_it_even_with_server_rejoin) {
  options.server_rejoin = 3s;
  start(1, 1);
  expect_admitted(join(1, wire::role::server));
  close(1);
  BOOST_TEST(contains(ended().failure->message(), "server 0 (node 8) was lost"));
}

BOOST_AUTO_TEST_CASE(once_every_worker_is_done_the_servers_are_stopped_and_their_leaving_ends_it) {
  run_job(2, 2);
  frame(3, done(50, 5));
  // Worker 0 leaves while worker 1 goes on: the others get a table that marks it left, and the
  // barriers stop waiting for it.
  BOOST_TEST(only_to<wire::ack>(3).request_id == 50u);
  BOOST_TEST(frames_to(3).size() == 1u);
  for (std::uint64_t other : {1, 2, 4}) {
    const auto table = only_to<wire::membership>(other);
    BOOST_TEST(table.epoch == 2u);
    for (const auto& node : table.nodes)
      BOOST_TEST(node.left == (node.node_id == 9), "node " << node.node_id);
  }
  std::size_t gone = 0;
  for (const auto& action : last)
    if (const auto* member = std::get_if<scheduler_core::barrier_member_gone>(&action))
      gone += member->member_role == wire::role::worker ? 1 : 0;
  BOOST_TEST(gone == 1u);
  frame(3, done(51)); // repeated: the same ack, nothing else
  BOOST_TEST(only_to<wire::ack>(3).request_id == 51u);
  BOOST_TEST(last.size() == 1u);
  BOOST_TEST(count<wire::command>() == 0u);
  // A barrier of the workers is the remaining worker's alone: it goes to the job barriers.
  frame(4, wire::barrier{52, 1, wire::group::workers, 11, {}});
  BOOST_TEST(frames_to(4).empty());
  BOOST_TEST(last.size() == 1u);
  BOOST_TEST(std::holds_alternative<scheduler_core::barrier_entry>(last.front()));

  frame(4, done(53, 8));
  BOOST_TEST((core->phase() == scheduler_phase::draining));
  const auto stop_0 = only_to<wire::command>(1), stop_1 = only_to<wire::command>(2);
  BOOST_TEST((stop_0.kind == wire::command_kind::stop));
  BOOST_TEST(stop_0.request_id != stop_1.request_id);
  // A node that comes now is turned away.
  core->on_authenticated(30, session_of(30));
  frame(30, registration(wire::role::worker, 5000));
  expect_rejected(admission_to(30), wire::reject_reason::shutting_down);

  close(3);
  close(1);
  BOOST_TEST(last.empty());
  close(2);
  const auto outcome = ended();
  BOOST_TEST((outcome.end == job_end::finished));
  BOOST_TEST(outcome.workers_finished == 2u);
  BOOST_TEST(!outcome.failure.has_value());
  BOOST_TEST(outcome.as_status().has_value());
  BOOST_TEST(outcome.left_workers.size() == 1u);
  BOOST_TEST(outcome.summary == "summary: the job finished; 2 of 2 workers finished (rank 0, 1); "
                                "left early: worker 0 (node 9) after 5 of 8 rounds, 0.0 s after "
                                "the job started; 0 lost");
}

BOOST_AUTO_TEST_CASE(workers_done_before_the_last_registration_drain_as_soon_as_the_job_starts) {
  start(1, 2);
  expect_admitted(join(1, wire::role::worker));
  frame(1, done());
  expect_admitted(join(2, wire::role::worker));
  frame(2, done());
  BOOST_TEST((core->phase() == scheduler_phase::registering));
  expect_admitted(join(3, wire::role::server));
  BOOST_TEST((core->phase() == scheduler_phase::draining));
  BOOST_TEST(only_to<wire::membership>(3).epoch == 1u);
  BOOST_TEST((only_to<wire::command>(3).kind == wire::command_kind::stop));
}

BOOST_AUTO_TEST_CASE(a_worker_done_before_the_job_starts_is_listed_left_in_the_first_table) {
  start(1, 2);
  expect_admitted(join(1, wire::role::worker));
  frame(1, done());
  expect_admitted(join(2, wire::role::worker));
  expect_admitted(join(3, wire::role::server));
  BOOST_TEST((core->phase() == scheduler_phase::running));
  BOOST_TEST(frames_to(1).empty()); // it is leaving: no table
  for (std::uint64_t other : {2, 3}) {
    const auto table = only_to<wire::membership>(other);
    BOOST_TEST(table.epoch == 1u);
    for (const auto& node : table.nodes)
      BOOST_TEST(node.left == (node.node_id == worker_node_id(0)), "node " << node.node_id);
  }
}

BOOST_AUTO_TEST_CASE(a_worker_joins_a_running_job_with_room_and_the_servers_hear_of_it_first) {
  options.max_workers = 3;
  run_job(2, 2); // servers on connections 1 and 2, workers 0 and 1 on 3 and 4
  frame(3, wire::barrier{5, 1, wire::group::workers, worker_node_id(0), {}});
  frame(3, wire::barrier{6, 2, wire::group::workers, worker_node_id(0), {}});
  // A third worker registers while the job runs: a fresh rank, its barriers after those reached.
  const auto granted = expect_admitted(join(5, wire::role::worker));
  BOOST_TEST(granted.rank == 2u);
  BOOST_TEST(granted.joined);
  BOOST_TEST_REQUIRE(granted.first_barrier.size() == 8u);
  BOOST_TEST(granted.first_barrier[wire::group::workers] == 3u);
  BOOST_TEST(granted.first_barrier[wire::group::all] == 1u);
  bool barriers_told = false;
  for (const auto& action : last)
    if (const auto* joined = std::get_if<scheduler_core::barrier_member_joined>(&action))
      barriers_told = joined->first_barrier == granted.first_barrier;
  BOOST_TEST(barriers_told);
  // The table that lists it goes to the servers only, asking for their acks.
  const auto table = only_to<wire::membership>(1);
  BOOST_TEST(table.request_id != 0u);
  BOOST_TEST(table.num_workers == 3u);
  BOOST_TEST(row(table, worker_node_id(2)).alive);
  BOOST_TEST(only_to<wire::membership>(2).request_id == table.request_id);
  BOOST_TEST(count<wire::membership>() == 2u);
  // Once both servers have acked it (a stale ack counts for nothing), every worker gets it.
  frame(1, wire::ack{table.request_id});
  frame(1, wire::ack{table.request_id + 100});
  BOOST_TEST(count<wire::membership>() == 0u);
  frame(2, wire::ack{table.request_id});
  for (std::uint64_t worker : {3, 4, 5}) {
    const auto told = only_to<wire::membership>(worker);
    BOOST_TEST(told.epoch == table.epoch);
    BOOST_TEST(told.num_workers == 3u);
  }
  // The job has no rank left to give.
  const auto full = expect_rejected(join(6, wire::role::worker), wire::reject_reason::role_full);
  BOOST_TEST(contains(full.detail, "job.max_workers 3"), full.detail);
  // A table with nobody new goes to everyone at once: worker 0 leaves (it still counts in
  // num_workers, which only joins change).
  frame(3, done(9, 4));
  BOOST_TEST(only_to<wire::membership>(4).num_workers == 3u);
  BOOST_TEST(only_to<wire::membership>(1).request_id == 0u);
  frame(4, done(9, 4));
  frame(5, done(9, 2));
  close(1);
  close(2);
  const auto outcome = ended();
  BOOST_TEST(outcome.workers_finished == 3u);
  BOOST_TEST_REQUIRE(outcome.joined_workers.size() == 1u);
  BOOST_TEST(outcome.joined_workers[0].rank == 2u);
  BOOST_TEST(contains(outcome.summary, "3 of 3 workers finished"), outcome.summary);
  BOOST_TEST(contains(outcome.summary, "joined: worker 2 (node 13)"), outcome.summary);
}

BOOST_AUTO_TEST_CASE(a_server_joins_then_one_leaves_and_the_key_ranges_follow_them) {
  // job.max_servers 3 with 2 servers: ranges 0 and 2 on server 0, range 1 on server 1.
  options.max_servers = 3;
  run_job(2, 1); // servers on connections 1 and 2, worker 0 on 3
  BOOST_TEST((core->range_owners() == std::vector<std::uint32_t>{0, 1, 0}));
  // A third server joins: a fresh rank; the table lists it (no range yet), and as few ranges
  // move as give each server its share of 3 over 3: range 2 from server 0 to it.
  const auto granted = expect_admitted(join(4, wire::role::server));
  BOOST_TEST(granted.rank == 2u);
  BOOST_TEST(only_to<wire::membership>(3).num_servers == 3u);
  const auto order = only_to<wire::hand_over>(1);
  BOOST_TEST((order.ranges == std::vector<std::uint32_t>{2}));
  BOOST_TEST(order.to_server == 2u);
  BOOST_TEST(frames_to(2).size() == 1u, "server 1 gives nothing");
  // Only server 0's ack counts; then every node gets the table naming range 2's new server.
  frame(2, wire::ack{order.request_id});
  BOOST_TEST(count<wire::membership>() == 0u);
  frame(1, wire::ack{order.request_id});
  const auto moved = only_to<wire::membership>(3);
  BOOST_TEST(moved.key_ranges[2].server_rank == 2u);
  BOOST_TEST((core->range_owners() == std::vector<std::uint32_t>{0, 1, 2}));
  // A fourth has no rank to take.
  const auto full = expect_rejected(join(5, wire::role::server), wire::reject_reason::role_full);
  BOOST_TEST(contains(full.detail, "job.max_servers 3"), full.detail);
  // Server 1 asks to leave: acked, and its range goes to the first server below its share.
  frame(2, done(31));
  BOOST_TEST(only_to<wire::ack>(2).request_id == 31u);
  const auto away = only_to<wire::hand_over>(2);
  BOOST_TEST((away.ranges == std::vector<std::uint32_t>{1}));
  BOOST_TEST(away.to_server == 0u);
  BOOST_TEST(count<wire::hand_over>() == 1u);
  BOOST_TEST(count<wire::command>() == 0u, "it stops only once it holds nothing");
  frame(2, wire::ack{away.request_id});
  // It holds nothing now: told to stop, listed left in the table naming the new owners.
  BOOST_TEST((only_to<wire::command>(2).kind == wire::command_kind::stop));
  const auto after = only_to<wire::membership>(3);
  BOOST_TEST(row(after, server_node_id(1)).left);
  BOOST_TEST((core->range_owners() == std::vector<std::uint32_t>{0, 0, 2}));
  // Its going is expected; the last of the others may not leave.
  close(2);
  BOOST_TEST(!core->ended());
  frame(4, done(32));
  frame(1, done(33));
  BOOST_TEST(contains(only_to<wire::error_reply>(1).message, "no other server"),
             only_to<wire::error_reply>(1).message);
  // The summary names the join and the leave with the tables that listed them.
  frame(3, done(34));
  close(1);
  close(4);
  const auto outcome = ended();
  BOOST_TEST_REQUIRE(outcome.server_changes.size() == 2u);
  BOOST_TEST(outcome.server_changes[0].joined);
  BOOST_TEST(outcome.server_changes[0].rank == 2u);
  BOOST_TEST(!outcome.server_changes[1].joined);
  BOOST_TEST(outcome.server_changes[1].rank == 1u);
  BOOST_TEST(outcome.server_changes[1].epoch == after.epoch);
  BOOST_TEST(contains(outcome.summary, "servers: server 2 (node 12) joined"), outcome.summary);
  BOOST_TEST(contains(outcome.summary, "server 1 (node 10) left"), outcome.summary);
}

BOOST_AUTO_TEST_CASE(a_refused_hand_over_fails_the_job_naming_both_servers) {
  options.max_servers = 2;
  run_job(1, 1);
  expect_admitted(join(3, wire::role::server));
  const auto order = only_to<wire::hand_over>(1);
  frame(1, wire::error_reply{order.request_id, std::nullopt, wire::error_code::invalid_argument,
                             "the link to it failed"});
  const auto outcome = ended();
  BOOST_TEST_REQUIRE(outcome.failure.has_value());
  BOOST_TEST(contains(outcome.failure->message(),
                      "server 0 (node 8) could not hand key ranges over to server 1: the link to "
                      "it failed"),
             outcome.failure->message());
}

BOOST_AUTO_TEST_CASE(a_worker_that_joins_at_a_barrier_is_listed_only_once_a_barrier_takes_it_in) {
  options.max_workers = 3;
  run_job(2, 2); // servers on connections 1 and 2, workers 0 and 1 on 3 and 4
  core->on_authenticated(5, session_of(5));
  auto reg = registration(wire::role::worker, 1005);
  reg.join_at_barrier = true;
  frame(5, reg);
  const auto granted = expect_admitted(admission_to(5));
  BOOST_TEST(granted.rank == 2u);
  BOOST_TEST(granted.joined);
  // The barriers hear of it as one that waits; no table lists it yet.
  bool told = false;
  for (const auto& action : last)
    if (const auto* joined = std::get_if<scheduler_core::barrier_member_joined>(&action))
      told = joined->at_next_barrier;
  BOOST_TEST(told);
  BOOST_TEST(count<wire::membership>() == 0u);
  // Its arrival goes to the barriers like any other.
  frame(5, wire::barrier{7, 1, wire::group::workers, worker_node_id(2), {}});
  std::optional<std::uint32_t> member;
  for (const auto& action : last)
    if (const auto* entry = std::get_if<scheduler_core::barrier_entry>(&action))
      member = entry->member;
  BOOST_TEST_REQUIRE(member.has_value());
  // A table for another reason (worker 1 leaves) still does not list it, nor count it.
  frame(4, done(9, 4));
  const auto without = only_to<wire::membership>(3);
  BOOST_TEST(without.num_workers == 2u);
  for (const auto& node : without.nodes)
    BOOST_TEST(node.node_id != worker_node_id(2));
  // A barrier took it in: the table that lists it goes to the servers first...
  last = core->on_joiners_taken_in({*member}, now);
  const auto table = only_to<wire::membership>(1);
  BOOST_TEST(table.request_id != 0u);
  BOOST_TEST(table.num_workers == 3u);
  BOOST_TEST(row(table, worker_node_id(2)).alive);
  BOOST_TEST(count<wire::membership>() == 2u);
  for (const auto& action : last)
    BOOST_TEST(!std::holds_alternative<scheduler_core::release_held_barriers>(action));
  // ...then to the workers still in, the joiner among them, and only then the barrier goes.
  frame(1, wire::ack{table.request_id});
  frame(2, wire::ack{table.request_id});
  BOOST_TEST(only_to<wire::membership>(3).num_workers == 3u);
  BOOST_TEST(only_to<wire::membership>(5).num_workers == 3u);
  BOOST_TEST_REQUIRE(!last.empty());
  BOOST_TEST(std::holds_alternative<scheduler_core::release_held_barriers>(last.back()));
  frame(3, done(9, 4));
  frame(5, done(9, 2));
  close(1);
  close(2);
  const auto outcome = ended();
  BOOST_TEST_REQUIRE(outcome.joined_workers.size() == 1u);
  BOOST_TEST(outcome.joined_workers[0].rank == 2u);
}

BOOST_AUTO_TEST_CASE(a_worker_waiting_to_join_at_a_barrier_is_turned_away_when_the_others_finish) {
  options.max_workers = 3;
  run_job(1, 1); // server on connection 1, worker 0 on 2
  core->on_authenticated(3, session_of(3));
  auto reg = registration(wire::role::worker, 1003);
  reg.join_at_barrier = true;
  frame(3, reg);
  expect_admitted(admission_to(3));
  frame(3, wire::barrier{7, 1, wire::group::workers, worker_node_id(1), {}});
  // The only worker counted is done: nobody is left to meet the joiner at a barrier.
  frame(2, done(9, 4));
  const auto refused = only_to<wire::error_reply>(3);
  BOOST_TEST(refused.request_id == 7u);
  BOOST_TEST((refused.code == wire::error_code::shutting_down));
  BOOST_TEST(contains(refused.message, "cannot join"), refused.message);
  BOOST_TEST((core->phase() == scheduler_phase::draining));
  close(3);
  close(1);
  const auto outcome = ended();
  BOOST_TEST((outcome.end == job_end::finished));
  BOOST_TEST(outcome.joined_workers.empty());
}

BOOST_AUTO_TEST_CASE(a_worker_beyond_num_workers_is_turned_away_until_the_job_runs) {
  options.max_workers = 2;
  start(1, 1);
  expect_admitted(join(1, wire::role::worker));
  const auto early = expect_rejected(join(2, wire::role::worker), wire::reject_reason::role_full);
  BOOST_TEST(contains(early.detail, "joins only once the job runs"), early.detail);
  expect_admitted(join(3, wire::role::server));
  BOOST_TEST((core->phase() == scheduler_phase::running));
  // The server hears of the joiner first, the workers once it acked.
  BOOST_TEST(expect_admitted(join(4, wire::role::worker)).rank == 1u);
  BOOST_TEST(only_to<wire::membership>(3).request_id != 0u);
  frame(3, wire::ack{only_to<wire::membership>(3).request_id});
  BOOST_TEST(only_to<wire::membership>(4).num_workers == 2u);
}

BOOST_AUTO_TEST_CASE(a_server_that_does_not_leave_by_the_drain_timeout_does_not_hold_the_job) {
  run_job(1, 1);
  frame(2, done());
  tick(4900ms);
  BOOST_TEST(!core->ended());
  tick(100ms);
  const auto outcome = ended();
  BOOST_TEST((outcome.end == job_end::finished));
  BOOST_TEST(outcome.workers_finished == 1u);
}

BOOST_AUTO_TEST_CASE(a_job_whose_registration_never_completes_fails_naming_what_is_missing) {
  start(2, 2);
  expect_admitted(join(1, wire::role::server));
  expect_admitted(join(2, wire::role::worker));
  tick(9900ms);
  BOOST_TEST(!core->ended());
  tick(100ms);
  const auto outcome = ended();
  BOOST_TEST((outcome.failure->code() == errc::timeout));
  BOOST_TEST(outcome.failure->message() ==
             "1 of 2 servers and 1 of 2 workers registered after 10s");
  for (std::uint64_t c : {1u, 2u})
    BOOST_TEST((only_to<wire::error_reply>(c).code == wire::error_code::timeout));
}

BOOST_AUTO_TEST_CASE(sync_settings_come_from_worker_rank_0_with_a_quorum_within_the_workers) {
  run_job(1, 3);
  frame(3, quorum_of(2));
  BOOST_TEST(contains(only_to<wire::error_reply>(3).message,
                      "sync settings come from worker rank 0, not from worker 1"));
  frame(1, quorum_of(2));
  BOOST_TEST(contains(only_to<wire::error_reply>(1).message, "not from server 0"));
  frame(2, quorum_of(4));
  BOOST_TEST(contains(only_to<wire::error_reply>(2).message, "a quorum of 4 is outside 1..3"));
  BOOST_TEST(core->quorum() == 3u);
  frame(2, quorum_of(1));
  BOOST_TEST(only_to<wire::ack>(2).request_id == 7u);
  BOOST_TEST(core->quorum() == 1u);
}

BOOST_AUTO_TEST_SUITE_END()
