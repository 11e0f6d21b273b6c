#!/usr/bin/env bash
# A/B of two builds' KVStore jobs on one machine in one session: alternates
# bench/run_kvbench.sh (raw TCP, then a troupe-launch job of kvbench) for BUILD_A and BUILD_B,
# ROUNDS times each, and prints per op and size the median round trip and the median ratio to the
# raw-TCP baseline measured right before it, for each build, and B's medians over A's. On a shared
# 2-core machine only such interleaved medians mean anything.
#
#   bench/compare_kvbench.sh BUILD_A BUILD_B
#   ROUNDS=5 REPEATS=9 SIZES=4096,16777216,134217728 W=1 S=1 bench/compare_kvbench.sh before build
#
# A build directory needs bench/{tcp_baseline,kvbench} and apps/{troupe-launch,troupe-node}; a
# copy of those four binaries from an older commit is enough.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/jsonl.sh
. bench/jsonl.sh
[ $# -eq 2 ] || { echo "usage: $0 BUILD_A BUILD_B" >&2; exit 2; }
a=$1
b=$2
rounds=${ROUNDS:-5}
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for _ in $(seq 1 "$rounds"); do
  for side in A B; do
    build=$a
    [ "$side" = B ] && build=$b
    ROUNDS=1 bench/run_kvbench.sh "$build" | grep '^round=' | sed "s/^round=1 /side=$side /" >>"$log"
  done
done
echo "# $rounds interleaved rounds; A=$a B=$b; W=${W:-1} S=${S:-1}"
printf '%-9s %-11s %-10s %-10s %-8s %-8s %-8s %-8s\n' op bytes A_us B_us B/A_us A_ratio B_ratio B/A_ratio
awk "$jsonl_awk"'

  {
    side = $1; sub(/side=/, "", side)
    bytes = field($0, "bytes")
    if (field($0, "bench") == "tcp_baseline") { tcp[bytes] = field($0, "median_gbps"); next }
    key = field($0, "op") " " bytes
    if (!(key in seen)) { seen[key] = 1; order[++count] = key }
    us[side, key] = us[side, key] " " field($0, "median_us")
    ratio[side, key] = ratio[side, key] " " field($0, "gbps") / tcp[bytes]
  }
  END {
    for (i = 1; i <= count; i++) {
      key = order[i]; split(key, part, " ")
      au = median(us["A", key]); bu = median(us["B", key])
      ar = median(ratio["A", key]); br = median(ratio["B", key])
      printf "%-9s %-11s %-10.1f %-10.1f %-8.2f %-8.3f %-8.3f %-8.2f\n", part[1], part[2], au, bu,
             bu / au, ar, br, br / ar
    }
  }' "$log"
