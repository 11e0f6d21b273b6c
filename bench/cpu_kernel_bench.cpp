// cpu_kernel_bench: what a server's shard does to every byte it holds, on one core, against the
// memory bandwidth of that core: the sum of pushes (the merge of a sync round) and each optimizer
// rule of kernels/cpu, beside `a += b` (kernels::cpu::add in place, the merge of one push) and
// memcpy measured in the same run.
//
//   build/bench/cpu_kernel_bench [--megabytes 64] [--repeats 9] [--kernels memcpy,adam]
//
// Buffers hold --megabytes MiB each (well past the last-level cache, so that memory, not the
// cache, is what every kernel streams from), filled before timing. Each measurement is the median
// wall time of --repeats calls after one warm-up call (kernel_timing.hpp), on the calling thread.
// One JSON line per kernel (engine/json_line.hpp) with
//   bytes      read + written per call: a += b reads a and b and writes a (3 x n x 4); sum_n of k
//              float32 inputs (k + 1) x n x 4; SGD without momentum 3 x n x 4, with momentum and
//              NAG 5 x n x 4, Adam 7 x n x 4, RMSProp and AdaGrad 5 x n x 4, centered RMSProp
//              9 x n x 4; float16 kernels count 2 bytes per element
//   gb_per_s   bytes / median_s / 1e9
//   ratio_to_add   the kernel's GB/s over a += b's, median over --repeats pairs (each timed call
//              of the kernel right after one of a += b): how close a kernel comes to the
//              single-core bandwidth of the plainest in-place kernel
// so a kernel bound by memory, as every one of these should be, is near 1.
//
// Buffers are --spacing-kib KiB longer than they need to be (default 64), so that consecutive
// buffers do not start a power of two apart: on this project's EPYC VM, streams exactly 64 MiB
// apart (what consecutive 64 MiB allocations get) run centered RMSProp at half speed, while 64 KiB
// more restores it (BENCHMARKS.md); --spacing-kib 0 measures that placement.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/json_line.hpp"
#include "kernel_timing.hpp"
#include "kernels/cpu/elementwise.hpp"
#include "kernels/cpu/half.hpp"
#include "kernels/cpu/optimizer_rules.hpp"

namespace cpu = troupe::kernels::cpu;
namespace json_line = troupe::json_line;
using troupe::bench::median_seconds;

namespace {

struct settings {
  std::size_t megabytes = 64;
  /// Unused bytes after each buffer, in KiB (see the file comment).
  std::size_t spacing_kib = 64;
  int repeats = 9;
  /// Kernels to time by name (empty: all); `a += b` is timed whenever a ratio needs it.
  std::vector<std::string> kernels;

