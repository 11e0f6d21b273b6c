#include <cmath>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "engine/ndarray.hpp"
#include "engine/random.hpp"
#include "engine_test_support.hpp"

using troupe::context;
using troupe::dtype;
using troupe::errc;
using troupe::ndarray;
using troupe::test::require_error;

BOOST_AUTO_TEST_SUITE(random_suite)

BOOST_AUTO_TEST_CASE(the_generator_follows_the_standards_mt19937_64_sequence) {
  // The C++ standard fixes the 10000th output of a default-seeded (5489) mt19937_64:
  // 9981545732273789042. uniform01 keeps its top 53 bits.
  troupe::random_generator generator{5489};
  double value = 0;
  for (int i = 0; i < 10000; ++i)
    value = generator.uniform01();
  BOOST_TEST(value ==
             static_cast<double>(std::uint64_t{9981545732273789042u} >> 11) / 9007199254740992.0);
}

BOOST_AUTO_TEST_CASE(the_same_seed_gives_the_same_values_and_another_seed_other_values) {
  const auto a = ndarray::random_uniform(-1, 1, {100}, 42).to_vector<float>();
  const auto b = ndarray::random_uniform(-1, 1, {100}, 42).to_vector<float>();
  const auto c = ndarray::random_uniform(-1, 1, {100}, 43).to_vector<float>();
  BOOST_TEST(a == b, boost::test_tools::per_element());
  BOOST_TEST(a != c);
  const auto n1 = ndarray::random_normal(0, 1, {5, 20}, 7).to_vector<double>();
  const auto n2 = ndarray::random_normal(0, 1, {100}, 7, context::cpu(3)).to_vector<double>();
  BOOST_TEST(n1 == n2, boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(every_float_dtype_gets_the_same_samples_rounded_to_it) {
  const auto wide = ndarray::random_normal(1, 3, {1000}, 11, context::cpu(), dtype::float64);
  for (const dtype type : {dtype::float32, dtype::float16}) {
    const auto narrow = ndarray::random_normal(1, 3, {1000}, 11, context::cpu(), type);
    BOOST_TEST(narrow.to_vector<double>() == wide.as_type(type).to_vector<double>(),
               boost::test_tools::per_element());
  }
}

BOOST_AUTO_TEST_CASE(uniform_samples_lie_in_the_half_open_range_and_average_its_midpoint) {
  for (const dtype type : {dtype::float16, dtype::float32, dtype::float64}) {
    BOOST_TEST_CONTEXT(troupe::to_string(type)) {
      const auto a = ndarray::random_uniform(2, 5, {200000}, 3, context::cpu(), type);
      const auto values = a.to_vector<double>();
      for (const double v : values)
        BOOST_TEST_REQUIRE((v >= 2.0 && v < 5.0));
      BOOST_TEST(a.sum() / 200000.0 == 3.5, boost::test_tools::tolerance(0.005));
    }
  }
  // Rounding to float32 would reach `high` for draws just below 1; those stay below it.
  const auto narrow = ndarray::random_uniform(0, 1e-30, {100000}, 5).to_vector<float>();
  for (const float v : narrow)
    BOOST_TEST_REQUIRE(static_cast<double>(v) < 1e-30);
  BOOST_TEST(ndarray::random_uniform(3, 3, {4}, 1).to_vector<float>() ==
                 std::vector<float>(4, 3.0f),
             boost::test_tools::per_element());
}

BOOST_AUTO_TEST_CASE(one_million_normal_samples_have_the_requested_mean_and_deviation) {
  constexpr double count = 1e6;
  const auto a = ndarray::random_normal(1.5, 2.0, {1000, 1000}, 2024);
  const double mean = a.sum() / count;
  const auto centred = a - mean;
  const double deviation = centred.l2_norm() / std::sqrt(count);
  // Standard errors: 2 / 1000 for the mean, 2 / sqrt(2e6) ~ 0.0014 for the deviation.
  BOOST_TEST(std::fabs(mean - 1.5) < 0.01);
  BOOST_TEST(std::fabs(deviation - 2.0) < 0.01);
  // The tails are there too: about 4.55 % of samples lie beyond two deviations.
  const auto values = a.to_vector<double>();
  std::size_t beyond = 0;
  for (const double v : values)
    beyond += std::fabs(v - 1.5) > 4.0 ? 1 : 0;
  BOOST_TEST(static_cast<double>(beyond) / count == 0.0455, boost::test_tools::tolerance(0.05));
}

BOOST_AUTO_TEST_CASE(sampling_rejects_integer_dtypes_and_bad_parameters) {
  require_error([] { ndarray::random_uniform(0, 1, {2}, 1, context::cpu(), dtype::int32); },
                errc::not_supported, "random_uniform: dtype int32 is not supported");
  require_error([] { ndarray::random_normal(0, 1, {2}, 1, context::cpu(), dtype::int64); },
                errc::not_supported, "random_normal: dtype int64 is not supported");
  require_error([] { ndarray::random_uniform(2, 1, {2}, 1); }, errc::invalid_argument,
                "random_uniform: low 2 and high 1");
  require_error([] { ndarray::random_normal(0, -1, {2}, 1); }, errc::invalid_argument,
                "random_normal: mean 0 and standard deviation -1");
}

BOOST_AUTO_TEST_SUITE_END()
