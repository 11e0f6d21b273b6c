#pragma once
// Quantiles of durations in bounded memory, for the job's summary (round times p50 / p99): counts
// in logarithmic buckets 2^(1/16) apart (4.4 %), from 1 microsecond to about 18 minutes. A
// quantile is the geometric middle of its bucket, so it is within 2.2 % of a value that was
// recorded. Plain data, no locking: one owner records.

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdint>

namespace troupe {

class latency_histogram {
public:
  static constexpr int buckets_per_doubling = 16;
  static constexpr int bucket_count = 30 * buckets_per_doubling + 1;

  void record(std::chrono::microseconds duration) noexcept {
    const auto us = std::max<std::int64_t>(duration.count(), 1);
    auto index =
        static_cast<int>(std::floor(std::log2(static_cast<double>(us)) * buckets_per_doubling));
    index = std::clamp(index, 0, bucket_count - 1);
    ++counts_[static_cast<std::size_t>(index)];
    ++total_;
  }

  std::uint64_t count() const noexcept { return total_; }

  /// The q-quantile (0 < q <= 1) in microseconds; 0 when nothing was recorded.
  double quantile_us(double q) const noexcept {
    if (total_ == 0)
      return 0.0;
    const auto rank = static_cast<std::uint64_t>(std::ceil(q * static_cast<double>(total_)));
    std::uint64_t seen = 0;
    for (int i = 0; i < bucket_count; ++i) {
      seen += counts_[static_cast<std::size_t>(i)];
      if (seen >= std::max<std::uint64_t>(rank, 1))
        return std::exp2((i + 0.5) / buckets_per_doubling);
    }
    return std::exp2((bucket_count - 0.5) / buckets_per_doubling);
  }

  latency_histogram& operator+=(const latency_histogram& more) noexcept {
    for (std::size_t i = 0; i < counts_.size(); ++i)
      counts_[i] += more.counts_[i];
    total_ += more.total_;
    return *this;
  }

private:
  std::array<std::uint64_t, bucket_count> counts_{};
  std::uint64_t total_ = 0;
};

} // namespace troupe
