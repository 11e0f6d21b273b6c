#!/usr/bin/env bash
# Makes the certificates of a troupe job's TLS (docs/cluster.sample.toml, [tls]) with the openssl
# command: a CA, and one certificate and key per node, each naming its role.
#
#   scripts/make-tls-certs.sh [--days N] DIR [ROLE[:NAME[:HOST,...]]]...
#
# DIR receives ca.crt and ca.key (the CA; kept and reused when DIR already holds them, so a later
# run adds nodes signed by the same CA), and NAME.crt and NAME.key per node. ROLE is scheduler,
# server or worker; NAME defaults to the role; HOSTs (names or IP addresses) go into the
# certificate's subjectAltName for tools that check host names (troupe checks the role, not the
# host). Without a node, one certificate per role: scheduler, server and worker, which is what a
# cluster file with `cert_file = "DIR/{role}.crt"` and `key_file = "DIR/{role}.key"` needs.
#
# The role travels as the subjectAltName URI troupe:role=ROLE, which a troupe node checks against
# its own role at start-up and against the role a peer acts in on every connection. Keys are EC
# P-256, written with mode 0600 (a node refuses a key file that group or others may read).
# Certificates are valid for --days days (default 365). Exit 2 on a usage error, 1 when openssl
# fails (its message is shown).
set -euo pipefail

usage() {
  echo "usage: $0 [--days N] DIR [ROLE[:NAME[:HOST,...]]]..." >&2
  echo "  ROLE: scheduler, server or worker; NAME: file name (default ROLE); HOSTs: subjectAltName" >&2
  exit 2
}

days=365
while [ $# -gt 0 ]; do
  case "$1" in
  --days)
    [ $# -ge 2 ] || usage
    days=$2
    shift 2
    ;;
  -h | --help) usage ;;
  --) shift; break ;;
  -*) echo "$0: unknown option $1" >&2; usage ;;
  *) break ;;
  esac
done
[ $# -ge 1 ] || usage
case "$days" in
'' | *[!0-9]*) echo "$0: --days must be a positive integer, got '$days'" >&2; exit 2 ;;
esac
[ "$days" -gt 0 ] || { echo "$0: --days must be a positive integer, got '$days'" >&2; exit 2; }
dir=$1
shift
nodes=("$@")
[ ${#nodes[@]} -gt 0 ] || nodes=(scheduler server worker)

command -v openssl >/dev/null || { echo "$0: the openssl command is not installed" >&2; exit 1; }
mkdir -p "$dir"
umask 077
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Checks every node spec before anything is written.
for spec in "${nodes[@]}"; do
  IFS=: read -r role name hosts extra <<<"$spec"
  case "$role" in
  scheduler | server | worker) ;;
  *) echo "$0: '$spec': the role must be scheduler, server or worker, got '$role'" >&2; exit 2 ;;
  esac
  [ -z "${extra:-}" ] || { echo "$0: '$spec': ROLE[:NAME[:HOST,...]] has at most three parts" >&2; exit 2; }
  case "${name:-$role}" in
  *[!A-Za-z0-9._-]* | .*) echo "$0: '$spec': NAME may hold letters, digits, '.', '_' and '-' and must not start with '.'" >&2; exit 2 ;;
  esac
  case "${hosts:-}" in
  *[!A-Za-z0-9.:,_-]*) echo "$0: '$spec': HOSTs are names or addresses separated by ','" >&2; exit 2 ;;
  esac
done

run_openssl() {
  if ! openssl "$@" 2>"$work/openssl.err"; then
    echo "$0: openssl $1 failed:" >&2
    cat "$work/openssl.err" >&2
    exit 1
  fi
}

if [ -f "$dir/ca.key" ] && [ -f "$dir/ca.crt" ]; then
  echo "make-tls-certs: reusing the CA in $dir"
else
  run_openssl req -x509 -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$dir/ca.key" -out "$dir/ca.crt" -days "$days" -subj "/O=troupe/CN=troupe job CA" \
    -addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign"
  echo "make-tls-certs: made the CA $dir/ca.crt"
fi

for spec in "${nodes[@]}"; do
  IFS=: read -r role name hosts _ <<<"$spec"
  name=${name:-$role}
  san="URI:troupe:role=$role"
  if [ -n "${hosts:-}" ]; then
    IFS=, read -r -a host_list <<<"$hosts"
    for host in "${host_list[@]}"; do
      [ -n "$host" ] || continue
      if [[ "$host" =~ ^[0-9.]+$ || "$host" == *:* ]]; then
        san="$san,IP:$host"
      else
        san="$san,DNS:$host"
      fi
    done
  fi
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "keyUsage=critical,digitalSignature" \
    "extendedKeyUsage=serverAuth,clientAuth" "subjectAltName=$san" >"$work/$name.ext"
  run_openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
    -keyout "$dir/$name.key" -out "$work/$name.csr" -subj "/O=troupe/OU=$role/CN=$name"
  run_openssl x509 -req -in "$work/$name.csr" -CA "$dir/ca.crt" -CAkey "$dir/ca.key" \
    -CAcreateserial -CAserial "$work/ca.srl" -days "$days" -extfile "$work/$name.ext" \
    -out "$dir/$name.crt"
  chmod 600 "$dir/$name.key"
  chmod 644 "$dir/$name.crt"
  echo "make-tls-certs: $dir/$name.crt ($role) and $dir/$name.key"
done
chmod 600 "$dir/ca.key"
chmod 644 "$dir/ca.crt"
