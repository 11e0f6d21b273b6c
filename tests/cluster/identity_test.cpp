// Who a node of a live job is, across processes (docs/RELIABILITY.md, "Who may talk to a job"):
// troupe-node schedulers and servers and kv_worker workers, all real, on 127.0.0.1. The test
// process plays the attackers: a holder of the job's token with no node key, and an insider, a
// node agent admitted as one worker (a compromised worker), who tries to act as another or for
// the whole job on every server's data port while the real workers train. Every wait is bounded;
// every process is stopped by its PID.

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/logic/key_placement.hpp"
#include "actors/logic/node_identity.hpp"
#include "tests/cluster/insider.hpp"
#include "tests/cluster/process_support.hpp"
#include "tests/raw_peer.hpp"

using namespace troupe::testing;
namespace wire = troupe::wire;

namespace {

const std::string node_path = TROUPE_NODE_PATH;
const std::string worker_path = TROUPE_KV_WORKER_PATH;

constexpr const char* token = "identity test token";

/// The job of these cases: a scheduler and 2 servers on scheduler port `port`, with the job's
/// token and `more`, for `workers` workers; started and listening.
struct job_nodes {
  job_nodes(const std::string& port, int workers, std::map<std::string, std::string> more = {})
      : env(std::move(more)), scheduler{
                                  node_path, {}, node_env("scheduler", workers, 2, port, env)} {
    for (int i = 0; i < 2; ++i)
      servers.push_back(std::make_unique<child_process>(node_path, std::vector<std::string>{},
                                                        node_env("server", workers, 2, port, env)));
    for (const pid_t pid : {scheduler.pid(), servers[0]->pid(), servers[1]->pid()})
      await_listening(pid);
  }

