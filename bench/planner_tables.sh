#!/usr/bin/env bash
# Regenerates the planning tables of docs/RESULTS.md ("Planning (simulated, analytic A100)")
# from build/dynapipe on the bundled dataset. Markdown on stdout; each table is preceded
# by the exact command that produced it.
#
#   bench/planner_tables.sh > /tmp/tables.md      # from the repository root, after a build
#
# ITERATIONS (default 3) = global batches planned per table.
set -euo pipefail

DYNAPIPE=${DYNAPIPE:-build/dynapipe}
SAMPLES=assets/flan_like_mix.jsonl.gz
ITERATIONS=${ITERATIONS:-3}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# Runs one command, prints it and its markdown table (the lines starting with '|'), or the
# error line when the setting is infeasible (then returns 1).
table() {
  echo
  echo "\`${*//$TMP//tmp}\`"
  echo
  if "$@" > "$TMP/out" 2> "$TMP/err"; then
    # simulate reports infeasible rows instead of failing: all of them count as failure.
    if ! grep '^| [a-z]' "$TMP/out" | grep -v '^| strategy' | grep -vq 'infeasible\|n/a'; then
      echo "> every row is infeasible at this memory limit"
      return 1
    fi
    grep '^|' "$TMP/out"
    grep 'infeasible' "$TMP/err" | sed 's/^/> /' || true
  else
    echo "> $(grep '^error' "$TMP/err")"
    return 1
  fi
}

# T5 targets in the dataset are at most 300 tokens; --max-target-len 512 truncates none
# and keeps padding/packing from sizing decoder rows for max-seqlen.
model_flags() {
  if [ "$1" = t5-11b ]; then echo --model t5-11b --max-target-len 512; else echo --model "$1"; fi
}

# model pp seqlen [extra flags]: at 40 GiB on analytic:a100-40g, or, where that is
# infeasible, again at 80 GiB on analytic:a100-80g.
plan() {
  local model=$1 pp=$2 seqlen=$3
  shift 3
  for memory in 40 80; do
    table "$DYNAPIPE" plan --samples "$SAMPLES" $(model_flags "$model") --pp "$pp" \
      --memory-limit "$memory" --cost-model "analytic:a100-${memory}g" --max-seqlen "$seqlen" \
      --iterations "$ITERATIONS" --out "$TMP/plan.json" "$@" && return 0
  done
  return 0
}

simulate() {
  local model=$1 pp=$2 seqlen=$3
  shift 3
  for memory in 40 80; do
    table "$DYNAPIPE" simulate --samples "$SAMPLES" $(model_flags "$model") --pp "$pp" \
      --memory-limit "$memory" --cost-model "analytic:a100-${memory}g" --max-seqlen "$seqlen" \
      --iterations "$ITERATIONS" "$@" && return 0
  done
  return 0
}

echo "### dynapipe plan: strategies compared"
for seqlen in 1024 2048 4096 8192; do plan gpt-6.7b 4 "$seqlen"; done
for seqlen in 1024 2048 4096 8192; do plan t5-11b 8 "$seqlen"; done

echo
echo "### dynapipe simulate: strategy × schedule"
for model in gpt-6.7b t5-11b; do
  for pp in 4 8; do
    for seqlen in 2048 4096 8192; do simulate "$model" "$pp" "$seqlen"; done
  done
done
