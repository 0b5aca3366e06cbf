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
    >"$work/plan.out"
  grep -q "\"cost_model\": \"$work/$model.json\"" "$work/$model.plan.json"
  "$binary" train --data "$samples" --model "$model" --cost-model "$work/$model.json" --pp 2 \
    --max-seqlen 128 --global-batch-tokens 512 --steps 4 --refine-cost-model --no-progress \
    --metrics "$work/$model.metrics.jsonl" >"$work/train.out"
  grep -q '"summary":true' "$work/$model.metrics.jsonl"
  grep -q 'cost model refined    stage 0: fwd x' "$work/train.out"
done
echo "profile then plan and train: ok"
