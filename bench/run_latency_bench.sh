#!/usr/bin/env bash
# The small-message target of the data path: a 4 KiB pushpull's round trip over a plain 4 KiB
# TCP ping-pong measured right before it, in alternating runs. Each round runs, per path,
# `tcp_baseline --pingpong` and then a whole job (troupe-launch -n 1 -s 1 -- kvbench --ops
# pushpull), and prints one JSON line with both medians and their ratio; at the end one line per
# path with the medians over the rounds. Paths: tcp (data.shm_arena_bytes = 0: every frame through
# the socket) and shm (the default: the link has a same-host arena, which a 4 KiB tensor does not
# use, below shm_threshold_bytes).
#
#   bench/run_latency_bench.sh [BUILD_DIR]
#   ROUNDS=5 SIZE=4096 REPEATS=2000 PATHS="tcp shm" bench/run_latency_bench.sh build
#
# On a shared machine the loopback's own latency moves during a day (5 to 60 us measured), so only
# the ratio of one round means anything; the medians of the ratios are the figure to quote. Each
# round also times the ping-pong with both ends polling their socket SPIN_US (50) µs before they
# block (tcp_baseline --spin-us, as troupe's caller polls 50 µs): on an idle machine the blocking
# ping-pong is woken from deep sleeps and takes 14-50 µs from minute to minute, the polling one
# stays near the socket's own speed, and "ratio_to_polling" is the stricter figure.
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/jsonl.sh
. bench/jsonl.sh
build=${1:-build}
rounds=${ROUNDS:-5}
size=${SIZE:-4096}
repeats=${REPEATS:-2000}
paths=${PATHS:-tcp shm}
spin_us=${SPIN_US:-50}
need_executables run_latency_bench "$build" bench/tcp_baseline bench/kvbench \
  apps/troupe-launch apps/troupe-node
log=$(mktemp)
trap 'rm -f "$log"' EXIT
for round in $(seq 1 "$rounds"); do
  for path in $paths; do
    case $path in
      tcp) arena=(--shm-arena-bytes 0) ;;
      shm) arena=() ;;
      *) echo "run_latency_bench: unknown path '$path' (tcp or shm)" >&2; exit 2 ;;
    esac
    pingpong=$("$build/bench/tcp_baseline" --pingpong --sizes "$size" --repeats "$repeats" |
      grep '"tcp_pingpong"')
    polling=$("$build/bench/tcp_baseline" --pingpong --sizes "$size" --repeats "$repeats" \
      --spin-us "$spin_us" | grep '"tcp_pingpong"')
    job=$("$build/apps/troupe-launch" -n 1 -s 1 -- "$build/bench/kvbench" --ops pushpull \
      --sizes "$size" --repeats "$repeats" "${arena[@]}" | grep '"bench":"kvbench"' |
      sed -e 's/^\[worker [0-9]*\] //')
    awk "$jsonl_awk"'
      {
        if (field($0, "bench") != "tcp_pingpong") kv = field($0, "median_us")
        else if (field($0, "spin_us") + 0 > 0) polled = field($0, "median_rtt_us")
        else pp = field($0, "median_rtt_us")
      }
      END {
        printf "{\"bench\":\"latency\",\"round\":%d,\"path\":\"%s\",\"bytes\":%d,", round, path, size
        printf "\"pingpong_us\":%s,\"pushpull_us\":%s,\"ratio\":%.2f,", pp, kv, kv / pp
        printf "\"polling_pingpong_us\":%s,\"ratio_to_polling\":%.2f}\n", polled, kv / polled
      }' round="$round" path="$path" size="$size" \
      <<<"$pingpong"$'\n'"$polling"$'\n'"$job" | tee -a "$log"
  done
done
awk "$jsonl_awk"'
  {
    path = field($0, "path")
    if (!(path in seen)) { seen[path] = 1; order[++count] = path }
    pp[path] = pp[path] " " field($0, "pingpong_us")
    kv[path] = kv[path] " " field($0, "pushpull_us")
    ratio[path] = ratio[path] " " field($0, "ratio")
    polled[path] = polled[path] " " field($0, "polling_pingpong_us")
    to_polled[path] = to_polled[path] " " field($0, "ratio_to_polling")
    runs[path]++
  }
  END {
    for (i = 1; i <= count; i++) {
      p = order[i]
      printf "{\"bench\":\"latency_summary\",\"path\":\"%s\",\"runs\":%d,", p, runs[p]
      printf "\"median_pingpong_us\":%.1f,\"median_pushpull_us\":%.1f,\"median_ratio\":%.2f,",
             median(pp[p]), median(kv[p]), median(ratio[p])
      printf "\"median_polling_pingpong_us\":%.1f,\"median_ratio_to_polling\":%.2f}\n",
             median(polled[p]), median(to_polled[p])
    }
  }' "$log"
