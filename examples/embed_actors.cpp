// embed_actors: troupe's actors inside a host application's own CAF actor system. A program that
// already runs CAF 0.17 does not need a second actor system for troupe: here a parameter server
// (its shards and control actor), a worker of a dist_sync store linked to it in-process, and the
// engine's device actors all run in the host's system, next to an actor of the host's own that
// checks what the store pulls.
//
// Build against an installed troupe (docs/embedding.md):
//   cmake -S examples -B build-examples -DCMAKE_PREFIX_PATH=<prefix>
//   cmake --build build-examples
// Run:
//   build-examples/embed_actors
// It prints
//   embed_actors: 2 pushed gradients summed on the server: 3 in every element
//   embed_actors: 10 actors running in the host's actor system
// (the count depends on how many shards and device contexts did work) and exits 0; 1, with the
// reason on stderr, when a call fails or the host's actor finds a wrong value.

#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/device_actors.hpp"
#include "actors/kvstore/dist_kvstore.hpp"
#include "actors/server_node.hpp"

using namespace troupe;

namespace {

/// The host's own actor: given a pulled value and what it should be, answers with a line saying
/// whether every element is that value.
caf::behavior value_checker(caf::event_based_actor*) {
  return {[](const std::vector<float>& values, float expected) {
    for (float value : values)
      if (value != expected)
        return "an element is " + std::to_string(value) + ", not " + std::to_string(expected);
    return std::string{};
  }};
}

int run() {
  // The host's actor system, configured as the host likes; troupe needs nothing of it.
  caf::actor_system_config config;
  caf::actor_system system{config};
  auto checker = system.spawn(value_checker);

  // The engine's device actors (cpu(0), cpu(1), ... as arrays use them) in the host's system.
  device_scope devices{system};

  // A parameter server of two shards, and a dist_sync worker whose requests reach it through an
  // in-process link: the same actors as across the network, minus the sockets.
  server_node_options server_options;
  server_options.shards = 2;
  server_node server{system, server_options};
  worker_setup setup;
  setup.system = &system;
  setup.type = "dist_sync";
  setup.connect_servers = [&](const caf::actor& worker) -> result<server_links> {
    server_links links;
    links.links.push_back(
        spawn_local_link(system, server.router(), caf::actor_cast<reply_sink>(worker)));
    return links;
  };
  setup.barrier = [] { return status{}; }; // one worker: nobody to wait for
  auto store = dist_kvstore::create(std::move(setup)).value();

  // No optimizer: the sum of the pushed list replaces the stored value.
  store->init(7, ndarray::zeros({4})).value();
  store->push(7, {ndarray::ones({4}, context::cpu(0)), ndarray::full({4}, 2.0, context::cpu(1))})
      .value();
  auto pulled = ndarray::zeros({4});
  store->pull(7, pulled).value();

  std::string problem = "the host's actor did not answer";
  caf::scoped_actor self{system};
  self->request(checker, std::chrono::seconds{10}, pulled.to_vector<float>(), 3.0f)
      .receive([&](const std::string& answer) { problem = answer; },
               [&](const caf::error& failure) { problem += ": " + system.render(failure); });
  if (!problem.empty()) {
    std::cerr << "embed_actors: " << problem << "\n";
    return 1;
  }
  std::cout << "embed_actors: 2 pushed gradients summed on the server: 3 in every element\n"
            << "embed_actors: " << system.registry().running()
            << " actors running in the host's actor system\n";

  // The store, then the server, then the device actors stop (reverse order of declaration); the
  // host's own actor is the host's to stop.
  self->send_exit(checker, caf::exit_reason::user_shutdown);
  return 0;
}

} // namespace

int main() {
  try {
    return run();
  } catch (const troupe::exception& failure) {
    std::cerr << "embed_actors: " << failure.what() << "\n";
    return 1;
  }
}
