// kernels/cpu/half.hpp against an independent oracle: the table of every finite float16 value,
// searched for the nearest one with ties going to the even bit pattern.

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "kernels/cpu/half.hpp"
#include "tests/kernels/kernels_test_support.hpp"

namespace cpu = troupe::kernels::cpu;
using cpu::half_bits;
using namespace troupe::kernels::testing;

namespace {

bool is_half_nan(half_bits h) {
  return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0;
}

/// The value of a float16 bit pattern from its definition, in double.
double half_value(half_bits h) {
  const double sign = (h & 0x8000u) ? -1.0 : 1.0;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0x1f)
    return mantissa ? std::numeric_limits<double>::quiet_NaN()
                    : sign * std::numeric_limits<double>::infinity();
  if (exponent == 0)
    return sign * std::ldexp(mantissa, -24);
  return sign * std::ldexp(1024 + mantissa, exponent - 25);
}

/// Values of the non-negative finite float16 patterns 0x0000..0x7bff, increasing with the bits.
const std::vector<double>& finite_halves() {
  static const std::vector<double> table = [] {
    std::vector<double> t;
    for (unsigned h = 0; h <= 0x7bffu; ++h)
      t.push_back(half_value(static_cast<half_bits>(h)));
    return t;
  }();
  return table;
}

/// Round to nearest float16, ties to the even pattern, by searching the table.
half_bits oracle_float_to_half(float f) {
  if (std::isnan(f))
    return 0x7e00u; // any NaN; callers compare NaN-ness only
  const half_bits sign = std::signbit(f) ? 0x8000u : 0u;
  const double x = std::abs(static_cast<double>(f));
  const auto& table = finite_halves();
  // Beyond the largest half (65504) by half an ulp (16) or more: the tie goes to the even
  // neighbour, which is the infinity.
  if (x >= 65520.0)
    return static_cast<half_bits>(sign | 0x7c00u);
  const auto above = std::lower_bound(table.begin(), table.end(), x);
  auto index = static_cast<unsigned>(above - table.begin());
  if (above == table.end()) // between 65504 and 65520: the largest half is nearest
    return static_cast<half_bits>(sign | 0x7bffu);
  if (*above != x) {
    const unsigned below = index - 1;
    const double down = x - table[below];
    const double up = *above - x;
    if (down < up || (down == up && (below & 1u) == 0))
      index = below;
  }
  return static_cast<half_bits>(sign | index);
}

/// Floats spread over every float16 regime: values that flush to zero, subnormals, normals and
/// overflow, with random signs and full float mantissas.
std::vector<float> spread_floats(std::mt19937_64& rng, std::size_t n) {
  std::uniform_int_distribution<int> exponent{-27, 17};
  std::uniform_int_distribution<std::uint32_t> mantissa{0, (1u << 23) - 1};
  std::bernoulli_distribution negative{0.5};
  std::vector<float> v(n);
  for (auto& x : v) {
    const float m = 1.0f + std::ldexp(static_cast<float>(mantissa(rng)), -23);
    x = std::ldexp(m, exponent(rng)) * (negative(rng) ? -1.0f : 1.0f);
  }
  return v;
}

} // namespace

BOOST_AUTO_TEST_SUITE(half)

BOOST_AUTO_TEST_CASE(every_half_bit_pattern_survives_a_round_trip_through_float) {
  std::size_t wrong_value = 0, wrong_round_trip = 0;
  unsigned first_bad = 0;
  for (unsigned bits = 0; bits <= 0xffffu; ++bits) {
    const auto h = static_cast<half_bits>(bits);
    const float f = cpu::half_to_float(h);
    const double expected = half_value(h);
    const bool value_ok = is_half_nan(h) ? std::isnan(f)
                                         : static_cast<double>(f) == expected &&
                                               std::signbit(f) == std::signbit(expected);
    const half_bits back = cpu::float_to_half(f);
    const bool trip_ok = is_half_nan(h) ? is_half_nan(back) : back == h;
    if (!value_ok && wrong_value++ == 0)
      first_bad = bits;
    if (!trip_ok && wrong_round_trip++ == 0)
      first_bad = bits;
  }
  BOOST_TEST(wrong_value == 0u, wrong_value << " patterns convert to the wrong float, first 0x"
                                            << std::hex << first_bad);
  BOOST_TEST(wrong_round_trip == 0u,
             wrong_round_trip << " patterns do not round-trip, first 0x" << std::hex << first_bad);
}

