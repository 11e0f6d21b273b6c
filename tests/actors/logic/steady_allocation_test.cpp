// Once warm, a server shard's data path allocates nothing: a dist_sync round of small pushpulls
// (two workers, each pushing and pulling the key in one request, the key answered where it
// arrives) makes no operator new and takes no fresh storage block. What the test drives is
// shard_core alone, as the broker's lane runs it; the messages it hands in are built before the
// probe is armed, as a receiver builds them from its pooled frame buffers.

#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/storage.hpp"
#include "tests/actors/logic/shard_driver.hpp"
#include "tests/allocation_probe.hpp"

using namespace troupe;
using troupe::test::allocation_probe;
using troupe::testing::shard_driver;
using troupe::testing::whole;

namespace {

constexpr std::uint64_t key = 3;
constexpr std::uint32_t workers = 2;

/// Both workers' pushpulls of rounds [first, last), in the order they arrive.
std::vector<envelope> pushpulls(std::uint64_t first, std::uint64_t last,
                                const std::vector<ndarray>& gradients) {
  std::vector<envelope> out;
  std::uint64_t id = 100 + first * workers;
  for (std::uint64_t round = first; round < last; ++round)
    for (std::uint32_t worker = 0; worker < workers; ++worker) {
      const auto& gradient = gradients[worker];
      out.push_back(envelope{wire::pushpull{id++, key, worker, round, whole(gradient)},
                             gradient.keepalive(), shard_driver::connection});
    }
  return out;
}

/// Runs `requests` through the shard; the replies are kept only until the round's last one
/// arrived, as the broker releases a reply once it is written.
std::size_t run(shard_driver& job, std::vector<envelope>& requests) {
  std::size_t values = 0;
  const reply_function sink = [&](envelope out) { job.replies.push_back(std::move(out)); };
  for (auto& request : requests) {
    job.shard->handle(std::move(request), sink);
    for (const auto& reply : job.replies)
      values += std::holds_alternative<wire::pull_reply>(reply.msg) ? 1 : 0;
    job.replies.clear();
  }
  return values;
}

void expect_no_allocation_once_warm(shard_driver& job) {
  std::vector<ndarray> gradients;
  for (std::uint32_t worker = 0; worker < workers; ++worker)
    gradients.push_back(ndarray::full({1024}, 1.0 + worker)); // 4 KiB each
  BOOST_TEST_REQUIRE(job.init(key, ndarray::zeros({1024})));
  job.replies.clear();
  job.replies.reserve(16);

  constexpr std::uint64_t warm = 4, measured = 20;
  auto warming = pushpulls(0, warm, gradients);
  BOOST_TEST(run(job, warming) == warm * workers);
  auto steady = pushpulls(warm, warm + measured, gradients);
  const auto fresh_blocks = storage_pool::shared().stats().misses;
  std::size_t values = 0;
  std::size_t allocations = 0;
  {
    allocation_probe probe;
    values = run(job, steady);
    allocations = probe.count();
  }
  BOOST_TEST(values == measured * workers); // every pushpull was answered with its round's value
  BOOST_TEST(allocations == 0u);
  BOOST_TEST(storage_pool::shared().stats().misses == fresh_blocks);
  BOOST_TEST(job.shard->completed_rounds(key) == warm + measured);
}

} // namespace

BOOST_AUTO_TEST_SUITE(steady_state_allocation)

BOOST_AUTO_TEST_CASE(a_warm_shard_allocates_nothing_for_rounds_of_small_pushpulls) {
  shard_driver job{workers};
  expect_no_allocation_once_warm(job);
  // Without an optimizer each round's sum becomes the value: 1 + 2.
  BOOST_TEST(job.stored(key) == std::vector<float>(1024, 3.0f));
}

BOOST_AUTO_TEST_CASE(a_warm_shard_allocates_nothing_for_rounds_it_updates_with_sgd) {
  shard_driver job{workers};
  job.send(wire::set_optimizer{1, "sgd", {{"learning_rate", 0.5}}});
  BOOST_TEST_REQUIRE(job.ack(1) != nullptr);
  expect_no_allocation_once_warm(job);
  // Each of the 24 rounds moves the value by -0.5 * (1 + 2).
  BOOST_TEST(job.stored(key) == std::vector<float>(1024, -36.0f));
}

BOOST_AUTO_TEST_SUITE_END()
