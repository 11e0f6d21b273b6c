// A node agent's rules (actors/logic/agent_core.hpp) driven directly, frame by frame, with a clock
// the test moves: no actor system, no sockets, no waiting. Each case plays the scheduler's side of
// the control link and checks what the core asks for: frames to the scheduler, join()'s result,
// the answers to the waiting calls, the job's end and the subscribers' news. The scheduler's side
// includes a hostile one: frames that answer nothing, secrets that do not open, tables that go
// back in time.

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/logic/agent_core.hpp"
#include "actors/logic/node_identity.hpp"
#include "tests/actors/logic/core_clock.hpp"
#include "tests/actors/logic/test_digests.hpp"
#include "tests/stderr_capture.hpp"

using namespace troupe;
using namespace std::chrono_literals;
using clock_type = agent_core::clock;
using troupe::testing::core_clock;
using troupe::testing::digest_of;
using troupe::testing::stderr_capture;

namespace {

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

/// What the agents of a test log (errors only), read a piece at a time.
class agent_log {
public:
  static logger make() { return logger{"agent", 0}; }
  /// What was logged since the last call.
  std::string fresh() {
    auto all = capture_.text();
    auto text = all.substr(std::min(seen_, all.size()));
    seen_ = all.size();
    return text;
  }

private:
  stderr_capture capture_;
  std::size_t seen_ = 0;
};

/// An agent core and the scheduler's side of its control link, driven by hand.
struct agent_driver : core_clock<agent_core::actions, clock_type> {
  agent_options options;
  clock_type::time_point started = now;
  std::optional<agent_core> core;
  /// The control link's session key, and the secret the admission seals.
  session_key session{digest_of(7)};
  wire::link_digest secret = digest_of(42);

  explicit agent_driver(wire::role role = wire::role::worker) {
    options.role = role;
    options.job_id = "job-a";
    options.scheduler_host = "127.0.0.1";
    options.scheduler_port = 7000;
    options.data_port = 7100;
    options.startup_timeout = 10s;
    options.heartbeat_interval = 1s;
    options.peer_timeout = 5s;
    core.emplace(options, started);
  }

  /// The control link opens and its handshake agrees `session`.
  const agent_core::actions& connect() {
    BOOST_TEST_REQUIRE(core->wants_link());
    last = core->on_connected(now);
    core->on_authenticated(session);
    return last;
  }

  const agent_core::actions& frame(wire::message msg, std::chrono::milliseconds elapsed = 0ms) {
    return after(elapsed, [&](auto at) { return core->on_frame(msg, at); });
  }
  const agent_core::actions& tick(std::chrono::milliseconds elapsed) {
    return after(elapsed, [&](auto at) { return core->on_tick(at); });
  }
  const agent_core::actions& close(const std::string& reason,
                                   std::optional<std::string> refusal = std::nullopt) {
    last = core->on_closed(reason, refusal);
    return last;
  }

  /// The admission of rank `rank` whose secret is sealed under `under` for that very node.
  wire::admission admission(std::uint32_t rank, const session_key& under) const {
    const std::uint32_t node_id = options.role == wire::role::server ? 8 + 2 * rank : 9 + 2 * rank;
    wire::admitted granted{
        rank, node_id, seal_secret(under, secret, {options.role, rank}, node_id), false, {}};
    return wire::admission{agent_core::registration_request_id, granted};
  }
  wire::admission admission(std::uint32_t rank = 0) const { return admission(rank, session); }

  static wire::membership table(std::uint64_t epoch) {
    wire::membership t;
    t.epoch = epoch;
    t.num_servers = 1;
    t.num_workers = 2;
    t.nodes = {{8, wire::role::server, 0, "127.0.0.1", 7100, true},
               {9, wire::role::worker, 0, "127.0.0.1", 0, true},
               {11, wire::role::worker, 1, "127.0.0.1", 0, epoch < 3}};
    return t;
  }

  /// Connects, is admitted as rank 0 and gets the table of epoch 1: join() returns.
  void join() {
    connect();
    frame(admission());
    frame(table(1));
    BOOST_TEST_REQUIRE(count<agent_core::joined>() == 1u);
  }