BOOST_AUTO_TEST_CASE(exact_midpoints_between_neighbouring_halves_round_to_the_even_one) {
  std::size_t wrong = 0;
  unsigned first_bad = 0;
  for (unsigned low = 0; low < 0x7bffu; ++low) {
    // Midpoints of float16 neighbours need 12 significant bits: exact in float.
    const double mid =
        (half_value(static_cast<half_bits>(low)) + half_value(static_cast<half_bits>(low + 1))) / 2;
    const float f = static_cast<float>(mid);
    if (static_cast<double>(f) != mid && wrong++ == 0) // the test's own premise
      first_bad = low;
    const unsigned even = (low & 1u) ? low + 1 : low;
    for (const float signed_f : {f, -f}) {
      const unsigned expected = signed_f < 0 ? (even | 0x8000u) : even;
      if (cpu::float_to_half(signed_f) != expected && wrong++ == 0)
        first_bad = low;
      // one float ulp either side of the tie is no longer a tie
      const float toward = std::nextafter(signed_f, 0.0f);
      const float away = std::nextafter(signed_f, signed_f * 2);
      const unsigned sign = signed_f < 0 ? 0x8000u : 0u;
      if (cpu::float_to_half(toward) != (low | sign) && wrong++ == 0)
        first_bad = low;
      if (cpu::float_to_half(away) != ((low + 1) | sign) && wrong++ == 0)
        first_bad = low;
    }
  }
  BOOST_TEST(wrong == 0u, wrong << " ties or near-ties rounded wrongly, first above pattern 0x"
                                << std::hex << first_bad);
}

BOOST_AUTO_TEST_CASE(values_beyond_the_largest_half_overflow_to_infinity) {
  BOOST_TEST(cpu::float_to_half(65504.0f) == 0x7bffu);
  BOOST_TEST(cpu::float_to_half(std::nextafter(65520.0f, 0.0f)) == 0x7bffu);
  BOOST_TEST(cpu::float_to_half(65520.0f) == 0x7c00u); // the tie goes to the even pattern: inf
  BOOST_TEST(cpu::float_to_half(65536.0f) == 0x7c00u);
  BOOST_TEST(cpu::float_to_half(1e10f) == 0x7c00u);
  BOOST_TEST(cpu::float_to_half(-1e10f) == 0xfc00u);
  BOOST_TEST(cpu::float_to_half(std::numeric_limits<float>::max()) == 0x7c00u);
  BOOST_TEST(cpu::float_to_half(std::numeric_limits<float>::infinity()) == 0x7c00u);
  BOOST_TEST(cpu::float_to_half(-std::numeric_limits<float>::infinity()) == 0xfc00u);
  BOOST_TEST(std::isinf(cpu::half_to_float(0x7c00u)));
  BOOST_TEST(cpu::half_to_float(0xfc00u) < 0.0f);
}

