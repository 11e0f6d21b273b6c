// A server's memory follows the bytes that arrive (issue 22), across real processes: troupe-node
// as scheduler and server, and the test as the job's one worker, an insider
// (tests/cluster/insider.hpp): admitted as worker 0 with a real node key, it writes init frames by
// hand on raw connections that pass the link handshake as that worker. Only worker rank 0 may
// send an init, so this is what a rank 0 with a bug, or whose host was taken over, can cost.
// Every wait is bounded; every process is stopped by its PID.

#include <cstring>
#include <optional>
#include <string_view>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "insider.hpp"
#include "process_support.hpp"
#include "tests/raw_peer.hpp"

using namespace troupe::testing;
namespace wire = troupe::wire;

namespace {

const std::string node_path = TROUPE_NODE_PATH;
const std::string job_token = "store memory test token";

constexpr std::uint64_t gib = std::uint64_t{1} << 30;

/// The environment of a node of a job of 1 worker (the test) and 1 server with the test's token.
std::map<std::string, std::string> job_env(const std::string& role, const std::string& port,
                                           std::map<std::string, std::string> more = {}) {
  more["TROUPE_JOB_TOKEN"] = job_token;
  return node_env(role, 1, 1, port, std::move(more));
}

/// Resident memory of process `pid` in bytes (VmRSS of /proc/<pid>/status).
std::uint64_t vm_rss_of(pid_t pid) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);)
    if (line.starts_with("VmRSS:"))
      return std::stoull(line.substr(6)) * 1024;
  return 0;
}

/// An init of `key` declaring a float32 value of `declared` bytes, whose chunk carries `floats`
/// from byte `offset`.
wire::init init_request(std::uint64_t request_id, std::uint64_t key, std::uint64_t declared,
                        const std::vector<float>& floats, std::uint64_t offset = 0) {
  wire::init init;
  init.request_id = request_id;
  init.key = key;
  init.tensor.type = wire::dtype::float32;
  init.tensor.shape = {static_cast<std::int64_t>(declared / sizeof(float))};
  init.tensor.total_bytes = declared;
  init.tensor.offset = offset;
  init.tensor.data = std::as_bytes(std::span(floats));
  return init;
}

/// init_request's frame: about 100 bytes.
std::vector<std::byte> init_frame(std::uint64_t request_id, std::uint64_t key,
                                  std::uint64_t declared, const std::vector<float>& floats,
                                  std::uint64_t offset = 0) {
  return wire::encode(init_request(request_id, key, declared, floats, offset)).flatten();
}

/// Sends `frames`, then a pull of `key` (which the shard of `key` answers after them, as it takes
/// a connection's requests in order), and returns the replies up to the pull's.
std::vector<wire::message> send_then_sync(raw_peer& peer,
                                          const std::vector<std::vector<std::byte>>& frames,
                                          std::uint64_t key, std::uint64_t pull_id) {
  for (const auto& frame : frames)
    BOOST_TEST_REQUIRE(peer.send(frame));
  BOOST_TEST_REQUIRE(peer.send(wire::encode(wire::pull_request{pull_id, key, 0, 0, 0}).flatten()));
  std::vector<wire::message> replies;
  for (;;) {
    auto reply = peer.receive_reply();
    BOOST_TEST_REQUIRE(reply.has_value(), "the server did not answer pull " << pull_id);
    replies.push_back(*reply);
    if (wire::request_id_of(*reply) == pull_id)
      return replies;
  }
}

/// The error reply to request `id` among `replies`, if any.
std::optional<wire::error_reply> error_to(const std::vector<wire::message>& replies,
                                          std::uint64_t id) {
  for (const auto& reply : replies)
    if (const auto* error = std::get_if<wire::error_reply>(&reply);
        error && error->request_id == id)
      return *error;
  return std::nullopt;
}

bool says(const std::optional<wire::error_reply>& error, std::string_view part) {
  return error && error->message.find(part) != std::string::npos;
}

constexpr std::uint64_t key = 777'777, other_key = 777'778;

/// The scheduler and the server of a job of 1 worker, the server with a key budget of 6 GiB (one
/// init of 4 GiB fits, two do not: the budget shows which are held) and `server_args`, its data
/// port known, and the test as its worker 0, whose connections send 4 GiB inits of 64 bytes.
struct job_under_attack {
  explicit job_under_attack(std::vector<std::string> server_args = {})
      : scheduler{node_path, {}, job_env("scheduler", port)},
        server{node_path, with_budget(std::move(server_args)),
               job_env("server", port,
                       {{"PORT", std::to_string(data_port)}, {"TROUPE_SUMMARY", "true"}})} {}

