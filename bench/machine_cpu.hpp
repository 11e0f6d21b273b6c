#pragma once
// The whole machine's busy CPU time, for benchmarks that state what a transfer cost the cores
// (docs/scaling.md's c_net): read before and after the measured repetitions on an otherwise idle
// machine, the difference is the work of every process and of the kernel on both ends.

#include <cstdio>
#include <unistd.h>

namespace troupe::bench {

/// CPU-seconds the machine has spent in every state of /proc/stat's "cpu" line but idle and
/// iowait; negative where it cannot be read.
inline double machine_busy_seconds() {
  std::FILE* stat = std::fopen("/proc/stat", "r");
  if (stat == nullptr)
    return -1;
  unsigned long long user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0,
                     steal = 0;
  const int fields = std::fscanf(stat, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &user, &nice,
                                 &system, &idle, &iowait, &irq, &softirq, &steal);
  std::fclose(stat);
  if (fields != 8)
    return -1;
  return static_cast<double>(user + nice + system + irq + softirq + steal) /
         static_cast<double>(::sysconf(_SC_CLK_TCK));
}

} // namespace troupe::bench
