#!/usr/bin/env bash
# dist_async across three hosts (scripts/netns-cluster.sh), placed as sync_three_hosts_test.sh
# places its nodes (scheduler and servers 0-1 on host 0, workers 0 and 2 on host 1, 1 and 3 on
# host 2): each worker pushes ones*(rank+1) 20 times per key, then waits at a barrier; every
# value must then be 1 + 2 * 20 * (1+2+3+4) exactly (kv_worker --check async): every push applied
# exactly once, none lost or applied twice on the way between hosts. The keys of 1200x1200 and
# 1211x1211 are above the big-array bound (10^6 elements) and split over both servers. Tensors go through sockets, none through shared memory; nothing of the
# job is left on any host.
#   tests/hosts/async_three_hosts_test.sh BUILD_DIR
# Exit 77 (skipped, with the reason) where network namespaces cannot be made.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
hosts_setup async_three_hosts_test "${1:-}" tests/cluster/troupe_kv_worker
hosts_cluster a 3 -- "$@"

out=$work/job.out
err=$work/job.err
hosts_launch "$out" "$err" 0 0 1 2 1 2 -- -n 4 -s 2 --summary -- \
  "$kv_worker" --type dist_async --check async --rounds 20 --shapes 2x3,1200x1200,1211x1211 ||
  hosts_fail "troupe-launch exited $?"
holds=$(grep -c "async checks hold for 3 keys over 20 rounds" "$out" || true)
[ "$holds" -eq 4 ] || hosts_fail "$holds workers reported the async sums exact, not 4"
for host in 0 1 2; do
  [ "$(hosts_ssh_count $host)" -eq 2 ] || hosts_fail "$(hosts_ssh_count $host) nodes went to host $host, not 2"
done
# dist_async applies each push as it comes: 25 ps-keys (the 2x3 key whole; the two others split
# over the 2 servers, each half cut into 6 slices of at most data.slice_bytes, 512 KiB), 4 workers
# x 20 pushes each.
updates=$(grep -o "shards: [0-9]* updates" "$err" | awk '{s += $2} END {print s + 0}')
[ "$updates" -eq $((25 * 4 * 20)) ] ||
  hosts_fail "the servers applied $updates pushes, not 25 ps-keys x 4 workers x 20 = 2000"
hosts_check_tcp "$err" 2 4
hosts_check_nothing_runs
echo "async_three_hosts_test: 2000 pushes over 3 hosts, each applied once, tensors over TCP"