  static std::vector<std::string> with_budget(std::vector<std::string> args) {
    args.insert(args.end(), {"--max-store-bytes", "6GiB"});
    return args;
  }

  /// Sends init `id` of `of` (4 GiB declared, `first` from byte `offset`) and a pull of `of`
  /// behind it; returns the replies up to the pull's.
  std::vector<wire::message> init_4_gib(raw_peer& by, std::uint64_t id, std::uint64_t of,
                                        std::uint64_t offset = 0) {
    return send_then_sync(by, {init_frame(id, of, 4 * gib, first, offset)}, of, id + 1);
  }

  /// Sends 4 GiB inits of other_key by `by` until one is taken (an earlier init left the key
  /// budget), waiting at most 30 s; each refusal must name data.max_store_bytes.
  void await_budget_for_other_key(raw_peer& by, const char* holder) {
    const auto deadline = clock_type::now() + 30s;
    for (;;) {
      const auto refused = error_to(init_4_gib(by, next_id, other_key), next_id);
      next_id += 2;
      if (!refused)
        return;
      BOOST_TEST_REQUIRE(says(refused, "(data.max_store_bytes)"), refused->message);
      BOOST_TEST_REQUIRE((clock_type::now() < deadline),
                         holder << " still holds the key budget after 30 s");
      std::this_thread::sleep_for(100ms);
    }
  }

  /// A connection of the job's worker 0 to the server's data port, through the link handshake.
  /// Retries, bounded, while the server is still starting.
  raw_peer member() {
    const auto deadline = clock_type::now() + 30s;
    for (;;) {
      raw_peer peer(data_port);
      if (insider.handshake(peer))
        return peer;
      BOOST_TEST_REQUIRE((clock_type::now() < deadline), "no handshake with the server's data port "
                                                             << data_port << " within 30 s");
      std::this_thread::sleep_for(50ms);
    }
  }

  /// The job itself, by its worker on a fresh connection: a key of 16 ones initialised, the
  /// `test` optimizer (rescale_grad 2), and 20 dist_sync rounds pushing r + 1 in round r, each
  /// followed by a pull that must read exactly 1 + 2 (1 + ... + (r + 1)). Then the worker is done,
  /// every process exits 0, and the server's summary counts `dropped` unfinished inits.
  void finish_exactly(int dropped) {
    constexpr std::uint64_t trained = 5;
    auto worker = member();
    std::uint64_t id = 10'000;
    auto acked = [&](const wire::message& answer, const char* what) {
      BOOST_TEST_REQUIRE(std::holds_alternative<wire::ack>(answer),
                         what << ": a " << wire::kind_name(answer) << " "
                              << (std::holds_alternative<wire::error_reply>(answer)
                                      ? std::get<wire::error_reply>(answer).message
                                      : std::string{}));
    };
    acked(ask(worker, init_request(++id, trained, 64, first)), "init");
    acked(ask(worker, wire::set_optimizer{++id, "test", {{"rescale_grad", 2.0}}}), "set_optimizer");
    double expected = 1;
    for (std::uint64_t round = 0; round < 20; ++round) {
      const std::vector<float> pushed(16, static_cast<float>(round + 1));
      wire::tensor_chunk tensor;
      tensor.type = wire::dtype::float32;
      tensor.shape = {16};
      tensor.total_bytes = 64;
      tensor.data = std::as_bytes(std::span(pushed));
      acked(ask(worker, wire::push{++id, trained, 0, round, tensor}), "push");
      expected += 2.0 * static_cast<double>(round + 1);
      const auto answer = ask(worker, wire::pull_request{++id, trained, 0, round + 1, 0});
      const auto* value = std::get_if<wire::pull_reply>(&answer);
      BOOST_TEST_REQUIRE(value != nullptr,
                         "pull of round " << round << ": a " << wire::kind_name(answer));
      std::vector<float> got(16);
      BOOST_TEST_REQUIRE(value->tensor.data.size() == 64u);
      std::memcpy(got.data(), value->tensor.data.data(), 64);
      for (float v : got)
        BOOST_TEST_REQUIRE(v == static_cast<float>(expected), "round " << round);
    }
    worker.close();
    insider.done();
    for (auto* node : {&server, &scheduler}) {
      auto result = node->wait(60s);
      BOOST_TEST(!result.timed_out);
      BOOST_TEST(result.exit_code == 0, result.err);
      if (node == &server)
        BOOST_TEST(count_lines(result.err, std::to_string(dropped) + " unfinished inits dropped") ==
                       1u,
                   result.err);
    }
  }