BOOST_AUTO_TEST_CASE(tiny_values_become_subnormals_or_signed_zero) {
  const float smallest = std::ldexp(1.0f, -24); // smallest float16 subnormal
  BOOST_TEST(cpu::float_to_half(smallest) == 0x0001u);
  BOOST_TEST(cpu::float_to_half(smallest / 2) == 0x0000u); // tie: to the even pattern, zero
  BOOST_TEST(cpu::float_to_half(std::nextafter(smallest / 2, 1.0f)) == 0x0001u);
  BOOST_TEST(cpu::float_to_half(smallest * 1.5f) == 0x0002u); // tie between 1 and 2: even
  BOOST_TEST(cpu::float_to_half(smallest * 2.5f) == 0x0002u); // tie between 2 and 3: even
  BOOST_TEST(cpu::float_to_half(-smallest) == 0x8001u);
  BOOST_TEST(cpu::float_to_half(std::ldexp(1023.0f, -24)) == 0x03ffu); // largest subnormal
  BOOST_TEST(cpu::float_to_half(std::ldexp(1023.5f, -24)) == 0x0400u); // rounds up to normal
  BOOST_TEST(cpu::float_to_half(std::ldexp(1.0f, -14)) == 0x0400u);    // smallest normal
  BOOST_TEST(cpu::float_to_half(std::numeric_limits<float>::denorm_min()) == 0x0000u);
  BOOST_TEST(cpu::float_to_half(-std::numeric_limits<float>::denorm_min()) == 0x8000u);
  BOOST_TEST(cpu::float_to_half(0.0f) == 0x0000u);
  BOOST_TEST(cpu::float_to_half(-0.0f) == 0x8000u);
}

BOOST_AUTO_TEST_CASE(nan_stays_nan_whatever_its_payload) {
  for (std::uint32_t bits : {0x7fc00000u, 0xffc00000u, 0x7f800001u, 0x7f801fffu, 0x7fbfffffu,
                             0xff800001u, 0x7fffffffu}) {
    const half_bits h = cpu::float_to_half(std::bit_cast<float>(bits));
    BOOST_TEST(is_half_nan(h), "float NaN 0x" << std::hex << bits << " became 0x" << h);
    BOOST_TEST(((h & 0x8000u) != 0) == ((bits & 0x80000000u) != 0));
  }
}

BOOST_AUTO_TEST_CASE(float_to_half_matches_the_table_oracle_on_every_size) {
  for (std::size_t n : sizes) {
    auto rng = rng_for(31, n);
    const auto in = spread_floats(rng, n);
    std::vector<half_bits> expected(n);
    for (std::size_t i = 0; i < n; ++i)
      expected[i] = oracle_float_to_half(in[i]);
    std::vector<half_bits> out(n);
    cpu::float_to_half(in.data(), out.data(), n);
    check_equal(out, expected, "float_to_half");
  }
}

BOOST_AUTO_TEST_CASE(half_to_float_matches_the_definition_on_every_size) {
  for (std::size_t n : sizes) {
    auto rng = rng_for(32, n);
    std::uniform_int_distribution<unsigned> bits{0, 0xffffu};
    std::vector<half_bits> in(n);
    for (auto& h : in)
      h = static_cast<half_bits>(bits(rng));
    std::vector<float> expected(n);
    for (std::size_t i = 0; i < n; ++i)
      expected[i] = static_cast<float>(half_value(in[i]));
    std::vector<float> out(n);
    cpu::half_to_float(in.data(), out.data(), n);
    check_equal(out, expected, "half_to_float");
  }
}

