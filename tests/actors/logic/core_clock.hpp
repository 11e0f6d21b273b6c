#pragma once
// The clock and the last answer of a test that drives one of actors/logic's cores by hand: the
// cores are plain classes that take the time as an argument, so a test moves the clock itself,
// then calls the core and keeps what it answered.

#include <chrono>
#include <utility>
#include <variant>
#include <vector>

namespace troupe::testing {

template <class Actions, class Clock>
struct core_clock {
  /// An hour past the clock's epoch, so that a test's "earlier" never falls before it.
  typename Clock::time_point now = typename Clock::time_point{} + std::chrono::hours{1};
  /// The actions of the last call.
  Actions last;

  /// The last call's actions of kind T.
  template <class T>
  std::vector<T> actions_of() const {
    std::vector<T> found;
    for (const auto& action : last)
      if (const auto* typed = std::get_if<T>(&action))
        found.push_back(*typed);
    return found;
  }

  /// Moves the clock by `elapsed`, then calls `call(now)` and keeps its answer in `last`.
  template <class Call>
  const Actions& after(std::chrono::milliseconds elapsed, Call&& call) {
    now += elapsed;
    last = std::forward<Call>(call)(now);
    return last;
  }
};

} // namespace troupe::testing
