#!/usr/bin/env bash
# Hosts on one machine: H network namespaces on a bridge, each with its own address and,
# optionally, a link of a given rate in both directions, for running and measuring jobs across
# "hosts" that talk TCP to each other (docs/scaling.md, tests labelled `hosts`).
#
#   scripts/netns-cluster.sh up   --name N --hosts H [--rate RATE] [--subnet A.B.C]
#   scripts/netns-cluster.sh exec --name N I -- COMMAND...
#   scripts/netns-cluster.sh down --name N
#   scripts/netns-cluster.sh run  --name N --hosts H [--rate RATE] [--subnet A.B.C] -- COMMAND...
#   scripts/netns-cluster.sh list
#
# N is 1-8 characters of [a-z0-9]. Host i (0 <= i < H) is the namespace troupe-N-i, address
# A.B.C.(i+1)/24 on its eth0. The hosts' veth pairs meet on a bridge inside a namespace of its own,
# troupe-N-sw, so nothing is made in the namespace the script is called from, and no address leaves
# these namespaces. RATE (tc's units: 100mbit, 1gbit, 10gbit) puts a token bucket (tbf) on both
# ends of each host's veth pair: the host's end limits what it sends, the bridge's end what it
# receives, as on a full-duplex link. The default subnet is derived from N.
#
# The state lives in /run/troupe-netns/N: `hosts` (one address per line, host 0 first), `rate`,
# `made` (each namespace this script made, in order) and bin/ssh, a stand-in for ssh that runs a
# command on a host of this cluster (`ssh [-o OPT]... [-p PORT] ADDRESS COMMAND...`, stdin passed
# on), so that `PATH=/run/troupe-netns/N/bin:$PATH troupe-launch -H hostfile ...` starts a job
# the way docs/launching.md tells a user to.
#
# `up` removes what it made when it fails or gets SIGINT/SIGTERM/SIGHUP; `down` stops by PID
# whatever runs in the cluster's namespaces and removes exactly what `up` recorded in `made`.
# `run` is up, COMMAND (with TROUPE_NETNS_STATE set to the state directory), down, also when
# COMMAND fails or the script gets a signal; it exits with COMMAND's status.
#
# Exit status: 0; 1 a failure (named); 2 a usage error; 77 network namespaces cannot be made here
# (not root, no CAP_NET_ADMIN): tests pass it on as "skipped".
set -uo pipefail

state_root=/run/troupe-netns
program=$(basename "$0")

die() {
  echo "$program: $*" >&2
  exit 1
}
usage() {
  echo "$program: $*" >&2
  echo "usage: $program up|run --name N --hosts H [--rate RATE] [--subnet A.B.C] [-- COMMAND...]" >&2
  echo "       $program exec --name N I -- COMMAND...  |  down --name N  |  list" >&2
  exit 2
}

[ $# -ge 1 ] || usage "no action"
action=$1
shift
name=""
hosts=""
rate=""
subnet=""
host_index=""
command=()
while [ $# -gt 0 ]; do
  case "$1" in
    --name) [ $# -ge 2 ] || usage "--name needs a value"; name=$2; shift 2 ;;
    --hosts) [ $# -ge 2 ] || usage "--hosts needs a value"; hosts=$2; shift 2 ;;
    --rate) [ $# -ge 2 ] || usage "--rate needs a value"; rate=$2; shift 2 ;;
    --subnet) [ $# -ge 2 ] || usage "--subnet needs a value"; subnet=$2; shift 2 ;;
    --) shift; command=("$@"); break ;;
    -*) usage "unknown option $1" ;;
    *)
      [ "$action" = exec ] && [ -z "$host_index" ] || usage "unexpected argument $1"
      host_index=$1
      shift
      ;;
  esac
done

case "$action" in
  up | run | exec | down | list) ;;
  *) usage "unknown action $action" ;;
esac

if [ "$action" != list ]; then
  [[ "$name" =~ ^[a-z0-9]{1,8}$ ]] || usage "--name: \"$name\" is not 1-8 characters of [a-z0-9]"
fi
state=$state_root/$name
switch=troupe-$name-sw

# Bits per second of a tc rate ("1gbit", "500mbit", "100kbit", "1000000bit").
rate_bits() {
  local value unit
  [[ "$1" =~ ^([0-9]+)(bit|kbit|mbit|gbit)$ ]] || return 1
  value=${BASH_REMATCH[1]}
  unit=${BASH_REMATCH[2]}
  case "$unit" in
    bit) echo "$value" ;;
    kbit) echo $((value * 1000)) ;;
    mbit) echo $((value * 1000000)) ;;
    gbit) echo $((value * 1000000000)) ;;
  esac
}

