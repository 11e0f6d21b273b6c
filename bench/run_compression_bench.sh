#!/usr/bin/env bash
# Gradient compression (issue 26): what a push and a pushpull put on the wire and how long they
# take, dense and with --gradient-compression 2bit and 1bit, one after the other in one run: one
# worker and one server (troupe-launch -n W -s 1, W from WORKERS), every byte through the socket
# (data.shm_arena_bytes = 0, as between hosts). wire_bytes_per_op is what the machine's network
# interfaces transmitted per repetition (kvbench, /proc/net/dev): run it on an otherwise quiet
# machine. Expected: a push 16x (2bit) and 32x (1bit) smaller than dense, plus frame headers and
# acks; a pushpull's pull half stays dense, unless the rule is "+pulls" (--compress-pulls: the
# server packs its replies too, so a pushpull shrinks by the packing's factor as well).
#
#   bench/run_compression_bench.sh [BUILD_DIR]
#   SIZES="4194304 67108864" REPEATS=10 WORKERS=1 RESULTS=compression.jsonl bench/run_compression_bench.sh build
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/jsonl.sh
. bench/jsonl.sh
build=${1:-build}
sizes=${SIZES:-4194304 67108864}
repeats=${REPEATS:-10}
workers=${WORKERS:-1}
need_executables run_compression_bench "$build" bench/kvbench apps/troupe-launch apps/troupe-node
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for rule in none 2bit 1bit 2bit+pulls 1bit+pulls; do
  pulls=()
  [ "${rule%+pulls}" != "$rule" ] && pulls=(--compress-pulls)
  # shellcheck disable=SC2086  # sizes is a list
  timeout -k 10 900 "$build/apps/troupe-launch" -n "$workers" -s 1 -- "$build/bench/kvbench" \
    --ops push pushpull --sizes $sizes --repeats "$repeats" --shm-arena-bytes 0 \
    --gradient-compression "${rule%+pulls}" "${pulls[@]}" 2>/dev/null |
    grep '"bench":"kvbench"' |
    sed -e 's/^\[worker 0\] //' -e "s/^{/{\"rule\":\"$rule\",/" | tee -a "$log"
done
[ -n "${RESULTS:-}" ] && cp "$log" "$RESULTS"
echo
echo "| op | MiB | rule | median ms | wire MB per op | dense / this |"
echo "|---|---|---|---|---|---|"
awk "$jsonl_awk"'
  { rule = field($0, "rule"); op = field($0, "op"); bytes = field($0, "bytes")
    key = op " " bytes; wire[key, rule] = field($0, "wire_bytes_per_op"); ms[key, rule] = field($0, "median_ms")
    if (!(key in seen)) { seen[key] = 1; order[++n] = key } }
  END {
    split("none 2bit 1bit 2bit+pulls 1bit+pulls", rules, " ")
    for (i = 1; i <= n; i++) {
      split(order[i], parts, " ")
      for (r = 1; r <= 5; r++) {
        k = order[i]; if (!((k, rules[r]) in wire)) continue
        ratio = wire[k, rules[r]] > 0 ? wire[k, "none"] / wire[k, rules[r]] : 0
        printf "| %s | %g | %s | %.2f | %.2f | %.1f |\n", parts[1], parts[2] / 1048576, rules[r],
          ms[k, rules[r]], wire[k, rules[r]] / 1e6, ratio
      }
    }
  }' "$log"
