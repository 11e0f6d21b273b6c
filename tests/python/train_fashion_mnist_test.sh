#!/usr/bin/env bash
# The Python example trains as the C++ job does: examples/python/train_fashion_mnist.py under
# troupe-launch, 2 workers and 1 server, dist_sync, batch 64, one epoch.
#   tests/python/train_fashion_mnist_test.sh BUILD_DIR SOURCE_DIR PYTHON [MIN_ACCURACY]
#
# Passes when the job exits 0, rank 0's epoch line shows a test accuracy of at least
# MIN_ACCURACY (0.78 by default; the C++ job reaches 0.82 after one epoch), and both workers
# print the same digest of their final parameters (dist_sync: every worker pulls the same
# values). Exits 77 (skipped) when PYTHON lacks NumPy or PyTorch, or the data set is missing.
set -euo pipefail

if [ $# -lt 3 ]; then
  echo "usage: $0 BUILD_DIR SOURCE_DIR PYTHON [MIN_ACCURACY]" >&2
  exit 2
fi
build_dir=$(cd "$1" && pwd)
source_dir=$(cd "$2" && pwd)
python=$3
min_accuracy=${4:-0.78}
data_dir=/usr/share/datasets/fashion-mnist

if ! "$python" -c 'import numpy, torch' 2>/dev/null; then
  echo "SKIP: $python cannot import numpy and torch (python3-numpy, python3-torch)"
  exit 77
fi
if [ ! -e "$data_dir/train-images-idx3-ubyte.gz" ]; then
  echo "SKIP: no Fashion-MNIST in $data_dir (dataset-fashion-mnist)"
  exit 77
fi

output=$(mktemp "${TMPDIR:-/tmp}/troupe-python-train.XXXXXX")
trap 'rm -f "$output"' EXIT
status=0
# The launcher stops every node it started when it is stopped itself.
PYTHONPATH="$build_dir/python" timeout --signal=TERM --kill-after=10 150 \
  "$build_dir/apps/troupe-launch" -n 2 -s 1 -- \
  "$python" "$source_dir/examples/python/train_fashion_mnist.py" --epochs 1 --batch-size 64 \
  >"$output" 2>&1 || status=$?
cat "$output"

failures=0
fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}
[ "$status" -eq 0 ] || fail "the job exited with $status"

accuracy=$(sed -nE 's/^\[worker 0\] epoch 1: .* test_acc ([0-9.]+) .*/\1/p' "$output")
if [ -z "$accuracy" ]; then
  fail "worker 0 printed no line 'epoch 1: ... test_acc A ...'"
elif ! awk -v a="$accuracy" -v m="$min_accuracy" 'BEGIN { exit !(a >= m) }'; then
  fail "test accuracy $accuracy after one epoch is below $min_accuracy"
fi

digests=()
for rank in 0 1; do
  digest=$(sed -nE "s/^\[worker $rank\] worker $rank of 2: final test_acc [0-9.]+, parameters sha256 ([0-9a-f]{64})$/\1/p" "$output")
  [ -n "$digest" ] || fail "worker $rank printed no digest of its final parameters"
  digests+=("$digest")
done
if [ -n "${digests[0]}" ] && [ "${digests[0]}" != "${digests[1]}" ]; then
  fail "the workers end with different parameters: ${digests[0]} and ${digests[1]}"
fi

if [ "$failures" -ne 0 ]; then
  echo "train_fashion_mnist_test: $failures failure(s)"
  exit 1
fi
echo "train_fashion_mnist_test: test accuracy $accuracy after one epoch (floor $min_accuracy), equal parameters on both workers"
