#pragma once
// The whole machine's busy CPU time, for benchmarks that state what a transfer cost the cores
// (docs/scaling.md's c_net): read before and after the measured repetitions on an otherwise idle
// machine, the difference is the work of every process and of the kernel on both ends.

#include <cstdio>
#include <cstring>
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

/// Bytes every network interface of this network namespace has transmitted (/proc/net/dev,
/// loopback included): read before and after the measured repetitions of a job alone in its
/// namespace, the difference is what crossed the wire, frame and TCP headers included. Negative
/// where it cannot be read.
inline double network_transmitted_bytes() {
  std::FILE* dev = std::fopen("/proc/net/dev", "r");
  if (dev == nullptr)
    return -1;
  char line[512];
  double total = 0;
  int interfaces = 0;
  while (std::fgets(line, sizeof line, dev) != nullptr) {
    const char* colon = std::strchr(line, ':');
    if (colon == nullptr)
      continue; // the two header lines
    unsigned long long received[8] = {}, transmitted = 0;
    if (std::sscanf(colon + 1, "%llu %llu %llu %llu %llu %llu %llu %llu %llu", &received[0],
                    &received[1], &received[2], &received[3], &received[4], &received[5],
                    &received[6], &received[7], &transmitted) == 9) {
      total += static_cast<double>(transmitted);
      ++interfaces;
    }
  }
  std::fclose(dev);
  return interfaces > 0 ? total : -1;
}

} // namespace troupe::bench
