#!/usr/bin/env bash
# troupe as a program of one's own uses it: installed, found, built against and run.
#   tests/install_test.sh BUILD_DIR SOURCE_DIR CXX_COMPILER [COMPILER_LAUNCHER]
#
# Installs BUILD_DIR into a temporary prefix (cmake --install), configures examples/ in a fresh
# build directory against that prefix only (CMAKE_PREFIX_PATH, and troupe_DIR must come out inside
# it), builds every example, runs each and checks what it prints (kvstore_roundtrip also as a
# dist_sync job of the installed troupe-launch and troupe-node); then compiles kvstore_roundtrip
# with the line pkg-config gives for the installed troupe.pc and runs that too. The examples'
# includes resolve only through the prefix: the source tree is not on any include path.
set -euo pipefail

if [ $# -lt 3 ]; then
  echo "usage: $0 BUILD_DIR SOURCE_DIR CXX_COMPILER [COMPILER_LAUNCHER]" >&2
  exit 2
fi
build_dir=$(cd "$1" && pwd)
source_dir=$(cd "$2" && pwd)
cxx=$3
launcher=${4:-}

work=$(mktemp -d "${TMPDIR:-/tmp}/troupe-install-test.XXXXXX")
trap 'rm -rf "$work"' EXIT
prefix=$work/prefix
failures=0

fail() {
  echo "FAIL: $*"
  failures=$((failures + 1))
}

# run NAME PATTERN... -- COMMAND...: runs COMMAND in $work/run (60 s at most), then checks that it
# exited 0 and that its output has a line matching each extended regular expression PATTERN.
run() {
  local name=$1
  shift
  local patterns=()
  while [ "$1" != "--" ]; do
    patterns+=("$1")
    shift
  done
  shift
  local output status=0
  output=$(cd "$work/run" && timeout 60 "$@" 2>&1) || status=$?
  printf '%s\n' "$output" | sed "s/^/  $name| /"
  if [ "$status" -ne 0 ]; then
    fail "$name exited with $status"
    return
  fi
  local pattern
  for pattern in "${patterns[@]}"; do
    grep -qE -- "$pattern" <<<"$output" || fail "$name printed no line matching: $pattern"
  done
}

echo "== cmake --install $build_dir --prefix $prefix"
cmake --install "$build_dir" --prefix "$prefix" >"$work/install.log"
for installed in bin/troupe-node bin/troupe-launch lib/cmake/troupe/troupeConfig.cmake \
  lib/cmake/troupe/troupeConfigVersion.cmake lib/cmake/troupe/troupeTargets.cmake \
  lib/pkgconfig/troupe.pc include/troupe/actors/kvstore/kvstore.hpp \
  include/troupe/schema/troupe.capnp.h; do
  [ -e "$prefix/$installed" ] || fail "the install has no $installed"
done
# Tests, benchmarks and the other apps stay in the build tree.
unwanted=$(find "$prefix" -name '*_tests' -o -name 'kvbench' -o -name 'train_mnist' \
  -o -name 'kvstore_demo' -o -path '*/include/troupe/tests*' | head -5)
[ -z "$unwanted" ] || fail "the install holds what it should not: $unwanted"

echo "== examples/ against $prefix"
configure=(cmake -S "$source_dir/examples" -B "$work/build" -DCMAKE_PREFIX_PATH="$prefix"
  -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_BUILD_TYPE=Release)
[ -z "$launcher" ] || configure+=(-DCMAKE_CXX_COMPILER_LAUNCHER="$launcher")
if ! "${configure[@]}" >"$work/configure.log" 2>&1; then
  cat "$work/configure.log"
  fail "examples/ does not configure against the installed package"
  exit 1
fi
found=$(sed -n 's/^troupe_DIR:PATH=//p' "$work/build/CMakeCache.txt")
[ "$found" = "$prefix/lib/cmake/troupe" ] || fail "find_package(troupe) found $found, not the install"
if ! cmake --build "$work/build" -j 2 >"$work/build.log" 2>&1; then
  cat "$work/build.log"
  fail "the examples do not build against the installed package"
  exit 1
fi
if grep -q 'warning:' "$work/build.log"; then
  grep -B2 -A4 'warning:' "$work/build.log"
  fail "the examples build with warnings"
fi

mkdir -p "$work/run"
examples=$work/build
run kvstore_roundtrip \
  '^kvstore_roundtrip: local store, rank 0 of 1: pulled -0\.2 after one SGD step, expected -0\.2$' \
  '^kvstore_roundtrip: local store, rank 0: pulled rows 2 and 7 of 1000 at -0\.1 after a row_sparse push, expected -0\.1$' \
  '^kvstore_roundtrip: device store, rank 0: pulled -0\.05 after two 2bit pushes of 0\.3, expected -0\.05$' \
  '^kvstore_roundtrip: local store, rank 0: pulled 0\.999023 after ten float16 pushes of 1e-4 with multi_precision, expected 0\.999023$' \
  -- "$examples/kvstore_roundtrip"
run "kvstore_roundtrip under troupe-launch" \
  'kvstore_roundtrip: dist_sync store, rank 0 of 2: pulled -0\.4 after one SGD step, expected -0\.4$' \
  'kvstore_roundtrip: dist_sync store, rank 1 of 2: pulled -0\.4 after one SGD step, expected -0\.4$' \
  'kvstore_roundtrip: dist_sync store, rank 0: pulled rows 2 and 7 of 1000 at -0\.2 after a row_sparse push, expected -0\.2$' \
  'kvstore_roundtrip: dist_sync store, rank 0: pulled -0\.1 after two 2bit pushes of 0\.3, expected -0\.1$' \
  'kvstore_roundtrip: dist_sync store, rank 1: pulled -0\.1 after two 2bit pushes of 0\.3, expected -0\.1$' \
  'kvstore_roundtrip: dist_sync store, rank 0: pulled 0\.998047 after ten float16 pushes of 1e-4 with multi_precision, expected 0\.998047$' \
  'kvstore_roundtrip: dist_sync store, rank 1: pulled 0\.998047 after ten float16 pushes of 1e-4 with multi_precision, expected 0\.998047$' \
  -- "$prefix/bin/troupe-launch" -n 2 -s 1 -- "$examples/kvstore_roundtrip"
run train_with_trainer \
  '^train_with_trainer: epoch 1: training loss [0-9.]+, test accuracy [0-9.]+ %$' \
  '^train_with_trainer: epoch 5: training loss [0-9.]+, test accuracy (9[0-9]|100)\.[0-9] %$' \
  -- "$examples/train_with_trainer"
[ -s "$work/run/mlp.params" ] || fail "train_with_trainer wrote no mlp.params"
run sparse_embedding \
  '^sparse_embedding: rank 0 of 1, epoch 1: pushed [0-9]+ of 50000 rows per step, test accuracy [0-9.]+ %$' \
  '^sparse_embedding: rank 0 of 1, epoch 5: pushed [0-9]+ of 50000 rows per step, test accuracy (9[0-9]|100)\.[0-9] %$' \
  -- "$examples/sparse_embedding"
run "sparse_embedding --row-sparse-weight" \
  '^sparse_embedding: rank 0 of 1, epoch 5: pushed [0-9]+ of 50000 rows per step, test accuracy (9[0-9]|100)\.[0-9] %$' \
  -- "$examples/sparse_embedding" --row-sparse-weight
run "sparse_embedding under troupe-launch" \
  'sparse_embedding: rank 0 of 2, epoch 5: pushed [0-9]+ of 50000 rows per step, test accuracy (9[0-9]|100)\.[0-9] %$' \
  'sparse_embedding: rank 1 of 2, epoch 5: pushed [0-9]+ of 50000 rows per step, test accuracy (9[0-9]|100)\.[0-9] %$' \
  -- "$prefix/bin/troupe-launch" -n 2 -s 1 -- "$examples/sparse_embedding" --row-sparse-weight
run embed_actors \
  '^embed_actors: 2 pushed gradients summed on the server: 3 in every element$' \
  "^embed_actors: [0-9]+ actors running in the host's actor system$" \
  -- "$examples/embed_actors"
run device_actors \
  "^device_actors: y\[0\] = 392 \(784 ones times 0\.5\), computed on cpu\(1\)'s device actor$" \
  '^device_actors: the int32 input failed at the wait: .*FullyConnected on cpu\(1\): ' \
  -- "$examples/device_actors"
run pipeline_stages \
  '^pipeline_stages: 2 stages on cpu\(0\), cpu\(1\), batches of 64 in 4 micro-batches$' \
  '^pipeline_stages: loss [0-9.]+ at step 1, [0-9.]+ at step 200$' \
  -- "$examples/pipeline_stages"

echo "== pkg-config troupe"
if ! flags=$(PKG_CONFIG_PATH="$prefix/lib/pkgconfig" pkg-config --cflags --libs troupe); then
  fail "pkg-config --cflags --libs troupe fails for the install"
else
  echo "  $flags"
  case $flags in
    *"$prefix/"*) ;;
    *) fail "pkg-config's line names nothing of the install" ;;
  esac
  # shellcheck disable=SC2086 # the flags are words
  if ! ${launcher:+"$launcher"} "$cxx" -std=c++20 -o "$work/kvstore_roundtrip_pc" \
    "$source_dir/examples/kvstore_roundtrip.cpp" $flags >"$work/pkg-config.log" 2>&1; then
    cat "$work/pkg-config.log"
    fail "kvstore_roundtrip does not build with pkg-config's line"
  else
    run "kvstore_roundtrip (pkg-config)" \
      '^kvstore_roundtrip: local store, rank 0 of 1: pulled -0\.2 after one SGD step, expected -0\.2$' \
      -- "$work/kvstore_roundtrip_pc"
  fi
fi

if [ "$failures" -ne 0 ]; then
  echo "install test: $failures failure(s)"
  exit 1
fi
echo "install test: the installed package builds and runs every example, with CMake and pkg-config"
