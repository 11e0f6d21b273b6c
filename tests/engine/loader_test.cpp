// Tests of the in-memory data set, the samplers, gluon's batch sampler (keep, discard, rollover),
// the loader's gathered batches, and common_batch_count on uneven parts.

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/data/loader.hpp"

using namespace troupe;
using namespace troupe::data;

namespace {

using index_list = std::vector<std::int64_t>;

std::shared_ptr<const sampler> sharded(std::int64_t count, std::int64_t parts, std::int64_t part,
                                       bool shuffle = true, std::uint64_t seed = 0) {
  return make_sharded_sampler(count, parts, part, shuffle, seed).value();
}

/// Flattens an epoch's batches.
index_list flatten(const std::vector<index_list>& batches) {
  index_list all;
  for (const auto& b : batches)
    all.insert(all.end(), b.begin(), b.end());
  return all;
}

/// A set of `n` samples whose data row i is [i, 100 + i, 200 + i] and label i is 1000 + i.
in_memory_dataset numbered_set(std::int64_t n) {
  std::vector<float> data;
  std::vector<float> labels;
  for (std::int64_t i = 0; i < n; ++i) {
    for (int column = 0; column < 3; ++column)
      data.push_back(static_cast<float>(100 * column + i));
    labels.push_back(static_cast<float>(1000 + i));
  }
  return in_memory_dataset::create(ndarray::from_values(data, {n, 3}),
                                   ndarray::from_values(labels, {n}))
      .value();
}

} // namespace

BOOST_AUTO_TEST_SUITE(data_loader_as_gluon)

