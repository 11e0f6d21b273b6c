// device_actors: the dependency engine with device actors. While a device_scope lives, every
// operation on an ndarray is queued on its context's device actor (one CAF actor, one thread, per
// cpu(i) or gpu(i)) and the call returns at once; a read waits for the writes before it, and an
// error inside queued work is thrown at the wait, naming the operation and the context.
//
// Build against an installed troupe (docs/embedding.md):
//   cmake -S examples -B build-examples -DCMAKE_PREFIX_PATH=<prefix>
//   cmake --build build-examples
// Run:
//   build-examples/device_actors
// It prints
//   device_actors: y[0] = 392 (784 ones times 0.5), computed on cpu(1)'s device actor
// and, on one line,
//   device_actors: the int32 input failed at the wait: not_supported: FullyConnected on cpu(1):
//   FullyConnected: input 'data' is int32; operators compute on float32
// then exits 0; 1 when a step does not behave so.

#include <iostream>

// README devices {
#include "actors/device_actors.hpp"
#include "engine/nd.hpp"
using namespace troupe;

// README devices }

int main() {
  try {
    // README devices {
    troupe::device_scope devices; // until the end of the scope
    auto x = ndarray::ones({64, 784}, context::cpu(1));
    auto w = ndarray::full({256, 784}, 0.5, context::cpu(1));
    auto b = ndarray::zeros({256}, context::cpu(1));
    auto y = nd::fully_connected(x, w, b, 256); // queued on cpu(1); returns at once
    y.wait_to_read();                           // or to_vector, data<T>(): they wait
    engine::waitall();                          // every context; throws a queued error
    // README devices }
    std::cout << "device_actors: y[0] = " << y.to_vector<float>()[0]
              << " (784 ones times 0.5), computed on cpu(1)'s device actor\n";

    // FullyConnected takes float32 only: the queued work fails, and says so at the wait.
    auto ints = ndarray::ones({64, 784}, context::cpu(1), dtype::int32);
    auto failed = nd::fully_connected(ints, w, b, 256);
    try {
      failed.wait_to_read();
      std::cerr << "device_actors: FullyConnected on int32 input did not fail\n";
      return 1;
    } catch (const troupe::exception& queued) {
      std::cout << "device_actors: the int32 input failed at the wait: " << queued.what() << "\n";
    }
    return 0;
  } catch (const troupe::exception& failure) {
    std::cerr << "device_actors: " << failure.what() << "\n";
    return 1;
  }
}