check_up_arguments() {
  [[ "$hosts" =~ ^[0-9]+$ ]] && [ "$hosts" -ge 1 ] && [ "$hosts" -le 250 ] ||
    usage "--hosts: \"$hosts\" is not a number of hosts from 1 to 250"
  if [ -n "$rate" ]; then
    local bits
    bits=$(rate_bits "$rate") || usage "--rate: \"$rate\" is not a rate such as 100mbit, 1gbit or 10gbit"
    [ "$bits" -ge 1000000 ] || usage "--rate: $rate is below 1mbit"
  fi
  if [ -z "$subnet" ]; then
    # 10.231.X from the name: clusters of different names rarely share a subnet, and as each
    # lives in namespaces of its own they would not collide if they did.
    subnet=10.231.$(($(printf '%s' "$name" | cksum | cut -d' ' -f1) % 250 + 1))
  fi
  [[ "$subnet" =~ ^([0-9]{1,3})\.([0-9]{1,3})\.([0-9]{1,3})$ ]] &&
    [ "${BASH_REMATCH[1]}" -le 255 ] && [ "${BASH_REMATCH[2]}" -le 255 ] &&
    [ "${BASH_REMATCH[3]}" -le 255 ] || usage "--subnet: \"$subnet\" is not three octets like 10.231.7"
}

can_make_namespaces() {
  [ "$(id -u)" -eq 0 ] || { echo "$program: making network namespaces needs root" >&2; return 1; }
  command -v ip >/dev/null || { echo "$program: no ip command (iproute2)" >&2; return 1; }
  command -v tc >/dev/null || { echo "$program: no tc command (iproute2)" >&2; return 1; }
  return 0
}

# Stops by PID every process in the namespace, then removes the namespace (its veth ends go with
# it). A namespace with processes left in it would outlive `ip netns del`.
remove_namespace() {
  local ns=$1 pid pids tries
  for tries in 1 2 3 4 5 6 7 8 9 10; do
    pids=$(ip netns pids "$ns" 2>/dev/null) || break
    [ -n "$pids" ] || break
    for pid in $pids; do
      kill -CONT "$pid" 2>/dev/null
      kill -KILL "$pid" 2>/dev/null
    done
    # Killed processes leave the namespace once the kernel has reaped their threads.
    for _ in $(seq 50); do
      [ -z "$(ip netns pids "$ns" 2>/dev/null)" ] && break
      sleep 0.02
    done
  done
  ip netns del "$ns" 2>/dev/null || true
}

