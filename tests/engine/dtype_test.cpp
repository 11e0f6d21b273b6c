#include <boost/test/unit_test.hpp>

#include "engine/dtype.hpp"

using troupe::dtype;

BOOST_AUTO_TEST_SUITE(dtype_suite)

BOOST_AUTO_TEST_CASE(every_dtype_has_mxnets_name_and_element_size) {
  BOOST_TEST(troupe::size_of(dtype::float32) == 4u);
  BOOST_TEST(troupe::size_of(dtype::float16) == 2u);
  BOOST_TEST(troupe::size_of(dtype::int32) == 4u);
  BOOST_TEST(troupe::size_of(dtype::int64) == 8u);
  BOOST_TEST(troupe::size_of(dtype::float64) == 8u);
  BOOST_TEST(troupe::to_string(dtype::float32) == "float32");
  BOOST_TEST(troupe::to_string(dtype::float16) == "float16");
  BOOST_TEST(troupe::to_string(dtype::int32) == "int32");
  BOOST_TEST(troupe::to_string(dtype::int64) == "int64");
  BOOST_TEST(troupe::to_string(dtype::float64) == "float64");
}

BOOST_AUTO_TEST_CASE(parse_dtype_inverts_to_string_and_rejects_other_names) {
  for (auto type : {dtype::float32, dtype::float16, dtype::int32, dtype::int64, dtype::float64})
    BOOST_TEST((troupe::parse_dtype(troupe::to_string(type)) == type));
  BOOST_TEST(!troupe::parse_dtype("float"));
  BOOST_TEST(!troupe::parse_dtype("Float32"));
  BOOST_TEST(!troupe::parse_dtype(""));
  BOOST_TEST(!troupe::parse_dtype("uint8"));
}

BOOST_AUTO_TEST_SUITE_END()
