#!/usr/bin/env bash
# troupe-launch --sync-dst-dir onto a host that does not have the launcher's working directory
# (issue 23), and the README's hostfile of names. Two network namespaces joined by a veth pair
# stand for the hosts (10.214.0.1, where the launcher and the scheduler run, and 10.214.0.2); the
# fake ssh runs each command for the second host in its namespace and in a mount namespace of its
# own, in which an empty tmpfs hides the launcher's working directory: that host has the build
# (troupe-node) but not the directory the launcher runs in, which --sync-dst-dir copies to DIR, a
# different path. The worker program lies in the working directory, so the nodes run its copy,
# and read the cluster file's copy; both servers and workers are on the second host.
#   1. the job runs (MXNet's sync closed form holds in both workers) and the trace of all four
#      nodes is merged (their files are written beside the trace's copy under DIR, which this
#      test's hosts share, as a host of the hostfile that is the launcher's own would);
#   2. the hostfile names the second host `node2`, which resolves there (its /etc/hosts, bound
#      over the real one in its mount namespace) to the first host's address: the servers cannot
#      listen, and say which name resolved to what and what to fix;
#   3. with node2 resolving to the second host's own address the same job runs.
#   tests/hosts/sync_dst_dir_test.sh BUILD_DIR
# Exit 77 (skipped, with the reason) where namespaces cannot be made (not root, no unshare or
# CAP_SYS_ADMIN) or rsync is missing.
set -euo pipefail
build=$(cd "${1:?usage: sync_dst_dir_test.sh BUILD_DIR}" && pwd)
launch=$build/apps/troupe-launch
node=$build/apps/troupe-node
worker=$build/tests/cluster/troupe_kv_worker
for program in "$launch" "$node" "$worker"; do
  [ -x "$program" ] || { echo "sync_dst_dir_test: $program is missing"; exit 1; }
done
skip() { echo "sync_dst_dir_test: skipped: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "making network and mount namespaces needs root"
command -v ip >/dev/null || skip "no ip command (iproute2)"
command -v unshare >/dev/null || skip "no unshare command (util-linux)"
command -v rsync >/dev/null || skip "no rsync (--sync-dst-dir copies with it)"
unshare --mount --propagation private /bin/true 2>/dev/null ||
  skip "cannot make a mount namespace (unshare --mount)"

work=$(mktemp -d)
tag=$$
host_a=troupe-sa-$tag
host_b=troupe-sb-$tag
cleanup() {
  for ns in "$host_a" "$host_b"; do
    # Whatever still runs in a namespace is this test's: stop it by PID.
    for pid in $(ip netns pids "$ns" 2>/dev/null); do kill -9 "$pid" 2>/dev/null || true; done
    ip netns del "$ns" 2>/dev/null || true
  done
  # The tmpfs and /etc/hosts mounts lived in mount namespaces that ended with their processes.
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$host_a" 2>/dev/null || skip "cannot make a network namespace (ip netns add)"
ip netns add "$host_b"
ip link add "sa$tag" type veth peer name "sb$tag"
ip link set "sa$tag" netns "$host_a"
ip link set "sb$tag" netns "$host_b"
ip -n "$host_a" addr add 10.214.0.1/24 dev "sa$tag"
ip -n "$host_b" addr add 10.214.0.2/24 dev "sb$tag"
for ns in "$host_a" "$host_b"; do ip -n "$ns" link set lo up; done
ip -n "$host_a" link set "sa$tag" up
ip -n "$host_b" link set "sb$tag" up

here=$work/launch # the launcher's working directory, absent on the second host
dst=$work/remote/copy
mkdir -p "$here/bin" "$work/remote" "$work/bin"
cp "$worker" "$here/bin/troupe_kv_worker"
printf '[scheduler]\nhost = "10.214.0.1"\n' > "$here/cluster.toml"

# The second host's file system: the launcher's directory is an empty tmpfs there, and its
# /etc/hosts is $work/etc-hosts-b when that exists. Runs the command given as one word.
cat > "$work/bin/on-host-b" <<EOF
#!/bin/sh
mount -t tmpfs -o size=1m troupe-not-here "$here" || exit 255
[ -z "\$(ls -A "$here")" ] || exit 255
if [ -f "$work/etc-hosts-b" ]; then mount --bind "$work/etc-hosts-b" /etc/hosts || exit 255; fi
exec /bin/sh -c "\$1"
EOF
# ssh [-o OPTION]... [-p PORT] HOST COMMAND...: COMMAND on HOST, stdin passed on (the launcher
# writes the job token there, rsync its data), each host it was asked for noted.
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
  10.214.0.2|node2) ;;
  *) echo "fake ssh: no host \$host" >&2; exit 255 ;;
