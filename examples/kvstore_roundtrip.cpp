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
// into the one update: -0.4. Then it pushes twice under 2bit gradient compression and prints
//   kvstore_roundtrip: device store, rank 0: pulled -0.05 after two 2bit pushes of 0.3, expected
//   -0.05
// (alone, a `device` store; in the job -0.1 on each worker, the two workers' pushes summed).
// Between the two, a row_sparse key of 1000 rows of which each worker pushes rows 2 and 7:
//   kvstore_roundtrip: local store, rank 0: pulled rows 2 and 7 of 1000 at -0.1 after a
//   row_sparse push, expected -0.1
// (-0.2 in the job).

#include <cmath>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "actors/dist_job.hpp"
// README kvstore {
#include "actors/kvstore/kvstore.hpp"
using namespace troupe;

// README kvstore }

namespace {

/// Prints "kvstore_roundtrip: <type> store, rank <r><before><first value><after>, expected <e>"
/// and checks every pulled value against `expected` (within `tolerance`); false, naming the first
/// `element` value that differs, when one does.
bool pulled_as_expected(const kvstore& kv, const std::vector<float>& values, const char* before,
                        const char* after, float expected, const char* element,
                        float tolerance = 0.0f) {
  std::cout << "kvstore_roundtrip: " << kv.type() << " store, rank " << kv.rank() << before
            << values[0] << after << ", expected " << expected << "\n";
  for (float value : values)
    if (value != expected && !(std::abs(value - expected) <= tolerance)) {
      std::cerr << "kvstore_roundtrip: an element of the pulled " << element << " is " << value
                << "\n";
      return false;
    }
  return true;
}

/// `check()`, or 1 with the reason on stderr when one of its calls failed (.value() of an error).
template <class Check>
int reporting_failures(Check&& check) {
  try {
    return check();
  } catch (const troupe::exception& failure) {
    std::cerr << "kvstore_roundtrip: " << failure.what() << "\n";
    return 1;
  }
}

/// init, push and pull of one key on a store of `type`: the store when the pulled value is the
/// one SGD step the pushed gradients make, else null.
std::unique_ptr<kvstore> round_trip(const char* type) {
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
    const auto of_workers = " of " + std::to_string(kv->num_workers()) + ": pulled ";
    if (!pulled_as_expected(*kv, weight.to_vector<float>(), of_workers.c_str(),
                            " after one SGD step", expected, "weight", 1e-6f))
      return nullptr;
    return kv;
  } catch (const troupe::exception& failure) {
    std::cerr << "kvstore_roundtrip: " << failure.what() << "\n";
    return nullptr;
  }
}

/// Gradient compression on `kv` (a device store alone, the job's dist_sync store), SGD in the
/// store: two pushes of 0.3 under 2bit with threshold 0.5; 0 when the pulled value is what MXNet's
/// rule gives.
int compressed_round_trip(const std::unique_ptr<kvstore>& kv) {
  return reporting_failures([&] {
    kv->init("bias", ndarray::zeros({4})).value();
    // README compression {
    kv->set_gradient_compression("2bit", 0.5).value(); // MXNet's rule; "1bit" too
    kv->push("bias", ndarray::full({4}, 0.3)).value(); // 0.3 < 0.5: 0 sent, 0.3 kept
    kv->push("bias", ndarray::full({4}, 0.3)).value(); // 0.6 >= 0.5: +0.5 sent, 0.1 kept
    // README compression }
    auto bias = ndarray::zeros({4});
    kv->pull("bias", bias).value();
    // SGD (momentum 0.9) on the rounds' sums of what the pushes stood for: 0, then 0.5 a worker.
    const float expected = -0.1f * 0.5f * static_cast<float>(kv->num_workers());
    return pulled_as_expected(*kv, bias.to_vector<float>(), ": pulled ",
                              " after two 2bit pushes of 0.3", expected, "bias")
               ? 0
               : 1;
  });
}