  /// Places a call; it must be sent.
  agent_core::placed_call call(wire::message request, std::string what) {
    auto placed = core->on_call(std::move(request), std::move(what));
    if (!placed)
      BOOST_FAIL("the call was not sent: " << placed.error().message());
    return *placed;
  }

  template <class T>
  std::size_t count() const {
    return actions_of<T>().size();
  }
  template <class T>
  T only() const {
    const auto found = actions_of<T>();
    BOOST_TEST_REQUIRE(found.size() == 1u);
    return found.front();
  }

  /// The last call's frames to the scheduler of kind T.
  template <class T>
  std::vector<T> sent() const {
    std::vector<T> found;
    for (const auto& out : actions_of<agent_core::to_scheduler>())
      if (const auto* typed = std::get_if<T>(&out.msg))
        found.push_back(*typed);
    return found;
  }

  /// The last call ended the node with an error of `code`, which it returns.
  error failed_with(errc code) const {
    const auto failed = only<agent_core::job_failed>();
    BOOST_TEST((failed.failure.code() == code), failed.failure.to_string());
    BOOST_TEST_REQUIRE(core->failure().has_value());
    BOOST_TEST(!core->ticking());
    return failed.failure;
  }

  /// The lost_news the last call told the subscribers; nullopt when none.
  std::optional<std::string> lost_news() const {
    for (const auto& told : actions_of<agent_core::tell_subscribers>())
      if (const auto* lost = std::get_if<agent_core::lost_news>(&told.what))
        return lost->message;
    return std::nullopt;
  }
};

wire::barrier barrier_of(std::uint8_t group) {
  return wire::barrier{0, 0, group, 0, {}};
}

wire::command done_command() {
  return wire::command{0, wire::command_kind::stop, {}};
}

} // namespace

BOOST_AUTO_TEST_SUITE(agent_core_suite)

// --- admission -----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(the_agent_registers_as_its_options_say_once_the_link_opens) {
  agent_driver agent;
  agent.options.rank_hint = 3;
  agent.core.emplace(agent.options, agent.started);
  BOOST_TEST(agent.core->on_tick(agent.now).empty(), "no ticks before the link");
  agent.connect();
  const auto regs = agent.sent<wire::registration>();
  BOOST_TEST_REQUIRE(regs.size() == 1u);
  BOOST_TEST(regs[0].request_id == agent_core::registration_request_id);
  BOOST_TEST((regs[0].node_role == wire::role::worker));
  BOOST_TEST(regs[0].job_id == "job-a");
  BOOST_TEST(regs[0].port == 7100);
  BOOST_TEST(regs[0].rank_hint == 3);
  BOOST_TEST(agent.core->ticking());
  BOOST_TEST(!agent.core->wants_link(), "a second link is not taken");
}

BOOST_AUTO_TEST_CASE(a_worker_joins_with_the_node_key_its_admission_seals) {
  agent_driver agent;
  agent.connect();
  agent.frame(agent.admission(2));
  BOOST_TEST(agent.count<agent_core::joined>() == 0u, "no table yet");
  BOOST_TEST(agent.count<agent_core::job_secret_opened>() == 0u, "a worker has no job secret");
  agent.frame(agent_driver::table(1));
  const auto joined = agent.only<agent_core::joined>();
  BOOST_TEST(joined.admitted.rank == 2u);
  BOOST_TEST(joined.admitted.node_id == 13u);
  BOOST_TEST(joined.membership.epoch == 1u);
  BOOST_TEST_REQUIRE(!joined.key.empty());
  BOOST_TEST((joined.key.reveal() == agent.secret));
  // The table may come first: join() waits for both.
  agent_driver early;
  early.connect();
  early.frame(agent_driver::table(1));
  BOOST_TEST(early.count<agent_core::joined>() == 0u);
  early.frame(early.admission());
  BOOST_TEST(early.count<agent_core::joined>() == 1u);
}