esac
echo "\$host" >> "$work/ssh-hosts"
exec ip netns exec "$host_b" unshare --mount --propagation private "$work/bin/on-host-b" "\$*"
EOF
chmod 700 "$work/bin/ssh" "$work/bin/on-host-b"

# One job from the launcher's directory: 2 servers and 2 workers, all on the hostfile's one host.
status=0
run_job() {
  rm -rf "$dst" "$work/ssh-hosts"
  status=0
  (cd "$here" && PATH=$work/bin:$PATH timeout -k 10 180 ip netns exec "$host_a" "$launch" \
    -n 2 -s 2 -H "$work/hosts" --config cluster.toml --node-binary "$node" --sync-dst-dir "$dst" \
    --trace job.json --finish-timeout 20s -- \
    "$here/bin/troupe_kv_worker" --check sync --rounds 3 --shapes 2x3,1211x1211) \
    > "$work/out.txt" 2> "$work/err.txt" || status=$?
}
fail() {
  echo "sync_dst_dir_test: $*"
  echo "--- stdout"; cat "$work/out.txt"; echo "--- stderr"; cat "$work/err.txt"
  exit 1
}
check_job() {
  [ "$status" -eq 0 ] || fail "$1: troupe-launch exited $status"
  holds=$(grep -c "sync checks hold" "$work/out.txt" || true)
  [ "$holds" -eq 2 ] || fail "$1: $holds workers reported the closed form holding, not 2"
  # rsync once, then two servers and two workers: all on the second host.
  runs=$(grep -c . "$work/ssh-hosts" || true)
  [ "$runs" -eq 5 ] || fail "$1: $runs ssh runs, not 5 (one rsync, four nodes)"
  [ -f "$dst/cluster.toml" ] && [ -x "$dst/bin/troupe_kv_worker" ] ||
    fail "$1: the working directory was not copied to $dst"
  /usr/bin/python3 - "$here/job.json" <<'EOF' || fail "$1: the merged trace is wrong"
import json, sys
trace = json.load(open(sys.argv[1]))
nodes = trace["otherData"]["nodes"]
assert nodes == ["server-0", "server-1", "worker-0", "worker-1"], nodes
EOF
  leftover=$(find "$here" "$dst" -name 'job.json.*' | head -1)
  [ -z "$leftover" ] || fail "$1: node trace file $leftover left after the merge"
  rm -f "$here/job.json"
}

# 1. By address.
printf '10.214.0.2\n' > "$work/hosts"
run_job
check_job "by address"

# 2. node2 resolves, on node2, to the first host's address.
printf 'node2\n' > "$work/hosts"
printf '127.0.0.1 localhost\n10.214.0.1 node2\n' > "$work/etc-hosts-b"
run_job
[ "$status" -ne 0 ] || fail "with node2 resolving to 10.214.0.1 on node2 the job succeeded"
expected="cannot listen for data links on node2:0: node2 resolves to 10.214.0.1, which is not an \
address of this host (its addresses: "
grep -qF "$expected" "$work/out.txt" "$work/err.txt" || fail "no server said: $expected..."
grep -qF "each name there must resolve, on the host it names, to one of that host's own \
addresses" "$work/out.txt" "$work/err.txt" || fail "no server said how to fix the hostfile"
rm -f "$here"/job.json*

# 3. node2 resolves, on node2, to its own address.
printf '127.0.0.1 localhost\n10.214.0.2 node2\n' > "$work/etc-hosts-b"
run_job
check_job "by name"
echo "sync_dst_dir_test: --sync-dst-dir onto a host without the launcher's directory ran the job" \
  "in the copy; a hostfile name resolving elsewhere was named"
