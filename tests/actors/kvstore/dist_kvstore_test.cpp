// The distributed KVStore inside one process: W workers and S servers (several shards each) as
// actors, checked against MXNet's closed forms for dist_sync and dist_async
// (tests/nightly/dist_sync_kvstore.py of MXNet 1.x).

#include <atomic>
#include <filesystem>
#include <future>
#include <set>
#include <span>
#include <string>
#include <unistd.h>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "actors/logic/key_placement.hpp"
#include "engine/gradient_compression.hpp"
#include "tests/actors/kvstore/array_checks.hpp"
#include "tests/actors/kvstore/in_process_job.hpp"
#include "tests/poll.hpp"
#include "tests/temp_dir.hpp"

using namespace troupe;
using troupe::testing::first_mismatch;
using troupe::testing::in_process_job;
using troupe::testing::problems;

namespace {

/// MXNet's dist_sync check: key initialised to ones, `test` optimizer with rescale_grad 2, worker
/// r pushes ones*(r+1): after round i every worker pulls n(n+1)(i+1) + 1.
void check_sync_closed_form(std::uint32_t workers, std::uint32_t servers,
                            const std::vector<shape_vector>& shapes, int rounds,
                            dtype type = dtype::float32,
                            const troupe::testing::in_process_options& options =
                                troupe::testing::make_options(3, 1'000'000, std::size_t{1} << 20)) {
  in_process_job job{"dist_sync", workers, servers, options};
  problems seen;
  job.run([&](std::uint32_t rank, kvstore& kv) {
    std::vector<kv_key> keys;
    std::vector<ndarray> initial;
    for (std::size_t k = 0; k < shapes.size(); ++k) {
      keys.push_back(static_cast<std::int64_t>(k * 7 + 3));
      initial.push_back(ndarray::ones(shapes[k], context::cpu(), type));
    }
    if (!seen.check(kv.init(keys, initial), "init"))
      return;
    if (!seen.check(kv.set_optimizer("test", {{"rescale_grad", 2.0}}), "set_optimizer"))
      return;
    for (int round = 0; round < rounds; ++round) {
      for (std::size_t k = 0; k < keys.size(); ++k) {
        auto grad = ndarray::full(shapes[k], rank + 1.0, context::cpu(), type);
        if (!seen.check(kv.push(keys[k], grad), "push"))
          return;
      }
      for (std::size_t k = 0; k < keys.size(); ++k) {
        auto out = ndarray::zeros(shapes[k], context::cpu(), type);
        if (!seen.check(kv.pull(keys[k], out), "pull"))
          return;
        float expected = static_cast<float>(workers * (workers + 1) * (round + 1) + 1);
        if (auto at = first_mismatch(out, expected); at >= 0)
          seen.add("worker " + std::to_string(rank) + " key " + to_string(keys[k]) + " shape " +
                   shape_to_string(shapes[k]) + " round " + std::to_string(round) + ": element " +
                   std::to_string(at) + " is " + std::to_string(out.to_vector<float>()[at]) +
                   ", expected " + std::to_string(expected));
      }
    }
  });
  BOOST_TEST(seen.seen.empty(), "W=" << workers << " S=" << servers << "\n" << seen.report());
}

} // namespace

BOOST_AUTO_TEST_SUITE(key_placement_as_mxnet)

