#!/usr/bin/env bash
# One worker through a parameter server against the same job with no server, back to back,
# REPEATS times (issue 24's first target: dist_sync W=1 S=1 at 0.9x local or better):
#
#   local: build/apps/train_mnist --kvstore local                 (the update on the worker)
#   dist:  troupe-launch -n 1 -s 1 -- train_mnist --kvstore dist_sync
#          (the update on the server; gradients and weights cross shared memory)
#
# Both train BENCHMARKS.md's recipe (MLP 784-256-10, SGD lr 0.1, batch 128, one compute thread)
# for EPOCHS epochs. Each pair prints a JSON line with both samples/s and the ratio dist / local;
# the last line gives the medians. EXTRA="--model mlp-wide --max-batches 50" changes the job on
# both sides; DIST_FLAGS adds cluster flags to the dist run only (e.g. DIST_FLAGS="--slice-bytes 0").
#
#   bench/run_overlap_bench.sh [BUILD_DIR]
#   REPEATS=5 EPOCHS=1 bench/run_overlap_bench.sh build
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/jsonl.sh
. bench/jsonl.sh
build=${1:-build}
repeats=${REPEATS:-5}
epochs=${EPOCHS:-1}
read -r -a extra <<<"${EXTRA:-}"
read -r -a dist_flags <<<"${DIST_FLAGS:-}"
run_timeout=${RUN_TIMEOUT:-300}
for exe in apps/train_mnist apps/troupe-launch apps/troupe-node; do
  [ -x "$build/$exe" ] || { echo "run_overlap_bench: $build/$exe is missing" >&2; exit 1; }
done
common=(--epochs "$epochs" --batch-size 128 --lr 0.1 --init torch --seed 0 --threads 1
        --no-progress "${extra[@]}")
local_rates="" dist_rates="" ratios=""
for repeat in $(seq 1 "$repeats"); do
  local_line=$(timeout -k 10 "$run_timeout" "$build/apps/train_mnist" --kvstore local \
               "${common[@]}" | final_line || true)
  dist_line=$(timeout -k 10 "$run_timeout" "$build/apps/troupe-launch" -n 1 -s 1 -- \
              "$build/apps/train_mnist" --kvstore dist_sync "${common[@]}" "${dist_flags[@]}" \
              | final_line || true)
  if [ -z "$local_line" ] || [ -z "$dist_line" ]; then
    echo "run_overlap_bench: repeat $repeat skipped: a run printed no result" >&2
    continue
  fi
  row=$(awk "$jsonl_awk"'BEGIN {
      l = field(ARGV[1], "samples_per_s"); d = field(ARGV[2], "samples_per_s")
      printf "{\"bench\":\"overlap_w1s1\",\"repeat\":%d,\"model\":\"%s\",\"local_samples_per_s\":%s,\"dist_samples_per_s\":%s,\"ratio\":%.3f,\"local_test_acc\":%s,\"dist_test_acc\":%s}\n",
             ARGV[3], field(ARGV[1], "model"), l, d, d / l, field(ARGV[1], "final_test_acc"),
             field(ARGV[2], "final_test_acc")
    }' "$local_line" "$dist_line" "$repeat")
  echo "$row"
  local_rates+=" $(awk "$jsonl_awk"'BEGIN { print field(ARGV[1], "local_samples_per_s") }' "$row")"
  dist_rates+=" $(awk "$jsonl_awk"'BEGIN { print field(ARGV[1], "dist_samples_per_s") }' "$row")"
  ratios+=" $(awk "$jsonl_awk"'BEGIN { print field(ARGV[1], "ratio") }' "$row")"
done
[ -n "$ratios" ] || { echo "run_overlap_bench: no repeat gave a result" >&2; exit 1; }
awk "$jsonl_awk"'BEGIN {
    printf "{\"bench\":\"overlap_w1s1_median\",\"median_local_samples_per_s\":%s,\"median_dist_samples_per_s\":%s,\"median_ratio\":%s}\n",
           median(ARGV[1]), median(ARGV[2]), median(ARGV[3])
  }' "$local_rates" "$dist_rates" "$ratios"
