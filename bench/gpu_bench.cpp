// gpu_bench: the memory-bound kernels and the GEMMs of kernels/cuda on one GPU.
//
//   build/bench/gpu_bench [--device 0] [--megabytes 256] [--repeats 20] [--gemm-size 8192]
//
// Every kernels/cuda call is synchronous, so each measurement is the median wall time (host
// clock) of --repeats calls after one warm-up call. Buffers hold --megabytes MiB each. One JSON
// line per result (engine/json_line.hpp):
//   copy                 device-to-device copy; bytes = read + written = 2 x buffer
//   sum_n                float32, 2 and 8 inputs; bytes = (inputs + 1) x n x 4
//   sum_n_half           float16, 8 inputs; bytes = (inputs + 1) x n x 2
//   sgd_momentum, adam   float32 updates; bytes read + written: SGD with momentum reads w, g, mom
//                        and writes w, mom (5 x n x 4); Adam reads w, g, mean, var and writes w,
//                        mean, var (7 x n x 4)
// with gb_per_s = bytes / median_s / 1e9 and ratio_to_copy = gb_per_s / copy's gb_per_s (how close
// a kernel comes to the bandwidth of a plain copy), and
//   sgemm, gemm_half     M = N = K = --gemm-size (0 skips them); flops = 2·M·N·K,
//                        tflop_per_s = flops / median_s / 1e12
// Without a GPU it prints {"bench":"gpu","skipped":"<why>"} and exits 0.

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <exception>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/json_line.hpp"
#include "kernel_timing.hpp"
#include "kernels/cuda/device.hpp"
#include "kernels/cuda/optimizer.hpp"

namespace cuda = troupe::kernels::cuda;
namespace json_line = troupe::json_line;
using troupe::bench::median_seconds;

namespace {

/// Device memory held for one measurement.
class buffer {
public:
  buffer(int device, std::size_t bytes)
      : device_{device}, pointer_{cuda::allocate(device, bytes)} {}
  ~buffer() { cuda::release(device_, pointer_); }
  buffer(const buffer&) = delete;
  buffer& operator=(const buffer&) = delete;