BOOST_AUTO_TEST_CASE(a_worker_joining_at_a_barrier_arrives_there_and_joins_once_released) {
  agent_driver agent;
  agent.options.join_at_barrier = true;
  agent.core.emplace(agent.options, agent.started);
  agent.connect();
  BOOST_TEST(agent.sent<wire::registration>().at(0).join_at_barrier);
  auto admitted = agent.admission(2);
  auto& granted = std::get<wire::admitted>(admitted.outcome);
  granted.joined = true;
  granted.first_barrier.assign(8, 1);
  granted.first_barrier[wire::group::workers] = 4;
  agent.frame(admitted);
  const auto arrivals = agent.sent<wire::barrier>();
  BOOST_TEST_REQUIRE(arrivals.size() == 1u);
  BOOST_TEST(arrivals[0].group == wire::group::workers);
  BOOST_TEST(arrivals[0].barrier_id == 4u);
  BOOST_TEST(arrivals[0].sender_node_id == 13u);
  // The table that lists it comes first; join() waits for the release too.
  agent.frame(agent_driver::table(3));
  BOOST_TEST(agent.count<agent_core::joined>() == 0u);
  const std::vector<wire::gathered_values> shared{{wire::role::worker, 0, {10.0, 1.0}}};
  // Taken in at the others' barrier 5: its ids go on from there.
  agent.frame(wire::barrier_release{arrivals[0].request_id, 5, wire::group::workers, shared});
  const auto joined = agent.only<agent_core::joined>();
  BOOST_TEST(joined.admitted.rank == 2u);
  BOOST_TEST_REQUIRE(joined.gathered.has_value());
  BOOST_TEST((*joined.gathered == shared));
  const auto next = agent.call(barrier_of(wire::group::workers), "barrier");
  BOOST_TEST(std::get<wire::barrier>(next.frame).barrier_id == 6u);
}

BOOST_AUTO_TEST_CASE(a_worker_the_job_turns_away_at_its_joining_barrier_fails_join) {
  agent_driver agent;
  agent.options.join_at_barrier = true;
  agent.core.emplace(agent.options, agent.started);
  agent.connect();
  auto admitted = agent.admission(1);
  std::get<wire::admitted>(admitted.outcome).joined = true;
  agent.frame(admitted);
  const auto arrival = agent.sent<wire::barrier>().at(0);
  agent.frame(wire::error_reply{arrival.request_id, std::nullopt, wire::error_code::shutting_down,
                                "worker 1 cannot join"});
  const auto failure = agent.failed_with(errc::peer_lost);
  BOOST_TEST(failure.message().find("cannot join") != std::string::npos, failure.message());
  BOOST_TEST(agent.count<agent_core::joined>() == 0u);
}

BOOST_AUTO_TEST_CASE(a_server_hands_on_its_job_secret_before_join_returns) {
  agent_driver agent{wire::role::server};
  agent.connect();
  agent.frame(agent.admission(0));
  const auto opened = agent.only<agent_core::job_secret_opened>();
  BOOST_TEST((opened.secret.reveal() == agent.secret));
  agent.frame(agent_driver::table(1));
  const auto joined = agent.only<agent_core::joined>();
  BOOST_TEST(joined.key.empty(), "a server keeps no node key");
}

BOOST_AUTO_TEST_CASE(a_rejected_registration_fails_join_naming_the_reason) {
  agent_driver agent;
  agent.connect();
  agent.frame(wire::admission{agent_core::registration_request_id,
                              wire::rejected{wire::reject_reason::wrong_job, "job-b expected"}});
  const auto err = agent.failed_with(errc::invalid_argument);
  BOOST_TEST(err.message() == "registration rejected (wrong_job): job-b expected");
  BOOST_TEST(!agent.lost_news().has_value(), "join() was still waiting: no subscriber yet");
}

