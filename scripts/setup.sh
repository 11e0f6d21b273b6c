#!/usr/bin/env bash
# Installs what troupe needs from Debian 12 (as root, with apt-get) and configures a build.
#   scripts/setup.sh [BUILD_DIR] [extra cmake arguments...]
#   TROUPE_SETUP_ALL=1 scripts/setup.sh ...   also the packages of the tests and the Python module
# Safe to run again: it installs only what is missing and reconfigures in place.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${1:-build}
shift || true

packages=(
  g++ make cmake git pkg-config
  libcaf-dev libssl-dev          # C++ Actor Framework 0.17 (core, io, openssl)
  openssl                        # the openssl command: scripts/make-tls-certs.sh, the TLS tests
  capnproto libcapnp-dev         # wire protocol
  libfmt-dev libboost-test-dev
  libboost-dev                   # Boost's headers: wire::tensor_shape (a container::small_vector)
  libopenblas-dev                # CPU GEMM
  zlib1g-dev                     # gzip for the IDX data files
  libcli11-dev                   # command-line flags of the apps
  libtomlplusplus-dev            # toml++ 3.3: the cluster config file (actors/config/config.cpp)
  libspdlog-dev                  # the logging facility (engine/log.hpp)
  nlohmann-json3-dev             # JSON lines of the apps and benchmarks
  dataset-fashion-mnist          # the data the main job trains on
  rsync                          # troupe-launch --sync-dst-dir
)
# The tests' and the Python module's: not needed to build and run the main job (scripts/build.sh).
if [ "${TROUPE_SETUP_ALL:-0}" = 1 ]; then
  packages+=(
    clang libclang-rt-14-dev     # libFuzzer for the fuzz targets (scripts/fuzz.sh)
    python3-yaml                 # the test of troupe-launch --emit k8s parses its YAML
    iproute2                     # the two-hosts test's network namespaces (ip netns)
    python3-dev pybind11-dev     # the Python module (python/, docs/python.md)
    python3-numpy python3-torch  # its tests and the PyTorch example (examples/python/)
    python3-venv                 # pip install . into a venv (docs/python.md)
  )
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" -eq 0 ] || sudo_cmd=(sudo)
  export DEBIAN_FRONTEND=noninteractive
  "${sudo_cmd[@]}" apt-get update -q
  "${sudo_cmd[@]}" apt-get install -y -q --no-install-recommends "${missing[@]}"
fi

cmake -S . -B "$build_dir" "$@" >/dev/null
echo "setup: configured $build_dir"
