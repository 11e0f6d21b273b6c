#!/usr/bin/env bash
# A worker host lost mid-job: three hosts (scripts/netns-cluster.sh), the scheduler and servers 0-1
# on host 0, workers 0 and 2 on host 1, workers 1 and 3 on host 2, all pushing and pulling until a
# call fails (kv_worker --check hang, dist_sync, no quorum). Once every worker has initialised its
# keys, every troupe process on host 1 (its two workers) is killed with SIGKILL, twice over:
#
# - killed: only that. The remote side of each ssh session sees its program die and ends, so the
#   launcher learns at once: it stops the job naming a worker of host 1 (exit 137).
# - vanished: as a host that loses power. Host 1's link goes down first and its ssh sessions
#   freeze (SIGSTOP: a real ssh client to a dead host neither ends nor hears anything), so nothing
#   tells anyone: the scheduler must declare a worker of host 1 lost after the peer timeout (5 s;
#   it says how long it heard nothing, which must be at least that), and the job fails on its own:
#   the first node the launcher sees fail is one of the survivors, not host 1's.
#
# Either way troupe-launch exits non-zero within 60 s of the kill (nothing hangs), and no process
# of the job remains on any host.
#   tests/hosts/lost_worker_host_test.sh BUILD_DIR
# Exit 77 (skipped, with the reason) where network namespaces cannot be made.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
hosts_setup lost_worker_host_test "${1:-}" tests/cluster/troupe_kv_worker
hosts_cluster k 3 -- "$@"

# lose_host_1 VARIANT: starts the job, waits until every worker has initialised its keys, then
# loses host 1 (VARIANT "killed": its troupe processes are killed; "vanished": its link goes down,
# its ssh sessions freeze, as a real ssh client to a host that lost power would, and its troupe
# processes are killed), waits for the launcher and checks that it failed in time, and that
# nothing is left. Sets err (the launcher's stderr) and took (seconds from the kill to its exit).
lose_host_1() {
  local variant=$1 pid exe rank
  out=$work/$variant.out
  err=$work/$variant.err
  hosts_outputs+=("$out" "$err")
  rm -rf "$work/pids"
  mkdir "$work/pids"
  hosts_launch "$out" "$err" 0 0 1 2 1 2 -- -n 4 -s 2 --env "KV_WORKER_DIR=$work/pids" -- \
    "$kv_worker" --check hang --shapes 2x3,1211x1211 &
  local launcher=$!
  # Each worker writes its pid once its keys are initialised: the job is under way.
  for _ in $(seq 1200); do
    [ "$(ls "$work/pids" | wc -l)" -ge 4 ] && break
    kill -0 "$launcher" 2>/dev/null || break
    sleep 0.1
  done
  [ "$(ls "$work/pids" | wc -l)" -ge 4 ] ||
    hosts_fail "$variant: the 4 workers did not all start within 120 s ($(ls "$work/pids" | tr '\n' ' '))"

  # Every troupe process on host 1 (the programs the launcher started there), and the shells
  # around them, which stand for the ssh sessions.
  local victims=() sessions=()
  for pid in $(ip netns pids "${hosts_ns[1]}"); do
    exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
    case "$exe" in
      "$kv_worker" | "$node") victims+=("$pid") ;;
      *) sessions+=("$pid") ;;
    esac
  done
  [ "${#victims[@]}" -eq 2 ] ||
    hosts_fail "$variant: ${#victims[@]} troupe processes on host 1, not 2 workers"
  for rank in 0 2; do
    printf '%s\n' "${victims[@]}" | grep -qx "$(cat "$work/pids/rank-$rank")" ||
      hosts_fail "$variant: worker $rank (pid $(cat "$work/pids/rank-$rank")) is not on host 1"
  done
  if [ "$variant" = vanished ]; then
    ip -n "${hosts_ns[1]}" link set eth0 down
    kill -STOP "${sessions[@]}"
  fi
  local killed_at=$SECONDS
  kill -KILL "${victims[@]}"

  local status=0
  wait "$launcher" || status=$?
  took=$((SECONDS - killed_at))
  [ "$status" -ne 124 ] || hosts_fail "$variant: troupe-launch hung (ended by its bound of 150 s)"
  [ "$status" -ne 0 ] || hosts_fail "$variant: troupe-launch exited 0 after a worker host was lost"
  [ "$took" -le 60 ] ||
    hosts_fail "$variant: troupe-launch took $took s after the kill to exit, more than 60 s"
  hosts_check_nothing_runs
  echo "lost_worker_host_test: $variant: troupe-launch exited $status $took s after the kill"
}

lose_host_1 killed
grep -Eq "troupe-launch: worker [02] exited with code 137; stopping the job" "$err" ||
  hosts_fail "killed: troupe-launch did not stop the job naming a worker of host 1"

lose_host_1 vanished
# The scheduler declared a worker of host 1 lost for its silence.
lost=$(grep -E "^\[scheduler\].* worker [02] \(node [0-9]+\) was lost: nothing heard from it for [0-9]+ms \(peer timeout 5s\)" "$err" | head -n 1)
[ -n "$lost" ] || hosts_fail "vanished: the scheduler did not declare a worker of host 1 lost after the peer timeout"
[[ "$lost" =~ nothing\ heard\ from\ it\ for\ ([0-9]+)ms ]] && [ "${BASH_REMATCH[1]}" -ge 5000 ] ||
  hosts_fail "vanished: a worker was declared lost before the peer timeout: $lost"
# The job failed on its own: the first exit the launcher saw is a survivor's, with an error.
first=$(grep -E "troupe-launch: .* exited with code [0-9]+; stopping the job" "$err" | head -n 1)
[[ "$first" =~ troupe-launch:\ (scheduler|server\ [01]|worker\ [13])\ exited\ with\ code\ [1-9] ]] ||
  hosts_fail "vanished: the job was not stopped by a survivor's failure: ${first:-no such line}"
# Whatever the survivors said of it names the lost worker (and each may have been stopped before
# it could say anything: the launcher stops the job at the first failure).
named=$(grep -E "^\[(worker [13]|server [01])\].* was lost" "$err" || true)
if [ -n "$named" ]; then
  others=$(printf '%s\n' "$named" | grep -Ev "worker [02] \(node [0-9]+\) was lost" || true)
  [ -z "$others" ] || hosts_fail "vanished: a survivor named another node lost: $others"
fi
echo "lost_worker_host_test: vanished: ${lost#*E troupe }"
echo "lost_worker_host_test: vanished: ${first#*E troupe }; $(printf '%s' "$named" | grep -c . || true) survivor lines name the lost worker"
