# Shared by the tests labelled `hosts` (tests/hosts/*_test.sh): jobs across hosts made by
# scripts/netns-cluster.sh, one network namespace per host on a bridge, started the way
# docs/launching.md ("Over ssh, with a hostfile") tells a user to: troupe-launch on host 0 with a
# hostfile, a cluster file naming the scheduler's address, and the cluster's stand-in ssh.
#
# A test script sources this file, calls hosts_setup, then hosts_cluster; hosts_cluster runs the
# script again inside `netns-cluster.sh run` (TROUPE_NETNS_STATE set), where the script's body
# runs, and after it checks that the cluster left nothing behind. Bash only.
#
#   . "$(dirname "$0")/lib.sh"
#   hosts_setup NAME BUILD_DIR PROGRAM...      # PROGRAMs: paths under BUILD_DIR it needs besides
#                                              # troupe-launch and troupe-node; exit 77 with the
#                                              # reason where namespaces cannot be made
#   hosts_cluster PREFIX HOSTS [RATE] -- "$@"  # outside the cluster: run this script in one, exit
#   ...body: hosts_launch, hosts_fail, hosts_check_tcp...

# The test's name (for messages), the build and source trees, and the programs.
hosts_setup() {
  test_name=$1
  build=$(cd "${2:?usage: $test_name BUILD_DIR}" && pwd)
  shift 2
  source_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
  netns_cluster=$source_dir/scripts/netns-cluster.sh
  launch=$build/apps/troupe-launch
  node=$build/apps/troupe-node
  kv_worker=$build/tests/cluster/troupe_kv_worker
  local program
  for program in "$launch" "$node" "${@/#/$build/}"; do
    [ -x "$program" ] || { echo "$test_name: $program is missing"; exit 1; }
  done
  if [ -z "${TROUPE_NETNS_STATE:-}" ]; then
    [ "$(id -u)" -eq 0 ] || hosts_skip "making network namespaces needs root"
    command -v ip >/dev/null && command -v tc >/dev/null || hosts_skip "no ip or tc command (iproute2)"
    command -v timeout >/dev/null || hosts_skip "no timeout command (coreutils)"
    ip netns add "troupe-probe-$$" 2>/dev/null ||
      hosts_skip "cannot make a network namespace (ip netns add: needs CAP_SYS_ADMIN and CAP_NET_ADMIN)"
    ip netns del "troupe-probe-$$"
  fi
}

hosts_skip() {
  echo "$test_name: skipped: $*"
  exit 77
}

# Outside the cluster: makes cluster PREFIX<pid> of HOSTS hosts (links at RATE, if given) with
# scripts/netns-cluster.sh run, runs this script in it with the same arguments (bounded by 300 s:
# netns-cluster.sh removes the cluster when the bound sends it SIGTERM), then checks that no
# namespace or state of the cluster is left, and exits with the script's status.
# Inside (TROUPE_NETNS_STATE set): sets cluster, state, hosts_ns (namespace of host i) and
# addresses (address of host i), and returns.
hosts_cluster() {
  local prefix=$1 count=$2 rate=""
  shift 2
  if [ "${1:-}" != "--" ]; then
    rate=$1
    shift
  fi
  [ "${1:-}" = "--" ] || { echo "$test_name: hosts_cluster PREFIX HOSTS [RATE] -- ARGS"; exit 1; }
  shift
  if [ -n "${TROUPE_NETNS_STATE:-}" ]; then
    state=$TROUPE_NETNS_STATE
    cluster=$(basename "$state")
    mapfile -t addresses < "$state/hosts"
    [ "${#addresses[@]}" -eq "$count" ] ||
      hosts_fail "the cluster has ${#addresses[@]} hosts, not $count"
    hosts_ns=()
    local i
    for ((i = 0; i < count; i++)); do hosts_ns+=("troupe-$cluster-$i"); done
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    return 0
  fi
  # 1-8 characters of [a-z0-9]: the prefix and this run's PID.
  cluster=$prefix$(printf '%07d' $(($$ % 10000000)))
  cluster=${cluster:0:8}
  local flags=(--name "$cluster" --hosts "$count")
  [ -z "$rate" ] || flags+=(--rate "$rate")
  local started=$SECONDS status=0
  timeout -k 10 300 "$netns_cluster" run "${flags[@]}" -- bash "$0" "$@" || status=$?
  local left
  left=$(ip netns list | awk '{print $1}' | grep "^troupe-$cluster-" | tr '\n' ' ' || true)
  if [ -n "$left" ] || [ -e "/run/troupe-netns/$cluster" ]; then
    echo "$test_name: the cluster $cluster was not removed: namespaces left: ${left:-none}"
    "$netns_cluster" down --name "$cluster" >/dev/null 2>&1
    exit 1
  fi
  [ "$status" -ne 124 ] || echo "$test_name: FAILED: still running after 300 s"
  [ "$status" -ne 0 ] || echo "$test_name: passed in $((SECONDS - started)) s"
  exit "$status"
}

