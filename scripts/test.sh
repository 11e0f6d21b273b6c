#!/usr/bin/env bash
# Sets up, builds and runs every test.
#   scripts/test.sh              the normal build (CUDA when nvcc is present), in build/
#   scripts/test.sh --sanitize   AddressSanitizer + UBSan, CPU only, in build-asan/
set -euo pipefail
cd "$(dirname "$0")/.."

jobs=$(nproc)
if [ "${1:-}" = "--sanitize" ]; then
  build_dir=build-asan
  # The Python module stays out: a sanitized extension cannot load into an uninstrumented python.
  TROUPE_SETUP_ALL=1 scripts/setup.sh "$build_dir" -DTROUPE_SANITIZE=ON -DTROUPE_ENABLE_CUDA=OFF \
    -DTROUPE_PYTHON=OFF -DCMAKE_BUILD_TYPE=Debug
  # allocator_may_return_null: troupe turns a failed allocation into an error reply, and tests
  # exercise that with allocations no machine can serve, which ASan would otherwise abort on.
  export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1:strict_string_checks=1:allocator_may_return_null=1
  export LSAN_OPTIONS=suppressions=$PWD/tests/lsan.supp:print_suppressions=0
  export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
else
  build_dir=build
  # ON: a build folder that scripts/build.sh configured before pybind11-dev was installed
  # remembers the module as off.
  TROUPE_SETUP_ALL=1 scripts/setup.sh "$build_dir" -DTROUPE_PYTHON=ON
fi
cmake --build "$build_dir" -j "$jobs"
ctest --test-dir "$build_dir" --output-on-failure -j "$jobs"