BOOST_AUTO_TEST_CASE(small_keys_go_whole_to_one_server_and_big_ones_are_split_over_all) {
  auto small = place_key(3, 999'999, 4, 1'000'000);
  BOOST_TEST_REQUIRE(small.size() == 1u);
  BOOST_TEST(small[0].server == (3u * 9973u) % 4u);
  BOOST_TEST(small[0].ps_key == server_key_ranges(4)[small[0].server].begin + 3);
  auto big = place_key(5, 1'440'000, 3, 1'000'000);
  BOOST_TEST_REQUIRE(big.size() == 3u);
  std::int64_t covered = 0;
  for (std::uint32_t i = 0; i < 3; ++i) {
    BOOST_TEST(big[i].server == i);
    BOOST_TEST(big[i].begin == covered);
    covered = big[i].end;
  }
  BOOST_TEST(covered == 1'440'000);
  // MXNet's rounding: part i ends at round(N/S*(i+1)).
  auto odd = place_key(1, 1'466'521, 2, 1'000'000);
  BOOST_TEST(odd[0].end == 733'261);
}

BOOST_AUTO_TEST_CASE(row_sparse_keys_are_split_by_rows_as_mxnet_splits_them) {
  // Below the bound: whole on server (key * 9973) % S.
  auto small = place_rows(3, 1000, 999, 4, 1'000'000);
  BOOST_TEST_REQUIRE(small.size() == 1u);
  BOOST_TEST(small[0].server == (3u * 9973u) % 4u);
  BOOST_TEST(small[0].ps_key == server_key_ranges(4)[small[0].server].begin + 3);
  BOOST_TEST(small[0].first_row == 0);
  BOOST_TEST(small[0].end_row == 1000);
  // At or above it: rows [llround(R/S*i), llround(R/S*(i+1))) on server i, as EncodeRowSparseKey.
  auto big = place_rows(5, 1001, 1000, 3, 1'000'000);
  BOOST_TEST_REQUIRE(big.size() == 3u);
  const std::vector<std::int64_t> ends{334, 667, 1001};
  std::int64_t first = 0;
  for (std::uint32_t i = 0; i < 3; ++i) {
    BOOST_TEST(big[i].server == i);
    BOOST_TEST(big[i].ps_key == server_key_ranges(3)[i].begin + 5);
    BOOST_TEST(big[i].first_row == first);
    BOOST_TEST(big[i].end_row == ends[i]);
    BOOST_TEST(big[i].begin == first * 1000);
    BOOST_TEST(big[i].end == ends[i] * 1000);
    first = ends[i];
  }
}

BOOST_AUTO_TEST_CASE(without_a_slice_size_or_with_a_large_one_the_placement_is_mxnets) {
  for (std::int64_t elements : {std::int64_t{0}, std::int64_t{7}, std::int64_t{1'440'000}})
    for (std::uint32_t servers : {1u, 3u}) {
      const auto plain = place_key(5, elements, servers, 1'000'000);
      const auto sliced = place_key(5, elements, servers, 1'000'000, 100'000'000);
      BOOST_TEST_REQUIRE(plain.size() == sliced.size());
      for (std::size_t i = 0; i < plain.size(); ++i) {
        BOOST_TEST(plain[i].server == sliced[i].server);
        BOOST_TEST(plain[i].ps_key == sliced[i].ps_key);
        BOOST_TEST(plain[i].begin == sliced[i].begin);
        BOOST_TEST(plain[i].end == sliced[i].end);
      }
    }
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(key_slices)

/// The slices cover [0, elements) in order, none larger than `cap`, and no two share a ps-key.
void check_cover(const troupe::key_slices& slices, std::int64_t elements, std::int64_t cap) {
  std::int64_t covered = 0;
  std::set<std::uint64_t> ps_keys;
  for (const auto& slice : slices) {
    BOOST_TEST(slice.begin == covered);
    BOOST_TEST(slice.size() <= cap);
    BOOST_TEST(ps_keys.insert(slice.ps_key).second, "ps-key " << slice.ps_key << " twice");
    covered = slice.end;
  }
  BOOST_TEST(covered == elements);
}

BOOST_AUTO_TEST_CASE(a_small_key_larger_than_the_slice_size_is_cut_on_its_one_server) {
  const auto slices = place_key(3, 200'704, 4, 1'000'000, 65'536);
  BOOST_TEST_REQUIRE(slices.size() == 4u);
  check_cover(slices, 200'704, 65'536);
  const auto home = server_key_ranges(4)[(3u * 9973u) % 4u].begin;
  for (std::size_t slot = 0; slot < slices.size(); ++slot) {
    BOOST_TEST(slices[slot].server == (3u * 9973u) % 4u);
    BOOST_TEST(slices[slot].ps_key == home + 3 + slot * slot_stride);
  }
  // Neighbouring slots of a key fall on different shards of a server.
  BOOST_TEST(shard_of(slices[0].ps_key, 2) != shard_of(slices[1].ps_key, 2));
}

BOOST_AUTO_TEST_CASE(a_split_key_takes_its_servers_in_turn_slot_by_slot) {
  const auto slices = place_key(9, 1'440'000, 3, 1'000'000, 100'000);
  BOOST_TEST_REQUIRE(slices.size() == 15u); // 5 slots of 96,000 elements on each of 3 servers
  check_cover(slices, 1'440'000, 100'000);
  const auto ranges = server_key_ranges(3);
  for (std::size_t p = 0; p < slices.size(); ++p) {
    BOOST_TEST(slices[p].server == p % 3);
    BOOST_TEST(slices[p].ps_key == ranges[p % 3].begin + 9 + (p / 3) * slot_stride);
  }
}

BOOST_AUTO_TEST_CASE(slices_of_different_keys_never_share_a_ps_key) {
  std::set<std::uint64_t> seen;
  for (std::uint64_t key :
       {std::uint64_t{0}, std::uint64_t{1}, std::uint64_t{2}, std::uint64_t{4'294'967'295}})
    for (const auto& slice : place_key(key, 1'000, 2, 400, 10))
      BOOST_TEST(seen.insert(slice.ps_key).second, "key " << key << " ps-key " << slice.ps_key);
  BOOST_TEST(seen.size() == 4u * 100u);
}

BOOST_AUTO_TEST_CASE(a_key_with_more_slices_than_a_server_has_room_for_gets_larger_slices) {
  // 2^20 servers leave each a range of 2^44 ps-keys: room for 4094 slots after the keys.
  constexpr std::uint32_t servers = 1u << 20;
  const auto slices = place_key(1, 100'000, servers, 1'000'000, 10);
  BOOST_TEST(slices.size() == 4094u);
  check_cover(slices, 100'000, 25);
  const auto ranges = server_key_ranges(servers);
  for (const auto& slice : slices)
    BOOST_TEST(slice.ps_key < ranges[slice.server].end);
}

BOOST_AUTO_TEST_SUITE_END()

BOOST_AUTO_TEST_SUITE(dist_kvstore_in_one_process)

BOOST_AUTO_TEST_CASE(dist_sync_matches_the_closed_form_for_every_worker_and_server_count) {
  std::vector<shape_vector> shapes{{0}, {1}, {2, 3}, {1000}, {5, 7}};
  for (std::uint32_t workers = 1; workers <= 8; ++workers)
    for (std::uint32_t servers = 1; servers <= 4; ++servers)
      check_sync_closed_form(workers, servers, shapes, 2);
}

BOOST_AUTO_TEST_CASE(dist_sync_splits_big_keys_over_the_servers_and_sums_them_exactly) {
  std::vector<shape_vector> shapes{{1'000'000}, {1200, 1200}, {1211, 1211}};
  for (auto [workers, servers] :
       std::vector<std::pair<std::uint32_t, std::uint32_t>>{{1, 1}, {2, 3}, {4, 2}, {3, 4}})
    check_sync_closed_form(workers, servers, shapes, 2);
}

BOOST_AUTO_TEST_CASE(dist_sync_with_slice_credit_sums_sliced_keys_exactly) {
  // Keys cut into slices of 16 KiB (a whole one on its server: 10 slices; one split over the
  // servers: 245), each worker holding back its pushes for slice credit (1: one slice of a key
  // per server at a time; 3). The credit changes when pushes leave, never what they sum to.
  auto options = troupe::testing::make_options(3, 1'000'000, std::size_t{1} << 20);
  options.slice_bytes = 16 * 1024;
  std::vector<shape_vector> shapes{{40, 1000}, {1'000'000}, {3}};
  for (std::uint32_t credit : {1u, 3u}) {
    options.slice_credit = credit;
    for (auto [workers, servers] :
         std::vector<std::pair<std::uint32_t, std::uint32_t>>{{1, 1}, {3, 2}, {4, 3}})
      check_sync_closed_form(workers, servers, shapes, 3, dtype::float32, options);
  }
}

BOOST_AUTO_TEST_CASE(dist_sync_sums_float16_keys_exactly) {
  check_sync_closed_form(4, 2, {{2, 3}, {300, 300}}, 3, dtype::float16);
}

BOOST_AUTO_TEST_CASE(dist_sync_without_an_optimizer_replaces_the_value_with_the_round_sum) {
  for (std::uint32_t workers : {1u, 3u, 5u}) {
    in_process_job job{"dist_sync", workers, 2};
    problems seen;
    job.run([&](std::uint32_t rank, kvstore& kv) {
      if (!seen.check(kv.init("w", ndarray::full({40, 30}, 100.0)), "init"))
        return;
      for (int round = 0; round < 3; ++round) {
        auto out = ndarray::zeros({40, 30});
        if (!seen.check(kv.pushpull("w", ndarray::full({40, 30}, (rank + 1.0) * (round + 1)), out),
                        "pushpull"))
          return;
        float expected = workers * (workers + 1) / 2.0f * (round + 1);
        if (first_mismatch(out, expected) >= 0)
          seen.add("round " + std::to_string(round) + ": got " +
                   std::to_string(out.to_vector<float>()[0]) + ", expected " +
                   std::to_string(expected));
      }
    });
    BOOST_TEST(seen.seen.empty(), seen.report());
  }
}

BOOST_AUTO_TEST_CASE(dist_device_sync_sums_each_workers_devices_before_the_round) {
  // Each of W workers pushes one value per device d (cpu(0..2)) of (rank+1)(d+1); the round's sum
  // is 6 * W(W+1)/2, added once per round through `test` with rescale_grad 1.
  for (std::string type : {"dist_device_sync", "dist_sync"}) {
    const std::uint32_t workers = 3;
    in_process_job job{type, workers, 2};
    problems seen;
    job.run([&](std::uint32_t rank, kvstore& kv) {
      if (!seen.check(kv.init("w", ndarray::zeros({64, 64})), "init") ||
          !seen.check(kv.set_optimizer("test", {{"rescale_grad", 1.0}}), "set_optimizer"))
        return;
      for (int round = 0; round < 3; ++round) {
        std::vector<ndarray> grads;
        for (int d = 0; d < 3; ++d)
          grads.push_back(ndarray::full({64, 64}, (rank + 1.0) * (d + 1), context::cpu(d)));
        std::vector<ndarray> outs{ndarray::zeros({64, 64}, context::cpu(0)),
                                  ndarray::zeros({64, 64}, context::cpu(2))};
        if (!seen.check(kv.pushpull("w", grads, outs), "pushpull"))
          return;
        float expected = 6.0f * workers * (workers + 1) / 2.0f * (round + 1);
        for (auto& out : outs)
          if (first_mismatch(out, expected) >= 0)
            seen.add(type + " round " + std::to_string(round) + ": got " +
                     std::to_string(out.to_vector<float>()[0]) + ", expected " +
                     std::to_string(expected));
      }
    });
    BOOST_TEST(seen.seen.empty(), seen.report());
  }
}

BOOST_AUTO_TEST_CASE(dist_device_modes_match_mxnets_multi_device_closed_form) {
  // MXNet's multi-device dist check: d devices per worker each push ones*(rank+1) for a key
  // initialised to ones, `test` with rescale_grad 2: after round i every device pulls
  // d n(n+1)(i+1) + 1 (dist_device_sync); dist_device_async reaches the last round's value once
  // a barrier has passed. A small key and one split over the servers.
  const int rounds = 3;
  for (std::string type : {"dist_device_sync", "dist_device_async"})
    for (int devices : {2, 3})
      for (std::uint32_t workers : {2u, 3u}) {
        in_process_job job{type, workers, 2, 2, 100'000};
        problems seen;
        const bool sync = type == "dist_device_sync";
        job.run([&](std::uint32_t rank, kvstore& kv) {
          const std::vector<kv_key> keys{3, 10};
          const std::vector<shape_vector> shapes{{3, 5}, {400, 300}};
          const std::vector<ndarray> initial{ndarray::ones(shapes[0]), ndarray::ones(shapes[1])};
          if (!seen.check(kv.init(keys, initial), "init") ||
              !seen.check(kv.set_optimizer("test", {{"rescale_grad", 2.0}}), "set_optimizer"))
            return;
          auto check = [&](int round) {
            for (std::size_t k = 0; k < keys.size(); ++k) {
              std::vector<ndarray> outs;
              for (int d = 0; d < devices; ++d)
                outs.push_back(ndarray::zeros(shapes[k], context::cpu(d)));
              if (!seen.check(kv.pull(keys[k], outs), "pull"))
                return;
              const auto expected =
                  static_cast<float>(devices * workers * (workers + 1) * (round + 1) + 1);
              for (int d = 0; d < devices; ++d)
                if (auto at = first_mismatch(outs[d], expected); at >= 0)
                  seen.add(type + " d=" + std::to_string(devices) +
                           " W=" + std::to_string(workers) + " key " + to_string(keys[k]) +
                           " round " + std::to_string(round) + " cpu(" + std::to_string(d) +
                           "): element " + std::to_string(at) + " is " +
                           std::to_string(outs[d].to_vector<float>()[at]) + ", expected " +
                           std::to_string(expected));
            }
          };
          for (int round = 0; round < rounds; ++round) {
            for (std::size_t k = 0; k < keys.size(); ++k) {
              std::vector<ndarray> grads;
              for (int d = 0; d < devices; ++d)
                grads.push_back(ndarray::full(shapes[k], rank + 1.0, context::cpu(d)));
              if (!seen.check(kv.push(keys[k], grads), "push"))
                return;
            }
            if (sync)
              check(round);
          }
          if (!sync && seen.check(kv.barrier(), "barrier"))
            check(rounds - 1);
        });
        BOOST_TEST(seen.seen.empty(), seen.report());
      }
}

BOOST_AUTO_TEST_CASE(a_worker_that_joins_before_rank_0_initialised_a_key_waits_for_it) {
  // Rank 1 acts as a worker that joined as the job began: its init pulls the keys. Rank 0 inits
  // only once the server has turned that pull away (the key was unknown): the joiner's init waits
  // for the key instead of failing, and both then go through a round of the closed form.
  auto options = troupe::testing::make_options(2, 1'000'000, std::size_t{1} << 20);
  options.joined_ranks = {1};
  in_process_job job{"dist_sync", 2, 1, options};
  problems seen;
  const std::vector<kv_key> keys{5};
  job.run([&](std::uint32_t rank, kvstore& kv) {
    auto initial = ndarray::ones({2, 3});
    if (rank == 0 && !troupe::testing::poll_until([&] { return job.stats().requests_refused > 0; },
                                                  std::chrono::seconds{20}))
      seen.add("the joiner's first pull was never refused");
    if (!seen.check(kv.init(keys, std::span{&initial, 1}),
                    "rank " + std::to_string(rank) + " init"))
      return;
    if (rank == 0 && !seen.check(kv.set_optimizer("test", {{"rescale_grad", 2.0}}), "optimizer"))
      return;
    auto grad = ndarray::full({2, 3}, rank + 1.0);
    if (!seen.check(kv.push(keys[0], grad), "push"))
      return;
    auto out = ndarray::zeros({2, 3});
    if (!seen.check(kv.pull(keys[0], out), "pull"))
      return;
    if (auto at = first_mismatch(out, 7.0f); at >= 0)
      seen.add("rank " + std::to_string(rank) + ": element " + std::to_string(at) + " is " +
               std::to_string(out.to_vector<float>()[at]) + ", expected 7");
  });
  BOOST_TEST(seen.seen.empty(), seen.report());
}

BOOST_AUTO_TEST_CASE(dist_async_applies_every_push_exactly_once) {
  // N workers push integer gradients M times; after a barrier the value is 1 + 2 M N(N+1)/2.
  for (auto [workers, servers] :
       std::vector<std::pair<std::uint32_t, std::uint32_t>>{{1, 1}, {3, 2}, {6, 3}}) {
    const int pushes = 25;
    in_process_job job{"dist_async", workers, servers};
    problems seen;
    job.run([&](std::uint32_t rank, kvstore& kv) {
      std::vector<kv_key> keys{0, 1};
      std::vector<ndarray> initial{ndarray::ones({17}), ndarray::ones({1'100'000})};
      if (!seen.check(kv.init(keys, initial), "init") ||
          !seen.check(kv.set_optimizer("test", {{"rescale_grad", 2.0}}), "set_optimizer"))
        return;
      for (int i = 0; i < pushes; ++i)
        for (std::size_t k = 0; k < keys.size(); ++k)
          if (!seen.check(kv.push(keys[k], ndarray::full(initial[k].shape(), rank + 1.0)), "push"))
            return;
      if (!seen.check(kv.barrier(), "barrier"))
        return;
      for (std::size_t k = 0; k < keys.size(); ++k) {
        auto out = ndarray::zeros(initial[k].shape());
        if (!seen.check(kv.pull(keys[k], out), "pull"))
          return;
        float expected = 1.0f + static_cast<float>(pushes * workers * (workers + 1));
        if (first_mismatch(out, expected) >= 0)
          seen.add("key " + std::to_string(k) + ": got " +
                   std::to_string(out.to_vector<float>()[0]) + ", expected " +
                   std::to_string(expected));
      }
    });
    BOOST_TEST(seen.seen.empty(), "W=" << workers << "\n" << seen.report());
  }
}

BOOST_AUTO_TEST_CASE(pulls_issued_before_the_round_completes_wait_for_it) {
  // Worker 0 pushes and pulls at once; worker 1 pushes only once worker 0's pull is under way, so
  // the pull asks for a round that cannot close without worker 1, and is answered with the
  // round's sum after worker 1's push. (That a shard holds such a pull until its round closes is
  // shard_core's rule, checked message by message in tests/actors/logic/shard_core_test.cpp.)
  in_process_job job{"dist_sync", 2, 1};
  problems seen;
  std::atomic<bool> second_pushed{false};
  std::promise<void> pull_issued;
  auto issued = pull_issued.get_future();
  job.run([&](std::uint32_t rank, kvstore& kv) {
    if (!seen.check(kv.init(9, ndarray::zeros({4})), "init"))
      return;
    if (rank == 0) {
      std::vector<kv_key> key{9};
      std::vector<ndarray> grad{ndarray::ones({4})};
      std::vector<ndarray> out{ndarray::zeros({4})};
      (void)kv.push_async(key, grad);
      auto pulled = kv.pull_async(key, out);
      // Worker 1 has not pushed yet: the round cannot have closed.
      if (pulled.ready())
        seen.add("the pull completed before worker 1 pushed");
      pull_issued.set_value();
      if (!seen.check(pulled.wait(), "pull"))
        return;
      if (!second_pushed)
        seen.add("pull answered before worker 1 pushed");
      if (first_mismatch(out[0], 3.0f) >= 0)
        seen.add("pulled " + std::to_string(out[0].to_vector<float>()[0]) + ", expected 3");
    } else {
      if (issued.wait_for(std::chrono::seconds{30}) != std::future_status::ready) {
        seen.add("worker 0 issued no pull within 30 s");
        return;
      }
      second_pushed = true;
      (void)seen.check(kv.push(9, ndarray::full({4}, 2.0)), "push");
    }
  });
  BOOST_TEST(seen.seen.empty(), seen.report());
}

BOOST_AUTO_TEST_CASE(a_straggler_whose_rounds_closed_without_it_still_finishes_every_round) {
  // dist_sync with a quorum of 2 of 3: workers 0 and 1 run all their rounds before worker 2
  // starts. Each of worker 2's pushes is then late and dropped, and it keeps its own round
  // numbers: its last pushpull is of the last round, which has closed, so it returns at once.
  // (Moved forward to the round being collected, it would push a round nobody else pushes and
  // wait until its timeout.) Every value anyone pulls is the one of workers 0 and 1 alone.
  constexpr int rounds = 5;
  troupe::testing::in_process_options options;
  options.quorum = 2;
  in_process_job job{"dist_sync", 3, 1, options};
  testing::thread_barrier others_done{3};
  problems seen;
  job.run([&](std::uint32_t rank, kvstore& kv) {
    if (!seen.check(kv.init(5, ndarray::ones({4})), "init") ||
        !seen.check(kv.set_optimizer("test", {{"rescale_grad", 2.0}}), "set_optimizer"))
      return;
    if (rank == 2 && !seen.check(others_done.wait(std::chrono::seconds{20}), "wait for 0 and 1"))
      return;
    for (int round = 0; round < rounds; ++round) {
      auto out = ndarray::zeros({4});
      if (!seen.check(kv.pushpull(5, ndarray::full({4}, rank + 1.0), out),
                      "worker " + std::to_string(rank) + " round " + std::to_string(round)))
        return;
      // Each round of workers 0 and 1 adds 2 (1 + 2): rescale_grad times their sum.
      const float expected = 1.0f + 6.0f * static_cast<float>(rank == 2 ? rounds : round + 1);
      if (first_mismatch(out, expected) >= 0)
        seen.add("worker " + std::to_string(rank) + " round " + std::to_string(round) + ": got " +
                 std::to_string(out.to_vector<float>()[0]) + ", expected " +
                 std::to_string(expected));
    }
    if (rank != 2)
      (void)seen.check(others_done.wait(std::chrono::seconds{20}), "release worker 2");
  });
  BOOST_TEST(seen.seen.empty(), seen.report());
}

BOOST_AUTO_TEST_CASE(bad_input_gets_an_error_naming_the_key_and_changes_nothing) {
  in_process_job job{"dist_sync", 1, 2};
  auto& kv = *job.workers[0];
  BOOST_TEST_REQUIRE(kv.init("weight", ndarray::full({3, 4}, 5.0)).has_value());
  auto unknown = kv.push("bias", ndarray::ones({3, 4}));
  BOOST_TEST_REQUIRE(!unknown.has_value());
  BOOST_TEST(unknown.error().code() == errc::unknown_key);
  BOOST_TEST(unknown.error().message().find("'bias'") != std::string::npos);
  auto shape = kv.push("weight", ndarray::ones({4, 3}));
  BOOST_TEST_REQUIRE(!shape.has_value());
  BOOST_TEST(shape.error().code() == errc::shape_mismatch);
  auto type = kv.push("weight", ndarray::ones({3, 4}, context::cpu(), dtype::float16));
  BOOST_TEST_REQUIRE(!type.has_value());
  BOOST_TEST(type.error().code() == errc::dtype_mismatch);
  auto out = ndarray::zeros({3, 4});
  BOOST_TEST_REQUIRE(kv.pull("weight", out).has_value());
  BOOST_TEST(first_mismatch(out, 5.0f) == -1);
  BOOST_TEST(kv.set_updater([](const kv_key&, const ndarray&, ndarray&) {}).error().code() ==
             errc::not_supported);
  BOOST_TEST(!kv.set_optimizer("sgdd").has_value());
}

BOOST_AUTO_TEST_CASE(the_servers_optimizer_state_is_saved_and_restored_bit_for_bit) {
  troupe::testing::temp_dir dir;
  troupe::testing::in_process_options options;
  options.checkpoint_dir = dir.path();
  const std::string base = "states";
  optimizer_params sgd{{"learning_rate", 0.05}, {"momentum", 0.9}};
  auto grad_of = [](std::uint32_t rank, int round) {
    return ndarray::random_normal(0, 1, {1'200'000}, rank * 100 + round);
  };
  ndarray at_save, expected;
  {
    in_process_job job{"dist_sync", 2, 2, options};
    problems seen;
    job.run([&](std::uint32_t rank, kvstore& kv) {
      if (!seen.check(kv.init(0, ndarray::zeros({1'200'000})), "init") ||
          !seen.check(kv.set_optimizer("sgd", sgd), "set_optimizer"))
        return;
      for (int round = 0; round < 6; ++round) {
        if (!seen.check(kv.push(0, grad_of(rank, round)), "push"))
          return;
        if (round == 2) {
          auto out = ndarray::zeros({1'200'000});
          (void)seen.check(kv.pull(0, out), "pull");
          (void)seen.check(kv.barrier(), "barrier");
          if (rank == 0) {
            at_save = out;
            (void)seen.check(kv.save_optimizer_states(base), "save");
          }
          (void)seen.check(kv.barrier(), "barrier");
        }
      }
      auto out = ndarray::zeros({1'200'000});
      (void)seen.check(kv.pull(0, out), "pull");
      if (rank == 0)
        expected = out;
    });
    BOOST_TEST_REQUIRE(seen.seen.empty(), seen.report());
  }
  in_process_job job{"dist_sync", 2, 2, options};
  problems seen;
  ndarray resumed;
  job.run([&](std::uint32_t rank, kvstore& kv) {
    if (!seen.check(kv.init(0, at_save), "init") ||
        !seen.check(kv.set_optimizer("sgd", sgd), "set_optimizer"))
      return;
    if (rank == 0)
      (void)seen.check(kv.load_optimizer_states(base), "load");
    (void)seen.check(kv.barrier(), "barrier");
    for (int round = 3; round < 6; ++round)
      if (!seen.check(kv.push(0, grad_of(rank, round)), "push"))
        return;
    auto out = ndarray::zeros({1'200'000});
    (void)seen.check(kv.pull(0, out), "pull");
    if (rank == 0)
      resumed = out;
  });
  BOOST_TEST_REQUIRE(seen.seen.empty(), seen.report());
  BOOST_TEST((resumed.to_vector<float>() == expected.to_vector<float>()));
  for (int server = 0; server < 2; ++server)
    for (int shard = 0; shard < 2; ++shard)
      BOOST_TEST(std::filesystem::exists(
          dir / (base + ".server" + std::to_string(server) + ".shard" + std::to_string(shard))));
}

BOOST_AUTO_TEST_CASE(servers_write_states_only_inside_their_checkpoint_directory) {
  troupe::testing::temp_dir dir;
  troupe::testing::in_process_options options;
  options.checkpoint_dir = dir / "ckpt";
  std::filesystem::create_directory(options.checkpoint_dir);
  in_process_job job{"dist_sync", 1, 2, options};
  problems seen;
  job.run([&](std::uint32_t, kvstore& kv) {
    if (!seen.check(kv.init(0, ndarray::zeros({10})), "init") ||
        !seen.check(kv.set_optimizer("sgd", {{"learning_rate", 0.1}}), "set_optimizer"))
      return;
    auto outside = kv.save_optimizer_states((dir / "outside").string());
    if (outside || outside.error().message().find("absolute") == std::string::npos)
      seen.add("an absolute path was not refused");
    auto escaping = kv.save_optimizer_states("../outside");
    if (escaping || escaping.error().message().find("'..'") == std::string::npos)
      seen.add("a '..' name was not refused");
    (void)seen.check(kv.save_optimizer_states("inside", true), "save inside");
  });
  BOOST_TEST_REQUIRE(seen.seen.empty(), seen.report());
  BOOST_TEST(std::filesystem::exists(options.checkpoint_dir / "inside.server1.shard1"));
  std::size_t outside_files = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir.path()))
    outside_files += entry.path().filename() != "ckpt";
  BOOST_TEST(outside_files == 0u);
}

BOOST_AUTO_TEST_CASE(only_worker_rank_0_sends_commands_to_the_servers) {
  // A server takes commands only from a connection that proved worker rank 0
  // (actors/logic/node_identity.hpp); another rank's call fails at once, naming the rule, and
  // sends nothing (in one process the links carry no proof: only the store's rule holds here).
  troupe::testing::temp_dir dir;
  troupe::testing::in_process_options options;
  options.checkpoint_dir = dir.path();
  in_process_job job{"dist_sync", 2, 1, options};
  problems seen;
  job.run([&](std::uint32_t rank, kvstore& kv) {
    if (!seen.check(kv.init(0, ndarray::zeros({10})), "init") ||
        !seen.check(kv.set_optimizer("sgd", {{"learning_rate", 0.1}}), "set_optimizer"))
      return;
    if (rank == 0) {
      (void)seen.check(kv.save_optimizer_states("of_rank_0"), "save on rank 0");
    } else {
      for (auto refused :
           {kv.save_optimizer_states("of_rank_1"), kv.load_optimizer_states("of_rank_1")}) {
        if (refused || refused.error().code() != errc::invalid_argument ||
            refused.error().message().find("only worker rank 0 sends commands to the servers, "
                                           "and this is worker rank 1") == std::string::npos)
          seen.add("rank 1's command was not refused by the rule: " +
                   (refused ? std::string("ok") : refused.error().to_string()));
      }
    }
    (void)seen.check(kv.barrier(), "barrier");
  });
  BOOST_TEST_REQUIRE(seen.seen.empty(), seen.report());
  BOOST_TEST(std::filesystem::exists(dir / "of_rank_0.server0.shard0"));
  BOOST_TEST(!std::filesystem::exists(dir / "of_rank_1.server0.shard0"));
}

BOOST_AUTO_TEST_SUITE_END()

// --- gradient compression ------------------------------------------------------------------------

namespace {

/// Worker `rank`'s gradient of round `round` for element j: values in [-0.9, 0.9] that leave
/// residuals behind, different per worker, round and element.
float compressed_test_gradient(std::uint32_t rank, int round, std::size_t j) {
  return 0.15f * static_cast<float>((j * 7 + rank * 5 + static_cast<std::size_t>(round) * 3) % 13) -
         0.9f;
}

/// What `values` (taken as `type`) packed by `rule` with `residual` (updated) stand for.
std::vector<float> stands_for(const gradient_compression& rule, dtype type,
                              const std::vector<float>& values, std::vector<float>& residual) {
  const auto elements = values.size();
  auto value = ndarray::from_values(values, {static_cast<std::int64_t>(elements)}).as_type(type);
  std::vector<std::byte> packed(packed_bytes(rule.type, elements));
  quantize(rule, type, value.raw_data(), residual.data(), packed.data(), elements);
  auto unpacked = ndarray::zeros({static_cast<std::int64_t>(elements)}, context::cpu(), type);
  dequantize(rule, type, packed.data(), unpacked.raw_data(), elements);
  return unpacked.as_type(dtype::float32).to_vector<float>();
}

/// Keys 0, 1, ... of `shapes`, initialised to ones of `type`, after set_gradient_compression.
status init_compressed_keys(kvstore& kv, const gradient_compression& rule,
                            const std::vector<shape_vector>& shapes, dtype type,
                            std::vector<kv_key>& keys) {
  std::vector<ndarray> initial;
  for (std::size_t k = 0; k < shapes.size(); ++k) {
    keys.emplace_back(std::in_place_type<std::int64_t>, static_cast<std::int64_t>(k));
    initial.push_back(ndarray::ones(shapes[k], context::cpu(), type));
  }
  if (auto set = kv.set_gradient_compression(rule); !set)
    return set;
  return kv.init(keys, initial);
}

/// What workers [0, workers) send of their gradients of rounds [0, rounds] for a key of
/// `elements` elements of `type`, simulated with the quantizer: sent[round][element], summed
/// over the workers.
std::vector<std::vector<float>> simulate_compressed_rounds(const gradient_compression& rule,
                                                           dtype type, std::uint32_t workers,
                                                           int rounds, std::size_t elements,
                                                           float scale = 1.0f) {
  std::vector<std::vector<float>> sent(static_cast<std::size_t>(rounds),
                                       std::vector<float>(elements, 0.0f));
  for (std::uint32_t rank = 0; rank < workers; ++rank) {
    std::vector<float> residual(elements, 0.0f);
    for (int round = 0; round < rounds; ++round) {
      std::vector<float> gradient(elements);
      for (std::size_t j = 0; j < elements; ++j)
        gradient[j] = scale * compressed_test_gradient(rank, round, j);
      const auto values = stands_for(rule, type, gradient, residual);
      for (std::size_t j = 0; j < elements; ++j)
        sent[static_cast<std::size_t>(round)][j] += values[j];
    }
  }
  return sent;
}

/// dist_sync (or dist_async) with `rule`: keys initialised to ones, the `test` optimizer with
/// rescale_grad 2, every worker pushing (or pushpulling) compressed_test_gradient each round;
/// after round i every element holds 1 + 2 * (what the workers' packed pushes of rounds 0..i stand
/// for), which the test predicts by running the quantizer itself. Sums of ±0.5 and ±1 are exact
/// in any order, so the prediction is exact.
void check_compressed_rounds(const std::string& type_name, const gradient_compression& rule,
                             dtype type, std::uint32_t workers, std::uint32_t servers,
                             bool pushpull, const troupe::testing::in_process_options& options) {
  const std::vector<shape_vector> shapes{{7, 5}, {1, 1'100'000}, {17}};
  const int rounds = 3;
  std::vector<std::vector<std::vector<float>>> sent;
  for (const auto& shape : shapes)
    sent.push_back(simulate_compressed_rounds(rule, type, workers, rounds,
                                              static_cast<std::size_t>(element_count(shape))));
  const bool async = type_name.find("async") != std::string::npos;
  in_process_job job{type_name, workers, servers, options};
  problems seen;
  job.run([&](std::uint32_t rank, kvstore& kv) {
    std::vector<kv_key> keys;
    if (!seen.check(init_compressed_keys(kv, rule, shapes, type, keys), "init") ||
        !seen.check(kv.set_optimizer("test", {{"rescale_grad", 2.0}}), "set_optimizer"))
      return;
    for (int round = 0; round < rounds; ++round) {
      std::vector<ndarray> pulled;
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        std::vector<float> gradient(static_cast<std::size_t>(element_count(shapes[k])));
        for (std::size_t j = 0; j < gradient.size(); ++j)
          gradient[j] = compressed_test_gradient(rank, round, j);
        auto grad = ndarray::from_values(gradient, shapes[k]).as_type(type);
        pulled.push_back(ndarray::zeros(shapes[k], context::cpu(), type));
        const bool done = pushpull && !async
                              ? seen.check(kv.pushpull(keys[k], grad, pulled.back()), "pushpull")
                              : seen.check(kv.push(keys[k], grad), "push");
        if (!done)
          return;
      }
      if (async && !seen.check(kv.barrier(), "barrier"))
        return;
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        if ((!pushpull || async) && !seen.check(kv.pull(keys[k], pulled[k]), "pull"))
          return;
        const auto got = pulled[k].as_type(dtype::float32).to_vector<float>();
        for (std::size_t j = 0; j < got.size(); ++j) {
          float expected = 0;
          for (int r = 0; r <= round; ++r)
            expected += sent[k][static_cast<std::size_t>(r)][j];
          expected = 1 + 2 * expected;
          if (got[j] != expected) {
            seen.add("worker " + std::to_string(rank) + " key " + std::to_string(k) + " round " +
                     std::to_string(round) + ": element " + std::to_string(j) + " is " +
                     std::to_string(got[j]) + ", expected " + std::to_string(expected));
            break;
          }
        }
      }
      if (async && !seen.check(kv.barrier(), "barrier"))
        return;
    }
  });
  BOOST_TEST(seen.seen.empty(), type_name << " " << rule.describe() << " " << to_string(type)
                                          << " W=" << workers << " S=" << servers
                                          << (pushpull ? " pushpull" : " push") << "\n"
                                          << seen.report());
}

/// Compressed pulls (rule.pulls), dist_sync, no optimizer: each round's value on the servers is
/// the sum of what the workers' packed pushes stand for (sent[round], simulated), and each
/// worker's pull (or pushpull) of it comes back packed: the value plus that worker's residual on
/// the server, quantized, the rest kept for its next pull. Every worker starts from residual 0 and
/// sees the same sums, so all of them receive what the test predicts by running the quantizer on
/// the sums. A second pull of a round gets the sum itself, and leaves the residual alone. The
/// gradients are 4x compressed_test_gradient, so that the workers' packed pushes often agree and
/// their sums exceed what one packed reply carries.
void check_compressed_pulls(const gradient_compression& rule, dtype type, std::uint32_t workers,
                            std::uint32_t servers, bool pushpull,
                            const troupe::testing::in_process_options& options) {
  const std::vector<shape_vector> shapes{{7, 5}, {1, 1'100'000}, {17}};
  const int rounds = 3;
  // received[k][round][j]: what every worker should read.
  std::vector<std::vector<std::vector<float>>> sums, received;
  for (const auto& shape : shapes) {
    const auto elements = static_cast<std::size_t>(element_count(shape));
    sums.push_back(simulate_compressed_rounds(rule, type, workers, rounds, elements, 4.0f));
    std::vector<float> residual(elements, 0.0f);
    auto& got = received.emplace_back();
    for (const auto& sum : sums.back())
      got.push_back(stands_for(rule, type, sum, residual));
  }
  // Packing changes what arrives: a server answering dense would fail the comparisons below.
  BOOST_TEST_REQUIRE((received != sums));
  in_process_job job{"dist_sync", workers, servers, options};
  problems seen;
  job.run([&](std::uint32_t rank, kvstore& kv) {
    std::vector<kv_key> keys;
    if (!seen.check(init_compressed_keys(kv, rule, shapes, type, keys), "init"))
      return;
    auto compare = [&](const ndarray& pulled, const std::vector<float>& expected,
                       const std::string& what) {
      const auto got = pulled.as_type(dtype::float32).to_vector<float>();
      for (std::size_t j = 0; j < got.size(); ++j)
        if (got[j] != expected[j]) {
          seen.add("worker " + std::to_string(rank) + " " + what + ": element " +
                   std::to_string(j) + " is " + std::to_string(got[j]) + ", expected " +
                   std::to_string(expected[j]));
          return;
        }
    };
    for (int round = 0; round < rounds; ++round) {
      const auto r = static_cast<std::size_t>(round);
      for (std::size_t k = 0; k < shapes.size(); ++k) {
        std::vector<float> gradient(static_cast<std::size_t>(element_count(shapes[k])));
        for (std::size_t j = 0; j < gradient.size(); ++j)
          gradient[j] = 4.0f * compressed_test_gradient(rank, round, j);
        auto grad = ndarray::from_values(gradient, shapes[k]).as_type(type);
        auto pulled = ndarray::zeros(shapes[k], context::cpu(), type);
        const std::string what = "key " + std::to_string(k) + " round " + std::to_string(round);
        if (pushpull) {
          if (!seen.check(kv.pushpull(keys[k], grad, pulled), what + " pushpull"))
            return;
        } else if (!seen.check(kv.push(keys[k], grad), what + " push") ||
                   !seen.check(kv.pull(keys[k], pulled), what + " pull")) {
          return;
        }
        compare(pulled, received[k][r], what);
        auto again = ndarray::zeros(shapes[k], context::cpu(), type);
        if (!seen.check(kv.pull(keys[k], again), what + " second pull"))
          return;
        compare(again, sums[k][r], what + " second pull");
      }
    }
  });
  BOOST_TEST(seen.seen.empty(), "compressed pulls " << rule.describe() << " " << to_string(type)
                                                    << " W=" << workers << " S=" << servers
                                                    << (pushpull ? " pushpull" : " push, pull")
                                                    << "\n"
                                                    << seen.report());
}

} // namespace

BOOST_AUTO_TEST_SUITE(gradient_compression_in_one_process)

BOOST_AUTO_TEST_CASE(compressed_pulls_carry_each_round_with_the_servers_residual_per_worker) {
  const auto options = troupe::testing::make_options(2, 1'000'000, std::size_t{1} << 20);
  for (auto rule : {gradient_compression::make("2bit", 0.5).value(),
                    gradient_compression::make("1bit", 0.25).value()}) {
    rule.pulls = true;
    for (const bool pushpull : {false, true}) {
      check_compressed_pulls(rule, dtype::float32, 3, 2, pushpull, options);
      check_compressed_pulls(rule, dtype::float16, 2, 3, pushpull, options);
    }
  }
  // Packed replies cut into chunks of 8 KiB and slices of 16 KiB.
  auto small = troupe::testing::make_options(2, 1'000'000, std::size_t{8} << 10);
  small.slice_bytes = 16 * 1024;
  auto rule = gradient_compression::make("2bit", 0.5).value();
  rule.pulls = true;
  check_compressed_pulls(rule, dtype::float32, 2, 2, false, small);
}

BOOST_AUTO_TEST_CASE(with_an_optimizer_on_the_servers_compressed_pulls_stay_dense) {
  // The pulled value is the weight, not a sum to carry: the closed form of dense pulls holds.
  const auto options = troupe::testing::make_options(2, 1'000'000, std::size_t{1} << 20);
  auto rule = gradient_compression::make("2bit", 0.5).value();
  rule.pulls = true;
  check_compressed_rounds("dist_sync", rule, dtype::float32, 2, 2, true, options);
  check_compressed_rounds("dist_async", rule, dtype::float32, 2, 2, false, options);
}

BOOST_AUTO_TEST_CASE(dist_sync_sums_what_each_workers_packed_pushes_stand_for) {
  // A key of 35 elements (not whole words), one of 1.1M split over the servers, one of 17; the
  // residual carries over rounds; push then pull, and pushpull (which MXNet refuses compressed).
  const auto options = troupe::testing::make_options(2, 1'000'000, std::size_t{1} << 20);
  for (const auto& rule : {gradient_compression::make("2bit", 0.5).value(),
                           gradient_compression::make("1bit", 0.25).value()})
    for (const bool pushpull : {false, true}) {
      check_compressed_rounds("dist_sync", rule, dtype::float32, 3, 2, pushpull, options);
      check_compressed_rounds("dist_sync", rule, dtype::float16, 2, 3, pushpull, options);
    }
}

BOOST_AUTO_TEST_CASE(compressed_pushes_cut_into_chunks_and_slices_sum_the_same) {
  // 16 KiB slices and chunks of 8 KiB: the big key's packed pushes leave in many frames.
  auto options = troupe::testing::make_options(2, 1'000'000, std::size_t{8} << 10);
  options.slice_bytes = 16 * 1024;
  check_compressed_rounds("dist_sync", gradient_compression::make("2bit", 0.5).value(),
                          dtype::float32, 2, 2, false, options);
}

BOOST_AUTO_TEST_CASE(dist_async_applies_each_packed_push_once) {
  const auto options = troupe::testing::make_options(2, 1'000'000, std::size_t{1} << 20);
  check_compressed_rounds("dist_async", gradient_compression::make("2bit", 0.5).value(),
                          dtype::float32, 3, 2, false, options);
  check_compressed_rounds("dist_device_async", gradient_compression::make("1bit", 0.25).value(),
                          dtype::float32, 2, 2, false, options);
}

BOOST_AUTO_TEST_CASE(dist_device_sync_compresses_what_the_worker_summed) {
  // MXNet's dist_device_sync: the worker's devices are summed dense, then the sum is compressed.
  const auto options = troupe::testing::make_options(2, 1'000'000, std::size_t{1} << 20);
  check_compressed_rounds("dist_device_sync", gradient_compression::make("2bit", 0.5).value(),
                          dtype::float32, 2, 2, true, options);
}

BOOST_AUTO_TEST_CASE(compression_settings_that_mxnet_refuses_are_errors_naming_the_value) {
  in_process_job job{"dist_sync", 1, 1};
  auto& kv = *job.workers[0];
  auto unknown = kv.set_gradient_compression("3bit");
  BOOST_TEST_REQUIRE(!unknown.has_value());
  BOOST_TEST(unknown.error().message().find("'3bit'") != std::string::npos);
  auto negative = kv.set_gradient_compression("2bit", -0.5);
  BOOST_TEST_REQUIRE(!negative.has_value());
  BOOST_TEST(negative.error().message().find("-0.5") != std::string::npos);
  BOOST_TEST(!kv.set_gradient_compression("2bit", 0.0).has_value());
  BOOST_TEST(kv.set_gradient_compression("1bit", 0.0).has_value());
  // Keys that are not float32 or float16 travel dense.
  BOOST_TEST_REQUIRE(kv.init(1, ndarray::full({4}, 3.0, context::cpu(), dtype::int32)).has_value());
  BOOST_TEST_REQUIRE(kv.push(1, ndarray::full({4}, 7.0, context::cpu(), dtype::int32)).has_value());
  auto out = ndarray::zeros({4}, context::cpu(), dtype::int32);
  BOOST_TEST_REQUIRE(kv.pull(1, out).has_value());
  BOOST_TEST(out.to_vector<std::int32_t>() == std::vector<std::int32_t>(4, 7),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()

namespace {

/// The closed form in a distributed job: a row_sparse key of `rows` rows initialised to
/// ones, the test optimizer with rescale_grad 2, worker w pushing w + 1 into row w % rows (its
/// own rows of a big key: every row r with r % W == w and r % 5 == 0). After round i a row r
/// holds 1 + sum over the workers w that pushed it of 2 (w + 1) (i + 1); row_sparse_pull returns
/// exactly the rows asked for (unsorted, repeated float ids), every other row 0.
void check_row_sparse_rounds(const std::string& type_name, dtype type, std::uint32_t workers,
                             std::uint32_t servers, std::int64_t rows, std::int64_t width,
                             bool own_rows, const troupe::testing::in_process_options& options) {
  const bool async = type_name.find("async") != std::string::npos;
  const int rounds = 3;
  auto pushers_of = [&](std::int64_t r) {
    std::vector<std::uint32_t> ws;
    for (std::uint32_t w = 0; w < workers; ++w)
      if (own_rows ? (r % workers == w && r % 5 == 0) : (static_cast<std::int64_t>(w) % rows == r))
        ws.push_back(w);
    return ws;
  };
  in_process_job job{type_name, workers, servers, options};
  problems seen;
  job.run([&](std::uint32_t rank, kvstore& kv) {
    auto initial = row_sparse_array::from_dense(ndarray::ones({rows, width}, context::cpu(), type));
    if (!seen.check(kv.init(9, initial.value()), "init") ||
        !seen.check(kv.set_optimizer("test", {{"rescale_grad", 2.0}}), "set_optimizer"))
      return;
    std::vector<std::int64_t> mine;
    for (std::int64_t r = 0; r < rows; ++r)
      for (auto w : pushers_of(r))
        if (w == rank)
          mine.push_back(r);
    // Asked for: every third row, backwards, each twice, as floats.
    std::vector<float> asked;
    for (std::int64_t r = rows - 1; r >= 0; r -= 3) {
      asked.push_back(static_cast<float>(r));
      asked.push_back(static_cast<float>(r));
    }
    const auto ids = ndarray::from_values(asked, {static_cast<std::int64_t>(asked.size())});
    for (int round = 0; round < rounds; ++round) {
      auto values = ndarray::full({static_cast<std::int64_t>(mine.size()), width}, rank + 1.0,
                                  context::cpu(), type);
      auto grad = row_sparse_array::from_rows(values, mine, {rows, width}).value();
      if (!seen.check(kv.push(9, grad), "push"))
        return;
      if (async && (round + 1 < rounds || !seen.check(kv.barrier(), "barrier")))
        continue;
      row_sparse_array out;
      if (!seen.check(kv.row_sparse_pull(9, out, ids), "row_sparse_pull"))
        return;
      const auto dense = out.to_dense().as_type(dtype::float32).to_vector<float>();
      const int done = async ? rounds : round + 1;
      for (std::int64_t r = 0; r < rows; ++r) {
        float expected = 0;
        if ((rows - 1 - r) % 3 == 0) {
          expected = 1;
          for (auto w : pushers_of(r))
            expected += 2.0f * static_cast<float>(w + 1) * static_cast<float>(done);
        }
        const auto got = dense[static_cast<std::size_t>(r * width + width - 1)];
        if (got != expected) {
          seen.add("worker " + std::to_string(rank) + " round " + std::to_string(round) + ": row " +
                   std::to_string(r) + " is " + std::to_string(got) + ", expected " +
                   std::to_string(expected));
          return;
        }
      }
    }
    row_sparse_array none;
    if (seen.check(kv.row_sparse_pull(9, none, ndarray::zeros({0})), "empty row_sparse_pull") &&
        (none.stored_rows() != 0 || none.shape() != shape_vector{rows, width}))
      seen.add("an empty row_ids gave " + std::to_string(none.stored_rows()) + " rows");
  });
  BOOST_TEST(seen.seen.empty(), type_name << " " << to_string(type) << " W=" << workers
                                          << " S=" << servers << " rows=" << rows << "\n"
                                          << seen.report());
}

} // namespace

BOOST_AUTO_TEST_SUITE(row_sparse_in_one_process)

BOOST_AUTO_TEST_CASE(dist_sync_and_async_sum_the_pushed_rows_as_the_closed_form_says) {
  // A small key (whole on one server) and a big one split by rows over the servers (the bound is
  // lowered to 400 elements), float32 and float16.
  const auto options = troupe::testing::make_options(2, 400, std::size_t{1} << 20);
  for (const auto* type_name : {"dist_sync", "dist_async"})
    for (auto type : {dtype::float32, dtype::float16}) {
      check_row_sparse_rounds(type_name, type, 5, 2, 3, 4, false, options);
      check_row_sparse_rounds(type_name, type, 4, 3, 1000, 8, true, options);
    }
  check_row_sparse_rounds("dist_sync", dtype::float32, 1, 1, 7, 3, false, options);
  check_row_sparse_rounds("dist_sync", dtype::float32, 3, 4, 5, 100, true, options);
}

BOOST_AUTO_TEST_CASE(without_an_optimizer_the_round_sum_becomes_the_key) {
  in_process_job job{"dist_sync", 3, 2, troupe::testing::make_options(2, 10, std::size_t{1} << 20)};
  problems seen;
  job.run([&](std::uint32_t rank, kvstore& kv) {
    if (!seen.check(kv.init(4, row_sparse_array::from_dense(ndarray::ones({6, 2})).value()),
                    "init"))
      return;
    // Worker w pushes 1 into rows w and 5: row 5 sums three pushes, rows 3 and 4 none.
    auto grad = row_sparse_array::from_rows(ndarray::ones({2, 2}),
                                            std::vector<std::int64_t>{rank, 5}, {6, 2})
                    .value();
    if (!seen.check(kv.push(4, grad), "push"))
      return;
    row_sparse_array out;
    if (!seen.check(kv.row_sparse_pull(4, out, ndarray::from_values({0, 1, 2, 3, 4, 5}, {6})),
                    "row_sparse_pull"))
      return;
    const std::vector<float> expected{1, 1, 1, 1, 1, 1, 0, 0, 0, 0, 3, 3};
    if (out.to_dense().to_vector<float>() != expected)
      seen.add("worker " + std::to_string(rank) + " pulled another sum");
  });
  BOOST_TEST(seen.seen.empty(), seen.report());
}

BOOST_AUTO_TEST_CASE(lazy_sgd_on_the_servers_moves_only_the_pushed_rows) {
  in_process_job job{"dist_async", 2, 2,
                     troupe::testing::make_options(1, 10, std::size_t{1} << 20)};
  problems seen;
  job.run([&](std::uint32_t rank, kvstore& kv) {
    if (!seen.check(kv.init(0, row_sparse_array::from_dense(ndarray::ones({8, 2})).value()),
                    "init") ||
        !seen.check(kv.set_optimizer("sgd", {{"learning_rate", 0.5}, {"wd", 0.1}}),
                    "set_optimizer"))
      return;
    // Each worker pushes ones into row 6 * rank + 1 (rows 1 and 7, on different servers).
    auto grad = row_sparse_array::from_rows(ndarray::ones({1, 2}),
                                            std::vector<std::int64_t>{6 * rank + 1}, {8, 2})
                    .value();
    if (!seen.check(kv.push(0, grad), "push") || !seen.check(kv.barrier(), "barrier"))
      return;
    row_sparse_array out;
    if (!seen.check(kv.row_sparse_pull(0, out, ndarray::from_values({0, 1, 6, 7}, {4})),
                    "row_sparse_pull"))
      return;
    // Pushed rows: 1 - 0.5 (1 + 0.1) = 0.45; the others keep 1 (lazy_update: wd leaves them).
    // (Rows 2 to 5 were not asked for: 0.)
    const std::vector<float> expected{1, 1, 0.45f, 0.45f, 0, 0, 0,     0,
                                      0, 0, 0,     0,     1, 1, 0.45f, 0.45f};
    if (auto got = out.to_dense().to_vector<float>(); got != expected) {
      std::string text;
      for (auto v : got)
        text += " " + std::to_string(v);
      seen.add("worker " + std::to_string(rank) + " pulled" + text);
    }
  });
  BOOST_TEST(seen.seen.empty(), seen.report());
}

BOOST_AUTO_TEST_CASE(dense_calls_on_row_sparse_keys_and_bad_rows_are_errors_naming_them) {
  in_process_job job{"dist_sync", 1, 2, troupe::testing::make_options(2, 10, std::size_t{1} << 20)};
  auto& kv = *job.workers[0];
  BOOST_TEST_REQUIRE(
      kv.init("table", row_sparse_array::from_dense(ndarray::ones({6, 2})).value()).has_value());
  BOOST_TEST_REQUIRE(kv.init("bias", ndarray::ones({2})).has_value());
  auto out = ndarray::zeros({6, 2});
  auto pulled = kv.pull("table", out);
  BOOST_TEST_REQUIRE(!pulled.has_value());
  BOOST_TEST(pulled.error().message().find("row_sparse_pull") != std::string::npos,
             pulled.error().message());
  BOOST_TEST(!kv.push("table", ndarray::ones({6, 2})).has_value());
  row_sparse_array rows;
  auto dense_key = kv.row_sparse_pull("bias", rows, ndarray::zeros({1}));
  BOOST_TEST_REQUIRE(!dense_key.has_value());
  BOOST_TEST(dense_key.error().message().find("'bias'") != std::string::npos);
  auto outside = kv.row_sparse_pull("table", rows, ndarray::from_values({6}, {1}));
  BOOST_TEST_REQUIRE(!outside.has_value());
  BOOST_TEST(outside.error().message() ==
             "row_sparse_pull of key 'table': row_ids: row id 6 is outside [0, 6)");
  auto wrong_shape =
      kv.push("table", row_sparse_array::from_rows(ndarray::ones({1, 3}),
                                                   std::vector<std::int64_t>{0}, {6, 3})
                           .value());
  BOOST_TEST_REQUIRE(!wrong_shape.has_value());
  BOOST_TEST(wrong_shape.error().code() == errc::shape_mismatch);
  BOOST_TEST_REQUIRE(kv.set_gradient_compression("2bit", 0.5).has_value());
  auto compressed =
      kv.push("table", row_sparse_array::from_rows(ndarray::ones({1, 2}),
                                                   std::vector<std::int64_t>{0}, {6, 2})
                           .value());
  BOOST_TEST_REQUIRE(!compressed.has_value());
  BOOST_TEST(compressed.error().code() == errc::not_supported);
  // Nothing changed the table.
  BOOST_TEST_REQUIRE(
      kv.row_sparse_pull("table", rows, ndarray::from_values({0, 1, 2, 3, 4, 5}, {6})).has_value());
  BOOST_TEST(rows.to_dense().to_vector<float>() == std::vector<float>(12, 1.0f),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_SUITE_END()
