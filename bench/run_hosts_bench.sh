#!/usr/bin/env bash
# troupe across hosts with rate-limited links, each figure beside its baseline of the same run:
# hosts are network namespaces made by scripts/netns-cluster.sh, every host's link limited to
# RATE in both directions (docs/scaling.md explains the figures and models them).
#
#   bench/run_hosts_bench.sh [BUILD_DIR]
#   RATES="1gbit 10gbit" PARTS="link allreduce" REPEATS=5 bench/run_hosts_bench.sh build
#
# Parts (PARTS, default all of them):
#   calibrate  once, without a rate limit: the CPU time one byte across a link costs the machine
#              (docs/scaling.md's c_net), and the 4 KiB round trip of a socket, of the KVStore
#              and of gloo's all_reduce over 4 hosts.
#   link       two hosts: the raw TCP stream between them (bench/tcp_baseline --serve-on/--connect)
#              beside kvbench push, pull and pushpull of 16 and 128 MiB with the server on one host
#              and the worker on the other (W=1 S=1); ratio = kvbench GB/s / raw GB/s.
#   allreduce  4 worker hosts: one key of ALLREDUCE_BYTES (80 MiB) pushed, pulled and pushpulled
#              by every worker (kvbench, W=4) with 4 servers on hosts of their own, and with a
#              server on each worker host; beside gloo's all_reduce of the same bytes over the
#              same 4 worker hosts (bench/gloo_allreduce.py, Debian's python3-torch). Then the
#              pushpull alone (servers apart) for each data.slice_bytes of SLICES at the default
#              window and each data.send_window_bytes of WINDOWS at the default slice (SLICES,
#              WINDOWS: tc-style sizes as the flags take them, "0" = none; default: empty).
#   train      the jobs of docs/scaling.md: train_mnist dist_sync over 4 worker hosts, servers on
#              4 hosts of their own and on the worker hosts, beside PyTorch DDP/gloo over the
#              same worker hosts (and Apache MXNet 1.9.1's dist_sync when MXNET_PYTHON names a
#              python with mxnet: python3 -m venv V && V/bin/pip install mxnet==1.9.1
#              'numpy<1.24', then MXNET_PYTHON=V/bin/python), MODELS (default "mlp-wide mlp") for TRAIN_STEPS steps each
#              (30) of a batch of 64 per worker, lr 0.1, PyTorch's initialisation, one thread
#              per process; and each system's compute alone (one process, no network) for the
#              same steps, the "one process" rows.
#   step       mlp-wide's step against its parts (issue 24: step <= 1.15x max(compute, comm)):
#              the compute-only step, train_mnist --kvstore local with the job's per-worker batch
#              on one host alone and on the 4 worker hosts at once (what the job's 4 workers
#              compute on this machine's shared cores); the communication-only step, kvbench
#              pushpull of mlp-wide's keys with their shapes, one request per key in the
#              Trainer's order and priorities (--key-elements), servers apart and beside
#              workers; and the job itself (dist_sync) in both layouts.
#   compression  issue 26: the train part's troupe job (servers apart) for each of MODELS dense
#              and with train_mnist --gradient-compression 2bit and 1bit (threshold 0.5), rows
#              "troupe", "troupe-2bit", "troupe-1bit" of the train table.
# EXTRA_TOML: more lines for the jobs' cluster file, e.g. EXTRA_TOML='[data]\nshm_arena_bytes = 0'.
# RESULTS: keep the JSON lines in this file.
# Every line carries "load1", the machine's 1-minute load average when it was written; the
# training and step rows also "wall_s", "machine_cpu_s" (the whole machine's busy CPU-seconds
# over the run, /proc/stat) and "job_cpu_s" (the CPU-seconds of the run's own processes), so that
# what other work took from the cores stays visible beside each figure.
# Output: one JSON line per measurement, each with "rate" and "part", then a table of ratios.
# Needs root (network namespaces); exits 77 with the reason otherwise.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
build=$(cd "${1:-build}" && pwd)
rates=${RATES:-1gbit 10gbit}
parts=${PARTS:-calibrate link allreduce train step}
repeats=${REPEATS:-5}
allreduce_bytes=${ALLREDUCE_BYTES:-83886080}
models=${MODELS:-mlp-wide mlp}
train_steps=${TRAIN_STEPS:-30}
slices=${SLICES:-}
windows=${WINDOWS:-}
# mlp-wide's parameters (784-4096-4096-10) in gluon's order, the Trainer's key order: element
# counts of weight and bias of each layer.
mlp_wide_keys=3211264,4096,16777216,4096,40960,10
cluster_script=$PWD/scripts/netns-cluster.sh
mxnet_python=${MXNET_PYTHON:-}
[ -n "$mxnet_python" ] || echo "run_hosts_bench: MXNET_PYTHON is not set: no MXNet rows" >&2
for exe in bench/tcp_baseline bench/kvbench apps/troupe-launch apps/troupe-node apps/train_mnist; do
  [ -x "$build/$exe" ] || { echo "run_hosts_bench: $build/$exe is missing" >&2; exit 1; }
