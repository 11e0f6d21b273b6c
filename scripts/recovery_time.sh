#!/usr/bin/env bash
# Measures how long a dist_sync job waits for a server that is SIGKILLed and restarted with
# --recover: from the kill to the first round whose pulls are answered again, which includes the
# new process's start, reading and checking its checkpoint, restoring it, rejoining the job, and
# the workers' resent pushes. One server of one shard holding one key of MEGABYTES (float32),
# one worker, a checkpoint every round; the worker pulls every round (kv_worker --check recover
# --round-log). Prints one line; exits 1 when the job does not finish.
#
#   scripts/recovery_time.sh                      100 MB, from ./build
#   scripts/recovery_time.sh --megabytes 10 --build-dir DIR
set -euo pipefail
cd "$(dirname "$0")/.."

megabytes=100 build_dir=build
while [ $# -gt 0 ]; do
  case $1 in
  --megabytes) megabytes=$2; shift 2 ;;
  --build-dir) build_dir=$2; shift 2 ;;
  *) echo "recovery_time.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
node=$build_dir/apps/troupe-node
worker=$build_dir/tests/cluster/troupe_kv_worker
side=$((megabytes * 1024 * 1024 / 4))
side=$(awk -v n="$side" 'BEGIN { printf "%d", sqrt(n) }')

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -9 "$pid" 2> /dev/null || true; done
  [ -n "${KEEP:-}" ] || rm -rf "$work"
}
trap cleanup EXIT

port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
common=(--server-rejoin 60s --checkpoint-every-rounds 1 --timeout 120s)
export DMLC_PS_ROOT_URI=127.0.0.1 DMLC_PS_ROOT_PORT=$port DMLC_NUM_WORKER=1 DMLC_NUM_SERVER=1
export DMLC_NODE_HOST=127.0.0.1
server_flags=(--checkpoint-dir "$work/checkpoints" --shards 1 --rank-hint 0)

DMLC_ROLE=scheduler "$node" "${common[@]}" > "$work/scheduler.out" 2>&1 &
pids+=($!)
DMLC_ROLE=server "$node" "${common[@]}" "${server_flags[@]}" > "$work/server.out" 2>&1 &
server=$!
pids+=("$server")
DMLC_ROLE=worker "$worker" "${common[@]}" --check recover --rounds 12 --round-ms 300 --round-log \
  --shapes "${side}x${side}" > "$work/worker.out" 2> "$work/worker.err" &
worker_pid=$!
pids+=("$worker_pid")

# Some rounds in (and so some checkpoints written), then the kill.
for _ in $(seq 600); do
  grep -q '^round 3 pulled' "$work/worker.out" 2> /dev/null && break
  sleep 0.1
done
grep -q '^round 3 pulled' "$work/worker.out" || { echo "recovery_time.sh: the job did not reach round 3" >&2; cat "$work/worker.err" >&2; exit 1; }
kill -9 "$server"
killed=$(date +%s.%N)
DMLC_ROLE=server "$node" "${common[@]}" "${server_flags[@]}" --recover > "$work/recovered.out" 2>&1 &
pids+=($!)
if ! wait "$worker_pid"; then
  echo "recovery_time.sh: the worker failed" >&2
  cat "$work/worker.err" "$work/recovered.out" >&2
  exit 1
fi
awk -v killed="$killed" -v mb="$megabytes" '
  $1 == "round" && $5 + 0 > killed + 0 && !done {
    printf "recovery of a %d MB shard: %.2f s from the kill to round %d pulled again\n", mb, $5 - killed, $2
    done = 1
  }' "$work/worker.out"
