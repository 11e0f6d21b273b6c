#pragma once
// A compromised worker, for the attack tests of a live job: the test process joins the job as one
// of its workers through a real node agent (a real admission, so a real node key, sealed in it)
// and then speaks to the servers' data ports as that worker with raw_peer, byte by byte. What it
// can do there is what a worker whose program has a bug, or whose host was taken over, can do.
//
// The other workers are tests/cluster/kv_worker processes. An insider of rank R never pushes, so
// they run with `--absent R` and a quorum that lets rounds close without it (`--quorum W-1`), and
// it keeps in step with their barriers (barrier(): kv_worker passes one after its keys are
// initialised and one after set_optimizer). The job ends as usual once it says it is done (done()).
//
// join() returns once every node of the job has registered, so the kv_workers must be started
// first; rank 0 of the job initialises its keys before its first barrier.

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>

#include "actors/node_agent.hpp"
#include "tests/cluster/process_support.hpp"
#include "tests/raw_peer.hpp"

namespace troupe::testing {

class insider_worker {
public:
  /// Joins the job whose scheduler listens on 127.0.0.1:`scheduler_port` with `token`, as worker
  /// `rank` (which must be free). Fails the test when it is not admitted within `limit`.
  insider_worker(std::uint16_t scheduler_port, std::string token, std::uint32_t rank,
                 std::chrono::milliseconds limit = std::chrono::seconds{60})
      : token_(std::move(token)), who_{wire::role::worker, rank} {
    agent_options joining;
    joining.scheduler_port = scheduler_port;
    joining.role = wire::role::worker;
    joining.job_id = "troupe";
    joining.auth_token = token_;
    joining.rank_hint = static_cast<std::int32_t>(rank);
    joining.startup_timeout = limit;
    auto joined = node_agent::join(side_.sys, joining);
    BOOST_TEST_REQUIRE(joined.has_value(), (joined ? "" : joined.error().to_string()));
    agent_ = std::move(*joined);
    BOOST_TEST_REQUIRE(agent_->rank() == rank, "admitted as worker " << agent_->rank());
    BOOST_TEST_REQUIRE(!agent_->key().empty());
    key_ = agent_->key();
  }
  insider_worker(const insider_worker&) = delete;
  insider_worker& operator=(const insider_worker&) = delete;

  const wire::node_identity& who() const noexcept { return who_; }
  const node_key& key() const noexcept { return key_; }
  const std::string& token() const noexcept { return token_; }

  /// The data ports of the job's servers, by server rank.
  std::vector<std::uint16_t> server_ports() const {
    std::vector<std::uint16_t> ports;
    for (const auto& node : agent_->membership().nodes)
      if (node.node_role == wire::role::server) {
        if (ports.size() <= node.rank)
          ports.resize(node.rank + std::size_t{1});
        ports[node.rank] = node.data_port;
      }
    return ports;
  }

  /// The link handshake of this worker on `peer` (connected to a server's data port): the token
  /// and its own node key proven, the server's proofs checked.
  bool handshake(raw_peer& peer, std::uint64_t window = 0) const {
    return peer.connected && peer.handshake_as(who_, key_, token_, window).has_value();
  }

  /// The workers' next barrier; fails the test when it is not released within `limit`.
  void barrier(std::chrono::milliseconds limit = std::chrono::seconds{120}) {
    auto passed = agent_->barrier(wire::group::workers, limit);
    BOOST_TEST_REQUIRE(passed.has_value(), (passed ? "" : passed.error().to_string()));
  }

  /// Says this worker is done, as every worker does at its end: the job ends once every worker
  /// is. Its key stays usable, so attackers may go on until the servers stop.
  void done(std::chrono::milliseconds limit = std::chrono::seconds{60}) {
    auto said = agent_->notify_done(limit);
    BOOST_TEST(said.has_value(), (said ? "" : said.error().to_string()));
  }

private:
  /// The actor system the node agent lives in, of the test's own.
  struct node_side {
    struct config : caf::actor_system_config {
      config() { load<caf::io::middleman>(); }
    };
    config cfg;
    caf::actor_system sys{cfg};
  };

  node_side side_;
  std::string token_;
  wire::node_identity who_;
  std::unique_ptr<node_agent> agent_;
  node_key key_;
};

/// The kv_workers of a job of 3 workers whose third, rank `insider_rank`, is an insider: the
/// other two, each running `kv_worker --check sync --rounds R` on two keys (2x3 and 1211x1211:
/// the big one travels in 1 MiB chunks) with a quorum of 2 and the insider absent, in the
/// environment `env` (the job's node_env for a worker).
inline std::vector<std::unique_ptr<child_process>>
kv_workers_beside_insider(const std::string& worker_path, int rounds, std::uint32_t insider_rank,
                          const std::map<std::string, std::string>& env) {
  std::vector<std::unique_ptr<child_process>> workers;
  for (int i = 0; i < 2; ++i)
    workers.push_back(std::make_unique<child_process>(
        worker_path,
        std::vector<std::string>{"--check", "sync", "--rounds", std::to_string(rounds), "--shapes",
                                 "2x3,1211x1211", "--quorum", "2", "--absent",
                                 std::to_string(insider_rank)},
        env));
  return workers;
}

/// Sends `request` on `peer` and returns the answer (link credits skipped), which must come.
inline wire::message ask(raw_peer& peer, const wire::message& request) {
  BOOST_TEST_REQUIRE(peer.send(wire::encode(request).flatten()));
  auto reply = peer.receive_reply();
  BOOST_TEST_REQUIRE(reply.has_value(), "no answer to a " << wire::kind_name(request));
  return *reply;
}

} // namespace troupe::testing
