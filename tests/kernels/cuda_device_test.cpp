// kernels/cuda/device.hpp. With a GPU, every device function is checked against the CPU kernels
// (which are themselves checked against scalar references in the other files). Without one, the
// GPU suite is reported as skipped, and the no-device behaviour is checked instead.

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include <boost/test/unit_test.hpp>

#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/gemm.hpp"
#include "kernels/cpu/half.hpp"
#include "kernels/cuda/device.hpp"
#include "tests/kernels/cuda_test_support.hpp"
#include "tests/kernels/gemm_test_support.hpp"

namespace cpu = troupe::kernels::cpu;
namespace cuda = troupe::kernels::cuda;
using namespace troupe::kernels::testing;

namespace {

constexpr int gpu = 0;

/// Equal half bit patterns, except that any NaN matches any NaN (payloads may differ).
void check_same_halves(const std::vector<std::uint16_t>& actual,
                       const std::vector<std::uint16_t>& expected, const char* what) {
  auto canonical = [](std::vector<std::uint16_t> v) {
    for (auto& h : v)
      if ((h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0)
        h = 0x7e00u;
    return v;
  };
  check_equal(canonical(actual), canonical(expected), what);
}

void check_gemm(const gemm_case& g) {
  const auto in = make_gemm_inputs(g, 81);
  device_buffer<float> da{gpu, in.a}, db{gpu, in.b}, dc{gpu, in.c0};
  cuda::gemm(gpu, g.transpose_a, g.transpose_b, g.m, g.n, g.k, g.alpha, da.get(), in.lda, db.get(),
             in.ldb, g.beta, dc.get(), in.ldc);
  check_gemm_result(g, in, dc.download());
}

} // namespace

BOOST_AUTO_TEST_SUITE(cuda_device)

BOOST_AUTO_TEST_CASE(built_with_cuda_matches_the_build_configuration) {
#ifdef TROUPE_HAVE_CUDA
  BOOST_TEST(cuda::built_with_cuda());
#else
  BOOST_TEST(!cuda::built_with_cuda());
  BOOST_TEST(cuda::device_count() == 0);
#endif
  BOOST_TEST(cuda::device_count() >= 0);
  BOOST_TEST(cuda::device_count() == cuda::device_count()); // stable across calls
  BOOST_TEST_MESSAGE("CUDA devices: " << cuda::device_count()
                                      << "; device 0: " << cuda::describe_device(0));
}

BOOST_AUTO_TEST_SUITE(without_a_gpu, *boost::unit_test::precondition(has_no_cuda_device))

BOOST_AUTO_TEST_CASE(describe_device_explains_why_there_is_no_gpu) {
  const std::string text = cuda::describe_device(0);
  BOOST_TEST(!text.empty());
  if (!cuda::built_with_cuda())
    BOOST_TEST(text.find("built without CUDA") != std::string::npos, text);
}

BOOST_AUTO_TEST_CASE(every_call_that_needs_a_device_throws_a_runtime_error) {
  float host[1] = {};
  float* device_pointer = nullptr;
  const float* inputs[1] = {nullptr};
  std::uint16_t half[1] = {};
  check_throws_runtime_error([] { cuda::allocate(0, 16); }, "allocate");
  check_throws_runtime_error([&] { cuda::copy_host_to_device(0, device_pointer, host, 4); },
                             "copy_host_to_device");
  check_throws_runtime_error([&] { cuda::copy_device_to_host(0, host, device_pointer, 4); },
                             "copy_device_to_host");
  check_throws_runtime_error(
      [&] { cuda::copy_device_to_device(0, device_pointer, 0, device_pointer, 4); },
      "copy_device_to_device");
  check_throws_runtime_error([&] { cuda::zero(0, device_pointer, 4); }, "zero");
  check_throws_runtime_error([&] { cuda::add(0, host, host, host, 1); }, "add");
  check_throws_runtime_error([&] { cuda::sub(0, host, host, host, 1); }, "sub");
  check_throws_runtime_error([&] { cuda::mul(0, host, host, host, 1); }, "mul");
  check_throws_runtime_error([&] { cuda::scale(0, host, 2.0f, host, 1); }, "scale");
  check_throws_runtime_error([&] { cuda::axpy(0, 2.0f, host, host, 1); }, "axpy");
  check_throws_runtime_error([&] { cuda::fill(0, host, 2.0f, 1); }, "fill");
  check_throws_runtime_error([&] { cuda::sum_n(0, inputs, 1, host, 1); }, "sum_n");
  check_throws_runtime_error([&] { cuda::float_to_half(0, host, half, 1); }, "float_to_half");
  check_throws_runtime_error([&] { cuda::half_to_float(0, half, host, 1); }, "half_to_float");
  check_throws_runtime_error(
      [&] { cuda::gemm(0, false, false, 1, 1, 1, 1.0f, host, 1, host, 1, 0.0f, host, 1); }, "gemm");
  cuda::release(0, nullptr); // releasing nothing is always fine
}

BOOST_AUTO_TEST_SUITE_END() // without_a_gpu

BOOST_AUTO_TEST_SUITE(on_a_gpu, *boost::unit_test::precondition(has_cuda_device))

BOOST_AUTO_TEST_CASE(describe_device_names_every_gpu_and_its_architecture) {
  for (int d = 0; d < cuda::device_count(); ++d) {
    const std::string text = cuda::describe_device(d);
    BOOST_TEST_MESSAGE("device " << d << ": " << text);
    BOOST_TEST(text.find("sm_") != std::string::npos, text);
    BOOST_TEST(text.find("GiB") != std::string::npos, text);
  }
}

BOOST_AUTO_TEST_CASE(an_out_of_range_device_index_throws_a_runtime_error) {
  const int count = cuda::device_count();
  check_throws_runtime_error([&] { cuda::allocate(count, 16); }, "allocate");
  check_throws_runtime_error([] { cuda::allocate(-1, 16); }, "allocate");
}

BOOST_AUTO_TEST_CASE(host_device_round_trips_preserve_every_byte_on_every_size_and_device) {
  for (int d = 0; d < cuda::device_count(); ++d)
    for (std::size_t n : sizes) {
      auto rng = rng_for(70, n);
      const auto host = random_vector<float>(rng, n, -1e6f, 1e6f);
      device_buffer<float> buffer{d, host};
      check_equal(buffer.download(), host, "host -> device -> host");
    }
}

BOOST_AUTO_TEST_CASE(copies_within_and_between_devices_preserve_every_byte_on_every_size) {
  const int count = cuda::device_count();
  for (std::size_t n : sizes) {
    auto rng = rng_for(71, n);
    const auto host = random_vector<float>(rng, n, -1e6f, 1e6f);
    device_buffer<float> source{gpu, host}, same{gpu, n};
    cuda::copy_device_to_device(gpu, same.get(), gpu, source.get(), n * sizeof(float));
    check_equal(same.download(), host, "copy within device 0");
    if (count > 1) {
      device_buffer<float> other{1, n}, back{gpu, n};
      cuda::copy_device_to_device(1, other.get(), gpu, source.get(), n * sizeof(float));
      check_equal(other.download(), host, "copy from device 0 to device 1");
      cuda::copy_device_to_device(gpu, back.get(), 1, other.get(), n * sizeof(float));
      check_equal(back.download(), host, "copy from device 1 to device 0");
    }
  }
}

BOOST_AUTO_TEST_CASE(zero_clears_every_byte_on_every_size) {
  for (std::size_t n : sizes) {
    device_buffer<float> buffer{gpu, std::vector<float>(n, 3.0f)};
    cuda::zero(gpu, buffer.get(), n * sizeof(float));
    check_equal(buffer.download(), std::vector<float>(n, 0.0f), "zero");
  }
}

BOOST_AUTO_TEST_CASE(add_sub_mul_scale_and_fill_match_the_cpu_kernels_exactly_on_every_size) {
  // IEEE single-operation results are correctly rounded on both sides: no tolerance needed.
  for (std::size_t n : sizes) {
    auto rng = rng_for(72, n);
    const auto a = random_vector<float>(rng, n, -10.0f, 10.0f);
    const auto b = random_vector<float>(rng, n, -10.0f, 10.0f);
    device_buffer<float> da{gpu, a}, db{gpu, b}, dout{gpu, n};
    std::vector<float> expected(n);

    cuda::add(gpu, da.get(), db.get(), dout.get(), n);
    cpu::add(a.data(), b.data(), expected.data(), n);
    check_equal(dout.download(), expected, "add");

    cuda::sub(gpu, da.get(), db.get(), dout.get(), n);
    cpu::sub(a.data(), b.data(), expected.data(), n);
    check_equal(dout.download(), expected, "sub");

    cuda::mul(gpu, da.get(), db.get(), dout.get(), n);
    cpu::mul(a.data(), b.data(), expected.data(), n);
    check_equal(dout.download(), expected, "mul");

    cuda::scale(gpu, da.get(), -1.75f, dout.get(), n);
    cpu::scale(a.data(), -1.75f, expected.data(), n);
    check_equal(dout.download(), expected, "scale");

    cuda::fill(gpu, dout.get(), 0.125f, n);
    check_equal(dout.download(), std::vector<float>(n, 0.125f), "fill");

    // out may alias an input
    cuda::add(gpu, da.get(), db.get(), da.get(), n);
    cpu::add(a.data(), b.data(), expected.data(), n);
    check_equal(da.download(), expected, "add in place");
  }
}

BOOST_AUTO_TEST_CASE(axpy_matches_the_cpu_kernel_up_to_fused_multiply_add_on_every_size) {
  for (std::size_t n : sizes) {
    auto rng = rng_for(73, n);
    const auto x = random_vector<float>(rng, n, -10.0f, 10.0f);
    auto y = random_vector<float>(rng, n, -10.0f, 10.0f);
    device_buffer<float> dx{gpu, x}, dy{gpu, y};
    cuda::axpy(gpu, 0.625f, dx.get(), dy.get(), n);
    cpu::axpy(0.625f, x.data(), y.data(), n);
    // the GPU contracts y + alpha * x into one FMA; the CPU may round twice
    check_close(dy.download(), y, 2 * std::numeric_limits<float>::epsilon(),
                20 * std::numeric_limits<float>::epsilon(), "axpy");
  }
}

BOOST_AUTO_TEST_CASE(sum_n_matches_the_cpu_kernel_bit_for_bit_on_every_size_and_count) {
  for (std::size_t n : sizes)
    for (std::size_t count : {0u, 1u, 2u, 4u, 9u, 17u}) {
      auto rng = rng_for(74 + count, n);
      check_sum_matches_the_cpu(
          gpu, n, count, [&] { return random_vector<float>(rng, n, -10.0f, 10.0f); },
          cpu::sum_n<float>, cuda::sum_n, 5.0f, "sum_n");
    }
}

BOOST_AUTO_TEST_CASE(half_conversions_match_the_cpu_on_every_bit_pattern) {
  std::vector<std::uint16_t> all(65536);
  for (std::size_t i = 0; i < all.size(); ++i)
    all[i] = static_cast<std::uint16_t>(i);
  std::vector<float> expected(all.size());
  cpu::half_to_float(all.data(), expected.data(), all.size());

  device_buffer<std::uint16_t> halves{gpu, all}, back{gpu, all.size()};
  device_buffer<float> floats{gpu, all.size()};
  cuda::half_to_float(gpu, halves.get(), floats.get(), all.size());
  check_equal(floats.download(), expected, "half_to_float on every pattern");
  cuda::float_to_half(gpu, floats.get(), back.get(), all.size());
  check_same_halves(back.download(), all, "float_to_half round trip (NaN stays NaN)");
}

BOOST_AUTO_TEST_CASE(float_to_half_matches_the_cpu_on_every_size) {
  for (std::size_t n : sizes) {
    auto rng = rng_for(75, n);
    // spans flush-to-zero, subnormal, normal and overflowing magnitudes
    auto in = random_vector<float>(rng, n, -70000.0f, 70000.0f);
    std::uniform_int_distribution<int> shift{-30, 0};
    for (auto& x : in)
      x = std::ldexp(x, shift(rng));
    std::vector<std::uint16_t> expected(n);
    cpu::float_to_half(in.data(), expected.data(), n);
    device_buffer<float> din{gpu, in};
    device_buffer<std::uint16_t> dout{gpu, n};
    cuda::float_to_half(gpu, din.get(), dout.get(), n);
    check_same_halves(dout.download(), expected, "float_to_half");
  }
}

BOOST_AUTO_TEST_CASE(gemm_matches_the_reference_for_every_transpose_and_odd_or_empty_sizes) {
  for (const auto& g : gpu_gemm_cases())
    check_gemm(g);
}

BOOST_AUTO_TEST_CASE(gemm_reports_cublas_errors_as_runtime_errors_naming_the_call) {
  device_buffer<float> a{gpu, 16}, b{gpu, 16}, c{gpu, 16};
  // lda = 1 is too small for a 4×4 row-major A
  check_throws_runtime_error(
      [&] {
        cuda::gemm(gpu, false, false, 4, 4, 4, 1.0f, a.get(), 1, b.get(), 4, 0.0f, c.get(), 4);
      },
      "cublasSgemm", "device 0");
}

BOOST_AUTO_TEST_SUITE_END() // on_a_gpu

BOOST_AUTO_TEST_SUITE_END() // cuda_device