done
[ "$(id -u)" -eq 0 ] || { echo "run_hosts_bench: skipped: network namespaces need root"; exit 77; }

name=hb$(printf '%05d' $(($$ % 100000)))
work=$(mktemp -d)
log=$work/results.jsonl
cleanup() {
  "$cluster_script" down --name "$name" >/dev/null 2>&1
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# up RATE HOSTS: a fresh cluster (RATE "unlimited": no token bucket); sets `state` and `addr`.
up() {
  "$cluster_script" down --name "$name" >/dev/null 2>&1
  local limit=(--rate "$1")
  [ "$1" != unlimited ] || limit=()
  state=$("$cluster_script" up --name "$name" --hosts "$2" "${limit[@]}") || exit 1
  mapfile -t addr < "$state/hosts"
}
on() { # on HOST COMMAND...: COMMAND on host HOST
  local host=$1
  shift
  ip netns exec "troupe-$name-$host" "$@"
}
# emit PART RATE [FIELDS]: stdin's JSON lines tagged with the part, the rate and FIELDS (more
# "name":value pairs, comma-separated) and the 1-minute load average as each line arrives
# ("load1"), into the log and stdout.
emit() {
  sed -e 's/^\[worker [0-9]*\] //' -e "s/^{/{\"part\":\"$1\",\"rate\":\"$2\",${3:+$3,}/" |
    awk '/^\{.*\}$/ { getline load < "/proc/loadavg"; close("/proc/loadavg"); split(load, l, " ")
                      sub(/\}$/, ",\"load1\":" l[1] "}") } { print; fflush() }' |
    tee -a "$log"
}
# busy_seconds: the CPU-seconds the whole machine has been busy since boot (/proc/stat's cpu line
# less idle and iowait, as bench/machine_cpu.hpp reads it).
busy_seconds() {
  awk -v hz="$(getconf CLK_TCK)" '$1 == "cpu" { print ($2 + $3 + $4 + $7 + $8 + $9) / hz; exit }' /proc/stat
}
# costed COMMAND...: runs COMMAND (its stdout passes through) and then writes to $work/cost the
# fields "wall_s", "machine_cpu_s" and "job_cpu_s" (the user and system time of COMMAND and the
# descendants it waited for: every process of a job started by troupe-launch or by this script).
costed() {
  local busy_before busy_after wall user sys rc TIMEFORMAT='%R %U %S'
  busy_before=$(busy_seconds)
  { time "$@"; } 2> "$work/costed.err"
  rc=$?
  busy_after=$(busy_seconds)
  head -n -1 "$work/costed.err" >&2
  read -r wall user sys < <(tail -n 1 "$work/costed.err")
  awk -v w="$wall" -v u="$user" -v s="$sys" -v b0="$busy_before" -v b1="$busy_after" 'BEGIN {
    printf "\"wall_s\":%.2f,\"machine_cpu_s\":%.2f,\"job_cpu_s\":%.2f", w, b1 - b0, u + s }' \
    > "$work/cost"
  return "$rc"
}
# raw_stream RATE FROM TO SIZES: tcp_baseline from host FROM to host TO.
raw_stream() {
  local rate=$1 from=$2 to=$3 sizes=$4 out=$work/serve.out port
  on "$to" "$build/bench/tcp_baseline" --serve-on "${addr[to]}" --sizes "$sizes" > "$out" 2>&1 &
  local server=$!
  for _ in $(seq 300); do grep -q listening "$out" && break; sleep 0.1; done
  port=$(sed -n 's/{"listening":\([0-9]*\)}/\1/p' "$out")
  [ -n "$port" ] || { echo "run_hosts_bench: tcp_baseline did not listen: $(cat "$out")" >&2; exit 1; }
  on "$from" timeout 600 "$build/bench/tcp_baseline" --connect "${addr[to]}" --port "$port" \
    --sizes "$sizes" --repeats "$repeats" | grep '"tcp_baseline"' | emit "$5" "$rate"
  wait "$server"
}
# launch HOSTS_FILE_HOSTS W S -- PROGRAM...: troupe-launch on host 0 (the scheduler's host) with
# a hostfile of the given host numbers; servers then workers take them round-robin.
launch() {
  local hostnums=$1 workers=$2 servers=$3
  shift 4
  : > "$work/hostfile"
  for h in $hostnums; do echo "${addr[h]}" >> "$work/hostfile"; done
  printf '[scheduler]\nhost = "%s"\n%b\n' "${addr[0]}" "${EXTRA_TOML:-}" > "$work/cluster.toml"
  (cd "$work" && PATH=$state/bin:$PATH on 0 timeout -k 10 1200 "$build/apps/troupe-launch" \
    -n "$workers" -s "$servers" -H hostfile --config cluster.toml \
    --node-binary "$build/apps/troupe-node" -- "$@")
}

