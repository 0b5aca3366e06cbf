#!/usr/bin/env bash
# Installs what is missing, configures build/ once and builds the given targets (all
# when none). quickstart.sh and test.sh both come through here with the same flags, so
# the second reuses the first's objects instead of compiling the tree again.
#   bash scripts/build.sh [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
# Warnings are errors everywhere (the tree has none on Debian 12's g++ 12, LibTorch units
# included); one set of flags for every entry point keeps build/ valid for all of them.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDYNAPIPE_WERROR=ON >/dev/null
if [ $# -eq 0 ]; then
  cmake --build build -j2
else
  targets=()
  for t in "$@"; do targets+=(--target "$t"); done
  cmake --build build -j2 "${targets[@]}"
fi
