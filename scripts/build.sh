#!/usr/bin/env bash
# Installs what is missing, configures, and builds what the README's main job needs: troupe-node,
# troupe-launch and train_mnist. The tests build with scripts/test.sh, in the same build folder.
#   scripts/build.sh [BUILD_DIR] [extra cmake arguments...]    (BUILD_DIR: build)
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${1:-build}
scripts/setup.sh "$@"
# Measured from an empty build folder without ccache on a 2-core machine: 5 min (CPU only), 11 min
# with the CUDA kernels while another build shared the machine (8.5 min of CPU time).
echo "build: building troupe-node, troupe-launch and train_mnist in $build_dir (the first time" \
  "about 5 minutes on 2 cores, 10 with the CUDA kernels; the tests build with scripts/test.sh)"
cmake --build "$build_dir" -j "$(nproc)" --target troupe-node troupe-launch train_mnist