/// A row_sparse key on `kv` (with its SGD): every worker pushes ones into rows 2 and 7 of a table
/// of 1000 rows, and pulls back those rows alone; 0 when they hold the SGD step of the sum.
int row_sparse_round_trip(const std::unique_ptr<kvstore>& kv) {
  return reporting_failures([&] {
    // README row_sparse {
    kv->init("embedding", row_sparse_array::zeros({1000, 16})).value();
    auto rows = row_sparse_array::from_rows(ndarray::ones({2, 16}), // the rows' values
                                            std::vector<std::int64_t>{2, 7}, {1000, 16});
    kv->push("embedding", rows.value()).value(); // only rows 2 and 7 travel and are updated
    row_sparse_array pulled;
    kv->row_sparse_pull("embedding", pulled, ndarray::from_values({7, 2, 2}, {3})).value();
    // pulled holds rows 2 and 7 (ids sorted, repeats dropped); every other row reads 0
    // README row_sparse }
    const float expected = -0.1f * static_cast<float>(kv->num_workers());
    const bool as_expected = pulled_as_expected(
        *kv, pulled.data().to_vector<float>(), ": pulled rows 2 and 7 of 1000 at ",
        " after a row_sparse push", expected, "rows", 1e-6f);
    return as_expected && pulled.indices() == std::vector<std::int64_t>{2, 7} ? 0 : 1;
  });
}

/// multi_precision on `kv` (compression off): ten pushes of 1e-4 to a float16 key of ones, SGD
/// with rate 1; 0 when the pulled value is the float32 master copy rounded to float16.
int multi_precision_round_trip(const std::unique_ptr<kvstore>& kv) {
  return reporting_failures([&] {
    // README multi_precision {
    kv->set_optimizer("sgd", {{"learning_rate", 1.0}, {"multi_precision", 1}}).value();
    kv->init("half", ndarray::ones({8}, context::cpu(), dtype::float16)).value();
    const auto step = ndarray::full({8}, 1e-4, context::cpu(), dtype::float16);
    for (int i = 0; i < 10; ++i) // each below float16's spacing at 1: alone, 1 would stay 1
      kv->push("half", step).value();
    auto half = ndarray::zeros({8}, context::cpu(), dtype::float16);
    kv->pull("half", half).value(); // the float32 master copy moved: 0.999 in float16
    // README multi_precision }
    // Every worker's step each round, summed and applied to the float32 master in float32.
    float master = 1.0f;
    const float pushed = step.as_type(dtype::float32).to_vector<float>()[0];
    for (int i = 0; i < 10; ++i)
      master -= static_cast<float>(kv->num_workers()) * pushed;
    const float expected = ndarray::full({1}, master)
                               .as_type(dtype::float16)
                               .as_type(dtype::float32)
                               .to_vector<float>()[0];
    const bool as_expected = pulled_as_expected(
        *kv, half.as_type(dtype::float32).to_vector<float>(), ": pulled ",
        " after ten float16 pushes of 1e-4 with multi_precision", expected, "float16 key");
    if (expected >= 1.0f)
      std::cerr << "kvstore_roundtrip: the float32 master copy did not move below 1\n";
    return as_expected && expected < 1.0f ? 0 : 1;
  });
}

/// The round trips, on the job's dist_sync store or alone on local and device stores.
int round_trips(bool in_job) {
  auto kv = round_trip(in_job ? "dist_sync" : "local");
  if (!kv || row_sparse_round_trip(kv) != 0)
    return 1;
  // A process is one worker of its job: the compressed pushes go through the same store, with
  // its optimizer, which then turns compression off for multi_precision. Alone, a device store
  // (local refuses compression, as MXNet does), and multi_precision on the local store.
  if (in_job) {
    if (compressed_round_trip(kv) != 0 || !kv->set_gradient_compression("none"))
      return 1;
    return multi_precision_round_trip(kv);
  }
  auto device = kvstore::create("device").value();
  device->set_optimizer("sgd", {{"learning_rate", 0.1}, {"momentum", 0.9}}).value();
  if (compressed_round_trip(device) != 0)
    return 1;
  return multi_precision_round_trip(kv);
}

} // namespace

// README serve_if_node_role {
int main(int argc, char** argv) {
  if (auto served = troupe::serve_if_node_role(argc, argv))
    return *served; // this process was the scheduler or a server
  // A worker: of the job troupe-launch started (DMLC_ROLE=worker), or alone with a local store.
  return round_trips(std::getenv("DMLC_ROLE") != nullptr);
}
// README serve_if_node_role }
