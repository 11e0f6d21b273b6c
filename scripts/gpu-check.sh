#!/usr/bin/env bash
# On a machine with an NVIDIA GPU: build with CUDA for sm_90, run the test suites (whose GPU cases
# run only when a device is present) and print a short table. Needs the packages of setup.sh;
# installs them when missing.
#   scripts/gpu-check.sh [BUILD_DIR]
set -uo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:-build-gpu}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null ||
  echo "gpu-check: nvidia-smi found no GPU"
scripts/setup.sh "$build_dir" -DTROUPE_ENABLE_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 || exit 1
cmake --build "$build_dir" -j "$(nproc)" || exit 1

printf '\n%-16s %-8s %s\n' suite result summary
status=0
for suite in kernels_tests engine_tests schema_tests config_tests logic_tests actors_tests kvstore_tests \
  gluon_tests; do
  exe=$(find "$build_dir/tests" -name "$suite" -type f -perm -u+x | head -n 1)
  log="$build_dir/$suite.gpu.log"
  if "$exe" --report_level=short --log_level=message >"$log" 2>&1; then result=pass; else result=FAIL; status=1; fi
  summary=$(grep -E "Test module .* (has passed|has failed)|test cases? (passed|failed|skipped)" "$log" | tr -s ' ' | head -n 2 | paste -sd ';')
  skipped=$(grep -c "no GPU\|skipped" "$log" || true)
  printf '%-16s %-8s %s (skip notes: %s)\n' "$suite" "$result" "$summary" "$skipped"
done
exit $status
