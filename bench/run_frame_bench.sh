#!/usr/bin/env bash
# Runs bench/tcp_baseline and then bench/frame_bench back to back on the same sizes, and prints
# each frame_bench median beside the baseline's from the same run, with their ratio. On a shared
# or small machine only ratios measured back to back mean anything.
#
#   bench/run_frame_bench.sh [BUILD_DIR] [frame_bench flags...]
#   SIZES=4096,16777216 REPEATS=15 ROUNDS=3 bench/run_frame_bench.sh build-data
#
# ROUNDS repeats the pair (baseline, then frame_bench) to show the spread. Ratio: for a push,
# frame_bench's median GB/s over the baseline's; for a push+pull, the bytes of both directions
# per second (wire_gbps) over the baseline's, i.e. the time raw TCP needs to carry the same bytes
# one way after the other, divided by the time the push+pull took.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/jsonl.sh
. bench/jsonl.sh
build=build
if [ $# -gt 0 ] && [ -d "$1" ]; then
  build=$1
  shift
fi
sizes=${SIZES:-4096,1048576,16777216,134217728}
repeats=${REPEATS:-9}
rounds=${ROUNDS:-1}
for exe in tcp_baseline frame_bench; do
  if [ ! -x "$build/bench/$exe" ]; then
    echo "run_frame_bench: $build/bench/$exe is missing (cmake --build $build --target $exe)" >&2
    exit 1
  fi
done

for round in $(seq 1 "$rounds"); do
  log=$(mktemp)
  trap 'rm -f "$log"' EXIT
  echo "# round $round: $build/bench/tcp_baseline --sizes $sizes --repeats $repeats"
  "$build/bench/tcp_baseline" --sizes "$sizes" --repeats "$repeats" | tee "$log"
  echo "# round $round: $build/bench/frame_bench --sizes $sizes --repeats $repeats $*"
  "$build/bench/frame_bench" --sizes "$sizes" --repeats "$repeats" "$@" | tee -a "$log"
  awk "$jsonl_awk"'
    {
      bench = field($0, "bench"); bytes = field($0, "bytes")
      if (bench == "tcp_baseline") {
        tcp_gbps[bytes] = field($0, "median_gbps"); tcp_rtt[bytes] = field($0, "median_rtt_us")
      } else if (bench == "frame_bench") {
        n++; op[n] = field($0, "op"); size[n] = bytes; rtt[n] = field($0, "median_rtt_us")
        gbps[n] = (op[n] == "pushpull") ? field($0, "wire_gbps") : field($0, "median_gbps")
      }
    }
    END {
      printf "%-9s %11s %12s %12s %7s %14s %12s\n", "op", "bytes", "frame_GB/s", "tcp_GB/s",
             "ratio", "frame_rtt_us", "tcp_rtt_us"
      for (i = 1; i <= n; i++) {
        t = tcp_gbps[size[i]]
        ratio = (t > 0) ? sprintf("%.2f", gbps[i] / t) : "-"
        printf "%-9s %11s %12s %12s %7s %14s %12s\n", op[i], size[i], gbps[i], t, ratio, rtt[i],
               tcp_rtt[size[i]]
      }
    }' "$log"
done
