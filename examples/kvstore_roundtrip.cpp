// kvstore_roundtrip: the KVStore's init, push and pull, with the optimizer in the store. The same
// code is a single process with a `local` store, or a worker of a `dist_sync` job under
// troupe-launch.
//
// Build against an installed troupe (docs/embedding.md):
//   cmake -S examples -B build-examples -DCMAKE_PREFIX_PATH=<prefix>
//   cmake --build build-examples
// Run alone:
//   build-examples/kvstore_roundtrip
// It prints
//   kvstore_roundtrip: local store, rank 0 of 1: pulled -0.2 after one SGD step, expected -0.2
// and exits 0 (1, with the reason on stderr, when a call fails or an element of the pulled value
// is not the expected one). Run as a job of 2 workers and 1 server:
//   <prefix>/bin/troupe-launch -n 2 -s 1 -- build-examples/kvstore_roundtrip
// each worker prints the same line for the dist_sync store, the gradients of both workers summed
// into the one update: -0.4.

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <vector>

#include "actors/dist_job.hpp"
// README kvstore {
#include "actors/kvstore/kvstore.hpp"
using namespace troupe;

// README kvstore }

namespace {

/// init, push and pull of one key on a store of `type`; 0 when the pulled value is the one SGD
/// step the pushed gradients make.
int round_trip(const char* type) {
  try {
    // README kvstore {
    auto kv = kvstore::create(type).value(); // type: "local", or "dist_sync" in a job
    kv->set_optimizer("sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}}).value();
    kv->init("weight", ndarray::zeros({256, 784})).value();
    std::vector<ndarray> grads{
        ndarray::ones({256, 784}, context::cpu(0)),  // one per device:
        ndarray::ones({256, 784}, context::cpu(1))}; // summed, then the update
    kv->push("weight", grads).value();
    auto weight = ndarray::zeros({256, 784});
    kv->pull("weight", weight).value();
    // README kvstore }

    // Every worker pushed two gradients of ones: the update is -learning_rate times their sum.
    const float expected = -0.1f * 2.0f * static_cast<float>(kv->num_workers());
    const auto values = weight.to_vector<float>();
    std::cout << "kvstore_roundtrip: " << type << " store, rank " << kv->rank() << " of "
              << kv->num_workers() << ": pulled " << values[0] << " after one SGD step, expected "
              << expected << "\n";
    for (float value : values)
      if (std::abs(value - expected) > 1e-6f) {
        std::cerr << "kvstore_roundtrip: an element of the pulled weight is " << value << "\n";
        return 1;
      }
    return 0;
  } catch (const troupe::exception& failure) {
    std::cerr << "kvstore_roundtrip: " << failure.what() << "\n";
    return 1;
  }
}

} // namespace

// README serve_if_node_role {
int main(int argc, char** argv) {
  if (auto served = troupe::serve_if_node_role(argc, argv))
    return *served; // this process was the scheduler or a server
  // A worker: of the job troupe-launch started (DMLC_ROLE=worker), or alone with a local store.
  return round_trip(std::getenv("DMLC_ROLE") ? "dist_sync" : "local");
}
// README serve_if_node_role }