# What a byte across a link costs the machine's cores, for each system, and a small message's
# fixed cost: without a rate limit, the machine's busy CPU-seconds over the measured repetitions
# (machine_cpu_s, bench/machine_cpu.hpp: both ends and the kernel's work of both sides) of the raw
# stream and of kvbench (W=1 S=1) between two hosts and of gloo's all_reduce over four; then 4 KiB
# round trips of a socket, the KVStore and gloo's all_reduce.
part_calibrate() {
  up unlimited 4
  echo "{\"bench\":\"machine\",\"cores\":$(nproc)}" | emit calibrate unlimited
  repeats=15 raw_stream unlimited 1 0 134217728 calibrate
  raw_stream unlimited 1 0 4096 calibrate
  launch "0 1" 1 1 -- "$build/bench/kvbench" --sizes 4096,134217728 --keys 1 --repeats 10 |
    grep '"bench":"kvbench"' | emit calibrate unlimited
  allreduce_bytes=4096 gloo_reps=100 gloo unlimited calibrate '"layout":"ring"' 0 1 2 3
  gloo_reps=10 gloo unlimited calibrate '"layout":"ring"' 0 1 2 3
}

part_link() {
  local rate=$1 sizes=16777216,134217728
  up "$rate" 2
  raw_stream "$rate" 1 0 "$sizes" link
  # Hostfile host 0 then 1: the server on host 0, the worker on host 1.
  launch "0 1" 1 1 -- "$build/bench/kvbench" --sizes "$sizes" --keys 1 --repeats "$repeats" |
    grep '"bench":"kvbench"' | emit link "$rate"
}

# gloo RATE PART FIELDS HOSTS...: bench/gloo_allreduce.py over HOSTS (rank 0 on the first), the
# line of rank 0.
gloo() {
  local rate=$1 part=$2 fields=$3
  shift 3
  local hosts=("$@") pids=() rank
  for rank in "${!hosts[@]}"; do
    on "${hosts[rank]}" timeout -k 10 600 /usr/bin/python3 bench/gloo_allreduce.py --rank "$rank" \
      --world "${#hosts[@]}" --master-addr "${addr[hosts[0]]}" --master-port 29500 \
      --ifname eth0 --bytes "$allreduce_bytes" --reps "${gloo_reps:-$repeats}" > "$work/gloo-$rank.out" 2>&1 &
    pids+=($!)
  done
  for pid in "${pids[@]}"; do wait "$pid" || { echo "run_hosts_bench: gloo failed:" >&2; cat "$work"/gloo-*.out >&2; }; done
  grep '"gloo_allreduce"' "$work/gloo-0.out" | emit "$part" "$rate" "$fields"
}

