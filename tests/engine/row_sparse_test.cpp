// engine/row_sparse.hpp: row_sparse arrays to and from dense, MXNet's checks of (data, indices),
// sparse_retain, and the normalisation of row_sparse_pull's row ids.

#include <cstdint>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/row_sparse.hpp"

using namespace troupe;

namespace {

/// A (rows, 3) float32 array whose row r is r * 10 + column where `present` says, else zeros.
ndarray table_with_rows(std::int64_t rows, const std::vector<std::int64_t>& present) {
  std::vector<float> values(static_cast<std::size_t>(rows * 3), 0.0f);
  for (auto r : present)
    for (int c = 0; c < 3; ++c)
      values[static_cast<std::size_t>(r * 3 + c)] = static_cast<float>(r * 10 + c + 1);
  return ndarray::from_values(values, {rows, 3});
}

} // namespace

BOOST_AUTO_TEST_SUITE(row_sparse_arrays)

BOOST_AUTO_TEST_CASE(a_dense_array_keeps_its_nonzero_rows_and_comes_back_the_same) {
  for (auto type : {dtype::float32, dtype::float16, dtype::float64, dtype::int32, dtype::int64}) {
    const auto dense = table_with_rows(7, {1, 4, 6}).as_type(type);
    auto sparse = row_sparse_array::from_dense(dense);
    BOOST_TEST_REQUIRE(sparse.has_value(), to_string(type));
    BOOST_TEST(sparse->indices() == (std::vector<std::int64_t>{1, 4, 6}),
               boost::test_tools::per_element());
    BOOST_TEST((sparse->data().shape() == shape_vector{3, 3}));
    BOOST_TEST(sparse->dtype() == type);
    BOOST_TEST(sparse->row_elements() == 3);
    BOOST_TEST(sparse->to_dense().as_type(dtype::float32).to_vector<float>() ==
                   dense.as_type(dtype::float32).to_vector<float>(),
               boost::test_tools::per_element());
  }
  // -0.0 is zero, as MXNet compares with 0; all-zero and empty tables store nothing.
  auto negative_zero = row_sparse_array::from_dense(ndarray::full({2, 2}, -0.0));
  BOOST_TEST_REQUIRE(negative_zero.has_value());
  BOOST_TEST(negative_zero->stored_rows() == 0u);
  auto empty = row_sparse_array::from_dense(ndarray::zeros({0, 4}));
  BOOST_TEST_REQUIRE(empty.has_value());
  BOOST_TEST(empty->to_dense().size() == 0);
}

BOOST_AUTO_TEST_CASE(data_and_indices_make_the_dense_array_with_zeros_elsewhere) {
  const auto rows = ndarray::from_values({1, 2, 3, 4, 5, 6}, {2, 3});
  auto sparse = row_sparse_array::from_rows(rows, std::vector<std::int64_t>{0, 5}, {6, 3});
  BOOST_TEST_REQUIRE(sparse.has_value());
  BOOST_TEST(sparse->to_dense().to_vector<float>() ==
                 (std::vector<float>{1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 4, 5, 6}),
             boost::test_tools::per_element());
  auto none = row_sparse_array::zeros({4, 2}, dtype::float16);
  BOOST_TEST(none.stored_rows() == 0u);
  BOOST_TEST(none.to_dense().as_type(dtype::float32).to_vector<float>() ==
                 std::vector<float>(8, 0.0f),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(indices_out_of_range_or_order_and_data_of_another_shape_are_named) {
  const auto rows = ndarray::ones({2, 3});
  struct bad {
    std::vector<std::int64_t> indices;
    shape_vector shape;
    std::string named;
  };
  for (const auto& [indices, shape, named] :
       std::vector<bad>{{{0, 6}, {6, 3}, "index 6 at position 1 is outside [0, 6)"},
                        {{-1, 2}, {6, 3}, "index -1 at position 0"},
                        {{3, 3}, {6, 3}, "index 3 at position 1 does not follow 3"},
                        {{4, 2}, {6, 3}, "index 2 at position 1 does not follow 4"},
                        {{0, 1}, {6, 4}, "data of shape (2,3), expected (2,4)"},
                        {{0}, {6, 3}, "data of shape (2,3), expected (1,3)"},
                        {{}, {}, "it needs a row axis"}}) {
    auto made = row_sparse_array::from_rows(rows, indices, shape);
    BOOST_TEST_REQUIRE(!made.has_value(), named);
    BOOST_TEST(made.error().message().find(named) != std::string::npos, made.error().message());
  }
  BOOST_TEST(!row_sparse_array::from_dense(ndarray::full({}, 1.0)).has_value());
}

BOOST_AUTO_TEST_CASE(retain_keeps_the_stored_rows_among_the_ids_asked) {
  auto sparse = row_sparse_array::from_dense(table_with_rows(10, {2, 3, 7})).value();
  const std::vector<std::int64_t> ids{0, 3, 5, 7, 9};
  auto kept = sparse.retain(ids);
  BOOST_TEST(kept.indices() == (std::vector<std::int64_t>{3, 7}), boost::test_tools::per_element());
  BOOST_TEST(kept.data().to_vector<float>() == (std::vector<float>{31, 32, 33, 71, 72, 73}),
             boost::test_tools::per_element());
  BOOST_TEST((kept.shape() == shape_vector{10, 3}));
  BOOST_TEST(sparse.retain({}).stored_rows() == 0u);
}

BOOST_AUTO_TEST_CASE(row_ids_of_any_shape_and_type_are_flattened_sorted_and_made_unique) {
  const std::vector<std::int64_t> expected{0, 2, 5};
  for (auto type : {dtype::float32, dtype::float16, dtype::float64, dtype::int32, dtype::int64}) {
    const auto ids = ndarray::from_values({5, 2, 2, 0, 5, 2}, {2, 3}).as_type(type);
    auto unique = unique_row_ids(ids, 6, "row_ids");
    BOOST_TEST_REQUIRE(unique.has_value(), to_string(type));
    BOOST_TEST(*unique == expected, boost::test_tools::per_element());
  }
  BOOST_TEST(unique_row_ids(ndarray::zeros({0}), 6, "row_ids").value().empty());
  auto outside = unique_row_ids(ndarray::from_values({1, 6}, {2}), 6, "row_sparse_pull of key 3");
  BOOST_TEST_REQUIRE(!outside.has_value());
  BOOST_TEST(outside.error().message() == "row_sparse_pull of key 3: row id 6 is outside [0, 6)");
  auto fraction = unique_row_ids(ndarray::from_values({1.5}, {1}), 6, "row_ids");
  BOOST_TEST_REQUIRE(!fraction.has_value());
  BOOST_TEST(fraction.error().message() == "row_ids: row id 1.5 is not an integer");
  auto negative =
      unique_row_ids(ndarray::from_values({-1}, {1}).as_type(dtype::int64), 6, "row_ids");
  BOOST_TEST(!negative.has_value());
}

BOOST_AUTO_TEST_SUITE_END()
