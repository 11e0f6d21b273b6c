#!/usr/bin/env bash
# One table: troupe's KVStore beside every baseline a user would hold it against, measured back to
# back on this machine, one worker and one server, pushpull (push then pull where a system has no
# pushpull). Rows per size:
#   troupe shm   troupe-launch -n 1 -s 1 -- kvbench (the default: same-host tensors through the
#                shared-memory arena)
#   troupe tcp   the same with data.shm_arena_bytes = 0: every byte through the socket, as between
#                hosts
#   MXNet        Apache MXNet 1.9.1's dist_sync KVStore (bench/mxnet_kvbench.py) when MXNET_PYTHON
#                names a python that has it (python3 -m venv mx && mx/bin/pip install mxnet==1.9.1
#                'numpy<1.24'); skipped with a message otherwise
#   raw TCP      bench/tcp_baseline: a ping-pong echoing the size (below 64 KiB) whose ends poll
#                their sockets 50 µs before they block (--spin-us 50: an idle machine's blocking
#                ping-pong swings between 14 and 50 µs, bench/run_latency_bench.sh), else twice the
#                size at the one-way stream's rate (a pushpull moves it both ways)
#   memcpy       bench/cpu_kernel_bench: twice the size at one core's memcpy rate, the floor of a
#                same-host pushpull (one copy in, one out; from 1 MiB up)
#   gloo         PyTorch's all_reduce over 2 processes (bench/gloo_allreduce.py, Debian's
#                python3-torch; skipped when /usr/bin/python3 has no torch): what DDP pays
# and the many-keys rows: the same bytes as KEYS keys of 4 KiB against one key (troupe, MXNet).
#
#   bench/compare.sh [BUILD_DIR]
#   SIZES="4096 16777216 134217728" MANY_KEYS="1000 10000" REPEATS=20 \
#     MXNET_PYTHON=mx/bin/python RESULTS=compare.jsonl bench/compare.sh build
#
# Output: the JSON lines, each with "row" (RESULTS=FILE keeps them), then a markdown table of
# medians and ratios (bench/compare_table.py). On a shared machine only ratios of one run mean
# anything: every row of a size is measured within a minute of the others.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# shellcheck source=bench/jsonl.sh
. bench/jsonl.sh
build=${1:-build}
sizes=${SIZES:-4096 16777216 134217728}
many_keys=${MANY_KEYS:-1000 10000}
repeats=${REPEATS:-20}
mxnet_python=${MXNET_PYTHON:-}
need_executables compare "$build" bench/tcp_baseline bench/kvbench bench/cpu_kernel_bench \
  apps/troupe-launch apps/troupe-node
log=$(mktemp)
trap 'rm -f "$log"' EXIT

tag() { sed -n -e 's/^\[worker 0\] //' -e "s/^{/{\"row\":\"$1\",/p" | tee -a "$log"; }
kvbench() { # ROW KVBENCH-FLAGS...: one troupe job of one worker and one server
  local row=$1
  shift
  timeout -k 10 600 "$build/apps/troupe-launch" -n 1 -s 1 -- "$build/bench/kvbench" --ops pushpull \
    --repeats "$repeats" "$@" 2>/dev/null | grep '"bench":"kvbench"' | tag "$row"
}
mxnet() { # MXNET-FLAGS...
  [ -n "$mxnet_python" ] || return 0
  timeout -k 10 600 "$mxnet_python" bench/mxnet_kvbench.py --launch-local -n 1 -s 1 \
    --ops pushpull --repeats "$repeats" "$@" 2>/dev/null | grep '"bench": "mxnet_kvbench"' |
    sed 's/": /":/g; s/, "/,"/g' | tag mxnet
}
if [ -z "$mxnet_python" ]; then
  echo "compare: MXNET_PYTHON is not set: no MXNet rows" >&2
elif ! "$mxnet_python" -c 'import mxnet' 2>/dev/null; then
  echo "compare: $mxnet_python cannot import mxnet: no MXNet rows" >&2
  mxnet_python=
fi
have_torch=yes
/usr/bin/python3 -c 'import torch.distributed' 2>/dev/null ||
  { echo "compare: /usr/bin/python3 has no torch: no gloo rows" >&2; have_torch=; }

for size in $sizes; do
  if [ "$size" -lt 65536 ]; then
    "$build/bench/tcp_baseline" --pingpong --spin-us 50 --sizes "$size" \
      --repeats $((repeats * 100)) | tag raw-tcp
  else
    "$build/bench/tcp_baseline" --sizes "$size" --repeats "$repeats" | tag raw-tcp
  fi
  if [ "$size" -ge 1048576 ]; then
    "$build/bench/cpu_kernel_bench" --kernels memcpy --megabytes $((size >> 20)) \
      --repeats "$repeats" | sed "s/^{/{\"size\":$size,/" | tag memcpy
  fi
  kvbench troupe-shm --sizes "$size" --keys 1
  kvbench troupe-tcp --sizes "$size" --keys 1 --shm-arena-bytes 0
  mxnet --sizes "$size" --keys 1
  [ -n "$have_torch" ] && /usr/bin/python3 bench/gloo_allreduce.py --world 2 --bytes "$size" \
    --reps "$repeats" 2>/dev/null | tag gloo
done
for keys in $many_keys; do
  bytes=$((keys * 4096))
  kvbench troupe-shm --sizes "$bytes" --keys 1 "$keys"
  mxnet --sizes "$bytes" --keys "1,$keys"
done
if [ -n "${RESULTS:-}" ]; then
  cp "$log" "$RESULTS"
  echo "# the JSON lines are in $RESULTS"
fi
/usr/bin/python3 bench/compare_table.py "$log"