BOOST_AUTO_TEST_CASE(the_parts_of_a_sharded_sampler_serve_every_sample_exactly_once_per_epoch) {
  for (std::int64_t count : {0, 1, 7, 10, 64, 100, 1001}) {
    for (std::int64_t parts : {1, 2, 3, 4, 7, 16}) {
      for (std::int64_t epoch : {0, 1, 5}) {
        std::vector<int> served(static_cast<std::size_t>(count), 0);
        std::int64_t total = 0;
        for (std::int64_t part = 0; part < parts; ++part) {
          auto s = sharded(count, parts, part, true, 42);
          auto order = s->order(epoch);
          BOOST_TEST(static_cast<std::int64_t>(order.size()) == s->size());
          // Shuffling stays within the part: MXNet's part_range bounds it.
          const auto [first, last] = part_range(count, parts, part);
          for (auto index : order) {
            BOOST_TEST_REQUIRE((index >= first && index < last),
                               "index " << index << " outside part " << part << " [" << first
                                        << ", " << last << ")");
            ++served[static_cast<std::size_t>(index)];
          }
          total += static_cast<std::int64_t>(order.size());
        }
        BOOST_TEST(total == count);
        BOOST_TEST(std::all_of(served.begin(), served.end(), [](int n) { return n == 1; }),
                   "count " << count << " parts " << parts << " epoch " << epoch);
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_loader_per_part_covers_the_set_once_per_epoch_with_keep) {
  const std::int64_t count = 103;
  auto set = numbered_set(count);
  for (std::int64_t parts : {1, 2, 3, 5}) {
    std::vector<data_loader> loaders;
    for (std::int64_t part = 0; part < parts; ++part)
      loaders.push_back(
          data_loader::create(set, sharded(count, parts, part, true, 9), 8, last_batch::keep)
              .value());
    for (int epoch = 0; epoch < 3; ++epoch) {
      std::multiset<float> labels;
      for (auto& loader : loaders) {
        while (auto b = loader.next())
          for (float label : b->label.to_vector<float>())
            labels.insert(label);
        loader.reset();
      }
      BOOST_TEST(static_cast<std::int64_t>(labels.size()) == count);
      BOOST_TEST(static_cast<std::int64_t>(std::set<float>(labels.begin(), labels.end()).size()) ==
                 count);
    }
  }
}

BOOST_AUTO_TEST_CASE(orders_are_a_function_of_seed_and_epoch) {
  auto a = make_random_sampler(50, 7).value();
  auto b = make_random_sampler(50, 7).value();
  auto c = make_random_sampler(50, 8).value();
  BOOST_TEST(a->order(0) == b->order(0));
  BOOST_TEST(a->order(3) == b->order(3));
  // Asked twice, the same epoch gives the same order: samplers hold no state.
  BOOST_TEST(a->order(3) == a->order(3));
  BOOST_TEST(a->order(0) != a->order(1));
  BOOST_TEST(a->order(0) != c->order(0));
  // Neighbouring seeds do not give shifted copies of each other's epochs.
  BOOST_TEST(c->order(0) != a->order(1));
  auto order = a->order(2);
  std::sort(order.begin(), order.end());
  index_list expected(50);
  std::iota(expected.begin(), expected.end(), 0);
  BOOST_TEST(order == expected);

  auto sequential = make_sequential_sampler(4, 10).value();
  BOOST_TEST(sequential->order(5) == (index_list{10, 11, 12, 13}));
  auto unshuffled = sharded(10, 3, 1, false);
  BOOST_TEST(unshuffled->order(2) == (index_list{3, 4, 5, 6}));
}

BOOST_AUTO_TEST_CASE(keep_serves_a_short_last_batch_and_discard_drops_it) {
  auto seq = make_sequential_sampler(10).value();
  auto keep = batch_sampler::create(seq, 4, last_batch::keep).value();
  BOOST_TEST(keep.size() == 3);
  auto batches = keep.next_epoch();
  BOOST_TEST_REQUIRE(batches.size() == 3u);
  BOOST_TEST(batches[2] == (index_list{8, 9}));
  BOOST_TEST(keep.next_epoch().size() == 3u);

  auto discard = batch_sampler::create(seq, 4, last_batch::discard).value();
  BOOST_TEST(discard.size() == 2);
  batches = discard.next_epoch();
  BOOST_TEST_REQUIRE(batches.size() == 2u);
  BOOST_TEST(batches[1] == (index_list{4, 5, 6, 7}));
  BOOST_TEST(discard.next_epoch().size() == 2u);

  // An exact multiple leaves nothing over under any rule.
  for (auto rule : {last_batch::keep, last_batch::discard, last_batch::rollover}) {
    auto exact = batch_sampler::create(seq, 5, rule).value();
    BOOST_TEST(exact.next_epoch().size() == 2u, to_string(rule));
    BOOST_TEST(exact.size() == 2, to_string(rule));
  }
}

BOOST_AUTO_TEST_CASE(rollover_carries_the_leftover_to_the_front_of_the_next_epoch) {
  // gluon: BatchSampler(SequentialSampler(10), 4, 'rollover') gives [0..3], [4..7]; then
  // [8, 9, 0, 1], [2..5] (6, 7, 8, 9 make a third batch: len is (2 + 10) // 4 = 3); and so on.
  auto roll =
      batch_sampler::create(make_sequential_sampler(10).value(), 4, last_batch::rollover).value();
  BOOST_TEST(roll.size() == 2);
  auto first = roll.next_epoch();
  BOOST_TEST(first == (std::vector<index_list>{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  BOOST_TEST(roll.size() == 3);
  auto second = roll.next_epoch();
  BOOST_TEST(second == (std::vector<index_list>{{8, 9, 0, 1}, {2, 3, 4, 5}, {6, 7, 8, 9}}));
  // Nothing was left over by the second epoch.
  BOOST_TEST(roll.size() == 2);
  // Over many epochs every sample is served as often as any other, give or take the carried ones.
  std::vector<int> served(10, 0);
  std::int64_t batches = 0;
  for (int epoch = 0; epoch < 20; ++epoch) {
    auto all = roll.next_epoch();
    batches += static_cast<std::int64_t>(all.size());
    for (auto index : flatten(all))
      ++served[static_cast<std::size_t>(index)];
  }
  BOOST_TEST(batches == 50); // 200 samples in batches of 4: no sample lost
  BOOST_TEST(std::all_of(served.begin(), served.end(), [](int n) { return n == 20; }));
}

BOOST_AUTO_TEST_CASE(batches_are_gathered_rows_of_the_data_and_labels) {
  auto set = numbered_set(10);
  auto loader =
      data_loader::create(set, make_random_sampler(10, 3).value(), 4, last_batch::keep).value();
  auto order = make_random_sampler(10, 3).value()->order(0);
  BOOST_TEST(loader.num_batches() == 3);
  std::size_t served = 0;
  while (auto b = loader.next()) {
    const auto rows = b->data.shape()[0];
    BOOST_TEST(b->data.shape() == (shape_vector{rows, 3}));
    BOOST_TEST(b->label.shape() == (shape_vector{rows}));
    BOOST_TEST(b->pad == 0);
    auto data = b->data.to_vector<float>();
    auto labels = b->label.to_vector<float>();
    for (std::int64_t r = 0; r < rows; ++r, ++served) {
      const auto i = static_cast<float>(order[served]);
      BOOST_TEST(labels[static_cast<std::size_t>(r)] == 1000 + i);
      BOOST_TEST(data[static_cast<std::size_t>(r * 3)] == i);
      BOOST_TEST(data[static_cast<std::size_t>(r * 3 + 2)] == 200 + i);
    }
  }
  BOOST_TEST(served == 10u);
  BOOST_TEST(!loader.next().has_value());
  loader.reset();
  BOOST_TEST(loader.epoch() == 1);
  BOOST_TEST(loader.next().has_value());

  // Other dtypes and trailing axes are copied as bytes.
  auto ints = in_memory_dataset::create(
                  ndarray::from_values({0, 1, 2, 3, 4, 5}, {3, 2}, context::cpu(), dtype::int64),
                  ndarray::from_values({7, 8, 9}, {3}, context::cpu(), dtype::int32))
                  .value();
  auto picked = gather_rows(ints.data(), index_list{2, 0});
  BOOST_TEST(picked.dtype() == dtype::int64);
  BOOST_TEST(picked.to_vector<std::int64_t>() == (std::vector<std::int64_t>{4, 5, 0, 1}));
  BOOST_TEST(gather_rows(ints.label(), index_list{1}).to_vector<std::int32_t>() ==
             (std::vector<std::int32_t>{8}));
}

BOOST_AUTO_TEST_CASE(common_batch_count_is_what_the_smallest_part_can_serve) {
  // 60001 samples in 2 parts: 30001 and 30000 (part_range rounds 30000.5 up).
  BOOST_TEST(part_range(60001, 2, 0).second == 30001);
  BOOST_TEST(common_batch_count(60001, 2, 64, last_batch::keep) == 469);    // 469 and 469
  BOOST_TEST(common_batch_count(60001, 2, 64, last_batch::discard) == 468); // 468 and 468
  BOOST_TEST(common_batch_count(60001, 2, 64, last_batch::rollover) == 468);
  // 129 in 2 parts: 65 and 64. With keep the first part has 2 batches, the second 1: a worker
  // running all of its own batches would wait forever in a second sync round.
  BOOST_TEST(common_batch_count(129, 2, 64, last_batch::keep) == 1);
  BOOST_TEST(common_batch_count(129, 2, 64, last_batch::discard) == 1);
  // 60000 in 7 parts of 8571 or 8572: batch 4286 divides 8572 twice but 8571 only once (+1 kept).
  BOOST_TEST(common_batch_count(60000, 7, 4286, last_batch::discard) == 1);
  BOOST_TEST(common_batch_count(60000, 7, 4286, last_batch::keep) == 2);
  BOOST_TEST(common_batch_count(0, 3, 8, last_batch::keep) == 0);
  BOOST_TEST(common_batch_count(2, 3, 8, last_batch::keep) == 0); // one part is empty

  // It agrees with the loaders of every part, and every part can serve that many.
  for (std::int64_t count : {10, 129, 1000, 1001}) {
    for (std::int64_t parts : {1, 2, 3, 7}) {
      for (auto rule : {last_batch::keep, last_batch::discard}) {
        std::int64_t fewest = -1;
        for (std::int64_t part = 0; part < parts; ++part) {
          auto b = batch_sampler::create(sharded(count, parts, part), 32, rule).value();
          const auto n = static_cast<std::int64_t>(b.next_epoch().size());
          fewest = fewest < 0 ? n : std::min(fewest, n);
        }
        BOOST_TEST(common_batch_count(count, parts, 32, rule) == fewest,
                   count << " " << parts << " " << to_string(rule));
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(bad_arguments_are_errors_naming_the_value) {
  auto set = numbered_set(5);
  BOOST_TEST(!make_sharded_sampler(10, 0, 0).has_value());
  auto out_of_range = make_sharded_sampler(10, 2, 2);
  BOOST_TEST_REQUIRE(!out_of_range.has_value());
  BOOST_TEST(out_of_range.error().message().find("part_index 2") != std::string::npos);
  BOOST_TEST(!make_random_sampler(-1).has_value());
  auto zero_batch = data_loader::create(set, make_sequential_sampler(5).value(), 0);
  BOOST_TEST_REQUIRE(!zero_batch.has_value());
  BOOST_TEST(zero_batch.error().message().find("batch_size") != std::string::npos);
  auto too_long = data_loader::create(set, make_sequential_sampler(6).value(), 2);
  BOOST_TEST_REQUIRE(!too_long.has_value());
  BOOST_TEST(too_long.error().message().find("index 5") != std::string::npos);
  auto mismatch = in_memory_dataset::create(ndarray::zeros({4, 2}), ndarray::zeros({3}));
  BOOST_TEST_REQUIRE(!mismatch.has_value());
  BOOST_TEST(mismatch.error().message().find("(4,2)") != std::string::npos);
  BOOST_CHECK_THROW(common_batch_count(10, 2, 0, last_batch::keep), troupe::exception);
}

BOOST_AUTO_TEST_SUITE_END()
