#!/usr/bin/env bash
# scripts/netns-cluster.sh makes hosts that talk TCP over rate-limited links, and removes all it
# made, only what it made, on `down`, on a failure half way and on a signal.
#   tests/cluster/netns_cluster_test.sh BUILD_DIR
# Exit 77 (skipped, with the reason) where network namespaces cannot be made.
set -uo pipefail
build=$(cd "${1:?usage: netns_cluster_test.sh BUILD_DIR}" && pwd)
source_dir=$(cd "$(dirname "$0")/../.." && pwd)
cluster=$source_dir/scripts/netns-cluster.sh
tcp=$build/bench/tcp_baseline
[ -x "$tcp" ] || { echo "netns_cluster_test: $tcp is missing"; exit 1; }
skip() { echo "netns_cluster_test: skipped: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "making network namespaces needs root"
command -v ip >/dev/null && command -v tc >/dev/null || skip "no ip or tc command (iproute2)"
ip netns add "troupe-probe-$$" 2>/dev/null || skip "cannot make a network namespace (ip netns add)"
ip netns del "troupe-probe-$$"

# Names from this run's PID: 8 characters of [a-z0-9].
name=n$(printf '%07d' $(($$ % 10000000)))
work=$(mktemp -d)
pids_to_stop=()
cleanup() {
  for pid in "${pids_to_stop[@]}"; do kill -9 "$pid" 2>/dev/null; done
  "$cluster" down --name "$name" >/dev/null 2>&1
  for ns in $(ip netns list | awk '{print $1}' | grep "^troupe-$name-"); do ip netns del "$ns"; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "netns_cluster_test: $*"
  exit 1
}
# (A pipe into grep -q can fail under pipefail: grep leaves at its first match and the writer
# gets SIGPIPE. So output is captured first.)
# What a cluster must not leave: its namespaces, its state directory, links or addresses in the
# namespace the test runs in.
ip -o link show | awk -F': ' '{print $2}' | sort > "$work/links-before"
nothing_left() {
  local what=$1 left
  left=$(ip netns list | awk '{print $1}' | grep "^troupe-$name-" | tr '\n' ' ')
  [ -z "$left" ] || fail "$what: namespaces left: $left"
  [ ! -e "/run/troupe-netns/$name" ] || fail "$what: /run/troupe-netns/$name is left"
  ip -o link show | awk -F': ' '{print $2}' | sort > "$work/links-after"
  cmp -s "$work/links-before" "$work/links-after" ||
    fail "$what: the links of the test's namespace changed: $(diff "$work/links-before" "$work/links-after" | tr '\n' ' ')"
}
# Polls `file` for `pattern` for at most 30 s.
await_text() {
  local file=$1 pattern=$2
  for _ in $(seq 300); do
    grep -q "$pattern" "$file" 2>/dev/null && return 0
    sleep 0.1
  done
  fail "\"$pattern\" did not appear in $file within 30 s: $(cat "$file" 2>/dev/null)"
}

# --- up: three hosts at 1 Gbit/s, each with its address, a bucket on both ends, TCP between them
state=$("$cluster" up --name "$name" --hosts 3 --rate 1gbit) || fail "up failed"
[ "$state" = "/run/troupe-netns/$name" ] || fail "up printed \"$state\", not its state directory"
mapfile -t addresses < "$state/hosts"
[ ${#addresses[@]} -eq 3 ] || fail "${#addresses[@]} addresses in $state/hosts, not 3"
for i in 0 1 2; do
  got=$(ip -n "troupe-$name-$i" -o -4 addr show dev eth0 | awk '{print $4}')
  [ "$got" = "${addresses[i]}/24" ] || fail "host $i has \"$got\" on eth0, not ${addresses[i]}/24"
  grep -q ' lo .*127.0.0.1' <<< "$(ip -n "troupe-$name-$i" -o -4 addr show)" || fail "host $i has no loopback"
  grep -q 'tbf .*rate 1Gbit' <<< "$(tc -n "troupe-$name-$i" qdisc show dev eth0)" ||
    fail "host $i's upload is not limited: $(tc -n "troupe-$name-$i" qdisc show dev eth0)"
  grep -q 'tbf .*rate 1Gbit' <<< "$(tc -n "troupe-$name-sw" qdisc show dev "h$i")" ||
    fail "host $i's download is not limited: $(tc -n "troupe-$name-sw" qdisc show dev "h$i")"
done
if grep -q "${addresses[0]%.*}\." <<< "$(ip -o -4 addr show)"; then
  fail "an address of the cluster's subnet appeared outside its namespaces"
fi
# A stream from host 2 to host 1 crosses the bridge at about the link's rate (1 Gbit/s is
# 0.125 GB/s): well above a tenth of it, and not above it by more than tbf's burst allows.
"$cluster" exec --name "$name" 1 -- "$tcp" --serve-on "${addresses[1]}" --sizes 8388608 \
  > "$work/server.out" 2>&1 &
pids_to_stop+=($!)
await_text "$work/server.out" listening
port=$(sed -n 's/{"listening":\([0-9]*\)}/\1/p' "$work/server.out")
timeout 60 "$cluster" exec --name "$name" 2 -- "$tcp" --connect "${addresses[1]}" --port "$port" \
  --sizes 8388608 --repeats 3 > "$work/client.out" 2>&1 || fail "no stream from host 2 to host 1: $(cat "$work/client.out")"
rate=$(sed -n 's/.*"median_gbps":\([0-9.]*\).*/\1/p' "$work/client.out")
awk -v r="$rate" 'BEGIN { exit !(r > 0.0125 && r < 0.2) }' ||
  fail "host 2 to host 1 ran at $rate GB/s, not near 1 Gbit/s (0.125 GB/s)"
# The stand-in for ssh runs a command on the host an address names.
got=$("$state/bin/ssh" -o BatchMode=yes -p 22 "${addresses[2]}" ip -o -4 addr show dev eth0 | awk '{print $4}')
[ "$got" = "${addresses[2]}/24" ] || fail "ssh ${addresses[2]} ran where eth0 has \"$got\""
"$state/bin/ssh" 10.255.255.255 true 2>/dev/null && fail "ssh to an address of no host succeeded"
# A process left running on a host is stopped by down.
"$cluster" exec --name "$name" 0 -- sleep 600 &
sleeper=$!
pids_to_stop+=("$sleeper")
"$cluster" up --name "$name" --hosts 2 2>/dev/null && fail "a second up of the same name succeeded"
"$cluster" down --name "$name" || fail "down failed"
nothing_left "after down"
wait "$sleeper" 2>/dev/null
kill -0 "$sleeper" 2>/dev/null && fail "a process on host 0 outlived down"

# --- a failure half way removes what up made and nothing else: a namespace of the same name as
# its host 2, made by somebody else while up is paused after host 1, stays.
NETNS_CLUSTER_PAUSE_AFTER_HOST=1 "$cluster" up --name "$name" --hosts 4 > /dev/null 2> "$work/up.err" &
up_pid=$!
pids_to_stop+=("$up_pid")
await_text "$work/up.err" "paused after host 1"
ip netns add "troupe-$name-2"
# (The pause's own process, which up names: no pgrep, procps may be missing.)
kill -TERM "$(sed -n 's/.*paused after host 1 (kill \([0-9]*\) to go on).*/\1/p' "$work/up.err")"
wait "$up_pid"
status=$?
[ "$status" -eq 1 ] || fail "up exited $status when host 2's namespace could not be made, not 1"
grep -q "troupe-$name-2" "$work/up.err" || fail "up's error does not name troupe-$name-2: $(cat "$work/up.err")"
grep -q "^troupe-$name-2\b" <<< "$(ip netns list)" || fail "up removed a namespace it did not make"
ip netns del "troupe-$name-2"
nothing_left "after a failed up"

# --- a signal during up removes what it made
NETNS_CLUSTER_PAUSE_AFTER_HOST=1 "$cluster" up --name "$name" --hosts 3 --rate 10gbit \
  > /dev/null 2> "$work/up2.err" &
up_pid=$!
pids_to_stop+=("$up_pid")
await_text "$work/up2.err" "paused after host 1"
kill -TERM "$up_pid"
wait "$up_pid"
status=$?
[ "$status" -eq 143 ] || fail "up exited $status on SIGTERM, not 143"
nothing_left "after SIGTERM during up"

# --- run: the command's status, its environment, and a signal while it runs
"$cluster" run --name "$name" --hosts 2 -- sh -c 'test -f "$TROUPE_NETNS_STATE/hosts" && exit 3'
status=$?
[ "$status" -eq 3 ] || fail "run exited $status, not its command's 3"
nothing_left "after run"
"$cluster" run --name "$name" --hosts 2 -- \
  sh -c 'echo $$ > "$0"; exec sleep 600' "$work/command.pid" &
run_pid=$!
pids_to_stop+=("$run_pid")
await_text "$work/command.pid" '[0-9]'
command_pid=$(cat "$work/command.pid")
# (SIGTERM: a shell ignores SIGINT in what it starts in the background, and so may its caller.)
kill -TERM "$run_pid"
wait "$run_pid"
status=$?
[ "$status" -eq 143 ] || fail "run exited $status on SIGTERM, not 143"
for _ in $(seq 100); do kill -0 "$command_pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$command_pid" 2>/dev/null && fail "run's command (PID $command_pid) outlived SIGTERM"
nothing_left "after SIGTERM during run"

# --- usage errors name what is wrong
for args in "--name BAD_NAME --hosts 2" "--name $name --hosts 0" "--name $name --hosts 2 --rate fast" \
  "--name $name --hosts 2 --subnet 10.300.1"; do
  # shellcheck disable=SC2086
  "$cluster" up $args 2> "$work/usage.err"
  status=$?
  [ "$status" -eq 2 ] || fail "up $args exited $status, not 2"
done
grep -q -- '--subnet: "10.300.1"' "$work/usage.err" || fail "the subnet error does not name it: $(cat "$work/usage.err")"
nothing_left "after usage errors"
echo "netns_cluster_test: hosts up, limited both ways, talking TCP; nothing left after down, a failure, or a signal"
