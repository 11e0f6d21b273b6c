// split_and_load against MXNet 1.x gluon.utils.split_data / split_and_load (batch axis 0).

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/data/split.hpp"

using troupe::context;
using troupe::errc;
using troupe::ndarray;
using troupe::data::split_and_load;

namespace {

/// A (rows, cols) float32 batch on cpu(0) holding 0, 1, 2, ... in row-major order.
ndarray iota_batch(std::int64_t rows, std::int64_t cols) {
  std::vector<float> values(static_cast<std::size_t>(rows * cols));
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = static_cast<float>(i);
  return ndarray::from_values(values, {rows, cols});
}

/// The values of rows [begin, end) of iota_batch(_, cols).
std::vector<float> iota_rows(std::int64_t begin, std::int64_t end, std::int64_t cols) {
  std::vector<float> values;
  for (std::int64_t i = begin * cols; i < end * cols; ++i)
    values.push_back(static_cast<float>(i));
  return values;
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

const std::array<context, 4> four_cpus{context::cpu(0), context::cpu(1), context::cpu(2),
                                       context::cpu(3)};

} // namespace

BOOST_AUTO_TEST_SUITE(split_and_load_suite)

BOOST_AUTO_TEST_CASE(an_even_split_gives_one_equal_slice_per_context_with_the_right_rows) {
  const ndarray batch = iota_batch(8, 3);
  auto slices = split_and_load(batch, four_cpus);
  BOOST_TEST_REQUIRE(slices.has_value());
  BOOST_TEST_REQUIRE(slices->size() == 4U);
  for (std::size_t i = 0; i < 4; ++i) {
    const ndarray& slice = (*slices)[i];
    BOOST_TEST((slice.shape() == troupe::shape_vector{2, 3}));
    BOOST_TEST(slice.ctx() == four_cpus[i]);
    BOOST_TEST(slice.to_vector<float>() == iota_rows(2 * static_cast<std::int64_t>(i),
                                                     2 * static_cast<std::int64_t>(i) + 2, 3),
               boost::test_tools::per_element());
    BOOST_TEST(!slice.shares_storage_with(batch));
  }
}

BOOST_AUTO_TEST_CASE(an_uneven_split_gives_the_last_context_the_remainder_as_mxnet_does) {
  // 10 rows over 4 contexts: step = 10 // 4 = 2, so 2, 2, 2 and the last takes 4.
  auto slices = split_and_load(iota_batch(10, 3), four_cpus, /*even_split=*/false);
  BOOST_TEST_REQUIRE(slices.has_value());
  BOOST_TEST_REQUIRE(slices->size() == 4U);
  const std::array<std::int64_t, 5> bounds{0, 2, 4, 6, 10};
  for (std::size_t i = 0; i < 4; ++i) {
    const ndarray& slice = (*slices)[i];
    BOOST_TEST((slice.shape() == troupe::shape_vector{bounds[i + 1] - bounds[i], 3}));
    BOOST_TEST(slice.ctx() == four_cpus[i]);
    BOOST_TEST(slice.to_vector<float>() == iota_rows(bounds[i], bounds[i + 1], 3),
               boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(an_uneven_split_of_a_batch_as_large_as_the_contexts_gives_one_row_each) {
  auto slices = split_and_load(iota_batch(4, 2), four_cpus, /*even_split=*/false);
  BOOST_TEST_REQUIRE(slices.has_value());
  BOOST_TEST_REQUIRE(slices->size() == 4U);
  for (std::size_t i = 0; i < 4; ++i)
    BOOST_TEST((*slices)[i].to_vector<float>() ==
                   iota_rows(static_cast<std::int64_t>(i), static_cast<std::int64_t>(i) + 1, 2),
               boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(one_context_gets_a_copy_of_the_whole_batch_even_when_it_is_uneven) {
  const ndarray batch = iota_batch(5, 3);
  const std::array<context, 1> one{context::cpu(2)};
  auto slices = split_and_load(batch, one);
  BOOST_TEST_REQUIRE(slices.has_value());
  BOOST_TEST_REQUIRE(slices->size() == 1U);
  BOOST_TEST(((*slices)[0].shape() == troupe::shape_vector{5, 3}));
  BOOST_TEST((*slices)[0].ctx() == context::cpu(2));
  BOOST_TEST((*slices)[0].to_vector<float>() == iota_rows(0, 5, 3),
             boost::test_tools::per_element());
  BOOST_TEST(!(*slices)[0].shares_storage_with(batch));
}

BOOST_AUTO_TEST_CASE(an_uneven_batch_with_even_split_is_an_error_naming_the_shape_and_count) {
  auto slices = split_and_load(iota_batch(10, 3), four_cpus);
  BOOST_TEST_REQUIRE(!slices.has_value());
  BOOST_TEST(slices.error().code() == errc::invalid_argument);
  const std::string& message = slices.error().message();
  BOOST_TEST_INFO(message);
  BOOST_TEST(contains(message, "data with shape (10,3) cannot be evenly split into 4 slices"));
  BOOST_TEST(contains(message, "multiple of 4"));
  BOOST_TEST(contains(message, "even_split=False"));
}

BOOST_AUTO_TEST_CASE(a_batch_smaller_than_the_contexts_is_an_error_naming_both_numbers) {
  for (bool even_split : {true, false}) {
    auto slices = split_and_load(iota_batch(3, 2), four_cpus, even_split);
    BOOST_TEST_REQUIRE(!slices.has_value());
    BOOST_TEST(slices.error().code() == errc::invalid_argument);
    const std::string& message = slices.error().message();
    BOOST_TEST_INFO(message);
    BOOST_TEST(contains(message, "batch of 3 samples"));
    BOOST_TEST(contains(message, "number of contexts, 4"));
  }
}

BOOST_AUTO_TEST_CASE(an_empty_batch_is_smaller_than_the_contexts) {
  auto slices = split_and_load(ndarray::zeros({0, 3}), four_cpus);
  BOOST_TEST_REQUIRE(!slices.has_value());
  BOOST_TEST(slices.error().code() == errc::invalid_argument);
  BOOST_TEST(contains(slices.error().message(), "batch of 0 samples"));
}

BOOST_AUTO_TEST_CASE(no_contexts_is_an_error_naming_the_count) {
  auto slices = split_and_load(iota_batch(8, 3), std::span<const context>{});
  BOOST_TEST_REQUIRE(!slices.has_value());
  BOOST_TEST(slices.error().code() == errc::invalid_argument);
  BOOST_TEST(contains(slices.error().message(), "at least one context, got 0"));
}

BOOST_AUTO_TEST_CASE(a_scalar_or_none_batch_is_an_error) {
  auto scalar = split_and_load(ndarray::zeros({}), four_cpus);
  BOOST_TEST_REQUIRE(!scalar.has_value());
  BOOST_TEST(scalar.error().code() == errc::invalid_argument);
  auto none = split_and_load(ndarray{}, four_cpus);
  BOOST_TEST_REQUIRE(!none.has_value());
  BOOST_TEST(none.error().code() == errc::invalid_argument);
}

BOOST_AUTO_TEST_SUITE_END()
