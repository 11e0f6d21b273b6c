#!/usr/bin/env bash
# Runs bench/tcp_baseline and then a whole KVStore job (troupe-launch -n W -s S -- kvbench) back to
# back, ROUNDS times, and prints each kvbench median beside the baseline's from the same round
# with their ratio. On a shared 2-core machine only ratios measured back to back mean anything.
#
#   bench/run_kvbench.sh [BUILD_DIR]
#   W=1 S=1 SIZES=4096,16777216,134217728 KEYS=1 REPEATS=9 ROUNDS=3 bench/run_kvbench.sh build
#
# Ratio: kvbench's gbps (payload bytes moved per second: push and pull count the size once,
# pushpull twice) over tcp_baseline's one-way GB/s for the same size: 1.0 would mean the KVStore
# moves the bytes as fast as a bare socket carries them one way after the other.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/jsonl.sh
. bench/jsonl.sh
build=${1:-build}
sizes=${SIZES:-4096,16777216,134217728}
keys=${KEYS:-1}
repeats=${REPEATS:-9}
rounds=${ROUNDS:-3}
workers=${W:-1}
servers=${S:-1}
need_executables run_kvbench "$build" bench/tcp_baseline bench/kvbench apps/troupe-launch \
  apps/troupe-node
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for round in $(seq 1 "$rounds"); do
  echo "# round $round"
  "$build/bench/tcp_baseline" --sizes "$sizes" --repeats "$repeats" | sed "s/^/round=$round /" | tee -a "$log"
  # LAUNCH_ARGS: more troupe-launch flags, e.g. "--config noshm.toml" for an A/B of a setting.
  # shellcheck disable=SC2086
  "$build/apps/troupe-launch" -n "$workers" -s "$servers" ${LAUNCH_ARGS:-} -- "$build/bench/kvbench" \
      --sizes "$sizes" --keys "$keys" --repeats "$repeats" |
    grep '"bench":"kvbench"' | sed -e 's/^\[worker [0-9]*\] //' -e "s/^/round=$round /" | tee -a "$log"
done
echo
echo "# W=$workers S=$servers keys=$keys: kvbench vs tcp_baseline of the same round"
printf '%-6s %-9s %-11s %-10s %-10s %-7s %-10s %-10s\n' round op bytes kv_gbps tcp_gbps ratio kv_us tcp_us
awk "$jsonl_awk"'
  {
    round = $1; sub(/round=/, "", round)
    bytes = field($0, "bytes")
    if (field($0, "bench") == "tcp_baseline") {
      tcp[round, bytes] = field($0, "median_gbps"); rtt[round, bytes] = field($0, "median_rtt_us")
    } else {
      printf "%-6s %-9s %-11s %-10s %-10s %-7.2f %-10s %-10s\n", round, field($0, "op"), bytes,
             field($0, "gbps"), tcp[round, bytes], field($0, "gbps") / tcp[round, bytes],
             field($0, "median_us"), rtt[round, bytes]
    }
  }' "$log"