# Host 0 holds the scheduler (troupe-launch runs there), hosts 1-4 the workers, 5-8 the servers
# of the layout "servers apart"; "servers beside workers" puts server i on worker host i + 1.
part_allreduce() {
  local rate=$1
  up "$rate" 9
  launch "5 6 7 8 1 2 3 4" 4 4 -- "$build/bench/kvbench" --sizes "$allreduce_bytes" --keys 1 \
    --repeats "$repeats" | grep '"bench":"kvbench"' | emit allreduce "$rate" '"layout":"servers apart"'
  launch "1 2 3 4" 4 4 -- "$build/bench/kvbench" --sizes "$allreduce_bytes" --keys 1 \
    --repeats "$repeats" | grep '"bench":"kvbench"' | emit allreduce "$rate" '"layout":"servers beside workers"'
  gloo "$rate" allreduce '"layout":"ring"' 1 2 3 4
  # The pushpull alone for each slice size (at the default window), then each window (at the
  # default slice size): which of them serves this rate best.
  local size
  for size in $slices; do
    launch "5 6 7 8 1 2 3 4" 4 4 -- "$build/bench/kvbench" --sizes "$allreduce_bytes" --keys 1 \
      --ops pushpull --repeats "$repeats" --slice-bytes "$size" | grep '"bench":"kvbench"' |
      emit allreduce "$rate" "\"layout\":\"servers apart\",\"slice_bytes\":\"$size\""
  done
  for size in $windows; do
    launch "5 6 7 8 1 2 3 4" 4 4 -- "$build/bench/kvbench" --sizes "$allreduce_bytes" --keys 1 \
      --ops pushpull --repeats "$repeats" --send-window-bytes "$size" | grep '"bench":"kvbench"' |
      emit allreduce "$rate" "\"layout\":\"servers apart\",\"send_window_bytes\":\"$size\""
  done
}

# record SYSTEM LAYOUT WORKERS SERVERS MODEL STEPS: a run's final JSON line (stdin) as a train row:
# samples/s of the whole job (each system's final line counts the samples of every worker) and the
# test accuracy (percent) after the run's steps.
record() {
  /usr/bin/python3 -c '
import json, sys
system, layout, workers, servers, model, steps = sys.argv[1:7]
workers, servers, steps = int(workers), int(servers), int(steps)
lines = [l[l.index("{"):] for l in sys.stdin if "{" in l]
final = [json.loads(l) for l in lines if "final_test_acc" in l]
if not final:
    sys.exit(f"run_hosts_bench: {system} ({layout}) printed no final line")
f = final[-1]
rate = f["samples_per_s"]
acc = f["final_test_acc"]
print(json.dumps({"bench": "train", "system": system, "layout": layout, "model": model,
                  "workers": workers, "servers": servers, "batch": 64,
                  "steps": steps, "samples_per_s": rate, "test_acc": round(acc, 2)}))
' "$@"
}

# ddp MODEL STEPS: PyTorch DDP/gloo, one rank on each worker host (1-4); rank r's output in
# $work/ddp-r.out.
ddp() {
  local pids=() r
  for r in 0 1 2 3; do
    on $((r + 1)) timeout -k 10 900 /usr/bin/python3 bench/pytorch_ddp_mnist.py --rank "$r" \
      --world 4 --master-addr "${addr[1]}" --master-port 29501 --ifname eth0 --model "$1" \
      --epochs 1 --steps "$2" --batch-size 64 --lr 0.1 --threads 1 > "$work/ddp-$r.out" 2>&1 &
    pids+=($!)
  done
  for r in "${pids[@]}"; do wait "$r"; done
}

part_train() {
  local rate=$1 model steps=$train_steps
  up "$rate" 9
  local common=(--batch-size 64 --lr 0.1 --threads 1)
  for model in $models; do
    local troupe=("$build/apps/train_mnist" --model "$model" --init torch --epochs 1
      --max-batches "$steps" --quiet "${common[@]}")
    # Compute alone, one process on one host: the "compute-only step" of docs/scaling.md.
    on 0 "${troupe[@]}" --kvstore local | record troupe-local "one process" 1 0 "$model" "$steps" | emit train "$rate"
    on 0 /usr/bin/python3 bench/pytorch_mnist.py --model "$model" --epochs 1 --steps "$steps" \
      "${common[@]}" | record pytorch-local "one process" 1 0 "$model" "$steps" | emit train "$rate"
    costed launch "5 6 7 8 1 2 3 4" 4 4 -- "${troupe[@]}" --kvstore dist_sync > "$work/job.out"
    record troupe "servers apart" 4 4 "$model" "$steps" < "$work/job.out" |
      emit train "$rate" "$(cat "$work/cost")"
    costed launch "1 2 3 4" 4 4 -- "${troupe[@]}" --kvstore dist_sync > "$work/job.out"
    record troupe "servers beside workers" 4 4 "$model" "$steps" < "$work/job.out" |
      emit train "$rate" "$(cat "$work/cost")"
    # The small MLP's 0.8 MB first-layer weight lies below MXNet's bigarray bound, whole on one
    # server: the same job with the bound lowered so that it is split over all servers.
    if [ "$model" = mlp ]; then
      EXTRA_TOML="[data]\nbigarray_bound = 100000" launch "5 6 7 8 1 2 3 4" 4 4 -- "${troupe[@]}" \
        --kvstore dist_sync | record troupe "servers apart" 4 4 "$model" "$steps" |
        emit train "$rate" '"bigarray_bound":100000'
      EXTRA_TOML="[data]\nbigarray_bound = 100000" launch "1 2 3 4" 4 4 -- "${troupe[@]}" \
        --kvstore dist_sync | record troupe "servers beside workers" 4 4 "$model" "$steps" |
        emit train "$rate" '"bigarray_bound":100000'
    fi
    costed ddp "$model" "$steps"
    record pytorch-ddp ring 4 0 "$model" "$steps" < "$work/ddp-0.out" |
      emit train "$rate" "$(cat "$work/cost")"
    [ -n "$mxnet_python" ] && part_train_mxnet "$rate" "$model" "$steps"
  done
}

