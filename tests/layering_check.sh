#!/usr/bin/env bash
# Fails when an include runs against the layering of docs/architecture.md:
#   kernels/ uses nothing of troupe; engine/ uses kernels only and sees no CAF or Cap'n Proto;
#   schema/ sees no CAF, engine, kernels or actors. actors/ (and apps/, bench/, tests/ above it)
#   may use CAF and the wire's plain structs; Cap'n Proto itself stays inside schema/codec.cpp.
set -u
root=${1:-.}
cd "$root" || exit 2
bad=$( {
  grep -rnE '#include *[<"](caf|capnp|kj)/|#include *"(engine|schema|actors|apps)/' kernels
  grep -rnE '#include *[<"](caf|capnp|kj)/|#include *"(schema|actors|apps)/' engine
  grep -rnE '#include *[<"]caf/|#include *"(engine|kernels|actors|apps)/' schema
} 2>/dev/null )
if [ -n "$bad" ]; then
  echo "includes against the layering of docs/architecture.md:"
  echo "$bad"
  exit 1
fi
echo "layering ok: kernels -> engine -> actors, schema -> actors"
