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
//   ratio_to_add   gb_per_s / a += b's gb_per_s: how close a kernel comes to the single-core
//              bandwidth of the plainest in-place kernel
// so a kernel bound by memory, as every one of these should be, is near 1.

#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
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
  int repeats = 9;
  /// Kernels to time by name (empty: all); `a += b` is timed whenever a ratio needs it.
  std::vector<std::string> kernels;

  bool wants(const std::string& kernel) const {
    return kernels.empty() || std::find(kernels.begin(), kernels.end(), kernel) != kernels.end();
  }
};

/// `count` buffers of n elements, each filled with its own value (first touch happens here, not
/// in the timed calls).
template <class T>
std::vector<std::vector<T>> buffers(std::size_t count, std::size_t n, T first) {
  std::vector<std::vector<T>> out;
  for (std::size_t k = 0; k < count; ++k)
    out.emplace_back(n, static_cast<T>(first + static_cast<T>(k)));
  return out;
}

/// Prints one kernel's line and returns its GB/s; add_gb_per_s <= 0: no ratio (the baselines).
double print_bandwidth(const settings& s, const std::string& kernel, double bytes, double median,
                       double add_gb_per_s, json_line::object line = {}) {
  line["bench"] = "cpu_kernel";
  line["kernel"] = kernel;
  return troupe::bench::print_bandwidth(std::move(line), bytes, median, s.repeats, add_gb_per_s,
                                        "ratio_to_add");
}

void run(const settings& s) {
  const std::size_t bytes = s.megabytes << 20;
  const std::size_t n = bytes / sizeof(float), halves = bytes / sizeof(cpu::half_bits);
  const double per_buffer = static_cast<double>(bytes);

  if (s.wants("memcpy")) {
    auto b = buffers<float>(2, n, 1.0f);
    print_bandwidth(
        s, "memcpy", 2 * per_buffer,
        median_seconds(s.repeats, [&] { std::memcpy(b[0].data(), b[1].data(), bytes); }), 0);
  }
  const bool only_memcpy = s.kernels.size() == 1 && s.kernels[0] == "memcpy";
  if (only_memcpy)
    return;
  double add = 0;
  {
    auto b = buffers<float>(2, n, 0.0f);
    add = print_bandwidth(
        s, "a += b", 3 * per_buffer,
        median_seconds(s.repeats, [&] { cpu::add(b[0].data(), b[1].data(), b[0].data(), n); }), 0);
  }
  for (std::size_t count : {2u, 8u}) {
    if (!s.wants("sum_n"))
      break;
    auto b = buffers<float>(count + 1, n, 1.0f);
    std::vector<const float*> inputs;
    for (std::size_t k = 0; k < count; ++k)
      inputs.push_back(b[k].data());
    json_line::object line;
    line["inputs"] = count;
    print_bandwidth(
        s, "sum_n", static_cast<double>(count + 1) * per_buffer,
        median_seconds(s.repeats, [&] { cpu::sum_n(inputs.data(), count, b[count].data(), n); }),
        add, line);
  }
  if (s.wants("sum_n_half")) {
    std::vector<std::vector<cpu::half_bits>> b(
        3, std::vector<cpu::half_bits>(halves, cpu::float_to_half(0.25f)));
    const cpu::half_bits* inputs[] = {b[0].data(), b[1].data()};
    json_line::object line;
    line["inputs"] = 2;
    print_bandwidth(
        s, "sum_n_half", 3.0 * static_cast<double>(halves * sizeof(cpu::half_bits)),
        median_seconds(s.repeats, [&] { cpu::sum_n_half(inputs, 2, b[2].data(), halves); }), add,
        line);
  }

  // The rules, each on weight, gradient and its state buffers; the values stay finite over the
  // calls (small steps from 0.5).
  auto b = buffers<float>(6, n, 0.5f);
  float *weight = b[0].data(), *s1 = b[2].data(), *s2 = b[3].data(), *s3 = b[4].data();
  const float* grad = b[1].data();
  const cpu::gradient_settings gradient{};
  const auto rule = [&](const std::string& name, int buffers_touched, auto&& call) {
    if (!s.wants(name))
      return;
    print_bandwidth(s, name, buffers_touched * per_buffer, median_seconds(s.repeats, call), add);
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
