// kernels/cpu/compression.hpp against a plain reference written from MXNet's kernels
// (gradient_compression-inl.h): one element at a time, each 2-bit code set through MXNet's tables
// of masks into a 32-bit block, the residual carried over several rounds.

#include <array>
#include <cstdint>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "kernels/cpu/compression.hpp"
#include "kernels/cpu/half.hpp"
#include "tests/kernels/kernels_test_support.hpp"

namespace cpu = troupe::kernels::cpu;
using namespace troupe::kernels::testing;

namespace {

constexpr std::size_t compression_sizes[] = {0, 1, 15, 16, 17, 31, 33, 1000, 1'000'000};

struct reference_output {
  std::vector<std::uint8_t> packed;
  std::vector<float> values; // what the packed array stands for
};

/// MXNet's quantize_2bit, one block of 16 elements per 32-bit word.
reference_output reference_2bit(const std::vector<float>& grad, std::vector<float>& residual,
                                float threshold) {
  const std::uint8_t posbits[] = {0xc0, 0x30, 0x0c, 0x03};
  const std::uint8_t negbits[] = {0x80, 0x20, 0x08, 0x02};
  const std::size_t n = grad.size();
  reference_output out{std::vector<std::uint8_t>((n + 15) / 16 * 4, 0), std::vector<float>(n)};
  for (std::size_t block = 0; block * 16 < n; ++block) {
    std::uint8_t* word = out.packed.data() + block * 4;
    for (std::size_t i = block * 16; i < std::min(n, block * 16 + 16); ++i) {
      std::uint8_t* byte = word + (i - block * 16) / 4;
      residual[i] += grad[i];
      if (residual[i] >= threshold) {
        *byte |= posbits[i & 3];
        residual[i] -= threshold;
        out.values[i] = threshold;
      } else if (residual[i] <= -threshold) {
        *byte |= negbits[i & 3];
        residual[i] -= -threshold;
        out.values[i] = -threshold;
      } else {
        out.values[i] = 0;
      }
    }
  }
  return out;
}

/// MXNet 2.0's quantize_1bit, 8 elements per byte.
reference_output reference_1bit(const std::vector<float>& grad, std::vector<float>& residual,
                                float threshold) {
  const std::uint8_t bits[] = {0x80, 0x40, 0x20, 0x10, 0x08, 0x04, 0x02, 0x01};
  const std::size_t n = grad.size();
  reference_output out{std::vector<std::uint8_t>((n + 31) / 32 * 4, 0), std::vector<float>(n)};
  for (std::size_t i = 0; i < n; ++i) {
    residual[i] += grad[i];
    if (residual[i] > threshold) {
      out.packed[i / 8] |= bits[i & 7];
      residual[i] -= 1;
      out.values[i] = 1;
    } else {
      residual[i] += 1;
      out.values[i] = -1;
    }
  }
  return out;
}

std::vector<float> widened(const std::vector<cpu::half_bits>& h) {
  std::vector<float> f(h.size());
  cpu::half_to_float(h.data(), f.data(), h.size());
  return f;
}

std::vector<cpu::half_bits> narrowed(const std::vector<float>& f) {
  std::vector<cpu::half_bits> h(f.size());
  cpu::float_to_half(f.data(), h.data(), f.size());
  return h;
}

/// A rule's quantizer against its reference over three rounds of random gradients in [low, high]
/// (seeded by `seed` and the size), for every size and threshold: the packed words, the residual
/// carried over the rounds and the dequantized values.
template <class Reference, class Quantize, class Dequantize>
void check_rule_over_rounds(std::uint64_t seed, float low, float high,
                            std::initializer_list<float> thresholds,
                            std::size_t (*packed_bytes)(std::size_t), Reference reference,
                            Quantize quantize, Dequantize dequantize) {
  for (const float threshold : thresholds) {
    for (const std::size_t n : compression_sizes) {
      BOOST_TEST_CONTEXT("n = " << n << ", threshold " << threshold) {
        auto rng = rng_for(seed, n);
        std::vector<float> residual(n, 0.0f), expected_residual(n, 0.0f);
        for (int round = 0; round < 3; ++round) {
          const auto grad = random_vector<float>(rng, n, low, high);
          const auto expected = reference(grad, expected_residual, threshold);
          std::vector<std::uint8_t> packed(packed_bytes(n), 0xff);
          quantize(grad.data(), residual.data(), packed.data(), n, threshold);
          check_equal(packed, expected.packed, "packed");
          check_equal(residual, expected_residual, "residual");
          std::vector<float> values(n, 7.0f);
          dequantize(packed.data(), values.data(), n, threshold);
          check_equal(values, expected.values, "dequantized");
        }
      }
    }
  }
}

} // namespace

