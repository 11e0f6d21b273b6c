#!/usr/bin/env bash
# The Fashion-MNIST job against its PyTorch baselines, back to back, REPEATS times:
#
#   local: build/apps/train_mnist --model mlp --kvstore local --threads 1 (batch 128)
#          vs bench/pytorch_mnist.py --threads 1
#   dist:  troupe-launch -n 2 -s 1 -- train_mnist --kvstore dist_sync --batch-size 64
#          (step batch 128) vs bench/pytorch_ddp_mnist.py (2 processes, gloo, batch 64 each)
#   torch: troupe-launch -n 2 -s 1 -- bench/troupe_torch_mnist.py (PyTorch through troupe.torch's
#          DistributedOptimizer, batch 64 each; needs the Python module, -DTROUPE_PYTHON=ON) vs
#          the same DDP run
#
# Both sides train BENCHMARKS.md's recipe (MLP 784-256-10 ReLU, SGD lr 0.1, no momentum, global
# batch 128, last partial batch dropped) for EPOCHS epochs with one compute thread per process.
# Each pair prints a JSON line with both samples/s (training loop only, summed over workers) and
# final test accuracies and the ratio troupe / PyTorch; the last lines give the median ratio per
# setting. On a shared 2-core machine only ratios of runs made back to back mean anything.
# MODEL=mlp-wide trains issue 23's 784-4096-4096-10 (20M parameters) on both sides instead;
# STEPS=N caps every epoch at N steps per worker (train_mnist --max-batches, the scripts' --steps).
#
#   bench/run_train_bench.sh [BUILD_DIR]
#   REPEATS=3 EPOCHS=1 SETTINGS="local dist" SEED=0 bench/run_train_bench.sh build
#   SETTINGS=torch REPEATS=3 bench/run_train_bench.sh build
#   MODEL=mlp-wide STEPS=50 REPEATS=3 bench/run_train_bench.sh build
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=bench/jsonl.sh
. bench/jsonl.sh
build=${1:-build}
repeats=${REPEATS:-3}
epochs=${EPOCHS:-1}
settings=${SETTINGS:-local dist}
seed=${SEED:-0}
model=${MODEL:-mlp}
steps=${STEPS:-0}
python=${PYTHON:-/usr/bin/python3}
# Every run is bounded: a run that hangs (seen once with the DDP baseline, its gloo rendezvous never
# completing) is killed and its repeat skipped with a message, instead of stalling the benchmark.
run_timeout=${RUN_TIMEOUT:-300}
needed="apps/troupe-launch apps/troupe-node"
case " $settings " in *" local "* | *" dist "*) needed="apps/train_mnist $needed" ;; esac
for exe in $needed; do
  [ -x "$build/$exe" ] || { echo "run_train_bench: $build/$exe is missing" >&2; exit 1; }
done
case " $settings " in
  *" torch "*) [ -e "$build/python/troupe/__init__.py" ] ||
    { echo "run_train_bench: $build/python/troupe is missing (-DTROUPE_PYTHON=ON)" >&2; exit 1; } ;;
esac
log=$(mktemp)
trap 'rm -f "$log"' EXIT

# The final JSON line of a run (a launcher prefix such as "[worker 0] " removed).

run_troupe_local() {
  timeout -k 10 "$run_timeout" "$build/apps/train_mnist" --model "$model" --kvstore local --epochs "$epochs" --batch-size 128 \
      --lr 0.1 --init torch --seed "$seed" --threads 1 --max-batches "$steps" --no-progress | final_line
}
run_torch_local() {
  timeout -k 10 "$run_timeout" "$python" bench/pytorch_mnist.py --model "$model" --epochs "$epochs" --seed "$seed" \
      --threads 1 --steps "$steps" | final_line
}
run_troupe_dist() {
  timeout -k 10 "$run_timeout" "$build/apps/troupe-launch" -n 2 -s 1 -- "$build/apps/train_mnist" --model "$model" \
      --kvstore dist_sync --epochs "$epochs" --batch-size 64 --lr 0.1 --init torch --seed "$seed" \
      --threads 1 --max-batches "$steps" --no-progress | final_line
}
run_troupe_torch() {
  PYTHONPATH="$build/python" timeout -k 10 "$run_timeout" "$build/apps/troupe-launch" -n 2 -s 1 -- \
      "$python" bench/troupe_torch_mnist.py --model "$model" --epochs "$epochs" --seed "$seed" \
      --threads 1 --steps "$steps" | final_line
}
run_torch_torch() { run_torch_dist; }
run_torch_dist() {
  timeout -k 10 "$run_timeout" "$python" bench/pytorch_ddp_mnist.py --model "$model" --epochs "$epochs" --seed "$seed" \
      --threads 1 --steps "$steps" | final_line
}

for repeat in $(seq 1 "$repeats"); do
  for setting in $settings; do
    troupe=$("run_troupe_$setting" || true)
    torch=$("run_torch_$setting" || true)
    if [ -z "$troupe" ] || [ -z "$torch" ]; then
      echo "run_train_bench: repeat $repeat of $setting skipped: a run printed no result" \
           "(failed or exceeded RUN_TIMEOUT=${run_timeout}s)" >&2
      continue
    fi
    "$python" - "$setting" "$repeat" "$epochs" "$troupe" "$torch" <<'EOF' | tee -a "$log"
import json, sys
setting, repeat, epochs, troupe, torch = sys.argv[1:]
t, p = json.loads(troupe), json.loads(torch)
print(json.dumps({"bench": "train_mnist_vs_pytorch", "setting": setting, "repeat": int(repeat),
                  "model": t["model"], "epochs": int(epochs), "steps": p["steps"],
                  "troupe_samples_per_s": t["samples_per_s"], "torch_samples_per_s": p["samples_per_s"],
                  "ratio": round(t["samples_per_s"] / p["samples_per_s"], 3),
                  "troupe_test_acc": t["final_test_acc"], "torch_test_acc": p["final_test_acc"]}))
EOF
  done
done

"$python" - "$log" <<'EOF'
import json, statistics, sys
rows = [json.loads(line) for line in open(sys.argv[1])]
for setting in dict.fromkeys(r["setting"] for r in rows):
    mine = [r for r in rows if r["setting"] == setting]
    med = lambda key: statistics.median(r[key] for r in mine)
    print(json.dumps({"bench": "train_mnist_vs_pytorch_median", "setting": setting,
                      "repeats": len(mine), "median_ratio": round(med("ratio"), 3),
                      "median_troupe_samples_per_s": med("troupe_samples_per_s"),
                      "median_torch_samples_per_s": med("torch_samples_per_s"),
                      "median_troupe_test_acc": med("troupe_test_acc"),
                      "median_torch_test_acc": med("torch_test_acc")}))
EOF
