#!/usr/bin/env bash
# --planner-threads: `simulate`, `plan` and `tune` print and write the same with one thread
# as with three (each task writes its own slot; results are assembled in order), and so
# does one iteration planned on three threads (one plan's DPs side by side). Only the
# measured planning times may differ.
set -euo pipefail
binary=$1 root=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
data=$root/assets/flan_like_mix.jsonl.gz
model=(--samples "$data" --model gpt-small --pp 2 --max-seqlen 1024 --global-batch-tokens 16384
       --cost-model analytic:a100-40g)
common=("${model[@]}" --iterations 4)
fail() { echo "FAIL: $*"; exit 1; }

for t in 1 3; do
  "$binary" simulate "${common[@]}" --strategies dynapipe,packing-varlen,token-based \
    --schedules 1f1b,auto --planner-threads "$t" >"$work/simulate$t.txt" 2>/dev/null
  "$binary" plan "${common[@]}" --out "$work/plan$t.json" --planner-threads "$t" >/dev/null 2>&1
  "$binary" plan "${model[@]}" --iterations 1 --out "$work/one$t.json" --planner-threads "$t" >/dev/null 2>&1
  "$binary" tune --samples "$data" --model gpt-small --gpus 4 --max-seqlen 1024 \
    --global-batch-tokens 16384 --iterations 2 --strategies dynapipe,packing \
    --summary-json --planner-threads "$t" >"$work/tune$t.json" 2>/dev/null
done
grep -q '| dynapipe' "$work/simulate1.txt" || fail "simulate printed no dynapipe row"
cmp -s "$work/simulate1.txt" "$work/simulate3.txt" || fail "simulate differs: $(diff "$work/simulate1.txt" "$work/simulate3.txt")"
# Plans: the same bytes but the measured planning times (per iteration and summary).
strip() { grep -v 'planning_ms"' "$1"; }
[ "$(grep -c '"planning_ms"' "$work/plan1.json")" -ge 4 ] || fail "plan wrote fewer than 4 iterations"
cmp -s <(strip "$work/plan1.json") <(strip "$work/plan3.json") || fail "plan JSON differs beyond planning_ms"
grep -q '"planning_ms"' "$work/one1.json" || fail "plan --iterations 1 wrote no iteration"
cmp -s <(strip "$work/one1.json") <(strip "$work/one3.json") || fail "one iteration on 3 threads differs beyond planning_ms"
grep -q '"dynapipe"' "$work/tune1.json" || fail "tune found no dynapipe point"
cmp -s "$work/tune1.json" "$work/tune3.json" || fail "tune summary differs"
echo "planner threads: simulate, plan (4 iterations and 1) and tune the same with 1 and 3 threads"
