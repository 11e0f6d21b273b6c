#!/usr/bin/env bash
# The GPU check, on a machine with an NVIDIA GPU: builds troupe with CUDA for sm_90 (or takes the
# binaries of a bundle that scripts/gpu-bundle.sh made on a machine with troupe's packages, for a
# GPU machine without them), runs the test suites whose GPU cases run only where a device is
# present, the GPU benchmark (sum of N and optimizer bandwidth beside a device-to-device copy of
# the same run, cuBLAS GEMM TFLOP/s) and train_mnist on gpu(0) for the MLP and LeNet, with the
# pipeline's speed-up over two GPU contexts (two streams of one GPU when there is one:
# TROUPE_GPU_CONTEXTS=2), and prints a short table last. Logs and JSON lines go to $OUT (the device
# tool's folder) or BUILD_DIR/gpu-check. Bounded to about 8 minutes on an H200 (each step has a
# timeout); a build adds its own time.
#
#   scripts/gpu-check.sh [BUILD_DIR]        build in BUILD_DIR (default build-gpu), then check
#   scripts/gpu-check.sh --bundle ARCHIVE   check with the binaries of a gpu-bundle.sh archive
#   DATA_DIR=/path EPOCHS=1 scripts/gpu-check.sh ...
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/jsonl.sh
. bench/jsonl.sh

bundle=
build_dir=build-gpu
if [ "${1:-}" = --bundle ]; then
  archive=${2:?"--bundle needs an archive made by scripts/gpu-bundle.sh"}
  bundle=$(mktemp -d)
  trap 'rm -rf "$bundle"' EXIT
  tar -C "$bundle" -xJf "$archive" || exit 1
  # CUDA's libraries come from the machine: its toolkit, or the wheels PyTorch brought.
  cuda_libs=$(find /usr/local/cuda/lib64 /usr/local/cuda/lib -maxdepth 0 -type d 2>/dev/null | paste -sd ':' -)
  wheel_libs=$(python3 -c 'import glob, os, nvidia
print(":".join(sorted(glob.glob(os.path.join(list(nvidia.__path__)[0], "*", "lib")))))' 2>/dev/null)
  export LD_LIBRARY_PATH="$bundle/lib:$cuda_libs:$wheel_libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  [ -d "$bundle/data" ] && : "${DATA_DIR:=$bundle/data}"
else
  build_dir=${1:-build-gpu}
fi
out=${OUT:-$build_dir/gpu-check}
mkdir -p "$out"
data_dir=${DATA_DIR:-/usr/share/datasets/fashion-mnist}
epochs=${EPOCHS:-1}
table=$out/table.txt
: >"$table"
row() { printf '%-44s %s\n' "$1" "$2" | tee -a "$table"; }

echo "gpu-check: $(date -u +%FT%TZ), $(git rev-parse --short HEAD 2>/dev/null || echo 'no git')"
gpu=$(nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null |
  head -n 1)
have_gpu=yes
[ -n "$gpu" ] || { gpu="none (nvidia-smi found no GPU: the GPU cases skip)"; have_gpu=; }

if [ -z "$bundle" ]; then
  scripts/setup.sh "$build_dir" -DTROUPE_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo || exit 1
  cmake --build "$build_dir" -j "$(nproc)" --target kernels_tests engine_tests logic_tests gpu_bench \
    train_mnist >"$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; exit 1; }
fi
program() { # the path of a binary by name, in the bundle or the build
  if [ -n "$bundle" ]; then echo "$bundle/bin/$1"; else find "$build_dir" -name "$1" -type f -perm -u+x | head -n 1; fi
}

status=0
row "GPU" "$gpu"

# --- tests: the suites whose GPU cases skip without a device -----------------------------------
for suite in kernels_tests engine_tests logic_tests; do
  log=$out/$suite.log
  if timeout -k 10 240 "$(program "$suite")" --report_level=short --log_level=test_suite \
    >"$log" 2>&1; then result=pass; else result=FAIL; status=1; fi
  skipped=$(grep -c "is skipped because" "$log" || true)
  counts=$(grep -oE "[0-9]+ test cases? (out of [0-9]+ )?(passed|failed|skipped)" "$log" |
    paste -sd ',' -)
  row "$suite" "$result: $counts; suites skipped: $skipped"
done

# --- kernels against the copy -------------------------------------------------------------------
bench=$out/gpu_bench.jsonl
timeout -k 10 180 "$(program gpu_bench)" --megabytes 256 --repeats 20 >"$bench" 2>"$out/gpu_bench.err" ||
  status=1
awk "$jsonl_awk"'
  field($0, "skipped") != "" { printf "%-44s skipped: %s\n", "gpu_bench", field($0, "skipped"); next }
  field($0, "gb_per_s") != "" {
    name = field($0, "kernel"); if (field($0, "inputs") != "") name = name " of " field($0, "inputs")
    printf "%-44s %.0f GB/s (%.2fx the copy)\n", name, field($0, "gb_per_s"), field($0, "ratio_to_copy") + 0
  }
  field($0, "tflop_per_s") != "" {
    printf "%-44s %.1f TFLOP/s\n", field($0, "kernel"), field($0, "tflop_per_s")
  }' "$bench" | tee -a "$table"

# --- training on the GPU ------------------------------------------------------------------------
train() { # label, then train_mnist flags: one row with samples/s and the test accuracy
  local label=$1 log
  shift
  log=$out/train-$(echo "$label" | tr -c 'a-zA-Z0-9\n' '-').log
  if timeout -k 10 150 "$(program train_mnist)" --data-dir "$data_dir" --epochs "$epochs" \
    --no-progress "$@" >"$log" 2>&1; then
    final_line <"$log" | awk -v label="$label" "$jsonl_awk"'
      { printf "%-44s %.0f samples/s, test accuracy %.2f%%\n", label,
               field($0, "samples_per_s"), field($0, "final_test_acc") }' | tee -a "$table"
  else
    row "$label" "FAILED (see $log)"
    status=1
  fi
}
if [ -z "$have_gpu" ]; then
  row "train_mnist" "skipped: no GPU"
elif [ -d "$data_dir" ]; then
  for model in mlp lenet; do
    train "train_mnist $model gpu(0)" --model "$model" --contexts "gpu(0)"
  done
  for m in 1 4; do
    TROUPE_GPU_CONTEXTS=2 train "pipeline lenet gpu(0),gpu(1) m=$m" --model lenet \
      --model-parallel "gpu(0),gpu(1)" --micro-batches "$m"
  done
else
  row "train_mnist" "skipped: no Fashion-MNIST at $data_dir (set DATA_DIR)"
fi

echo
echo "== gpu-check summary ($(date -u +%FT%TZ)) =="
cat "$table"
exit $status
