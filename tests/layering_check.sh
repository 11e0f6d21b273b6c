#!/usr/bin/env bash
# Fails when an include runs against the layering of docs/architecture.md in a way that the build
# cannot catch. Each library's include root (cmake/TroupeIncludeRoots.cmake) already makes a
# troupe header resolve only where its library is linked (the wrong_include_fails_in_* tests show
# it), but CAF's and Cap'n Proto's headers are system headers that every target sees, and a
# relative include would bypass the include roots. So this checks the sources themselves:
#   kernels/ uses nothing of troupe; engine/ sees no CAF or Cap'n Proto; schema/ sees no CAF, and
#   only schema/codec.cpp includes Cap'n Proto (generated or not); actors/config/ and actors/logic/
#   see no CAF; actors/logic/ includes no actor (nothing of actors/ but actors/logic/ and
#   actors/config/); the actors in actors/ include neither the KVStore (actors/kvstore/) nor the
#   Trainer (actors/gluon/), which sit above them, and actors/kvstore/ not the Trainer.
#   Every include of a troupe header is spelled from the repository root ("engine/ndarray.hpp");
#   only tests/ and bench/ may include a helper of their own folder by its bare name (bench/ is
#   no library and has no include root), and nothing uses "../".
set -u
root=${1:-.}
cd "$root" || exit 2
sources=(--include='*.cpp' --include='*.hpp' --include='*.h' --include='*.cu')
bad=$( {
  grep -rnE '#include *[<"](caf|capnp|kj)/|#include *"(engine|schema|actors|apps)/' kernels
  grep -rnE '#include *[<"](caf|capnp|kj)/|#include *"(schema|actors|apps)/' engine
  grep -rnE '#include *[<"]caf/|#include *"(engine|kernels|actors|apps)/' schema
  grep -rnE '#include *[<"](capnp|kj)/|#include *"schema/troupe\.capnp\.h"' "${sources[@]}" \
    kernels engine schema actors apps bench tests | grep -v '^schema/codec\.cpp:'
  grep -rnE '#include *[<"]caf/' actors/config actors/logic
  grep -rnE '#include *"actors/' actors/config | grep -vE '#include *"actors/config/'
  grep -rnE '#include *"actors/' actors/logic | grep -vE '#include *"actors/(logic|config)/'
  grep -nE '#include *"actors/(kvstore|gluon)/' actors/*.hpp actors/*.cpp
  grep -rnE '#include *"actors/gluon/' actors/kvstore
  grep -rnE '#include *"' "${sources[@]}" kernels engine schema actors apps |
    grep -vE '#include *"(kernels|engine|schema|actors|apps)/'
  grep -rnE '#include *"\.\./' "${sources[@]}" tests bench
} 2>/dev/null )
if [ -n "$bad" ]; then
  echo "includes against the layering of docs/architecture.md:"
  echo "$bad"
  exit 1
fi
echo "layering ok: kernels -> engine -> {config, logic} -> actors -> kvstore -> gluon, schema -> {config, logic}"