  bool wants(const std::string& kernel) const {
    return kernels.empty() || std::find(kernels.begin(), kernels.end(), kernel) != kernels.end();
  }
};

/// `count` buffers of n elements (plus the spacing), each filled with its own value (first touch
/// happens here, not in the timed calls).
template <class T>
std::vector<std::vector<T>> buffers(const settings& s, std::size_t count, std::size_t n, T first) {
  const std::size_t spacing = (s.spacing_kib << 10) / sizeof(T);
  std::vector<std::vector<T>> out;
  for (std::size_t k = 0; k < count; ++k)
    out.emplace_back(n + spacing, static_cast<T>(first + static_cast<T>(k)));
  return out;
}

/// Prints one kernel's line and returns its GB/s; add_gb_per_s <= 0: no ratio (the baselines).
double print_bandwidth(const settings& s, const std::string& kernel, double bytes, double median,
                       double add_gb_per_s, json_line::object line = {}) {
  line["bench"] = "cpu_kernel";
  line["spacing_kib"] = s.spacing_kib;
  line["kernel"] = kernel;
  return troupe::bench::print_bandwidth(std::move(line), bytes, median, s.repeats, add_gb_per_s,
                                        "ratio_to_add");
}

/// A kernel timed beside a += b: each timed call of the kernel follows one of a += b, so that a
/// change of the machine's bandwidth during the run (other processes, the VM's neighbours) moves
/// both sides of a ratio alike.
struct beside_add_times {
  double median_s = 0;
  /// Median over the pairs of the kernel's GB/s over a += b's.
  double ratio = 0;
};

beside_add_times time_beside(int repeats, const std::function<void()>& add, double add_bytes,
                             const std::function<void()>& kernel, double kernel_bytes) {
  using clock_type = std::chrono::steady_clock;
  const auto seconds_of = [](const std::function<void()>& call) {
    const auto start = clock_type::now();
    call();
    return std::chrono::duration<double>(clock_type::now() - start).count();
  };
  add();
  kernel();
  std::vector<double> kernel_seconds, ratios;
  for (int r = 0; r < repeats; ++r) {
    const double add_s = seconds_of(add);
    const double kernel_s = seconds_of(kernel);
    kernel_seconds.push_back(kernel_s);
    ratios.push_back((kernel_bytes / kernel_s) / (add_bytes / add_s));
  }
  return {troupe::bench::median(std::move(kernel_seconds)),
          troupe::bench::median(std::move(ratios))};
}

void run(const settings& s) {
  const std::size_t bytes = s.megabytes << 20;
  const std::size_t n = bytes / sizeof(float), halves = bytes / sizeof(cpu::half_bits);
  const double per_buffer = static_cast<double>(bytes);

  if (s.wants("memcpy")) {
    auto b = buffers<float>(s, 2, n, 1.0f);
    print_bandwidth(
        s, "memcpy", 2 * per_buffer,
        median_seconds(s.repeats, [&] { std::memcpy(b[0].data(), b[1].data(), bytes); }), 0);
  }
  const bool only_memcpy = s.kernels.size() == 1 && s.kernels[0] == "memcpy";
  if (only_memcpy)
    return;
  auto add_buffers = buffers<float>(s, 2, n, 0.0f);
  const std::function<void()> add = [&] {
    cpu::add(add_buffers[0].data(), add_buffers[1].data(), add_buffers[0].data(), n);
  };
  print_bandwidth(s, "a += b", 3 * per_buffer, median_seconds(s.repeats, add), 0);
  const auto beside_add = [&](const std::string& kernel, double kernel_bytes,
                              const std::function<void()>& call, json_line::object line = {}) {
    const auto times = time_beside(s.repeats, add, 3 * per_buffer, call, kernel_bytes);
    line["ratio_to_add"] = json_line::fixed(times.ratio, 3);
    print_bandwidth(s, kernel, kernel_bytes, times.median_s, 0, std::move(line));
  };
  for (std::size_t count : {2u, 8u}) {
    if (!s.wants("sum_n"))
      break;
    auto b = buffers<float>(s, count + 1, n, 1.0f);
    std::vector<const float*> inputs;
    for (std::size_t k = 0; k < count; ++k)
      inputs.push_back(b[k].data());
    json_line::object line;
    line["inputs"] = count;
    beside_add(
        "sum_n", static_cast<double>(count + 1) * per_buffer,
        [&] { cpu::sum_n(inputs.data(), count, b[count].data(), n); }, line);
  }
  if (s.wants("sum_n_half")) {
    const auto quarter = cpu::float_to_half(0.25f);
    auto b = buffers<cpu::half_bits>(s, 3, halves, quarter);
    for (auto& buffer : b)
      std::fill(buffer.begin(), buffer.end(), quarter);
    const cpu::half_bits* inputs[] = {b[0].data(), b[1].data()};
    json_line::object line;
    line["inputs"] = 2;
    beside_add(
        "sum_n_half", 3.0 * static_cast<double>(halves * sizeof(cpu::half_bits)),
        [&] { cpu::sum_n_half(inputs, 2, b[2].data(), halves); }, line);
  }

  // The rules, each on weight, gradient and its state buffers; the values stay finite over the
  // calls (small steps from 0.5).
  auto b = buffers<float>(s, 6, n, 0.5f);
  float *weight = b[0].data(), *s1 = b[2].data(), *s2 = b[3].data(), *s3 = b[4].data();
  const float* grad = b[1].data();
  const cpu::gradient_settings gradient{};
  const auto rule = [&](const std::string& name, int buffers_touched, auto&& call) {
    if (!s.wants(name))
      return;
    beside_add(name, buffers_touched * per_buffer, call);
  };
  rule("test", 3, [&] { cpu::test_update(weight, grad, n, 1e-6f); });
  rule("sgd", 3, [&] { cpu::sgd_update(weight, grad, nullptr, n, 1e-6f, 0.0f, 1e-4f, gradient); });
  rule("sgd_momentum", 5,
       [&] { cpu::sgd_update(weight, grad, s1, n, 1e-6f, 0.9f, 1e-4f, gradient); });
  rule("nag", 5, [&] { cpu::nag_update(weight, grad, s1, n, 1e-6f, 0.9f, 1e-4f, gradient); });
  rule("adam", 7, [&] {
    cpu::adam_update(weight, grad, s1, s2, n, 1e-6f, 0.9f, 0.999f, 1e-8f, 1e-4f, gradient);
  });
  rule("rmsprop", 5, [&] {
    cpu::rmsprop_update(weight, grad, s1, n, 1e-6f, 0.9f, 1e-8f, 1e-4f, -1.0f, gradient);
  });
  rule("rmsprop_centered", 9, [&] {
    cpu::rmsprop_centered_update(weight, grad, s1, s2, s3, n, 1e-6f, 0.95f, 0.9f, 1e-8f, 1e-4f,
                                 -1.0f, gradient);
  });
  rule("adagrad", 5,
       [&] { cpu::adagrad_update(weight, grad, s1, n, 1e-6f, 1e-7f, 1e-4f, gradient); });
}

} // namespace

int main(int argc, char** argv) {
  CLI::App app{"troupe CPU kernel benchmark: a shard's sum and optimizer rules against a += b"};
  settings s;
  app.add_option("--megabytes", s.megabytes, "MiB per buffer")->check(CLI::Range(1, 16384));
  app.add_option("--spacing-kib", s.spacing_kib, "unused KiB after each buffer (0: none)")
      ->check(CLI::Range(0, 1 << 20));
  app.add_option("--repeats", s.repeats, "timed calls per measurement (median)")
      ->check(CLI::Range(1, 100000));
  app.add_option("--kernels", s.kernels,
                 "kernels to time (memcpy, sum_n, sum_n_half, test, sgd, sgd_momentum, nag, adam, "
                 "rmsprop, rmsprop_centered, adagrad); default all")
      ->delimiter(',');
  CLI11_PARSE(app, argc, argv);
  try {
    run(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "cpu_kernel_bench: %s\n", e.what());
    return 1;
  }
  return 0;
}
