#include <atomic>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <thread>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/storage.hpp"

using troupe::context;
using troupe::storage_pool;

namespace {

constexpr std::size_t kib = 1024;

std::uintptr_t address(const std::shared_ptr<troupe::storage>& block) {
  return reinterpret_cast<std::uintptr_t>(block->data());
}

} // namespace

BOOST_AUTO_TEST_SUITE(storage_suite)

BOOST_AUTO_TEST_CASE(size_classes_round_up_by_at_most_a_quarter_and_pages_from_16_kib) {
  BOOST_TEST(storage_pool::size_class(0) == 64u);
  BOOST_TEST(storage_pool::size_class(1) == 64u);
  BOOST_TEST(storage_pool::size_class(64) == 64u);
  BOOST_TEST(storage_pool::size_class(65) == 128u);
  BOOST_TEST(storage_pool::size_class(256) == 256u);
  BOOST_TEST(storage_pool::size_class(257) == 320u);
  BOOST_TEST(storage_pool::size_class(1000) == 1024u);
  BOOST_TEST(storage_pool::size_class(5000) == 5120u);
  BOOST_TEST(storage_pool::size_class(16385) == 20480u);
  BOOST_TEST(storage_pool::size_class(std::size_t{1} << 30) == std::size_t{1} << 30);
  std::size_t previous = 0;
  for (std::size_t bytes = 1; bytes < (std::size_t{4} << 20); bytes += bytes / 7 + 1) {
    const std::size_t capacity = storage_pool::size_class(bytes);
    BOOST_TEST(capacity >= bytes);
    BOOST_TEST(capacity % 64 == 0u);
    BOOST_TEST(capacity <= bytes + bytes / 4 + 64);
    BOOST_TEST(capacity >= previous);
    if (bytes >= 16 * kib)
      BOOST_TEST(capacity % 4096 == 0u);
    previous = capacity;
  }
}

BOOST_AUTO_TEST_CASE(a_freed_block_is_handed_out_again_for_the_same_size_class) {
  storage_pool pool;
  auto first = pool.allocate(1000, context::cpu());
  const auto first_address = address(first);
  BOOST_TEST(first->capacity() == 1024u);
  first.reset();
  BOOST_TEST(pool.stats().cached_blocks == 1u);
  BOOST_TEST(pool.stats().cached_bytes == 1024u);
  auto second = pool.allocate(1020, context::cpu()); // same class
  BOOST_TEST(address(second) == first_address);
  const auto stats = pool.stats();
  BOOST_TEST(stats.hits == 1u);
  BOOST_TEST(stats.misses == 1u);
  BOOST_TEST(stats.cached_blocks == 0u);
  BOOST_TEST(stats.live_blocks == 1u);
  BOOST_TEST(stats.live_bytes == 1024u);
}

BOOST_AUTO_TEST_CASE(a_block_of_another_size_class_is_not_reused) {
  storage_pool pool;
  pool.allocate(1000, context::cpu()).reset();
  auto bigger = pool.allocate(4000, context::cpu());
  BOOST_TEST(pool.stats().hits == 0u);
  BOOST_TEST(pool.stats().misses == 2u);
  BOOST_TEST(pool.stats().cached_blocks == 1u);
}

BOOST_AUTO_TEST_CASE(host_blocks_are_shared_by_every_cpu_context) {
  storage_pool pool;
  auto block = pool.allocate(512, context::cpu(0));
  const auto first_address = address(block);
  block.reset();
  block = pool.allocate(512, context::cpu(1));
  BOOST_TEST(address(block) == first_address);
  BOOST_TEST((block->ctx() == context::cpu(1)));
  BOOST_TEST(pool.stats().hits == 1u);
}

BOOST_AUTO_TEST_CASE(host_blocks_are_64_byte_aligned_and_writable_to_their_capacity) {
  storage_pool pool;
  std::vector<std::shared_ptr<troupe::storage>> blocks;
  for (std::size_t bytes : {std::size_t{0}, std::size_t{1}, std::size_t{63}, std::size_t{100},
                            std::size_t{4097}, std::size_t{3} << 20}) {
    auto block = pool.allocate(bytes, context::cpu());
    BOOST_TEST(block->data() != nullptr);
    BOOST_TEST(address(block) % storage_pool::alignment == 0u);
    BOOST_TEST(block->capacity() >= bytes);
    std::memset(block->data(), 0xab, block->capacity());
    blocks.push_back(std::move(block));
  }
}

BOOST_AUTO_TEST_CASE(the_least_recently_freed_blocks_leave_when_the_cap_is_reached) {
  const std::size_t capacity = storage_pool::size_class(100 * kib);
  storage_pool pool{{.max_cached_bytes = 2 * capacity}};
  auto a = pool.allocate(100 * kib, context::cpu());
  auto b = pool.allocate(100 * kib, context::cpu());
  auto c = pool.allocate(100 * kib, context::cpu());
  const auto b_address = address(b);
  const auto c_address = address(c);
  a.reset();
  b.reset();
  c.reset(); // pushes a out
  auto stats = pool.stats();
  BOOST_TEST(stats.cached_bytes == 2 * capacity);
  BOOST_TEST(stats.cached_blocks == 2u);
  BOOST_TEST(stats.releases == 1u);
  // The most recently freed (warmest) block comes back first.
  auto first = pool.allocate(100 * kib, context::cpu());
  auto second = pool.allocate(100 * kib, context::cpu());
  BOOST_TEST(address(first) == c_address);
  BOOST_TEST(address(second) == b_address);
  BOOST_TEST(pool.stats().hits == 2u);
}