# locals STEPS HOSTS...: train_mnist mlp-wide --kvstore local on each of HOSTS at once, STEPS
# steps each; host h's output in $work/local-h.out.
locals() {
  local steps=$1 pids=() h
  shift
  for h in "$@"; do
    on "$h" "$build/apps/train_mnist" --model mlp-wide --init torch --epochs 1 --max-batches "$steps" \
      --quiet --batch-size 64 --lr 0.1 --threads 1 --kvstore local > "$work/local-$h.out" &
    pids+=($!)
  done
  for h in "${pids[@]}"; do wait "$h"; done
}

# mlp-wide's step and its two parts, each measured alone (issue 24's target at 10 Gbit/s: the
# job's step at most 1.15x the longer part). Step rows: "what" compute, communication or job,
# "step_ms" one step of one worker.
part_step() {
  local rate=$1 steps=$train_steps layout hosts h
  up "$rate" 9
  local troupe=("$build/apps/train_mnist" --model mlp-wide --init torch --epochs 1
    --max-batches "$steps" --quiet --batch-size 64 --lr 0.1 --threads 1)
  # Compute alone: one process on one host, then one on each of the 4 worker hosts at once (the
  # job's workers share this machine's cores in the same way). Step time from each process's
  # samples/s (its own samples over its training loop).
  for hosts in "1" "1 2 3 4"; do
    read -r -a h <<<"$hosts"
    costed locals "$steps" "${h[@]}"
    cat "$work"/local-*.out | step_rows compute "one process on each of ${#h[@]} hosts" "${#h[@]}" |
      emit step "$rate" "$(cat "$work/cost")"
    rm -f "$work"/local-*.out
  done
  for layout in "servers apart" "servers beside workers"; do
    hosts="1 2 3 4"
    [ "$layout" = "servers apart" ] && hosts="5 6 7 8 1 2 3 4"
    # Communication alone: the model's keys pushpulled as the Trainer issues them.
    costed launch "$hosts" 4 4 -- "$build/bench/kvbench" --key-elements "$mlp_wide_keys" \
      --ops pushpull --repeats "$steps" > "$work/job.out"
    grep '"bench":"kvbench"' "$work/job.out" | step_rows communication "$layout" 4 |
      emit step "$rate" "$(cat "$work/cost")"
    costed launch "$hosts" 4 4 -- "${troupe[@]}" --kvstore dist_sync > "$work/job.out"
    step_rows job "$layout" 4 < "$work/job.out" | emit step "$rate" "$(cat "$work/cost")"
  done
}