BOOST_AUTO_TEST_CASE(an_admission_whose_secret_does_not_open_fails_join) {
  // Sealed under another session key: a scheduler that did not make this link's key exchange.
  agent_driver agent;
  agent.connect();
  agent.frame(agent.admission(0, session_key{digest_of(8)}));
  const auto err = agent.failed_with(errc::invalid_argument);
  BOOST_TEST(contains(err.message(), "admitted this node as worker 0"), err.message());
  BOOST_TEST(contains(err.message(), "its secret does not open"), err.message());
  BOOST_TEST(!agent.core->admitted().has_value());
  agent.frame(agent_driver::table(1));
  BOOST_TEST(agent.count<agent_core::joined>() == 0u, "a failed node never joins");

  // Sealed for another rank than the one it grants.
  agent_driver other;
  other.connect();
  auto admission = other.admission(0);
  std::get<wire::admitted>(admission.outcome).rank = 1;
  other.frame(admission);
  other.failed_with(errc::invalid_argument);

  // No secret at all.
  agent_driver bare;
  bare.connect();
  bare.frame(
      wire::admission{agent_core::registration_request_id, wire::admitted{0, 9, {}, false, {}}});
  bare.failed_with(errc::invalid_argument);

  // A link without a key exchange cannot open any secret.
  agent_driver no_session;
  no_session.last = no_session.core->on_connected(no_session.now);
  no_session.frame(no_session.admission());
  no_session.failed_with(errc::invalid_argument);

  // Control: the same admission under the right key is taken.
  agent_driver control;
  control.connect();
  control.frame(control.admission(0));
  BOOST_TEST(control.core->admitted().has_value());
  BOOST_TEST(!control.core->failure().has_value());
}

// --- membership ----------------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_membership_table_not_newer_than_the_last_is_ignored) {
  agent_driver agent;
  agent.join();
  agent.frame(agent_driver::table(3));
  const auto told = agent.only<agent_core::tell_subscribers>();
  const auto* update = std::get_if<wire::membership>(&told.what);
  BOOST_TEST_REQUIRE(update != nullptr);
  BOOST_TEST(update->epoch == 3u);
  BOOST_TEST(!update->nodes[2].alive);
  for (std::uint64_t stale : {3u, 2u, 1u, 0u}) {
    agent.frame(agent_driver::table(stale));
    BOOST_TEST(agent.last.empty(), "epoch " << stale << " after 3 changed something");
  }
  BOOST_TEST(agent.core->membership()->epoch == 3u);
  BOOST_TEST(!agent.core->membership()->nodes[2].alive, "the lost worker stays lost");
  agent.frame(agent_driver::table(4));
  BOOST_TEST(agent.count<agent_core::tell_subscribers>() == 1u);
}

// --- calls, barrier ids
// ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(barrier_ids_count_per_group_and_request_ids_per_node) {
  agent_driver agent;
  agent.join();
  const auto first = agent.call(barrier_of(wire::group::workers), "barrier of group 4");
  const auto second = agent.call(barrier_of(wire::group::workers), "barrier of group 4");
  const auto mixed =
      agent.call(barrier_of(wire::group::workers | wire::group::servers), "barrier of group 6");
  const auto done = agent.call(done_command(), "done");
  BOOST_TEST(first.request_id == 2u, "1 is the registration's");
  BOOST_TEST(second.request_id == 3u);
  BOOST_TEST(mixed.request_id == 4u);
  BOOST_TEST(done.request_id == 5u);
  const auto& b1 = std::get<wire::barrier>(first.frame);
  const auto& b2 = std::get<wire::barrier>(second.frame);
  const auto& b6 = std::get<wire::barrier>(mixed.frame);
  BOOST_TEST(b1.barrier_id == 1u);
  BOOST_TEST(b2.barrier_id == 2u);
  BOOST_TEST(b6.barrier_id == 1u, "group 6 counts its own barriers");
  BOOST_TEST(b1.request_id == 2u);
  BOOST_TEST(b1.sender_node_id == 9u);
  BOOST_TEST(std::get<wire::command>(done.frame).request_id == 5u);
  BOOST_TEST(agent.core->waiting_calls() == 4u);

  // The releases answer their own calls, the gathered values with them.
  wire::barrier_release release{
      second.request_id, 2, wire::group::workers, {{wire::role::worker, 1, {0.5}}}};
  agent.frame(release);
  const auto answered = agent.only<agent_core::answer>();
  BOOST_TEST(answered.request_id == second.request_id);
  BOOST_TEST(answered.outcome.has_value());
  BOOST_TEST_REQUIRE(answered.gathered.has_value());
  BOOST_TEST((*answered.gathered == release.gathered));
  BOOST_TEST(agent.core->waiting_calls() == 3u);
}