  std::map<std::string, std::string> env;
  child_process scheduler;
  std::vector<std::unique_ptr<child_process>> servers;
};

std::map<std::string, std::string> with_token(std::map<std::string, std::string> env = {}) {
  env["TROUPE_JOB_TOKEN"] = token;
  return env;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

} // namespace

BOOST_AUTO_TEST_SUITE(node_identity_across_processes)

BOOST_AUTO_TEST_CASE(
    an_insider_admitted_as_one_worker_cannot_act_as_another_and_values_stay_exact) {
  // A dist_sync job of 3 workers with a quorum of 2: kv_worker ranks 0 and 1 train, and the test
  // registers as worker 2 (its node agent: a real admission, a real node key), which never
  // pushes. Once the keys are initialised, and before the workers may train (they wait at the
  // barrier after set_optimizer, which the insider joins only after the attack), on each
  // server's data port: a token holder without a node key is refused; the insider claiming
  // worker 1 with its own key is refused; as worker 2 it gets in, and then every push, pull and
  // pushpull it sends as worker 1 (pushes of round 0 and two rounds ahead among them, which,
  // taken, would make worker 1's own pushes of those rounds fail), the set_optimizer
  // with a learning rate of 10^6, sync settings, a checkpoint command and an init are refused
  // naming the rule, while its pull as itself is answered (the requests do reach the server).
  // The workers then train and check the closed form 2 (i+1) (1 + 2) + 1 after every round:
  // exact.
  const auto port = std::to_string(free_port());
  job_nodes nodes(port, 3, with_token());
  const auto worker_env = with_token();
  auto workers =
      kv_workers_beside_insider(worker_path, 150, 2, node_env("worker", 3, 2, port, worker_env));

  insider_worker insider(static_cast<std::uint16_t>(std::stoi(port)), token, 2);
  const auto& key = insider.key();
  // The insider keeps in step with the workers' barriers: after init (rank 0 has initialised the
  // keys), then after set_optimizer once the attack is over; then the workers train.
  insider.barrier();

  // Key 1 (2 x 3 values) lives whole on one server, as this ps-key.
  const auto placed = troupe::place_key(1, 6, 2, 1'000'000).front();
  const std::vector<float> forged(6, 1e6f);
  wire::tensor_chunk tensor;
  tensor.type = wire::dtype::float32;
  tensor.shape = {2, 3};
  tensor.total_bytes = sizeof(float) * forged.size();
  tensor.data = std::as_bytes(std::span(forged));
  const wire::node_identity worker_1{wire::role::worker, 1}, worker_2{wire::role::worker, 2};

  std::size_t servers_attacked = 0;
  const auto server_ports = insider.server_ports();
  for (std::uint32_t server = 0; server < server_ports.size(); ++server) {
    const std::uint16_t data_port = server_ports[server];
    ++servers_attacked;
    BOOST_TEST_CONTEXT("server " << server << " at port " << data_port) {
      {
        // The token without a node key: no handshake.
        raw_peer stranger(data_port);
        auto theirs = stranger.server_hello();
        BOOST_TEST_REQUIRE(theirs.has_value());
        BOOST_TEST_REQUIRE(
            stranger.send(wire::encode(raw_peer::connector_hello(*theirs, token)).flatten()));
        auto answer = stranger.receive_frame();
        BOOST_TEST_REQUIRE((answer && std::holds_alternative<wire::error_reply>(*answer)));
        BOOST_TEST(contains(std::get<wire::error_reply>(*answer).message, "proves no node key"));
        BOOST_TEST(stranger.sees_close());
      }
      {
        // Its own key, claiming worker 1.
        raw_peer impostor(data_port);
        BOOST_TEST(!impostor.handshake_as(worker_1, key, token).has_value());
        BOOST_TEST(contains(impostor.refusal, "the node key of worker 1 is wrong"),
                   impostor.refusal);
      }
      raw_peer peer(data_port);
      BOOST_TEST_REQUIRE(peer.handshake_as(worker_2, key, token).has_value(), peer.refusal);
      const std::uint64_t ps_key = placed.ps_key;
      const std::vector<std::pair<wire::message, const char*>> forgeries = {
          {wire::push{1, ps_key, 1, 0, tensor}, "as worker 1 on a connection that proved worker 2"},
          {wire::push{2, ps_key, 1, 2, tensor}, "as worker 1 on a connection that proved worker 2"},
          {wire::pull_request{3, ps_key, 1, 0, 0},
           "as worker 1 on a connection that proved worker 2"},
          {wire::pushpull{4, ps_key, 1, 4, tensor, 0},
           "as worker 1 on a connection that proved worker 2"},
          {wire::set_optimizer{5, "sgd", {{"learning_rate", 1e6}}}, "only worker rank 0"},
          {wire::sync_settings{6, wire::consistency_mode::async, 1, false, -1, 2},
           "only worker rank 0"},
          {wire::command{7, wire::command_kind::save_checkpoint, "stolen"}, "only worker rank 0"},
          {wire::init{8, ps_key + 7, tensor}, "only worker rank 0"},
      };
      for (const auto& [request, rule] : forgeries) {
        BOOST_TEST_CONTEXT(wire::kind_name(request) << " " << wire::request_id_of(request)) {
          const auto answer = ask(peer, request);
          const auto* refused = std::get_if<wire::error_reply>(&answer);
          BOOST_TEST_REQUIRE(refused != nullptr, "a " << wire::kind_name(answer));
          BOOST_TEST((refused->code == wire::error_code::not_permitted), refused->message);
          BOOST_TEST(contains(refused->message, rule), refused->message);
        }
      }
      // The control: as itself, the insider is served (on the server that holds the key).
      if (server == placed.server) {
        const auto answer = ask(peer, wire::pull_request{9, ps_key, 2, 0, 0});
        BOOST_TEST(std::holds_alternative<wire::pull_reply>(answer), wire::kind_name(answer));
      }
    }
  }
  BOOST_TEST(servers_attacked == 2u);
  insider.barrier();

  for (auto& worker : workers) {
    auto result = worker->wait(180s);
    BOOST_TEST(!result.timed_out);
    BOOST_TEST(result.exit_code == 0, result.err);
    BOOST_TEST(count_lines(result.out, "sync checks hold for 2 keys over 150 rounds") == 1u,
               result.out);
  }
  // The insider says done too: the job ends as one of 3 workers that all finished.
  insider.done();
  for (auto* node : {&nodes.scheduler, nodes.servers[0].get(), nodes.servers[1].get()}) {
    auto result = node->wait(60s);
    BOOST_TEST(!result.timed_out);
    BOOST_TEST(result.exit_code == 0, result.err);
  }
}

BOOST_AUTO_TEST_CASE(a_node_with_a_wrong_token_exits_saying_the_token_is_wrong) {
  // Not "the scheduler was lost": the scheduler's answer, naming its address and the proof.
  const auto port = std::to_string(free_port());
  child_process scheduler{node_path, {}, node_env("scheduler", 1, 1, port, with_token())};
  await_listening(scheduler.pid());
  const std::map<std::string, std::string> wrong{{"TROUPE_JOB_TOKEN", "not the job's token"}};
  child_process worker{worker_path, {"--check", "sync"}, node_env("worker", 1, 1, port, wrong)};
  child_process server{node_path, {}, node_env("server", 1, 1, port, wrong)};
  for (auto* node : {&worker, &server}) {
    auto refused = node->wait(60s);
    BOOST_TEST(!refused.timed_out);
    BOOST_TEST(refused.exit_code != 0);
    BOOST_TEST(contains(refused.err, "refused by the scheduler at 127.0.0.1:" + port +
                                         ": the job token is wrong"),
               refused.err);
    BOOST_TEST(!contains(refused.err, "was lost"), refused.err);
    BOOST_TEST(!contains(refused.err, "not the job's token"), refused.err);
  }
}

BOOST_AUTO_TEST_SUITE_END()
