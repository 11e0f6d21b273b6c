#!/usr/bin/env bash
# Two contexts of one process against one: train_mnist with data parallelism over cpu(0) and
# cpu(1), and with the network cut into two model-parallel stages on them, each context's work
# queued on its own device actor, OpenBLAS on one thread per call (--threads 1), for the MLP and
# LeNet. For reference, data parallelism also runs under the naive engine
# (TROUPE_ENGINE_TYPE=naive: every operation on the caller's thread, one context after the other).
#
#   one_context          --contexts cpu(0)
#   two_contexts         --contexts cpu(0),cpu(1) --kvstore device
#   two_contexts_naive   the same under the naive engine
#   pipeline_m1          --model-parallel cpu(0),cpu(1) --micro-batches 1 (stages take turns)
#   pipeline_m4          --model-parallel cpu(0),cpu(1) --micro-batches 4 (stages overlap)
#
# Each run prints one JSON line (train_mnist's samples/s over the training steps, and the test
# accuracy); the last lines give the medians per model and setting and the speed-up of two
# contexts over one. The machine is shared: compare settings within one run of this script.
#
#   bench/run_context_bench.sh [BUILD_DIR]
#   REPEATS=5 EPOCHS=1 MODELS="mlp lenet" bench/run_context_bench.sh build
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/jsonl.sh
. bench/jsonl.sh
build=${1:-build}
repeats=${REPEATS:-5}
epochs=${EPOCHS:-1}
models=${MODELS:-mlp lenet}
run_timeout=${RUN_TIMEOUT:-900}
[ -x "$build/apps/train_mnist" ] || { echo "run_context_bench: $build/apps/train_mnist is missing" >&2; exit 1; }
log=$(mktemp)
trap 'rm -f "$log"' EXIT

settings=(one_context two_contexts two_contexts_naive pipeline_m1 pipeline_m4)
for repeat in $(seq 1 "$repeats"); do
  for model in $models; do
    for setting in "${settings[@]}"; do
      engine=device placement=(--contexts "cpu(0),cpu(1)")
      case $setting in
      one_context) placement=(--contexts "cpu(0)") ;;
      two_contexts_naive) engine=naive ;;
      pipeline_m1) placement=(--model-parallel "cpu(0),cpu(1)" --micro-batches 1) ;;
      pipeline_m4) placement=(--model-parallel "cpu(0),cpu(1)" --micro-batches 4) ;;
      esac
      out=$(TROUPE_ENGINE_TYPE=$engine timeout -k 10 "$run_timeout" "$build/apps/train_mnist" \
              --model "$model" "${placement[@]}" --kvstore device --threads 1 \
              --epochs "$epochs" --quiet 2>/dev/null | final_line || true)
      if [ -z "$out" ]; then
        echo "run_context_bench: repeat $repeat of $model $setting skipped: no result" >&2
        continue
      fi
      printf '%s\n' "$out" | awk -v model="$model" -v setting="$setting" -v repeat="$repeat" "$jsonl_awk"'
        {
          printf "{\"bench\":\"contexts\",\"model\":\"%s\",\"setting\":\"%s\",\"repeat\":%d," \
                 "\"samples_per_s\":%s,\"test_acc\":%s}\n", model, setting, repeat,
                 field($0, "samples_per_s"), field($0, "final_test_acc")
        }' | tee -a "$log"
    done
  done
done

echo
echo "# medians over $repeats repeats, $epochs epoch(s), batch 128 split over the contexts, --threads 1"
printf '%-6s %-20s %-14s %-10s %s\n' model setting samples_per_s test_acc vs_one_context
awk "$jsonl_awk"'
  {
    key = field($0, "model") " " field($0, "setting")
    if (!(key in seen)) { seen[key] = 1; order[++count] = key }
    rate[key] = rate[key] " " field($0, "samples_per_s"); acc[key] = acc[key] " " field($0, "test_acc")
  }
  END {
    for (i = 1; i <= count; i++) {
      split(order[i], parts, " ")
      one = median(rate[parts[1] " one_context"])
      ratio = (one > 0) ? median(rate[order[i]]) / one : 0
      printf "%-6s %-20s %-14.0f %-10.2f %.2f\n", parts[1], parts[2], median(rate[order[i]]),
             median(acc[order[i]]), ratio
    }
  }' "$log"