# step_rows WHAT LAYOUT WORKERS: the step row of stdin's final lines (train_mnist's, one per
# process for compute, the job's for job) or kvbench's pushpull line (communication).
step_rows() {
  /usr/bin/python3 -c '
import json, statistics, sys
what, layout, workers = sys.argv[1], sys.argv[2], int(sys.argv[3])
lines = [json.loads(l[l.index("{"):]) for l in sys.stdin if "{" in l]
row = {"bench": "step", "what": what, "layout": layout, "model": "mlp-wide", "workers": workers,
       "batch": 64}
if what == "communication":
    pushpull = [l for l in lines if l.get("op") == "pushpull"]
    if not pushpull:
        sys.exit("run_hosts_bench: kvbench printed no pushpull line")
    row["step_ms"] = pushpull[-1]["median_ms"]
    row["kvbench_machine_cpu_s"] = pushpull[-1].get("machine_cpu_s")
else:
    final = [l for l in lines if "final_test_acc" in l]
    if len(final) < (workers if what == "compute" else 1):
        sys.exit(f"run_hosts_bench: {what} ({layout}) printed {len(final)} final lines")
    # Compute: each process its own samples; the job: the samples of all its workers.
    per_step = [64 * (1 if what == "compute" else workers) / f["samples_per_s"] for f in final]
    row["step_ms"] = round(1e3 * statistics.median(per_step), 1)
    row["test_acc"] = round(final[-1]["final_test_acc"], 2)
print(json.dumps(row))
' "$@"
}

# Apache MXNet 1.9.1's dist_sync in the layout "servers apart": the scheduler on host 0, servers
# on hosts 5-8, workers on 1-4, each started with its DMLC_* variables (bench/mxnet_mnist.py).
part_train_mxnet() {
  local rate=$1 model=$2 steps=$3 pids=() h i
  local dmlc=(--root-uri "${addr[0]}" --root-port 29600 --num-workers 4 --num-servers 4 --interface eth0)
  on 0 "$mxnet_python" bench/mxnet_mnist.py --role scheduler --node-host "${addr[0]}" "${dmlc[@]}" \
    > "$work/mx-scheduler.out" 2>&1 &
  pids+=($!)
  for i in 0 1 2 3; do
    h=$((i + 5))
    on "$h" "$mxnet_python" bench/mxnet_mnist.py --role server --node-host "${addr[h]}" "${dmlc[@]}" \
      > "$work/mx-server-$i.out" 2>&1 &
    pids+=($!)
  done
  for i in 0 1 2 3; do
    h=$((i + 1))
    on "$h" timeout -k 10 900 "$mxnet_python" bench/mxnet_mnist.py --role worker --node-host "${addr[h]}" \
      "${dmlc[@]}" --kvstore dist_sync --model "$model" --init torch --epochs 1 --steps "$steps" \
      --batch-size 64 --lr 0.1 --threads 1 > "$work/mx-worker-$i.out" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i"; done
  cat "$work"/mx-worker-*.out | record mxnet "servers apart" 4 4 "$model" "$steps" | emit train "$rate"
  on 0 "$mxnet_python" bench/mxnet_mnist.py --model "$model" --init torch --epochs 1 --steps "$steps" \
    --batch-size 64 --lr 0.1 --threads 1 | record mxnet-local "one process" 1 0 "$model" "$steps" |
    emit train "$rate"
}

part_compression() {
  local rate=$1 model steps=$train_steps rule
  up "$rate" 9
  for model in $models; do
    local troupe=("$build/apps/train_mnist" --model "$model" --init torch --epochs 1
      --max-batches "$steps" --quiet --batch-size 64 --lr 0.1 --threads 1 --kvstore dist_sync)
    for rule in none 2bit 1bit; do
      costed launch "5 6 7 8 1 2 3 4" 4 4 -- "${troupe[@]}" --gradient-compression "$rule" \
        > "$work/job.out"
      local system=troupe
      [ "$rule" = none ] || system=troupe-$rule
      record "$system" "servers apart" 4 4 "$model" "$steps" < "$work/job.out" |
        emit train "$rate" "$(cat "$work/cost")"
    done
  done
}

case " $parts " in *" calibrate "*) part_calibrate ;; esac
for rate in $rates; do
  for part in $parts; do
    case "$part" in
      link) part_link "$rate" ;;
      calibrate) ;;
      allreduce) part_allreduce "$rate" ;;
      train) part_train "$rate" ;;
      step) part_step "$rate" ;;
      compression) part_compression "$rate" ;;
      *) echo "run_hosts_bench: unknown part $part" >&2; exit 2 ;;
    esac
  done
done
"$cluster_script" down --name "$name" >/dev/null 2>&1
if [ -n "${RESULTS:-}" ]; then
  cp "$log" "$RESULTS"
  echo "# the JSON lines are in $RESULTS (python3 bench/scale_model.py $RESULTS checks the model)"
fi
/usr/bin/python3 bench/hosts_table.py "$log"