  template <class T>
  T* as() const {
    return static_cast<T*>(pointer_);
  }

private:
  int device_;
  void* pointer_;
};

struct settings {
  int device = 0;
  std::size_t megabytes = 256;
  int repeats = 20;
  std::size_t gemm_size = 8192;
};

json_line::object line_for(const settings& s, const char* kernel) {
  json_line::object line;
  line["bench"] = "gpu";
  line["kernel"] = kernel;
  line["device"] = cuda::describe_device(s.device);
  return line;
}

/// Prints a bandwidth result and returns its GB/s; copy_gb_per_s <= 0: no ratio (the copy).
double print_bandwidth(const settings& s, json_line::object line, double bytes, double median,
                       double copy_gb_per_s) {
  return troupe::bench::print_bandwidth(std::move(line), bytes, median, s.repeats, copy_gb_per_s,
                                        "ratio_to_copy");
}

void print_gemm(const settings& s, const char* kernel, double median) {
  const double size = static_cast<double>(s.gemm_size);
  const double flops = 2.0 * size * size * size;
  json_line::object line = line_for(s, kernel);
  line["m"] = s.gemm_size;
  line["n"] = s.gemm_size;
  line["k"] = s.gemm_size;
  line["flops"] = static_cast<std::uint64_t>(flops);
  line["repeats"] = s.repeats;
  line["median_s"] = json_line::significant(median, 4);
  line["tflop_per_s"] = json_line::fixed(flops / median / 1e12, 2);
  json_line::print(line);
}

/// `count` float16 buffers of n elements holding `value`.
std::vector<std::unique_ptr<buffer>> half_buffers(const settings& s, std::size_t count,
                                                  std::size_t n, float value) {
  buffer staging{s.device, n * sizeof(float)};
  cuda::fill(s.device, staging.as<float>(), value, n);
  std::vector<std::unique_ptr<buffer>> out;
  for (std::size_t k = 0; k < count; ++k) {
    out.push_back(std::make_unique<buffer>(s.device, n * sizeof(std::uint16_t)));
    cuda::float_to_half(s.device, staging.as<float>(), out.back()->as<std::uint16_t>(), n);
  }
  return out;
}

double bench_copy(const settings& s, std::size_t bytes) {
  buffer src{s.device, bytes}, dst{s.device, bytes};
  cuda::zero(s.device, src.as<void>(), bytes);
  const double median = median_seconds(s.repeats, [&] {
    cuda::copy_device_to_device(s.device, dst.as<void>(), s.device, src.as<void>(), bytes);
  });
  return print_bandwidth(s, line_for(s, "copy"), 2.0 * static_cast<double>(bytes), median, 0);
}

void bench_sum_n(const settings& s, std::size_t count, std::size_t n, double copy) {
  std::vector<std::unique_ptr<buffer>> inputs;
  std::vector<const float*> pointers;
  for (std::size_t k = 0; k < count; ++k) {
    inputs.push_back(std::make_unique<buffer>(s.device, n * sizeof(float)));
    cuda::fill(s.device, inputs.back()->as<float>(), 1.0f + static_cast<float>(k), n);
    pointers.push_back(inputs.back()->as<float>());
  }
  buffer out{s.device, n * sizeof(float)};
  const double median = median_seconds(
      s.repeats, [&] { cuda::sum_n(s.device, pointers.data(), count, out.as<float>(), n); });
  json_line::object line = line_for(s, "sum_n");
  line["inputs"] = count;
  print_bandwidth(s, line, static_cast<double>((count + 1) * n * sizeof(float)), median, copy);
}

void bench_sum_n_half(const settings& s, std::size_t count, std::size_t n, double copy) {
  const auto inputs = half_buffers(s, count, n, 0.25f);
  std::vector<const std::uint16_t*> pointers;
  for (const auto& input : inputs)
    pointers.push_back(input->as<std::uint16_t>());
  buffer out{s.device, n * sizeof(std::uint16_t)};
  const double median = median_seconds(s.repeats, [&] {
    cuda::sum_n_half(s.device, pointers.data(), count, out.as<std::uint16_t>(), n);
  });
  json_line::object line = line_for(s, "sum_n_half");
  line["inputs"] = count;
  print_bandwidth(s, line, static_cast<double>((count + 1) * n * sizeof(std::uint16_t)), median,
                  copy);
}

void bench_sgd_momentum(const settings& s, std::size_t n, double copy) {
  buffer weight{s.device, n * sizeof(float)}, grad{s.device, n * sizeof(float)},
      mom{s.device, n * sizeof(float)};
  cuda::fill(s.device, weight.as<float>(), 0.5f, n);
  cuda::fill(s.device, grad.as<float>(), 0.01f, n);
  cuda::fill(s.device, mom.as<float>(), 0.0f, n);
  const cuda::weight_and_grad w{weight.as<void>(), grad.as<void>(), cuda::element_type::float32};
  const double median = median_seconds(s.repeats, [&] {
    cuda::sgd_update(s.device, w, mom.as<float>(), n, 0.01f, 0.9f, 1e-4f, {});
  });
  json_line::object line = line_for(s, "sgd_momentum");
  line["dtype"] = "float32";
  print_bandwidth(s, line, 5.0 * static_cast<double>(n * sizeof(float)), median, copy);
}

void bench_adam(const settings& s, std::size_t n, double copy) {
  buffer weight{s.device, n * sizeof(float)}, grad{s.device, n * sizeof(float)},
      mean{s.device, n * sizeof(float)}, var{s.device, n * sizeof(float)};
  cuda::fill(s.device, weight.as<float>(), 0.5f, n);
  cuda::fill(s.device, grad.as<float>(), 0.01f, n);
  cuda::fill(s.device, mean.as<float>(), 0.0f, n);
  cuda::fill(s.device, var.as<float>(), 0.0f, n);
  const cuda::weight_and_grad w{weight.as<void>(), grad.as<void>(), cuda::element_type::float32};
  const double median = median_seconds(s.repeats, [&] {
    cuda::adam_update(s.device, w, mean.as<float>(), var.as<float>(), n, 0.001f, 0.9f, 0.999f,
                      1e-8f, 1e-4f, {});
  });
  json_line::object line = line_for(s, "adam");
  line["dtype"] = "float32";
  print_bandwidth(s, line, 7.0 * static_cast<double>(n * sizeof(float)), median, copy);
}

void bench_sgemm(const settings& s) {
  const std::size_t size = s.gemm_size, elements = size * size;
  buffer a{s.device, elements * sizeof(float)}, b{s.device, elements * sizeof(float)},
      c{s.device, elements * sizeof(float)};
  cuda::fill(s.device, a.as<float>(), 0.01f, elements);
  cuda::fill(s.device, b.as<float>(), 0.01f, elements);
  const double median = median_seconds(s.repeats, [&] {
    cuda::gemm(s.device, false, false, size, size, size, 1.0f, a.as<float>(), size, b.as<float>(),
               size, 0.0f, c.as<float>(), size);
  });
  print_gemm(s, "sgemm", median);
}

void bench_gemm_half(const settings& s) {
  const std::size_t size = s.gemm_size, elements = size * size;
  const auto operands = half_buffers(s, 2, elements, 0.01f);
  buffer c{s.device, elements * sizeof(std::uint16_t)};
  const double median = median_seconds(s.repeats, [&] {
    cuda::gemm_half(s.device, false, false, size, size, size, 1.0f,
                    operands[0]->as<std::uint16_t>(), size, operands[1]->as<std::uint16_t>(), size,
                    0.0f, c.as<std::uint16_t>(), size);
  });
  print_gemm(s, "gemm_half", median);
}

void run(const settings& s) {
  const std::size_t bytes = s.megabytes << 20;
  const std::size_t floats = bytes / sizeof(float), halves = bytes / sizeof(std::uint16_t);
  const double copy = bench_copy(s, bytes);
  bench_sum_n(s, 2, floats, copy);
  bench_sum_n(s, 8, floats, copy);
  bench_sum_n_half(s, 8, halves, copy);
  bench_sgd_momentum(s, floats, copy);
  bench_adam(s, floats, copy);
  if (s.gemm_size > 0) {
    bench_sgemm(s);
    bench_gemm_half(s);
  }
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"troupe GPU kernel benchmark: bandwidth of the memory-bound kernels, GEMM TFLOP/s"};
  settings s;
  app.add_option("--device", s.device, "CUDA device index")->check(CLI::NonNegativeNumber);
  app.add_option("--megabytes", s.megabytes, "MiB per buffer")->check(CLI::Range(1, 65536));
  app.add_option("--repeats", s.repeats, "timed calls per measurement (median)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--gemm-size", s.gemm_size, "M = N = K of the GEMMs; 0 skips them")
      ->check(CLI::Range(0, 65536));
  CLI11_PARSE(app, argc, argv);

  if (cuda::device_count() == 0) {
    json_line::object line;
    line["bench"] = "gpu";
    line["skipped"] = cuda::describe_device(0);
    json_line::print(line);
    return 0;
  }
  if (s.device >= cuda::device_count()) {
    std::fprintf(stderr, "gpu_bench: no CUDA device %d (%d present)\n", s.device,
                 cuda::device_count());
    return 2;
  }
  try {
    run(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "gpu_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
