#!/usr/bin/env bash
# A job on two hosts, as docs/launching.md ("Over ssh, with a hostfile") tells a user to start
# one: two hosts of scripts/netns-cluster.sh (network namespaces on a bridge, each with its own
# network stack, so no node reaches another through loopback) and its stand-in ssh, which runs
# each remote command in its host's namespace. troupe-launch runs on the first host with a
# hostfile and a cluster file naming the scheduler's address; it makes the job token and hands it
# over the ssh channel, servers and workers go round-robin over both hosts (server 0 and worker 0
# on host 0, server 1 and worker 1 on host 1), the workers check MXNet's sync closed form, and the
# job trace of all four nodes is merged.
#
# Which way tensors went (docs/data-path.md, "Same host"): each server has one worker on its own
# host and one on the other. The 1211x1211 key is split over both servers, 2933040 bytes on each
# (cut into 6 slices of at most data.slice_bytes); over 3 rounds each worker pushes 8799120 bytes of them to each server. So each
# server's summary must show at least 8 MB in through shared memory (its own host's worker: same
# network namespace) and at least 8 MB in through sockets (the other host's worker: another
# network namespace, hence TCP, although both hosts share this machine's kernel).
#   tests/hosts/two_hosts_test.sh BUILD_DIR
# Exit 77 (skipped, with the reason) where network namespaces cannot be made: not root, or a
# container without CAP_SYS_ADMIN / CAP_NET_ADMIN.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
hosts_setup two_hosts_test "${1:-}" tests/cluster/troupe_kv_worker
hosts_cluster t 2 -- "$@"

out=$work/job.out
err=$work/job.err
hosts_launch "$out" "$err" 0 1 -- -n 2 -s 2 --summary --trace "$work/job.json" -- \
  "$kv_worker" --check sync --rounds 3 --shapes 2x3,1211x1211 ||
  hosts_fail "troupe-launch exited $?"
holds=$(grep -c "sync checks hold" "$out" || true)
[ "$holds" -eq 2 ] || hosts_fail "$holds workers reported the closed form holding, not 2"
# Server 1 and worker 1 ran on the second host, server 0 and worker 0 on the first.
for host in 0 1; do
  [ "$(hosts_ssh_count $host)" -eq 2 ] ||
    hosts_fail "$(hosts_ssh_count $host) nodes went to host $host, not 2 (a server and a worker)"
done
/usr/bin/python3 - "$work/job.json" <<'PY' || hosts_fail "the merged trace is wrong"
import json, sys
trace = json.load(open(sys.argv[1]))
nodes = trace["otherData"]["nodes"]
assert nodes == ["server-0", "server-1", "worker-0", "worker-1"], nodes
updates = sum(1 for e in trace["traceEvents"] if e["ph"] == "b" and e["name"] == "update")
assert updates == 39, f"{updates} update spans, not 13 ps-keys x 3 rounds"
PY
for s in 0 1; do
  line=$(grep "^\[server $s\].*tensor bytes: " "$err" || true)
  [[ "$line" =~ tensor\ bytes:\ ([0-9]+)\ in\ and\ [0-9]+\ out\ through\ sockets,\ ([0-9]+)\ in\ and\ [0-9]+\ out\ through\ shared\ memory ]] ||
    hosts_fail "server $s printed no 'tensor bytes' summary line"
  [ "${BASH_REMATCH[1]}" -ge 8000000 ] ||
    hosts_fail "server $s took ${BASH_REMATCH[1]} tensor bytes through sockets, not the other host's worker's 8.8 MB: $line"
  [ "${BASH_REMATCH[2]}" -ge 8000000 ] ||
    hosts_fail "server $s took ${BASH_REMATCH[2]} tensor bytes through shared memory, not its own host's worker's 8.8 MB: $line"
  echo "two_hosts_test: $line"
done
hosts_check_nothing_runs
echo "two_hosts_test: a job over two hosts (network namespaces) held the sync closed form; TCP between the hosts, shared memory within each"
