#!/usr/bin/env bash
# A job on two hosts, as docs/launching.md ("Over ssh, with a hostfile") tells a user to start
# one: two network namespaces joined by a veth pair stand for the hosts (10.213.0.1 and
# 10.213.0.2, each with its own network stack, so no node reaches another through loopback), and
# a fake ssh runs each remote command in its host's namespace. troupe-launch runs on the first
# host with a hostfile and a cluster file naming the scheduler's address; it makes the job token
# and hands it over the ssh channel, servers and workers go round-robin over both hosts, the
# workers check MXNet's sync closed form, and the job trace of all four nodes is merged.
#   tests/cluster/two_hosts_test.sh BUILD_DIR
# Exit 77 (skipped, with the reason) where network namespaces cannot be made: not root, or a
# container without CAP_SYS_ADMIN / CAP_NET_ADMIN.
set -euo pipefail
build=$(cd "${1:?usage: two_hosts_test.sh BUILD_DIR}" && pwd)
launch=$build/apps/troupe-launch
node=$build/apps/troupe-node
worker=$build/tests/cluster/troupe_kv_worker
for program in "$launch" "$node" "$worker"; do
  [ -x "$program" ] || { echo "two_hosts_test: $program is missing"; exit 1; }
done
skip() { echo "two_hosts_test: skipped: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "making network namespaces needs root"
command -v ip >/dev/null || skip "no ip command (iproute2)"

work=$(mktemp -d)
tag=$$
host_a=troupe-a-$tag
host_b=troupe-b-$tag
cleanup() {
  for ns in "$host_a" "$host_b"; do
    # Whatever still runs in a namespace is this test's: stop it by PID.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$host_a" 2>/dev/null || skip "cannot make a network namespace (ip netns add)"
ip netns add "$host_b"
ip link add "ta$tag" type veth peer name "tb$tag"
ip link set "ta$tag" netns "$host_a"
ip link set "tb$tag" netns "$host_b"
ip -n "$host_a" addr add 10.213.0.1/24 dev "ta$tag"
ip -n "$host_b" addr add 10.213.0.2/24 dev "tb$tag"
for ns in "$host_a" "$host_b"; do ip -n "$ns" link set lo up; done
ip -n "$host_a" link set "ta$tag" up
ip -n "$host_b" link set "tb$tag" up

# ssh [-o OPTION]... [-p PORT] HOST COMMAND...: COMMAND in HOST's namespace, stdin passed on (the
# launcher writes the job token there), each host it was asked for noted.
mkdir "$work/bin"
cat > "$work/bin/ssh" <<EOF
#!/bin/sh
while [ \$# -gt 0 ]; do
  case "\$1" in
    -o|-p|-l|-i|-e) shift 2 ;;
    -*) shift ;;
    *) break ;;
  esac
done
host=\$1
shift
case "\$host" in
  10.213.0.1) ns=$host_a ;;
  10.213.0.2) ns=$host_b ;;
  *) echo "fake ssh: no host \$host" >&2; exit 255 ;;
esac
echo "\$host" >> "$work/ssh-hosts"
exec ip netns exec "\$ns" /bin/sh -c "\$*"
EOF
chmod 700 "$work/bin/ssh"

# What the user writes (docs/launching.md): a hostfile and the scheduler's address.
printf '10.213.0.1\n10.213.0.2\n' > "$work/hosts"
printf '[scheduler]\nhost = "10.213.0.1"\n' > "$work/cluster.toml"

cd "$work"
status=0
PATH=$work/bin:$PATH timeout -k 10 180 ip netns exec "$host_a" "$launch" -n 2 -s 2 -H hosts \
  --config cluster.toml --node-binary "$node" --trace "$work/job.json" -- \
  "$worker" --check sync --rounds 3 --shapes 2x3,1211x1211 > out.txt 2> err.txt || status=$?
fail() {
  echo "two_hosts_test: $*"
  echo "--- stdout"; cat out.txt; echo "--- stderr"; cat err.txt
  exit 1
}
[ "$status" -eq 0 ] || fail "troupe-launch exited $status"
holds=$(grep -c "sync checks hold" out.txt || true)
[ "$holds" -eq 2 ] || fail "$holds workers reported the closed form holding, not 2"
# Server 1 and worker 1 ran on the second host, server 0 and worker 0 on the first.
for host in 10.213.0.1 10.213.0.2; do
  runs=$(grep -c "^$host\$" ssh-hosts || true)
  [ "$runs" -eq 2 ] || fail "$runs nodes went to $host, not 2 (a server and a worker)"
done
/usr/bin/python3 - "$work/job.json" <<'EOF' || fail "the merged trace is wrong"
import json, sys
trace = json.load(open(sys.argv[1]))
nodes = trace["otherData"]["nodes"]
assert nodes == ["server-0", "server-1", "worker-0", "worker-1"], nodes
updates = sum(1 for e in trace["traceEvents"] if e["ph"] == "b" and e["name"] == "update")
assert updates == 9, f"{updates} update spans, not 3 ps-keys x 3 rounds"
EOF
echo "two_hosts_test: a job over two hosts (network namespaces) held the sync closed form"
