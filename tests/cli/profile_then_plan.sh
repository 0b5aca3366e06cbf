#!/usr/bin/env bash
# `dynapipe profile` on a tiny grid, then `dynapipe plan --cost-model` and
# `dynapipe train --cost-model` (2 ranks, refining it) with that profile, for gpt-tiny and
# t5-tiny on the bundled text samples.
set -euo pipefail
binary=$1
samples=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
for model in gpt-tiny t5-tiny; do
  "$binary" profile --model "$model" --out "$work/$model.json" --batch-sizes 1,2,4 \
    --seqlens 16,32,64 --dec-seqlens 8,16 --warmup 1 --repeats 1 --no-progress
  grep -q '"format": "dynapipe-profile"' "$work/$model.json"
  "$binary" plan --samples "$samples" --model "$model" --cost-model "$work/$model.json" \
    --max-seqlen 128 --global-batch-tokens 512 --out "$work/$model.plan.json" --no-compare \
    >"$work/plan.out" 2>"$work/plan.err"
  # The grid stops at 64: plans at 128 extrapolate, and say so.
  grep -q "measured .*lengths up to 64, --max-seqlen is 128" "$work/plan.err"
  grep -q "\"cost_model\": \"$work/$model.json\"" "$work/$model.plan.json"
  "$binary" train --data "$samples" --model "$model" --cost-model "$work/$model.json" --pp 2 \
    --max-seqlen 128 --global-batch-tokens 512 --steps 4 --refine-cost-model --no-progress \
    --metrics "$work/$model.metrics.jsonl" >"$work/train.out" 2>"$work/train.err"
  [ "$(grep -c "lengths up to 64, --max-seqlen is 128" "$work/train.err")" = 1 ]  # rank 0 only
  grep -q '"summary":true' "$work/$model.metrics.jsonl"
  grep -q 'cost model refined    stage 0: fwd x' "$work/train.out"
done
# Without --seqlens the grid doubles up to --max-seqlen (here 48, 96): no warning at 96.
"$binary" profile --model gpt-tiny --out "$work/grid.json" --max-seqlen 96 --batch-sizes 1,2 \
  --warmup 0 --repeats 1 --no-progress
grep -q '"seqlen":96' "$work/grid.json"
"$binary" plan --samples "$samples" --model gpt-tiny --cost-model "$work/grid.json" --max-seqlen 96 \
  --global-batch-tokens 512 --out "$work/grid.plan.json" --no-compare >/dev/null 2>"$work/plan.err"
if grep -q "warning" "$work/plan.err"; then cat "$work/plan.err"; exit 1; fi
# T5's default decoder lengths double from 8 (short targets are priced inside the grid).
"$binary" profile --model t5-tiny --out "$work/t5grid.json" --max-seqlen 64 --max-target-len 32 \
  --seqlens 32,64 --batch-sizes 1,2 --warmup 0 --repeats 1 --no-progress
for d in 8 16 32; do grep -q "\"dec_seqlen\":$d[,}]" "$work/t5grid.json"; done
# Whole stages (--stages) at pp 2: a profile train plans with, no refinement.
"$binary" profile --stages --pp 2 --model gpt-tiny --out "$work/stages.json" --seqlens 16,32,64 \
  --max-tokens 128 --warmup 0 --repeats 1 --no-progress
grep -q '"format": "dynapipe-profile"' "$work/stages.json"
"$binary" train --data "$samples" --model gpt-tiny --cost-model "$work/stages.json" --pp 2 \
  --max-seqlen 64 --global-batch-tokens 512 --steps 2 --no-progress \
  --metrics "$work/stages.metrics.jsonl" >/dev/null 2>"$work/train.err"
grep -q '"summary":true' "$work/stages.metrics.jsonl"
echo "profile then plan and train: ok"
