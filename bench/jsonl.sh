# shellcheck shell=bash
# Sourced by the bench/*.sh scripts: awk functions for the JSON lines the benchmarks print, to put
# in front of a program, awk "$jsonl_awk"'{ ... }'. One flat object per line, no nesting.
#   field(line, name)  the value of "name" (a number, or a string without its quotes); "" if absent
#   median(list)       the median of a space-separated list of numbers
# and a shell filter: ... | final_line  keeps the last train_mnist-style final JSON line (the one
# with "final_test_acc"), without troupe-launch's "[worker N] " prefix; and need_executables.
# shellcheck disable=SC2034  # used by the scripts that source this file
jsonl_awk='
  function field(line, name,    m) {
    if (match(line, "\"" name "\":\"?[^,\"}]*")) {
      m = substr(line, RSTART, RLENGTH); sub(/^"[^"]*":"?/, "", m); return m
    }
    return ""
  }
  function median(list,    n, values, i, j, t) {
    n = split(list, values, " ")
    for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
      if (values[j] + 0 < values[i] + 0) { t = values[i]; values[i] = values[j]; values[j] = t }
    return n % 2 ? values[(n + 1) / 2] : (values[n / 2] + values[n / 2 + 1]) / 2
  }
'

final_line() { grep '"final_test_acc"' | sed -e 's/^\[worker [0-9]*\] //' | tail -n 1; }

# need_executables SCRIPT BUILD EXE...: exits 1 naming the first of BUILD/EXE that is missing.
need_executables() {
  local script=$1 build=$2 exe
  shift 2
  for exe in "$@"; do
    [ -x "$build/$exe" ] || { echo "$script: $build/$exe is missing" >&2; exit 1; }
  done
}