# Prints why, the job's outputs (the files named in hosts_outputs), and exits 1.
hosts_outputs=()
hosts_fail() {
  echo "$test_name: FAILED: $*"
  local file
  for file in "${hosts_outputs[@]}"; do
    [ -f "$file" ] && { echo "--- $file"; tail -n 150 "$file"; }
  done
  exit 1
}

# hosts_launch OUT ERR HOST... -- LAUNCH_ARGS...: troupe-launch on host 0 (the scheduler's host,
# named in $work/cluster.toml) in ssh mode over a hostfile of the given host indexes, one line per
# node: the servers, then the workers, take its lines in order (troupe-launch's round-robin), so a
# host listed twice gets two nodes. The stand-in ssh is wrapped to note each host it is asked for
# in $work/ssh-hosts. Bounded by 150 s; returns the launcher's status.
hosts_launch() {
  local out=$1 err=$2 index
  shift 2
  : > "$work/hostfile"
  while [ "$1" != "--" ]; do
    echo "${addresses[$1]}" >> "$work/hostfile"
    shift
  done
  shift
  printf '[scheduler]\nhost = "%s"\n' "${addresses[0]}" > "$work/cluster.toml"
  mkdir -p "$work/bin"
  cat > "$work/bin/ssh" <<EOF
#!/bin/sh
# Notes the host (the first word that is not an option or its value), then runs the cluster's ssh.
for word in "\$@"; do
  case "\$word" in
    -*) ;;
    *) [ "\$skip" = 1 ] && { skip=0; continue; }; echo "\$word" >> "$work/ssh-hosts"; break ;;
  esac
  skip=0
  case "\$word" in -o|-p|-l|-i|-e|-F|-J) skip=1 ;; esac
done
exec "$state/bin/ssh" "\$@"
EOF
  chmod 755 "$work/bin/ssh"
  : > "$work/ssh-hosts"
  hosts_outputs+=("$out" "$err")
  local status=0
  (cd "$work" && PATH=$work/bin:$PATH timeout -k 10 150 ip netns exec "${hosts_ns[0]}" "$launch" \
    -H hostfile --config cluster.toml --node-binary "$node" "$@") > "$out" 2> "$err" || status=$?
  return "$status"
}

# How many nodes the launcher's ssh started on host `index`.
hosts_ssh_count() {
  grep -c "^${addresses[$1]}\$" "$work/ssh-hosts" || true
}

# hosts_check_tcp ERR SERVERS [WORKERS]: each of the SERVERS servers' summaries, and of the
# WORKERS workers' (troupe-launch --summary, lines "[server i] ... tensor bytes: A in and B out
# through sockets, C in and D out through shared memory") shows tensors in and out through sockets
# and none through shared memory: every data link of the job crossed a link between hosts as TCP.
hosts_check_tcp() {
  local err=$1 servers=$2 workers=${3:-0} role count i line
  for role in server worker; do
    count=$servers
    [ "$role" = server ] || count=$workers
    for ((i = 0; i < count; i++)); do
      line=$(grep "^\[$role $i\].*tensor bytes: " "$err" || true)
      [ "$(printf '%s\n' "$line" | grep -c 'tensor bytes')" -eq 1 ] ||
        hosts_fail "$role $i printed no (or more than one) 'tensor bytes' summary line"
      [[ "$line" =~ tensor\ bytes:\ ([0-9]+)\ in\ and\ ([0-9]+)\ out\ through\ sockets,\ ([0-9]+)\ in\ and\ ([0-9]+)\ out\ through\ shared\ memory ]] ||
        hosts_fail "$role $i's 'tensor bytes' line has another form: $line"
      [ "${BASH_REMATCH[1]}" -gt 0 ] && [ "${BASH_REMATCH[2]}" -gt 0 ] ||
        hosts_fail "$role $i moved no tensor bytes through its sockets: $line"
      [ "${BASH_REMATCH[3]}" -eq 0 ] && [ "${BASH_REMATCH[4]}" -eq 0 ] ||
        hosts_fail "$role $i moved tensors through shared memory across hosts: $line"
      echo "$test_name: $line"
    done
  done
}

# Nothing runs in any host of the cluster once the launcher has returned: every node it started
# must go with it. A node whose ssh client the launcher ended gets SIGTERM from the remote side's
# stdin watcher (troupe-launch's ssh_command), which may come a moment after the launcher
# returned: waits for that, at most 30 s.
hosts_check_nothing_runs() {
  local ns pids left
  for _ in $(seq 300); do
    left=""
    for ns in "${hosts_ns[@]}"; do
      pids=$(ip netns pids "$ns" | tr '\n' ' ')
      [ -z "$pids" ] || left="$left $ns: $pids"
    done
    [ -n "$left" ] || return 0
    sleep 0.1
  done
  hosts_fail "processes still run 30 s after the job ended:$left: $(for p in $(for ns in "${hosts_ns[@]}"; do ip netns pids "$ns"; done); do
    tr '\0' ' ' < "/proc/$p/cmdline" 2>/dev/null | cut -c1-160; echo; done)"
}
