#!/usr/bin/env bash
# MXNet's dist_sync closed form across three hosts (scripts/netns-cluster.sh): the scheduler and
# both servers on host 0, workers 0 and 2 on host 1, workers 1 and 3 on host 2 (W=4, S=2), in
# float32 and then float16, with keys of 2x3, 1200x1200 and 1211x1211 (the last two above the
# big-array bound of 10^6 elements: split over both servers). Every worker checks the closed form after each of
# 3 rounds; both servers' summaries show that tensors went through sockets, none through shared
# memory; nothing of the job is left on any host.
#   tests/hosts/sync_three_hosts_test.sh BUILD_DIR
# Exit 77 (skipped, with the reason) where network namespaces cannot be made.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
hosts_setup sync_three_hosts_test "${1:-}" tests/cluster/troupe_kv_worker
hosts_cluster s 3 -- "$@"

for dtype in float32 float16; do
  out=$work/$dtype.out
  err=$work/$dtype.err
  # Hostfile lines in the launcher's order: server 0, server 1, worker 0, 1, 2, 3.
  hosts_launch "$out" "$err" 0 0 1 2 1 2 -- -n 4 -s 2 --summary -- \
    "$kv_worker" --check sync --rounds 3 --dtype "$dtype" --shapes 2x3,1200x1200,1211x1211 ||
    hosts_fail "$dtype: troupe-launch exited $?"
  holds=$(grep -c "sync checks hold" "$out" || true)
  [ "$holds" -eq 4 ] || hosts_fail "$dtype: $holds workers reported the closed form holding, not 4"
  for host in 0 1 2; do
    [ "$(hosts_ssh_count $host)" -eq 2 ] ||
      hosts_fail "$dtype: $(hosts_ssh_count $host) nodes went to host $host, not 2"
  done
  hosts_check_tcp "$err" 2 4
  hosts_check_nothing_runs
  echo "sync_three_hosts_test: $dtype: the closed form held on 4 workers over 3 hosts, tensors over TCP"
done