pause_pid=""
# Removes what the state directory's `made` lists, last made first, and the state directory.
teardown() {
  [ -z "$pause_pid" ] || kill "$pause_pid" 2>/dev/null
  if [ -f "$state/made" ]; then
    local objects=()
    mapfile -t objects < "$state/made"
    local i
    for ((i = ${#objects[@]} - 1; i >= 0; i--)); do
      remove_namespace "${objects[i]}"
    done
  fi
  rm -rf "$state"
}

make_namespace() {
  ip netns add "$1" || return 1
  echo "$1" >> "$state/made"
}

# A token bucket for `rate` on an interface in a namespace. The burst holds 2 ms of the rate (at
# least 64 KiB): at 10 Gbit/s a smaller bucket refills too coarsely for the kernel's timer and
# the link runs below its rate; a larger one lets bursts through above it.
limit_rate() {
  local ns=$1 dev=$2 bits burst
  bits=$(rate_bits "$rate")
  burst=$((bits / 8 / 500))
  [ "$burst" -ge 65536 ] || burst=65536
  ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst "$burst" latency 50ms
}

write_fake_ssh() {
  mkdir -p "$state/bin"
  {
    echo '#!/bin/sh'
    echo "# ssh for the hosts of netns-cluster $name: runs COMMAND in the host's namespace."
    echo 'while [ $# -gt 0 ]; do'
    echo '  case "$1" in'
    echo '    -o|-p|-l|-i|-e|-F|-J) shift 2 ;;'
    echo '    -*) shift ;;'
    echo '    *) break ;;'
    echo '  esac'
    echo 'done'
    echo '[ $# -ge 1 ] || { echo "ssh (netns-cluster): no host" >&2; exit 255; }'
    echo 'host=$1'
    echo 'shift'
    echo 'case "$host" in'
    local i
    for ((i = 0; i < hosts; i++)); do
      echo "  $subnet.$((i + 1))) ns=troupe-$name-$i ;;"
    done
    echo "  *) echo \"ssh (netns-cluster $name): no host \$host\" >&2; exit 255 ;;"
    echo 'esac'
    echo 'exec ip netns exec "$ns" /bin/sh -c "$*"'
  } > "$state/bin/ssh"
  chmod 755 "$state/bin/ssh"
}

bring_up() {
  check_up_arguments
  can_make_namespaces || exit 77
  [ ! -e "$state" ] || die "cluster $name exists ($state); remove it with: $program down --name $name"
  # Captured, not piped into grep -q: under pipefail a writer cut off by grep's early exit fails.
  local existing
  existing=$(ip netns list)
  for ((i = 0; i < hosts; i++)); do
    ! grep -q "^troupe-$name-$i\b" <<< "$existing" ||
      die "a namespace troupe-$name-$i exists that this cluster did not make; choose another --name"
  done
  ! grep -q "^$switch\b" <<< "$existing" ||
    die "a namespace $switch exists that this cluster did not make; choose another --name"
  mkdir -p "$state" || die "cannot make $state"
  : > "$state/made"
  trap 'teardown; exit 130' INT
  trap 'teardown; exit 143' TERM
  trap 'teardown; exit 129' HUP

  make_namespace "$switch" || { teardown; die "cannot make the namespace $switch (ip netns add)"; }
  ip -n "$switch" link add br0 type bridge &&
    ip -n "$switch" link set br0 up &&
    ip -n "$switch" link set lo up || { teardown; die "cannot make the bridge in $switch"; }
  local ns address
  for ((i = 0; i < hosts; i++)); do
    ns=troupe-$name-$i
    address=$subnet.$((i + 1))
    make_namespace "$ns" || { teardown; die "cannot make the namespace $ns"; }
    ip -n "$switch" link add "h$i" type veth peer name eth0 netns "$ns" &&
      ip -n "$switch" link set "h$i" master br0 &&
      ip -n "$switch" link set "h$i" up &&
      ip -n "$ns" addr add "$address/24" dev eth0 &&
      ip -n "$ns" link set eth0 up &&
      ip -n "$ns" link set lo up || { teardown; die "cannot wire host $i ($ns, $address)"; }
    if [ -n "$rate" ]; then
      limit_rate "$ns" eth0 && limit_rate "$switch" "h$i" ||
        { teardown; die "cannot limit host $i's link to $rate (tc tbf)"; }
    fi
    echo "$address" >> "$state/hosts"
    # A pause point for tests/hosts/netns_cluster_test.sh: a signal arriving here must still
    # remove everything.
    if [ "${NETNS_CLUSTER_PAUSE_AFTER_HOST:-}" = "$i" ]; then
      sleep 600 &
      pause_pid=$!
      echo "$program: paused after host $i (kill $pause_pid to go on)" >&2
      wait "$pause_pid"
      pause_pid=""
    fi
  done
  echo "${rate:-unlimited}" > "$state/rate"
  write_fake_ssh
  # `run` keeps its handlers from here on (set before bring_up returns, so no signal slips by).
  [ "$action" = run ] || trap - INT TERM HUP
}

case "$action" in
  list)
    [ -d "$state_root" ] && ls "$state_root"
    exit 0
    ;;
  up)
    bring_up
    echo "$state"
    ;;
  down)
    [ -d "$state" ] || die "no cluster $name ($state does not exist)"
    teardown
    ;;
  exec)
    [ -f "$state/hosts" ] || die "no cluster $name ($state/hosts does not exist)"
    count=$(wc -l < "$state/hosts")
    [[ "$host_index" =~ ^[0-9]+$ ]] && [ "$host_index" -lt "$count" ] ||
      usage "exec: \"$host_index\" is not a host of cluster $name (0 to $((count - 1)))"
    [ ${#command[@]} -gt 0 ] || usage "exec: no command after --"
    exec ip netns exec "troupe-$name-$host_index" "${command[@]}"
    ;;
  run)
    [ ${#command[@]} -gt 0 ] || usage "run: no command after --"
    bring_up
    child=""
    # COMMAND and whatever it starts outside the cluster's namespaces form a process group of
    # their own (job control), stopped as one; what runs inside the namespaces goes with them.
    finish() {
      local status=$1
      [ -n "$child" ] && kill -TERM -- "-$child" 2>/dev/null && wait "$child" 2>/dev/null
      teardown
      exit "$status"
    }
    trap 'finish 130' INT
    trap 'finish 143' TERM
    trap 'finish 129' HUP
    set -m
    TROUPE_NETNS_STATE=$state "${command[@]}" &
    child=$!
    set +m
    wait "$child"
    status=$?
    child=""
    teardown
    exit "$status"
    ;;
esac
