#pragma once
// Waiting in a test for something another thread or process does: the condition is polled until
// it holds or `within` has passed (a generous bound: the suite runs on 2 loaded cores and under
// AddressSanitizer). The pause between polls orders nothing; the caller asserts the returned
// value, so a condition that never comes fails the test, with no fixed sleep standing in for the
// event.

#include <chrono>
#include <thread>

namespace troupe::testing {

/// True once `condition()` holds, false if it still does not after `within`.
template <class Condition>
bool poll_until(Condition&& condition, std::chrono::milliseconds within) {
  const auto deadline = std::chrono::steady_clock::now() + within;
  while (!condition()) {
    if (std::chrono::steady_clock::now() >= deadline)
      return condition();
    std::this_thread::sleep_for(std::chrono::milliseconds{1});
  }
  return true;
}

} // namespace troupe::testing
