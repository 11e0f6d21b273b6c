#!/usr/bin/env bash
# Packs what scripts/gpu-check.sh runs into one archive, for a GPU machine that lacks troupe's
# Debian packages (and cannot install them): the binaries of a CUDA build (stripped) and the
# shared libraries they load, except the C library's own and CUDA's (which the GPU machine has,
# and cuBLAS alone is over 500 MB). Optionally the Fashion-MNIST files, for the training rows.
#
#   scripts/gpu-bundle.sh BUILD_DIR ARCHIVE [--with-data]
#   scripts/gpu-bundle.sh build gpu-bundle.tar.xz --with-data
# then, on the GPU machine: scripts/gpu-check.sh --bundle gpu-bundle.tar.xz
# BUILD_DIR must be a CUDA build for the GPU's architecture (CMake's default here is sm_90).
set -euo pipefail
cd "$(dirname "$0")/.."
build_dir=${1:?"usage: scripts/gpu-bundle.sh BUILD_DIR ARCHIVE [--with-data]"}
archive=${2:?"usage: scripts/gpu-bundle.sh BUILD_DIR ARCHIVE [--with-data]"}
with_data=${3:-}
grep -q '^TROUPE_ENABLE_CUDA:STRING=\(ON\|AUTO\)' "$build_dir/CMakeCache.txt" ||
  { echo "gpu-bundle: $build_dir is not a CUDA build" >&2; exit 1; }

programs=(kernels_tests engine_tests logic_tests gpu_bench train_mnist)
cmake --build "$build_dir" -j "$(nproc)" --target "${programs[@]}" >/dev/null
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$stage/bin" "$stage/lib"
for name in "${programs[@]}"; do
  path=$(find "$build_dir" -name "$name" -type f -perm -u+x | head -n 1)
  [ -n "$path" ] || { echo "gpu-bundle: $name was not built" >&2; exit 1; }
  strip -o "$stage/bin/$name" "$path"
  # The libraries it loads, but not the C library's, the loader or CUDA's own.
  ldd "$path" | awk '$3 ~ /^\// { print $3 }' |
    grep -vE '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*)\.so|/usr/local/cuda|/libcu(da|blas)' |
    while read -r library; do cp -Lu "$library" "$stage/lib/"; done
done
if [ "$with_data" = --with-data ]; then
  mkdir -p "$stage/data"
  cp /usr/share/datasets/fashion-mnist/*.gz "$stage/data/"
fi
tar -C "$stage" -cJf "$archive" .
echo "gpu-bundle: $archive, $(du -h "$archive" | cut -f1): ${programs[*]} and $(find "$stage/lib" -type f | wc -l) libraries"