BOOST_AUTO_TEST_CASE(an_error_that_answers_a_call_fails_that_call_alone) {
  agent_driver agent;
  agent.join();
  const auto settings = agent.call(
      [] {
        wire::sync_settings settings;
        settings.quorum = 3;
        return settings;
      }(),
      "sync settings");
  agent.frame(wire::error_reply{settings.request_id, std::nullopt,
                                wire::error_code::invalid_argument, "quorum 3 of 2 workers"});
  const auto answered = agent.only<agent_core::answer>();
  BOOST_TEST_REQUIRE(!answered.outcome.has_value());
  BOOST_TEST(contains(answered.outcome.error().message(), "quorum 3 of 2 workers"));
  BOOST_TEST(agent.count<agent_core::job_failed>() == 0u);
  BOOST_TEST(!agent.core->failure().has_value());
}

BOOST_AUTO_TEST_CASE(an_abandoned_call_is_forgotten) {
  agent_driver agent;
  agent.join();
  const auto placed = agent.call(barrier_of(wire::group::workers), "barrier of group 4");
  agent.core->abandon(placed.request_id);
  BOOST_TEST(agent.core->waiting_calls() == 0u);
  agent.frame(wire::ack{placed.request_id, 0, false});
  BOOST_TEST(agent.count<agent_core::answer>() == 0u);
}

// --- which errors of the scheduler end the node
// ---------------------------------------------------

BOOST_AUTO_TEST_CASE(an_unasked_lost_peer_or_timeout_from_the_scheduler_ends_the_node) {
  for (auto code : {wire::error_code::lost_peer, wire::error_code::timeout}) {
    agent_driver agent;
    agent.join();
    const auto placed = agent.call(barrier_of(wire::group::workers), "barrier of group 4");
    agent.frame(wire::error_reply{0, std::nullopt, code, "worker 1 (node 11) was lost: closed"});
    const auto err =
        agent.failed_with(code == wire::error_code::lost_peer ? errc::peer_lost : errc::timeout);
    BOOST_TEST(contains(err.message(), "worker 1 (node 11) was lost"), err.message());
    const auto answered = agent.only<agent_core::answer>();
    BOOST_TEST(answered.request_id == placed.request_id);
    BOOST_TEST(!answered.outcome.has_value(), "the waiting call gets the failure");
    BOOST_TEST(agent.lost_news().has_value() == (code == wire::error_code::lost_peer));
    // Every later call gets it too.
    const auto later = agent.core->on_call(done_command(), "done");
    BOOST_TEST_REQUIRE(!later.has_value());
    BOOST_TEST(later.error().message() == err.message());
  }
}

BOOST_AUTO_TEST_CASE(the_schedulers_complaint_about_a_frame_of_ours_is_no_failure) {
  agent_log log;
  agent_driver agent;
  agent.options.log = agent_log::make();
  agent.core.emplace(agent.options, agent.started);
  agent.join();
  // What the link makes of a frame that fails validation, and an error for a request of nobody.
  agent.frame(
      wire::error_reply{0, std::nullopt, wire::error_code::bad_frame, "membership: 3 nodes of 2"});
  BOOST_TEST(agent.last.empty());
  BOOST_TEST(contains(log.fresh(), "the scheduler reported: membership: 3 nodes of 2"));
  agent.frame(wire::error_reply{99, std::nullopt, wire::error_code::internal, "what request?"});
  BOOST_TEST(agent.last.empty());
  BOOST_TEST(contains(log.fresh(), "the scheduler reported: what request?"));
  BOOST_TEST(!agent.core->failure().has_value());
  // The registration's error before admission, though, is the scheduler turning this node away.
  agent_driver joining;
  joining.connect();
  joining.frame(wire::error_reply{agent_core::registration_request_id, std::nullopt,
                                  wire::error_code::internal, "cannot seal"});
  joining.failed_with(errc::internal);
}

BOOST_AUTO_TEST_CASE(an_admission_for_another_request_does_not_admit_the_node) {
  agent_log log;
  agent_driver agent;
  agent.options.log = agent_log::make();
  agent.core.emplace(agent.options, agent.started);
  agent.connect();
  auto stray = agent.admission(0);
  stray.request_id = agent_core::registration_request_id + 1;
  agent.frame(stray);
  agent.frame(agent_driver::table(1));
  BOOST_TEST(agent.last.empty());
  BOOST_TEST(!agent.core->admitted().has_value());
  BOOST_TEST(contains(log.fresh(), "ignored an admission that answers no registration"));
  // Control: the admission that answers the registration joins at once.
  agent.frame(agent.admission(0));
  BOOST_TEST(agent.count<agent_core::joined>() == 1u);
}

