#!/usr/bin/env bash
# Installs what is missing, builds, and runs the main job on the bundled data.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j2
build/dynapipe plan --samples assets/flan_like_mix.jsonl.gz --model gpt-6.7b --pp 4 \
  --max-seqlen 4096 --global-batch-tokens 65536 --memory-limit 40 \
  --cost-model analytic:a100-40g --iterations 4 --out build/plan.json