BOOST_AUTO_TEST_CASE(sum_n_half_accumulates_in_float_and_rounds_once_on_every_size) {
  for (std::size_t n : sizes) {
    for (std::size_t count : {0u, 1u, 2u, 4u, 9u}) {
      auto rng = rng_for(33 + count, n);
      std::vector<std::vector<half_bits>> inputs;
      std::vector<const half_bits*> pointers;
      for (std::size_t k = 0; k < count; ++k) {
        const auto values = random_vector<float>(rng, n, -100.0f, 100.0f);
        // inputs need only be valid halves; the conversion itself is checked above
        std::vector<half_bits> h(n);
        cpu::float_to_half(values.data(), h.data(), n);
        inputs.push_back(std::move(h));
      }
      for (const auto& in : inputs)
        pointers.push_back(in.data());

      std::vector<half_bits> expected(n, 0);
      for (std::size_t i = 0; i < n && count > 0; ++i) {
        float acc = static_cast<float>(half_value(inputs[0][i]));
        for (std::size_t k = 1; k < count; ++k)
          acc += static_cast<float>(half_value(inputs[k][i]));
        expected[i] = oracle_float_to_half(acc);
      }
      std::vector<half_bits> out(n, 0x3c00u);
      cpu::sum_n_half(pointers.data(), count, out.data(), n);
      check_equal(out, expected, "sum_n_half");

      if (count > 0) {
        auto first = inputs[0];
        pointers[0] = first.data();
        cpu::sum_n_half(pointers.data(), count, first.data(), n);
        check_equal(first, expected, "sum_n_half into inputs[0]");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(sum_n_half_gives_the_bits_of_the_software_conversions_on_every_pattern) {
  // Every float16 pattern (NaNs with every payload, signalling ones too, infinities, subnormals,
  // both zeros) meets every other through rotated partners, with lengths whose tails leave the
  // eight-lane path; a NaN's payload is compared bit for bit where one input is NaN.
  constexpr std::size_t patterns = 65536;
  std::vector<half_bits> all(patterns + 5);
  for (std::size_t i = 0; i < all.size(); ++i)
    all[i] = static_cast<half_bits>(i % patterns);
  for (std::size_t shift : {0u, 1u, 977u, 32768u, 40000u}) {
    std::vector<half_bits> partner(all.size()), third(all.size());
    for (std::size_t i = 0; i < all.size(); ++i) {
      partner[i] = all[(i + shift) % all.size()];
      third[i] = all[(i * 7 + shift) % all.size()];
    }
    for (std::size_t count : {1u, 2u, 3u}) {
      const half_bits* inputs[] = {all.data(), partner.data(), third.data()};
      for (std::size_t n : {all.size(), std::size_t{13}, std::size_t{1031}}) {
        std::vector<half_bits> fast(n), portable(n);
        cpu::sum_n_half(inputs, count, fast.data(), n);
        cpu::detail::sum_n_half_portable(inputs, count, portable.data(), n);
        // Where two NaNs meet, which payload an add keeps depends on the order of its operands,
        // which the compiler picks (the software path alone differs between -O0 and -O3): there
        // both must be NaN. Everywhere else, the bits.
        for (std::size_t i = 0; i < n; ++i) {
          std::size_t nans = 0;
          for (std::size_t k = 0; k < count; ++k)
            nans += is_half_nan(inputs[k][i]) ? 1 : 0;
          if (nans >= 2) {
            BOOST_TEST((is_half_nan(fast[i]) && is_half_nan(portable[i])));
            fast[i] = portable[i];
          }
        }
        check_equal(fast, portable, "sum_n_half against its software path");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(sum_n_half_keeps_small_addends_that_rounding_each_step_would_lose) {
  // 2^-11 is half an ulp of 1.0 in float16: each add alone would tie back to 1.0, but the float
  // sum 1 + 2^-10 is exactly the next float16 above 1.
  const half_bits one = 0x3c00u;
  const half_bits half_ulp = cpu::float_to_half(std::ldexp(1.0f, -11));
  const half_bits* inputs[] = {&one, &half_ulp, &half_ulp};
  half_bits out = 0;
  cpu::sum_n_half(inputs, 3, &out, 1);
  BOOST_TEST(out == 0x3c01u);
}

BOOST_AUTO_TEST_CASE(sum_n_half_of_a_single_negative_zero_is_negative_zero) {
  const half_bits negative_zero = 0x8000u;
  const half_bits* inputs[] = {&negative_zero};
  half_bits out = 0;
  cpu::sum_n_half(inputs, 1, &out, 1);
  BOOST_TEST(out == 0x8000u);
}

BOOST_AUTO_TEST_SUITE_END()
