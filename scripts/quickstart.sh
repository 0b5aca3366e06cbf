#!/usr/bin/env bash
# Installs what is missing, builds the CLI, and runs the main job on the bundled data.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh dynapipe
# The main job: train gpt-tiny in two pipeline stages (two processes) on the bundled data,
# planning every iteration with dynapipe; a summary with measured vs estimated figures.
build/dynapipe train --data assets/flan_like_mix.jsonl.gz --model gpt-tiny --pp 2 \
  --strategy dynapipe --max-seqlen 1024 --global-batch-tokens 8192 --steps 20 \
  --metrics build/quickstart-metrics.jsonl
