#!/usr/bin/env bash
# Fashion-MNIST with a straggler: 3 workers and 1 server on this machine, one worker sleeping in
# its steps (train_mnist --slow-worker: SLOW=2:5ms, worker 2 in every step; SLOW=rotate:5ms, each
# step another worker), under each way troupe lets workers wait for each other:
#
#   dist_sync            every round waits for all 3 workers (MXNet's dist_sync)
#   quorum_2_of_3        dist_sync whose rounds close with the first 2 workers (--quorum 2)
#   staleness_2          dist_async whose pulls wait until no worker is more than 2 rounds behind
#                        (--max-staleness 2)
#   dist_async           every push applied as it arrives (MXNet's dist_async)
#   dist_sync_no_straggler   the same job without the sleep, for reference
#
# Each run prints one JSON line: the job's samples/s (every worker's samples over the wall time
# from the first step to the end of the last epoch, which ends when the slowest worker's does;
# train_mnist's job_samples_per_s) and the test accuracy after the last epoch; the last lines give
# the medians per setting. The machine is shared: compare settings within one run of this script.
#
#   bench/run_straggler_bench.sh [BUILD_DIR]
#   REPEATS=3 EPOCHS=5 SLOW=2:5ms BATCH=64 bench/run_straggler_bench.sh build
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/jsonl.sh
. bench/jsonl.sh
build=${1:-build}
repeats=${REPEATS:-3}
epochs=${EPOCHS:-5}
slow=${SLOW:-2:5ms}
batch=${BATCH:-64}
run_timeout=${RUN_TIMEOUT:-600}
for exe in apps/train_mnist apps/troupe-launch apps/troupe-node; do
  [ -x "$build/$exe" ] || { echo "run_straggler_bench: $build/$exe is missing" >&2; exit 1; }
done
log=$(mktemp)
trap 'rm -f "$log"' EXIT

settings=(dist_sync quorum_2_of_3 staleness_2 dist_async dist_sync_no_straggler)
flags_of() {
  case $1 in
  dist_sync) echo "--kvstore dist_sync --slow-worker $slow" ;;
  quorum_2_of_3) echo "--kvstore dist_sync --quorum 2 --slow-worker $slow" ;;
  staleness_2) echo "--kvstore dist_async --max-staleness 2 --slow-worker $slow" ;;
  dist_async) echo "--kvstore dist_async --slow-worker $slow" ;;
  dist_sync_no_straggler) echo "--kvstore dist_sync" ;;
  esac
}

for repeat in $(seq 1 "$repeats"); do
  for setting in "${settings[@]}"; do
    # shellcheck disable=SC2046
    out=$(timeout -k 10 "$run_timeout" "$build/apps/troupe-launch" -n 3 -s 1 -- \
            "$build/apps/train_mnist" $(flags_of "$setting") --epochs "$epochs" \
            --batch-size "$batch" --threads 1 --no-progress 2>/dev/null |
            final_line || true)
    if [ -z "$out" ]; then
      echo "run_straggler_bench: repeat $repeat of $setting skipped: it printed no result" >&2
      continue
    fi
    printf '%s\n' "$out" | awk -v setting="$setting" -v repeat="$repeat" -v slow="$slow" "$jsonl_awk"'
      {
        printf "{\"bench\":\"straggler\",\"setting\":\"%s\",\"repeat\":%d,\"slow\":\"%s\"," \
               "\"samples_per_s\":%s,\"test_acc\":%s}\n", setting, repeat, slow,
               field($0, "job_samples_per_s"), field($0, "final_test_acc")
      }' | tee -a "$log"
  done
done

echo
echo "# medians over $repeats repeats: 3 workers, 1 server, $epochs epochs, batch $batch per worker, slow $slow"
printf '%-24s %-12s %-10s\n' setting samples_per_s test_acc
awk "$jsonl_awk"'

  {
    s = field($0, "setting")
    if (!(s in seen)) { seen[s] = 1; order[++count] = s }
    rate[s] = rate[s] " " field($0, "samples_per_s"); acc[s] = acc[s] " " field($0, "test_acc")
  }
  END {
    for (i = 1; i <= count; i++)
      printf "%-24s %-12.0f %-10.2f\n", order[i], median(rate[order[i]]), median(acc[order[i]])
  }' "$log"
