#!/usr/bin/env bash
# Fails when a C++ code block of the documentation is not the code of an example, so that what
# the README shows compiles and runs (tests/install_test.sh builds and runs every example).
#   tests/readme_blocks.sh ROOT [MARKDOWN_FILE...]    (README.md and docs/*.md by default)
#
# Every fenced block of C++ (```cpp, ```c++, ```cxx) must come right after a line
#   <!-- example: examples/FILE.cpp REGION -->
# and be, character for character, that region of that file: the lines between
#   // README REGION {
# and
#   // README REGION }
# in the order they appear (a region may be cut into several pieces, so that the example can do
# more between them than the README shows), each piece without the indentation common to its
# lines, and without the marker lines of other regions. Every region an example marks must be
# quoted by some block, so that no marker outlives its block.
set -uo pipefail
root=${1:?usage: readme_blocks.sh ROOT [MARKDOWN_FILE...]}
shift
cd "$root" || exit 2
files=("$@")
[ ${#files[@]} -gt 0 ] || files=(README.md docs/*.md)

# region FILE NAME: the text of region NAME of FILE; exit status 1 when FILE has no such region
# or one of its pieces is not closed.
region() {
  awk -v name="$2" '
    function flush(   i) {
      for (i = 1; i <= n; ++i)
        print (lines[i] ~ /^[ \t]*$/ ? "" : substr(lines[i], indent + 1))
      n = 0
    }
    $0 ~ "^[ \t]*// README " name " [{]$" { inside = 1; found = 1; indent = -1; next }
    $0 ~ "^[ \t]*// README " name " [}]$" { flush(); inside = 0; next }
    /^[ \t]*\/\/ README [A-Za-z0-9_]+ [{}]$/ { next }
    inside {
      lines[++n] = $0
      if ($0 !~ /^[ \t]*$/) {
        match($0, /^[ \t]*/)
        if (indent < 0 || RLENGTH < indent)
          indent = RLENGTH
      }
    }
    END { exit (found && !inside) ? 0 : 1 }
  ' "$1"
}

failures=0
quoted=()
work=$(mktemp -d "${TMPDIR:-/tmp}/troupe-readme-blocks.XXXXXX")
trap 'rm -rf "$work"' EXIT

for markdown in "${files[@]}"; do
  # Each C++ block as a file of its own, named by its first line number; its marker (or nothing)
  # in a .source file next to it.
  awk -v out="$work/block" '
    !fenced && /^```(cpp|c\+\+|cxx)[ \t]*$/ {
      fenced = 1; start = NR; file = out "." NR
      printf "" > file
      print (previous ~ /^<!-- example: [^ ]+ [A-Za-z0-9_]+ -->$/ ? previous : "") > (file ".source")
      close(file ".source")
      next
    }
    fenced && /^```[ \t]*$/ { fenced = 0; close(file); previous = $0; next }
    fenced { print > file; next }
    { previous = $0 }
  ' "$markdown"
  for block in "$work"/block.*; do
    [ -e "$block" ] || continue
    case $block in *.source) continue ;; esac
    line=${block##*.}
    read -r _ _ source name _ <"$block.source"
    if [ -z "${source:-}" ]; then
      echo "$markdown:$line: a C++ block without '<!-- example: examples/FILE.cpp REGION -->' before it"
      failures=$((failures + 1))
    elif [ ! -f "$source" ]; then
      echo "$markdown:$line: quotes $source, which does not exist"
      failures=$((failures + 1))
    elif ! region "$source" "$name" >"$block.expected"; then
      echo "$markdown:$line: $source has no complete region '$name' (// README $name { ... })"
      failures=$((failures + 1))
    elif ! diff -u --label "$source ($name)" --label "$markdown:$line" "$block.expected" "$block"; then
      echo "$markdown:$line: the block differs from region '$name' of $source (diff above)"
      failures=$((failures + 1))
    else
      quoted+=("$source $name")
    fi
    rm -f "$block" "$block.source" "$block.expected"
    source=""
  done
done

# Every region of the examples is quoted.
while read -r source name; do
  found=0
  for entry in "${quoted[@]}"; do
    [ "$entry" = "$source $name" ] && found=1
  done
  if [ "$found" -eq 0 ]; then
    echo "$source: region '$name' is quoted by no block of ${files[*]}"
    failures=$((failures + 1))
  fi
done < <(grep -HoE '^[[:space:]]*// README [A-Za-z0-9_]+ [{]$' examples/*.cpp |
  sed -E 's|^([^:]+):[[:space:]]*// README ([A-Za-z0-9_]+) [{]$|\1 \2|' | sort -u)

if [ "$failures" -ne 0 ]; then
  echo "readme blocks: $failures problem(s)"
  exit 1
fi
echo "readme blocks: each C++ block of ${files[*]} is a region of an example (${#quoted[@]} blocks)"
