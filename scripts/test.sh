#!/usr/bin/env bash
# Installs what is missing, builds everything and runs every test (what CI runs).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
# Warnings are errors here (CI): the whole tree, LibTorch units included, builds without one.
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DDYNAPIPE_WERROR=ON
cmake --build build -j2
cd build
ctest --output-on-failure -j2 "$@"