BOOST_AUTO_TEST_CASE(hostile_frames_from_the_schedulers_side_are_named_and_change_nothing) {
  agent_log log;
  agent_driver agent;
  agent.options.log = agent_log::make();
  agent.core.emplace(agent.options, agent.started);
  agent.join();
  BOOST_TEST(log.fresh().empty(), "a well-behaved scheduler leaves nothing to complain about");
  const auto placed = agent.call(barrier_of(wire::group::workers), "barrier of group 4");

  // An admission that answers no registration: another request id, or a second one.
  auto stray = agent.admission(1);
  stray.request_id = 5;
  agent.frame(stray);
  BOOST_TEST(agent.last.empty());
  BOOST_TEST(contains(log.fresh(), "ignored an admission that answers no registration"));
  agent.frame(agent.admission(1));
  BOOST_TEST(agent.last.empty());
  BOOST_TEST(contains(log.fresh(), "ignored an admission that answers no registration"));
  BOOST_TEST(agent.core->admitted()->rank == 0u, "the first admission stands");

  // A kind the agent never takes.
  agent.frame(wire::push{});
  BOOST_TEST(agent.last.empty());
  BOOST_TEST(contains(log.fresh(), "ignored a push from the scheduler"));

  // Answers to requests this node never made.
  agent.frame(wire::ack{77, 0, false});
  BOOST_TEST(agent.last.empty());
  agent.frame(wire::barrier_release{78, 1, wire::group::workers, {}});
  BOOST_TEST(agent.last.empty());

  // A checkpoint command: refused back, by name.
  agent.frame(wire::command{12, wire::command_kind::save_checkpoint, "x", false});
  const auto refused = agent.sent<wire::error_reply>();
  BOOST_TEST_REQUIRE(refused.size() == 1u);
  BOOST_TEST(refused[0].request_id == 12u);
  BOOST_TEST((refused[0].code == wire::error_code::unsupported));
  BOOST_TEST(refused[0].message == "the node agent runs no checkpoint commands");

  // None of it touched the node: its call still waits, and still completes.
  BOOST_TEST(!agent.core->failure().has_value());
  BOOST_TEST(agent.core->waiting_calls() == 1u);
  agent.frame(wire::barrier_release{placed.request_id, 1, wire::group::workers, {}});
  BOOST_TEST(agent.only<agent_core::answer>().outcome.has_value());
}

BOOST_AUTO_TEST_CASE(the_stop_command_ends_the_job_well_once) {
  agent_driver agent{wire::role::server};
  agent.join();
  agent.frame(wire::command{0, wire::command_kind::stop, {}, false});
  BOOST_TEST(agent.count<agent_core::job_stopped>() == 1u);
  const auto told = agent.only<agent_core::tell_subscribers>();
  BOOST_TEST(std::holds_alternative<agent_core::stop_news>(told.what));
  BOOST_TEST(agent.core->stopped());
  agent.frame(wire::command{0, wire::command_kind::stop, {}, false});
  BOOST_TEST(agent.last.empty(), "a second stop is nothing new");
  const auto news = agent.core->news_for_new_subscriber();
  BOOST_TEST_REQUIRE(news.size() == 1u);
  BOOST_TEST(std::holds_alternative<agent_core::stop_news>(news[0]));
}

BOOST_AUTO_TEST_CASE(a_local_failure_is_told_to_the_scheduler_unasked) {
  agent_driver agent{wire::role::server};
  agent.join();
  agent.last = agent.core->on_local_failure("shard 0 died: out of memory");
  const auto told = agent.sent<wire::error_reply>();
  BOOST_TEST_REQUIRE(told.size() == 1u);
  BOOST_TEST(told[0].request_id == 0u);
  BOOST_TEST((told[0].code == wire::error_code::internal));
  BOOST_TEST(told[0].message == "shard 0 died: out of memory");
}