  const std::string port = std::to_string(free_port());
  const std::uint16_t data_port = free_port();
  child_process scheduler;
  child_process server;
  insider_worker insider{static_cast<std::uint16_t>(std::stoi(port)), job_token, 0};
  const std::vector<float> first = std::vector<float>(16, 1.0f);
  std::uint64_t next_id = 100;
};

} // namespace

BOOST_AUTO_TEST_SUITE(store_memory_across_processes)

BOOST_AUTO_TEST_CASE(
    a_short_init_declaring_4_gib_costs_the_server_little_and_nothing_once_it_leaves) {
  // Issue 22: one init frame of about 100 bytes that declares a 4 GiB value. Measured on this
  // test before the change (the value then came from the pre-faulting pool): the server's VmRSS
  // went from 17 MiB to 3.1 GiB in the 5 s the peer waited for the answer to its pull, still
  // growing toward the declared 4 GiB, and that pull got no answer in time. After it: 17.2 MiB to
  // 17.3 MiB.
  job_under_attack job;
  auto attacker = job.member();
  const auto before = vm_rss_of(job.server.pid());
  BOOST_TEST_REQUIRE(before > 0u);
  auto answered = job.init_4_gib(attacker, 1, key);
  // No answer to the init (it waits for its bytes); the pull behind it finds no value yet.
  BOOST_TEST(!error_to(answered, 1).has_value());
  BOOST_TEST(says(error_to(answered, 2), "pull of key 777777, which was never initialised"));
  const auto during = vm_rss_of(job.server.pid());
  BOOST_TEST_MESSAGE("server VmRSS " << before << " bytes before the init, " << during
                                     << " with it under way");
  BOOST_TEST(during < before + (std::uint64_t{64} << 20),
             "the server grew from " << before << " to " << during << " bytes");

  // The attack holds: the init is under way in the key budget, and no other connection (another
  // of worker 0's own) may continue it.
  auto bystander = job.member();
  answered = job.init_4_gib(bystander, 3, other_key);
  BOOST_TEST(says(error_to(answered, 3),
                  "init of key 777778: its 4294967296 bytes would take this server's keys from "
                  "4294967296 to more than their budget of 6442450944 bytes "
                  "(data.max_store_bytes)"),
             (error_to(answered, 3) ? error_to(answered, 3)->message : "no error"));
  answered = job.init_4_gib(bystander, 5, key, job.first.size() * sizeof(float));
  BOOST_TEST(says(error_to(answered, 5), "init of key 777777: another connection began it (64 of "
                                         "4294967296 bytes arrived)"));

  // The attacker leaves: its init is dropped, its budget back (the server hears of the close on
  // its own time), and nothing of it stays in the server's memory.
  attacker.close();
  job.await_budget_for_other_key(bystander, "the init of a member that left");
  BOOST_TEST(vm_rss_of(job.server.pid()) < before + (std::uint64_t{64} << 20));
  bystander.close();
  // Both unfinished inits (the attacker's, and the bystander's 4 GiB one) were dropped as their
  // connections closed.
  job.finish_exactly(2);
}

BOOST_AUTO_TEST_CASE(an_init_whose_member_stays_connected_and_silent_is_dropped_as_stalled) {
  // timeouts.stalled_frame of 2 s: the member keeps its connection open and sends nothing more.
  job_under_attack job{{"--stalled-frame-timeout", "2s"}};
  auto attacker = job.member();
  BOOST_TEST(!error_to(job.init_4_gib(attacker, 1, key), 1).has_value());
  auto bystander = job.member();
  job.await_budget_for_other_key(bystander, "a stalled init");
  // The attacker is still connected, and its init is gone: its next chunk, which would continue
  // an init under way without an answer, is refused as the start of a new one (here by the
  // budget the bystander now holds).
  const auto refused =
      error_to(job.init_4_gib(attacker, 3, key, job.first.size() * sizeof(float)), 3);
  BOOST_TEST(says(refused, "init of key 777777: "), (refused ? refused->message : "no error"));
  attacker.close();
  bystander.close();
  // Two dropped as they stalled: the attacker's, and the bystander's that took its budget.
  job.finish_exactly(2);
}

BOOST_AUTO_TEST_SUITE_END()
