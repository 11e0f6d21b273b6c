#pragma once
// What the kernel benchmarks (gpu_bench, cpu_kernel_bench) share: the timing rule, one untimed
// warm-up call and then the median wall time of `repeats` calls (so that a page fault or a
// descheduling in one call does not move the figure), and the fields of a bandwidth line.

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "engine/json_line.hpp"

namespace troupe::bench {

/// Median seconds of `repeats` calls of `body`, after one untimed warm-up call.
/// The median of `values` (the mean of the middle two when their count is even); 0 when empty.
inline double median(std::vector<double> values) {
  if (values.empty())
    return 0;
  std::sort(values.begin(), values.end());
  const std::size_t middle = values.size() / 2;
  return values.size() % 2 == 1 ? values[middle] : (values[middle - 1] + values[middle]) / 2;
}

inline double median_seconds(int repeats, const std::function<void()>& body) {
  using clock_type = std::chrono::steady_clock;
  body();
  std::vector<double> seconds;
  for (int r = 0; r < repeats; ++r) {
    const auto start = clock_type::now();
    body();
    seconds.push_back(std::chrono::duration<double>(clock_type::now() - start).count());
  }
  return median(std::move(seconds));
}

/// Prints `line` with the bandwidth of `bytes` read and written in `median` seconds, and its ratio
/// to `baseline_gb_per_s` as field `ratio_field` when that is positive (not for the baselines
/// themselves); returns the GB/s.
inline double print_bandwidth(json_line::object line, double bytes, double median, int repeats,
                              double baseline_gb_per_s, const std::string& ratio_field) {
  const double gb_per_s = bytes / median / 1e9;
  line["bytes"] = static_cast<std::uint64_t>(bytes);
  line["repeats"] = repeats;
  line["median_s"] = json_line::significant(median, 4);
  line["gb_per_s"] = json_line::fixed(gb_per_s, 2);
  if (baseline_gb_per_s > 0)
    line[ratio_field] = json_line::fixed(gb_per_s / baseline_gb_per_s, 3);
  json_line::print(line);
  return gb_per_s;
}

} // namespace troupe::bench
