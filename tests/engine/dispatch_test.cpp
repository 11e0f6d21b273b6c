// The dependency engine (engine/dispatch.hpp) with a backend: contexts run concurrently, reads
// wait for the writes queued before them, a use on another context waits for the last use, errors
// reach the next wait with the operation and the context, and the caller cannot run far ahead.

#include <atomic>
#include <chrono>
#include <future>
#include <string>
#include <thread>

#include <boost/test/unit_test.hpp>

#include "engine/dispatch.hpp"
#include "engine/error.hpp"
#include "engine/nd.hpp"
#include "engine/ndarray.hpp"
#include "tests/engine/lane_threads.hpp"

namespace troupe {
namespace {

using namespace std::chrono_literals;

/// True once `flag` is set, false after `limit`.
bool wait_for_flag(const std::atomic<bool>& flag, std::chrono::milliseconds limit) {
  const auto deadline = std::chrono::steady_clock::now() + limit;
  while (!flag.load()) {
    if (std::chrono::steady_clock::now() > deadline)
      return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

/// Queued work on `ctx` that holds its lane until `release` is set (or 10 s pass).
void hold_lane(context ctx, const std::atomic<bool>& release) {
  engine::push("hold", ctx, {}, [&release] { wait_for_flag(release, 10s); });
}

/// Sets `flag` after `delay` from another thread, joined when the result goes.
std::jthread set_after(std::atomic<bool>& flag, std::chrono::milliseconds delay) {
  return std::jthread([&flag, delay] {
    std::this_thread::sleep_for(delay);
    flag = true;
  });
}

} // namespace

BOOST_AUTO_TEST_SUITE(dispatch)

BOOST_AUTO_TEST_CASE(work_on_two_contexts_runs_at_the_same_time_and_the_caller_goes_on) {
  test::queued_engine queued;
  std::atomic<bool> second_ran{false}, first_saw_it{false};
  const auto started = std::chrono::steady_clock::now();
  // cpu(0) waits for cpu(1): with one thread for both this could only time out.
  engine::push("first", context::cpu(0), {},
               [&] { first_saw_it = wait_for_flag(second_ran, 5000ms); });
  engine::push("second", context::cpu(1), {}, [&] { second_ran = true; });
  // Run inline, the first push alone would take its 5 s wait (and first_saw_it stays false).
  BOOST_TEST((std::chrono::steady_clock::now() - started < 4500ms));
  engine::waitall();
  BOOST_TEST(first_saw_it.load());
}

BOOST_AUTO_TEST_CASE(reading_an_array_waits_for_the_work_queued_on_it) {
  test::queued_engine queued;
  std::atomic<bool> release{false};
  auto a = ndarray::zeros({4}, context::cpu(1));
  hold_lane(context::cpu(1), release);
  a += 7.0;
  auto b = a * 2.0;
  BOOST_TEST(!engine::runs_inline());
  const auto releaser = set_after(release, 50ms);
  BOOST_TEST(b.to_vector<float>() == std::vector<float>(4, 14.0f),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(a_copy_to_another_context_reads_the_source_before_later_writes) {
  test::queued_engine queued;
  std::atomic<bool> release{false};
  auto x = ndarray::ones({1000}, context::cpu(1));
  hold_lane(context::cpu(0), release); // the copy, queued on cpu(0), must wait
  auto y = x.copy_to(context::cpu(0));
  x += 1.0; // on cpu(1), free to run: it must not overtake the copy's read
  auto twice = x * 2.0;
  const auto releaser = set_after(release, 50ms);
  BOOST_TEST(y.to_vector<float>() == std::vector<float>(1000, 1.0f),
             boost::test_tools::per_element());
  BOOST_TEST(twice.to_vector<float>() == std::vector<float>(1000, 4.0f),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(work_on_another_array_of_a_context_is_not_held_back_by_a_cross_context_use) {
  test::queued_engine queued;
  std::atomic<bool> release{false};
  auto x = ndarray::ones({8}, context::cpu(1));
  auto other = ndarray::ones({8}, context::cpu(1));
  hold_lane(context::cpu(0), release);
  auto y = x.copy_to(context::cpu(0)); // waits behind the held cpu(0)
  other += 1.0;                        // cpu(1), another array: runs now
  BOOST_TEST(other.to_vector<float>() == std::vector<float>(8, 2.0f),
             boost::test_tools::per_element());
  release = true;
  BOOST_TEST(y.to_vector<float>() == std::vector<float>(8, 1.0f), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(readers_on_two_contexts_run_at_the_same_time_and_a_writer_waits_for_both) {
  test::queued_engine queued;
  auto x = ndarray::full({4}, 2.0, context::cpu(2));
  std::atomic<bool> second_read{false}, first_saw_it{false};
  // The reader on cpu(0) waits for the one on cpu(1): reads of one array must not queue behind
  // each other.
  engine::push("first reader", context::cpu(0), {.reads = {&x}},
               [&] { first_saw_it = wait_for_flag(second_read, 5000ms); });
  engine::push("second reader", context::cpu(1), {.reads = {&x}}, [&] { second_read = true; });
  x += 1.0; // on cpu(2): after both reads
  BOOST_TEST(x.to_vector<float>() == std::vector<float>(4, 3.0f), boost::test_tools::per_element());
  BOOST_TEST(first_saw_it.load());
}

BOOST_AUTO_TEST_CASE(an_error_in_queued_work_is_thrown_at_the_next_wait_naming_the_work) {
  test::queued_engine queued;
  auto a = ndarray::zeros({2}, context::cpu(1));
  engine::push("exploding op", context::cpu(1), {.writes = {&a}},
               [] { throw exception(errc::shape_mismatch, "the shapes were wrong"); });
  auto b = a + 1.0; // reads the failed array: fails with the same error
  try {
    a.wait_to_read();
    BOOST_FAIL("the failed work's error was not thrown");
  } catch (const exception& e) {
    BOOST_TEST((e.error().code() == errc::shape_mismatch));
    BOOST_TEST(e.error().message() == "exploding op on cpu(1): the shapes were wrong");
  }
  BOOST_CHECK_THROW(a.wait_to_read(), exception); // the array stays failed
  BOOST_CHECK_THROW(b.to_vector<float>(), exception);
  engine::waitall(); // every error was seen at a wait
  a.fill(3.0);       // a write that succeeds makes the array usable again
  BOOST_TEST(a.to_vector<float>() == std::vector<float>(2, 3.0f), boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(waitall_throws_an_error_nobody_waited_for) {
  test::queued_engine queued;
  auto a = ndarray::zeros({2}, context::cpu(0));
  engine::push("unread op", context::cpu(0), {.writes = {&a}},
               [] { throw std::runtime_error("lost"); });
  try {
    engine::waitall();
    BOOST_FAIL("waitall did not throw");
  } catch (const exception& e) {
    BOOST_TEST(e.error().message() == "unread op on cpu(0): lost");
  }
  engine::waitall();
}

BOOST_AUTO_TEST_CASE(an_operator_that_fails_on_its_lane_names_itself_and_its_context) {
  test::queued_engine queued;
  // float64 passes shape inference on the caller and fails in the operator, on the lane.
  const auto x = ndarray::ones({2, 3}, context::cpu(1), dtype::float64);
  const auto w = ndarray::ones({4, 3}, context::cpu(1), dtype::float64);
  const auto y = nd::fully_connected(x, w, ndarray(), 4);
  try {
    y.wait_to_read();
    BOOST_FAIL("no error");
  } catch (const exception& e) {
    BOOST_TEST(e.error().message().starts_with("FullyConnected on cpu(1): "));
  }
}

BOOST_AUTO_TEST_CASE(an_inline_scope_runs_its_work_at_once_after_the_queued_work) {
  test::queued_engine queued;
  std::atomic<bool> release{false};
  auto a = ndarray::zeros({3}, context::cpu(0));
  hold_lane(context::cpu(0), release);
  a += 1.0;
  const auto releaser = set_after(release, 50ms);
  {
    const engine::inline_scope here;
    std::atomic<bool> ran_here{false};
    const auto caller = std::this_thread::get_id();
    engine::push("inline", context::cpu(0), {.writes = {&a}},
                 [&] { ran_here = std::this_thread::get_id() == caller; });
    BOOST_TEST(ran_here.load());
    a *= 5.0;
    BOOST_TEST(a.to_vector<float>() == std::vector<float>(3, 5.0f),
               boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(the_caller_waits_when_it_is_too_far_ahead_of_a_lane) {
  test::queued_engine queued;
  std::atomic<bool> release{false};
  hold_lane(context::cpu(0), release);
  auto pushing = std::async(std::launch::async, [] {
    for (std::uint64_t i = 0; i < engine::max_queued_per_lane + 10; ++i)
      engine::push("noop", context::cpu(0), {}, [] {});
  });
  BOOST_TEST((pushing.wait_for(200ms) == std::future_status::timeout));
  release = true;
  BOOST_TEST((pushing.wait_for(10s) == std::future_status::ready));
  engine::waitall();
}

BOOST_AUTO_TEST_CASE(data_parallel_steps_give_the_same_values_queued_and_at_once) {
  auto run = [] {
    std::vector<ndarray> weights{ndarray::full({16, 8}, 0.5, context::cpu(0)),
                                 ndarray::full({16, 8}, 0.5, context::cpu(1))};
    for (int step = 0; step < 20; ++step) {
      for (std::size_t c = 0; c < weights.size(); ++c) {
        auto x = ndarray::full({4, 8}, 0.1 * (step + 1) * (c + 1), weights[c].ctx());
        auto y = nd::fully_connected(x, weights[c], ndarray(), 16);
        weights[c] -= ndarray::full({16, 8}, y.sum() * 1e-4, weights[c].ctx());
      }
      auto other = weights[1].copy_to(context::cpu(0));
      weights[0] += other;
      weights[0] *= 0.5;
      weights[0].copy_to(weights[1]);
    }
    return weights[1].to_vector<float>();
  };
  const auto at_once = run();
  test::queued_engine queued;
  BOOST_TEST(run() == at_once, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()

} // namespace troupe
