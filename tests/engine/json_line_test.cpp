#include <cmath>
#include <cstdio>
#include <string>

#include <boost/test/unit_test.hpp>

#include "engine/json_line.hpp"

namespace json_line = troupe::json_line;

BOOST_AUTO_TEST_SUITE(json_line_suite)

BOOST_AUTO_TEST_CASE(a_line_is_compact_with_its_keys_in_the_order_they_were_added) {
  json_line::object line;
  line["bench"] = "kvbench";
  line["op"] = "push";
  line["bytes"] = std::size_t{4096};
  line["gbps"] = json_line::fixed(2.1604328, 3);
  line["hybridize"] = false;
  line["final_test_acc"] = NAN;
  BOOST_TEST(line.dump() == R"({"bench":"kvbench","op":"push","bytes":4096,"gbps":2.16,)"
                            R"("hybridize":false,"final_test_acc":null})");
}

BOOST_AUTO_TEST_CASE(rounded_numbers_print_the_digits_printf_prints_without_trailing_zeros) {
  BOOST_TEST(json_line::object(json_line::fixed(83.4449, 1)).dump() == "83.4");
  BOOST_TEST(json_line::object(json_line::fixed(0.0004, 3)).dump() == "0.0");
  BOOST_TEST(json_line::object(json_line::fixed(1234.5678, 3)).dump() == "1234.568");
  BOOST_TEST(json_line::object(json_line::significant(41234.5678, 6)).dump() == "41234.6");
  BOOST_TEST(json_line::object(json_line::significant(0.412345678, 6)).dump() == "0.412346");
  BOOST_TEST(std::isnan(json_line::fixed(NAN, 3)));
  BOOST_TEST(std::isinf(json_line::significant(INFINITY, 6)));
}

BOOST_AUTO_TEST_CASE(print_writes_one_line_and_flushes_it) {
  std::FILE* file = std::tmpfile();
  BOOST_TEST_REQUIRE(file != nullptr);
  json_line::print({{"a", 1}, {"b", "two"}}, file);
  std::rewind(file);
  char text[64] = {};
  const auto read = std::fread(text, 1, sizeof text - 1, file);
  std::fclose(file);
  BOOST_TEST(std::string(text, read) == "{\"a\":1,\"b\":\"two\"}\n");
}

BOOST_AUTO_TEST_SUITE_END()