BOOST_AUTO_TEST_SUITE(gradient_compression_kernels)

BOOST_AUTO_TEST_CASE(two_bit_matches_mxnet_over_rounds) {
  check_rule_over_rounds(
      41, -1.0f, 1.0f, {0.5f, 0.125f}, cpu::packed_bytes_2bit, reference_2bit,
      [](auto... args) { cpu::quantize_2bit(args...); },
      [](const std::uint8_t* packed, float* values, std::size_t n, float threshold) {
        cpu::dequantize_2bit(packed, values, n, threshold);
      });
}

BOOST_AUTO_TEST_CASE(one_bit_matches_mxnet_over_rounds) {
  check_rule_over_rounds(
      43, -2.0f, 2.0f, {0.0f, 0.5f}, cpu::packed_bytes_1bit, reference_1bit,
      [](auto... args) { cpu::quantize_1bit(args...); },
      [](const std::uint8_t* packed, float* values, std::size_t n, float) {
        cpu::dequantize_1bit(packed, values, n);
      });
}

BOOST_AUTO_TEST_CASE(float16_gradients_keep_a_float32_residual) {
  for (const std::size_t n : compression_sizes) {
    BOOST_TEST_CONTEXT("n = " << n) {
      auto rng = rng_for(47, n);
      std::vector<float> residual(n, 0.0f), expected_residual(n, 0.0f);
      std::vector<float> residual_1bit(n, 0.0f), expected_residual_1bit(n, 0.0f);
      for (int round = 0; round < 2; ++round) {
        const auto grad = narrowed(random_vector<float>(rng, n, -1.0f, 1.0f));
        const auto expected = reference_2bit(widened(grad), expected_residual, 0.5f);
        std::vector<std::uint8_t> packed(cpu::packed_bytes_2bit(n));
        cpu::quantize_2bit(grad.data(), residual.data(), packed.data(), n, 0.5f);
        check_equal(packed, expected.packed, "packed 2bit");
        check_equal(residual, expected_residual, "residual 2bit");
        std::vector<cpu::half_bits> values(n);
        cpu::dequantize_2bit(packed.data(), values.data(), n, 0.5f);
        check_equal(widened(values), expected.values, "dequantized 2bit");

        const auto expected_1bit = reference_1bit(widened(grad), expected_residual_1bit, 0.25f);
        std::vector<std::uint8_t> packed_1bit(cpu::packed_bytes_1bit(n));
        cpu::quantize_1bit(grad.data(), residual_1bit.data(), packed_1bit.data(), n, 0.25f);
        check_equal(packed_1bit, expected_1bit.packed, "packed 1bit");
        check_equal(residual_1bit, expected_residual_1bit, "residual 1bit");
        cpu::dequantize_1bit(packed_1bit.data(), values.data(), n);
        check_equal(widened(values), expected_1bit.values, "dequantized 1bit");
      }
    }
  }
}

BOOST_AUTO_TEST_CASE(a_code_of_01_stands_for_zero_as_in_mxnet) {
  // 0x5a = 01 01 10 10: MXNet's dequantize reads 01 as 0 (neither mask matches).
  const std::array<std::uint8_t, 4> packed{0x5a, 0xff, 0x00, 0x00};
  std::vector<float> values(16);
  cpu::dequantize_2bit(packed.data(), values.data(), values.size(), 0.5f);
  const std::vector<float> expected{0, 0, -0.5f, -0.5f, 0.5f, 0.5f, 0.5f, 0.5f,
                                    0, 0, 0,     0,     0,    0,    0,    0};
  check_equal(values, expected, "values");
}

BOOST_AUTO_TEST_SUITE_END()
