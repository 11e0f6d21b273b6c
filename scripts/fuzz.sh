#!/usr/bin/env bash
# Builds the libFuzzer targets of tests/fuzz with clang (ASan and UBSan on every troupe library)
# and runs each one from the committed corpus for a share of the time given; prints one line per
# target and exits 1 on any finding, whose input is kept under BUILD_DIR/findings. The committed
# corpus is only read: what the run finds goes to a temporary directory.
#
#   scripts/fuzz.sh                         60 s in all (the test suite's run)
#   scripts/fuzz.sh --seconds 3600          the longer run (docs/RELIABILITY.md)
#   scripts/fuzz.sh --build-dir DIR         where to build (default build-fuzz)
#   scripts/fuzz.sh --seeds                 rewrite the well-formed seeds (fuzz_seeds) and exit
#
# Exits 77 (a skip, for CTest) when there is no clang++ with libFuzzer.
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=60 build_dir=build-fuzz seeds_only=0
while [ $# -gt 0 ]; do
  case $1 in
  --seconds) seconds=$2; shift 2 ;;
  --build-dir) build_dir=$2; shift 2 ;;
  --seeds) seeds_only=1; shift ;;
  *) echo "fuzz.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
targets=(fuzz_frames fuzz_link_hello fuzz_tls fuzz_config)

if ! command -v clang++ > /dev/null || ! echo 'extern "C" int LLVMFuzzerTestOneInput(const char*, unsigned long) { return 0; }' |
    clang++ -x c++ -fsanitize=fuzzer -o /dev/null - 2> /dev/null; then
  echo "fuzz.sh: skipped: no clang++ with libFuzzer (Debian: clang libclang-rt-14-dev)" >&2
  exit 77
fi

if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  echo "fuzz.sh: configuring $build_dir (clang, libFuzzer, ASan, UBSan)"
  mkdir -p "$build_dir"
  cmake -S . -B "$build_dir" -DCMAKE_C_COMPILER=clang -DCMAKE_CXX_COMPILER=clang++ \
    -DTROUPE_FUZZ=ON -DTROUPE_BUILD_TESTS=OFF -DTROUPE_ENABLE_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo > "$build_dir/configure.log" 2>&1 ||
    { cat "$build_dir/configure.log" >&2; exit 1; }
fi
echo "fuzz.sh: building ${targets[*]} in $build_dir"
cmake --build "$build_dir" -j "$(nproc)" --target "${targets[@]}" fuzz_seeds > /dev/null

if [ "$seeds_only" = 1 ]; then
  "$build_dir/tests/fuzz/fuzz_seeds" tests/fuzz/corpus
  echo "fuzz.sh: wrote the well-formed seeds under tests/fuzz/corpus"
  exit 0
fi

export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
mkdir -p "$build_dir/findings"
# fuzz_tls needs the certificates of a job: made here, as a user would, by the project's script.
scripts/make-tls-certs.sh "$work/certs" > "$work/make-tls-certs.log" 2>&1 ||
  { cat "$work/make-tls-certs.log" >&2; exit 1; }
export TROUPE_FUZZ_TLS_CERTS="$work/certs"
share=$(( seconds / ${#targets[@]} ))
[ "$share" -ge 1 ] || share=1
failed=0
printf '%-16s %10s %8s %8s %s\n' target runs seconds new findings
for target in "${targets[@]}"; do
  mkdir -p "$work/$target"
  log="$work/$target.log"
  status=0
  "$build_dir/tests/fuzz/$target" -max_total_time="$share" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$work/$target-" "$work/$target" \
    "tests/fuzz/corpus/$target" > "$log" 2>&1 || status=$?
  runs=$(awk -F: '/stat::number_of_executed_units/ {gsub(/ /, "", $NF); print $NF}' "$log")
  new=$(awk -F: '/stat::new_units_added/ {gsub(/ /, "", $NF); print $NF}' "$log")
  findings=0
  for artifact in "$work/$target"-*; do
    [ -e "$artifact" ] || continue
    findings=$((findings + 1))
    cp "$artifact" "$build_dir/findings/"
  done
  if [ "$status" -ne 0 ] || [ "$findings" -ne 0 ]; then
    failed=1
    [ "$findings" -ne 0 ] || findings="exit $status"
    tail -40 "$log" >&2
  fi
  printf '%-16s %10s %8s %8s %s\n' "$target" "${runs:-?}" "$share" "${new:-?}" "$findings"
done
[ "$failed" = 0 ] || { echo "fuzz.sh: findings kept in $build_dir/findings" >&2; exit 1; }
