#!/usr/bin/env bash
# What the job trace costs: the Fashion-MNIST dist_sync job (2 workers of batch 64, 1 server)
# without and with `troupe-launch --trace` (and --summary), back to back, REPEATS times. Each pair
# prints a JSON line with both samples/s (training loop, summed over workers), the ratio traced /
# plain, and the merged trace's spans and bytes; the last line gives the median ratio. On a shared
# 2-core machine only ratios of runs made back to back mean anything.
#
#   bench/run_trace_bench.sh [BUILD_DIR]
#   REPEATS=5 EPOCHS=1 bench/run_trace_bench.sh build
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/jsonl.sh
. bench/jsonl.sh
build=${1:-build}
repeats=${REPEATS:-5}
epochs=${EPOCHS:-1}
python=${PYTHON:-/usr/bin/python3}
run_timeout=${RUN_TIMEOUT:-300}
for exe in apps/train_mnist apps/troupe-launch apps/troupe-node; do
  [ -x "$build/$exe" ] || { echo "run_trace_bench: $build/$exe is missing" >&2; exit 1; }
done
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# run_job [launcher flags...]: the job's final JSON line.
run_job() {
  timeout -k 10 "$run_timeout" "$build/apps/troupe-launch" -n 2 -s 1 "$@" -- \
      "$build/apps/train_mnist" --model mlp --kvstore dist_sync --epochs "$epochs" --batch-size 64 \
      --lr 0.1 --init torch --seed 0 --threads 1 --no-progress 2>/dev/null | final_line
}

for repeat in $(seq 1 "$repeats"); do
  plain=$(run_job || true)
  rm -f "$work/trace.json"
  traced=$(run_job --trace "$work/trace.json" --summary || true)
  if [ -z "$plain" ] || [ -z "$traced" ] || [ ! -f "$work/trace.json" ]; then
    echo "run_trace_bench: repeat $repeat skipped: a run printed no result or no trace" >&2
    continue
  fi
  "$python" - "$repeat" "$plain" "$traced" "$work/trace.json" <<'EOF' | tee -a "$work/lines"
import json, os, sys
repeat, plain, traced, trace = sys.argv[1:]
p, t = json.loads(plain), json.loads(traced)
events = json.load(open(trace))["traceEvents"]
print(json.dumps({"bench": "trace_overhead", "repeat": int(repeat),
                  "plain_samples_per_s": p["samples_per_s"], "traced_samples_per_s": t["samples_per_s"],
                  "ratio": round(t["samples_per_s"] / p["samples_per_s"], 3),
                  "spans": sum(1 for e in events if e["ph"] == "b"),
                  "trace_bytes": os.path.getsize(trace)}))
EOF
done

"$python" - "$work/lines" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
print(json.dumps({"bench": "trace_overhead_median", "repeats": len(rows),
                  "median_ratio": round(statistics.median(r["ratio"] for r in rows), 3),
                  "median_plain_samples_per_s": statistics.median(r["plain_samples_per_s"] for r in rows),
                  "median_traced_samples_per_s": statistics.median(r["traced_samples_per_s"] for r in rows),
                  "spans": rows[-1]["spans"], "trace_bytes": rows[-1]["trace_bytes"]}))
EOF