BOOST_AUTO_TEST_CASE(a_block_larger_than_the_cap_is_released_when_freed) {
  storage_pool pool{{.max_cached_bytes = 64 * kib}};
  pool.allocate(1000, context::cpu()).reset();
  pool.allocate(256 * kib, context::cpu()).reset();
  const auto stats = pool.stats();
  BOOST_TEST(stats.cached_blocks == 1u);
  BOOST_TEST(stats.cached_bytes == 1024u);
  BOOST_TEST(stats.releases == 1u);
  BOOST_TEST(stats.cached_bytes <= pool.max_cached_bytes());
}

BOOST_AUTO_TEST_CASE(cached_bytes_never_exceed_the_cap_over_many_sizes) {
  storage_pool pool{{.max_cached_bytes = 1 << 20}};
  std::mt19937 random{7};
  std::vector<std::shared_ptr<troupe::storage>> live;
  for (int round = 0; round < 2000; ++round) {
    if (live.size() < 8 && random() % 2 == 0) {
      live.push_back(pool.allocate(random() % (300 * kib), context::cpu()));
    } else if (!live.empty()) {
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(random() % live.size()));
    }
    BOOST_TEST_REQUIRE(pool.stats().cached_bytes <= pool.max_cached_bytes());
  }
}

BOOST_AUTO_TEST_CASE(trim_and_a_lower_cap_release_cached_blocks_at_once) {
  storage_pool pool;
  auto a = pool.allocate(10 * kib, context::cpu());
  auto b = pool.allocate(20 * kib, context::cpu());
  auto c = pool.allocate(40 * kib, context::cpu());
  a.reset();
  b.reset();
  c.reset();
  BOOST_TEST(pool.stats().cached_blocks == 3u);
  pool.set_max_cached_bytes(storage_pool::size_class(40 * kib));
  BOOST_TEST(pool.stats().cached_blocks == 1u); // the two freed first are gone
  BOOST_TEST(pool.max_cached_bytes() == storage_pool::size_class(40 * kib));
  pool.trim();
  const auto stats = pool.stats();
  BOOST_TEST(stats.cached_blocks == 0u);
  BOOST_TEST(stats.cached_bytes == 0u);
  BOOST_TEST(stats.releases == 3u);
}

BOOST_AUTO_TEST_CASE(blocks_stay_valid_after_their_pool_is_destroyed) {
  auto pool = std::make_unique<storage_pool>();
  auto block = pool->allocate(1000, context::cpu());
  pool->allocate(2000, context::cpu()).reset();
  pool.reset();
  std::memset(block->data(), 1, block->capacity());
  BOOST_TEST(static_cast<unsigned char*>(block->data())[block->capacity() - 1] == 1);
  block.reset(); // released, not cached: AddressSanitizer reports a leak or a double free
}

BOOST_AUTO_TEST_CASE(the_shared_pool_is_one_instance) {
  BOOST_TEST(&storage_pool::shared() == &storage_pool::shared());
  BOOST_TEST(storage_pool::shared().max_cached_bytes() <= storage_pool::default_max_cached_bytes);
}

BOOST_AUTO_TEST_CASE(concurrent_allocations_keep_the_counters_consistent) {
  storage_pool pool{{.max_cached_bytes = 4 << 20}};
  constexpr int threads = 4;
  constexpr int rounds = 2000;
  std::atomic<int> corrupted{0};
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&pool, &corrupted, t] {
      std::mt19937 random{static_cast<unsigned>(t)};
      std::vector<std::shared_ptr<troupe::storage>> live;
      for (int round = 0; round < rounds; ++round) {
        auto block = pool.allocate(64 * (random() % 64), context::cpu());
        // Each thread stamps its blocks; a block handed to two owners at once would show.
        auto* bytes = static_cast<unsigned char*>(block->data());
        std::memset(bytes, t + 1, block->capacity());
        live.push_back(std::move(block));
        if (live.size() > 4) {
          const auto& oldest = live.front();
          const auto* check = static_cast<const unsigned char*>(oldest->data());
          for (std::size_t i = 0; i < oldest->capacity(); ++i)
            if (check[i] != t + 1) {
              ++corrupted;
              break;
            }
          live.erase(live.begin());
        }
      }
    });
  }
  for (auto& worker : workers)
    worker.join();
  const auto stats = pool.stats();
  BOOST_TEST(corrupted.load() == 0);
  BOOST_TEST(stats.hits + stats.misses == std::uint64_t{threads * rounds});
  BOOST_TEST(stats.live_blocks == 0u);
  BOOST_TEST(stats.live_bytes == 0u);
  BOOST_TEST(stats.hits > stats.misses); // a pool that did not recycle would miss every time
}

BOOST_AUTO_TEST_SUITE_END()