// --- a closed control link
// -------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(a_refused_handshake_fails_join_as_the_schedulers_answer) {
  agent_driver agent;
  agent.last = agent.core->on_connected(agent.now); // no handshake done
  agent.close("refused by 127.0.0.1:7000: the job token is wrong (proof mismatch)",
              "the job token is wrong (proof mismatch)");
  const auto err = agent.failed_with(errc::invalid_argument);
  BOOST_TEST(err.message() ==
             "refused by the scheduler at 127.0.0.1:7000: the job token is wrong (proof mismatch)");
}

BOOST_AUTO_TEST_CASE(a_link_closed_before_its_handshake_is_a_lost_scheduler) {
  agent_driver agent;
  agent.last = agent.core->on_connected(agent.now);
  agent.close("data link to 127.0.0.1:7000 closed by the peer");
  const auto err = agent.failed_with(errc::peer_lost);
  BOOST_TEST(contains(err.message(), "closed the control link before its handshake was done: "
                                     "data link to 127.0.0.1:7000 closed by the peer"),
             err.message());
}

BOOST_AUTO_TEST_CASE(a_scheduler_lost_while_the_job_runs_fails_every_call_and_tells_subscribers) {
  agent_driver agent;
  agent.join();
  const auto placed = agent.call(barrier_of(wire::group::workers), "barrier of group 4");
  agent.close("data link to 127.0.0.1:7000 closed by the peer");
  const auto err = agent.failed_with(errc::peer_lost);
  BOOST_TEST(err.message() ==
             "scheduler (node 1) was lost: data link to 127.0.0.1:7000 closed by the peer");
  const auto answered = agent.only<agent_core::answer>();
  BOOST_TEST(answered.request_id == placed.request_id);
  BOOST_TEST(answered.outcome.error().message() == err.message());
  BOOST_TEST((agent.lost_news() == err.message()));
  const auto news = agent.core->news_for_new_subscriber();
  BOOST_TEST_REQUIRE(news.size() == 1u);
  BOOST_TEST(std::get<agent_core::lost_news>(news[0]).message == err.message());
}

BOOST_AUTO_TEST_CASE(a_scheduler_that_leaves_after_the_node_finished_is_no_loss) {
  agent_driver agent;
  agent.join();
  const auto done = agent.call(done_command(), "done");
  agent.frame(wire::ack{done.request_id, 0, false});
  BOOST_TEST(agent.only<agent_core::answer>().outcome.has_value());
  BOOST_TEST(agent.core->finished());
  const auto late = agent.call(barrier_of(wire::group::workers), "barrier of group 4");
  agent.close("data link to 127.0.0.1:7000 closed by the peer");
  BOOST_TEST(agent.count<agent_core::job_failed>() == 0u);
  BOOST_TEST(!agent.core->failure().has_value());
  const auto answered = agent.only<agent_core::answer>();
  BOOST_TEST(answered.request_id == late.request_id);
  BOOST_TEST(answered.outcome.error().message() ==
             "barrier of group 4: the scheduler at 127.0.0.1:7000 has left (the job ended)");
  const auto after = agent.core->on_call(barrier_of(wire::group::workers), "barrier of group 4");
  BOOST_TEST_REQUIRE(!after.has_value());
  BOOST_TEST((after.error().code() == errc::peer_lost));
  BOOST_TEST(contains(after.error().message(), "has left"));

  // Control: a done that the scheduler refused does not finish the node.
  agent_driver refused;
  refused.join();
  const auto again = refused.call(done_command(), "done");
  refused.frame(
      wire::error_reply{again.request_id, std::nullopt, wire::error_code::internal, "no"});
  BOOST_TEST(!refused.core->finished());
  refused.close("closed by the peer");
  refused.failed_with(errc::peer_lost);
}

// --- ticks: the join deadline, heartbeats, the scheduler's silence
// --------------------------------

