#!/usr/bin/env bash
# troupe.torch in a dist_sync job: tests/python/torch_worker.py under troupe-launch with 2 workers
# and 1 server (each worker asserts; see its docstring).
#   tests/python/torch_test.sh BUILD_DIR SOURCE_DIR PYTHON
#
# Passes when the job exits 0 and both workers print "torch_worker R of 2: ok". Exits 77
# (skipped) when PYTHON lacks PyTorch.
set -euo pipefail

if [ $# -ne 3 ]; then
  echo "usage: $0 BUILD_DIR SOURCE_DIR PYTHON" >&2
  exit 2
fi
build_dir=$(cd "$1" && pwd)
source_dir=$(cd "$2" && pwd)
python=$3

if ! "$python" -c 'import numpy, torch' 2>/dev/null; then
  echo "SKIP: $python cannot import numpy and torch (python3-numpy, python3-torch)"
  exit 77
fi

output=$(mktemp "${TMPDIR:-/tmp}/troupe-python-torch.XXXXXX")
trap 'rm -f "$output"' EXIT
status=0
# The launcher stops every node it started when it is stopped itself.
PYTHONPATH="$build_dir/python" timeout --signal=TERM --kill-after=10 150 \
  "$build_dir/apps/troupe-launch" -n 2 -s 1 -- "$python" "$source_dir/tests/python/torch_worker.py" \
  >"$output" 2>&1 || status=$?
cat "$output"

if [ "$status" -ne 0 ]; then
  echo "torch_test: the job exited with $status"
  exit 1
fi
for rank in 0 1; do
  if ! grep -q "^\[worker $rank\] torch_worker $rank of 2: ok$" "$output"; then
    echo "torch_test: worker $rank did not print 'torch_worker $rank of 2: ok'"
    exit 1
  fi
done
echo "torch_test: both workers ok"