BOOST_AUTO_TEST_CASE(no_answer_to_the_registration_by_the_join_deadline_fails_join) {
  agent_driver agent;
  agent.connect();
  agent.tick(9'999ms);
  BOOST_TEST(agent.last.empty(), "no heartbeat before admission, no failure before the deadline");
  agent.tick(1ms);
  const auto err = agent.failed_with(errc::timeout);
  BOOST_TEST(contains(err.message(), "no answer to the registration from the scheduler at "
                                     "127.0.0.1:7000 within"),
             err.message());
}

BOOST_AUTO_TEST_CASE(an_admission_without_a_table_by_the_join_deadline_fails_join) {
  agent_driver agent;
  agent.connect();
  agent.frame(agent.admission(1), 2s);
  agent.tick(8s);
  const auto err = agent.failed_with(errc::timeout);
  BOOST_TEST(contains(err.message(), "admitted as worker 1, but no membership table from the "
                                     "scheduler at 127.0.0.1:7000 within"),
             err.message());
  // Control: with the table the deadline does not apply.
  agent_driver joined;
  joined.join();
  joined.frame(wire::heartbeat{1, 1, 0}, 9s);
  joined.tick(1s);
  BOOST_TEST(joined.sent<wire::heartbeat>().size() == 1u);
  BOOST_TEST(joined.count<agent_core::job_failed>() == 0u);
}

BOOST_AUTO_TEST_CASE(a_scheduler_silent_past_the_peer_timeout_is_lost) {
  agent_driver agent;
  agent.join();
  agent.tick(1s);
  const auto beats = agent.sent<wire::heartbeat>();
  BOOST_TEST_REQUIRE(beats.size() == 1u);
  BOOST_TEST(beats[0].sender_node_id == 9u);
  BOOST_TEST(beats[0].sequence == 1u);
  agent.tick(4s); // 5 s of silence: not more than the peer timeout
  BOOST_TEST(agent.count<agent_core::job_failed>() == 0u);
  BOOST_TEST(agent.sent<wire::heartbeat>().at(0).sequence == 2u);
  agent.frame(wire::heartbeat{1, 1, 0}); // the scheduler speaks: silence starts again
  agent.tick(5s);
  BOOST_TEST(agent.count<agent_core::job_failed>() == 0u);
  agent.tick(1ms);
  const auto err = agent.failed_with(errc::peer_lost);
  BOOST_TEST(contains(err.message(), "scheduler (node 1) was lost: nothing heard from it for"),
             err.message());
  BOOST_TEST(agent.lost_news().has_value());
  BOOST_TEST(agent.core->on_tick(agent.now + 1s).empty(), "a failed node stops ticking");
}

BOOST_AUTO_TEST_CASE(a_finished_node_does_not_miss_a_silent_scheduler) {
  agent_driver agent{wire::role::server};
  agent.join();
  agent.frame(wire::command{0, wire::command_kind::stop, {}, false});
  agent.tick(60s);
  BOOST_TEST(agent.count<agent_core::job_failed>() == 0u);
  BOOST_TEST(agent.sent<wire::heartbeat>().size() == 1u, "it still says it is alive");
}

// --- join()'s backoff ---------------------------------------------------------------------------

BOOST_AUTO_TEST_CASE(the_connect_backoff_doubles_to_a_second_and_stops_at_the_deadline) {
  const auto start = clock_type::time_point{} + 1h;
  connect_backoff backoff{start, start + 3s};
  auto now = start;
  std::vector<std::chrono::milliseconds> pauses;
  while (auto pause = backoff.failed(now, "connection refused")) {
    pauses.push_back(std::chrono::duration_cast<std::chrono::milliseconds>(*pause));
    now += *pause;
  }
  // 50+100+200+400+800+1000 = 2550 ms; the last pause ends at the deadline.
  const std::vector<std::chrono::milliseconds> expected{50ms,  100ms,  200ms, 400ms,
                                                        800ms, 1000ms, 450ms};
  BOOST_TEST(pauses == expected, boost::test_tools::per_element());
  BOOST_TEST(backoff.attempts() == 8);
  const auto err = backoff.give_up("127.0.0.1:7000", 3s);
  BOOST_TEST((err.code() == errc::timeout));
  BOOST_TEST(contains(err.message(), "could not reach the scheduler at 127.0.0.1:7000: tried for"),
             err.message());
  BOOST_TEST(contains(err.message(), "(8 attempts, connect timeout"), err.message());
  BOOST_TEST(contains(err.message(), "last: connection refused"), err.message());
}

BOOST_AUTO_TEST_SUITE_END()
