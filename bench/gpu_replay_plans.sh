#!/usr/bin/env bash
# The plans bench/gpu_replay.py replays: each strategy's plan (its own split, --schedule
# auto) at every point of the issue-8 family on a profile cost model, with the executors'
# instructions dropped (the replay reads the micro-batches and the timeline; 80 plans are
# ~7 MB instead of ~46 MB, small enough to carry to a GPU machine).
#
#   bench/gpu_replay_plans.sh .gpu      # GPT-6.7B and T5-11B on the bundled H100 profiles
#   PROFILE_GPT=h200.gpt-6.7b.json MODELS=gpt-6.7b bench/gpu_replay_plans.sh .gpu
#   python3 bench/gpu_replay.py --rounds 3 --samples assets/flan_like_mix.jsonl.gz \
#       --out replay.json .gpu/*.json   # on the GPU
#
# Environment: DYNAPIPE (build/dynapipe), DATA (the bundled dataset), MODELS (gpt-6.7b
# t5-11b), PPS (4 8), SEQLENS (1024 2048 4096 8192), GIB (80), ITERATIONS (2),
# STRATEGIES (dynapipe packing packing-varlen token-based dynapipe-padded), PROFILE_GPT and
# PROFILE_T5 (the cost models; default: assets/profiles/<model>.h100.measured.json).
# T5 plans take --max-target-len 512. Files: OUTDIR/<model>-pp<P>-<seqlen>-<strategy>.json.
set -euo pipefail

if [ $# -ne 1 ]; then
  echo "usage: $0 OUTDIR" >&2
  exit 2
fi
OUTDIR=$1
DYNAPIPE=${DYNAPIPE:-build/dynapipe}
DATA=${DATA:-assets/flan_like_mix.jsonl.gz}
MODELS=${MODELS:-"gpt-6.7b t5-11b"}
PPS=${PPS:-"4 8"}
SEQLENS=${SEQLENS:-"1024 2048 4096 8192"}
GIB=${GIB:-80}
ITERATIONS=${ITERATIONS:-2}
STRATEGIES=${STRATEGIES:-"dynapipe packing packing-varlen token-based dynapipe-padded"}
PROFILE_GPT=${PROFILE_GPT:-assets/profiles/gpt-6.7b.h100.measured.json}
PROFILE_T5=${PROFILE_T5:-assets/profiles/t5-11b.h100.measured.json}

if [ ! -x "$DYNAPIPE" ]; then
  echo "error: $DYNAPIPE is not an executable dynapipe; build it (bash scripts/build.sh)" >&2
  exit 2
fi
mkdir -p "$OUTDIR"
made=0 infeasible=0
for model in $MODELS; do
  case $model in
    gpt-*) profile=$PROFILE_GPT flags=() ;;
    t5-*) profile=$PROFILE_T5 flags=(--max-target-len 512) ;;
    *) echo "error: MODELS: expected gpt-* or t5-* presets, got $model" >&2; exit 2 ;;
  esac
  for pp in $PPS; do
    for seqlen in $SEQLENS; do
      for strategy in $STRATEGIES; do
        out=$OUTDIR/$model-pp$pp-$seqlen-$strategy.json
        # Exit 2 with "infeasible" is a point no plan of this strategy fits: skipped, counted.
        if ! log=$("$DYNAPIPE" plan --samples "$DATA" --model "$model" "${flags[@]}" --pp "$pp" \
                     --memory-limit "$GIB" --cost-model "$profile" --max-seqlen "$seqlen" \
                     --iterations "$ITERATIONS" --strategy "$strategy" --no-compare --out "$out" 2>&1); then
          if grep -q "infeasible\|no schedule fits\|must exceed the static memory" <<< "$log"; then
            infeasible=$((infeasible + 1))
            echo "$model pp $pp $seqlen $strategy: infeasible, skipped"
            continue
          fi
          echo "$log" >&2
          exit 1
        fi
        python3 - "$out" <<'PY'
import json, sys
path = sys.argv[1]
with open(path) as f:
    plan = json.load(f)
for iteration in plan["iterations"]:
    for replica in iteration["replicas"]:
        replica.pop("executors", None)
with open(path, "w") as f:
    json.dump(plan, f)
PY
        made=$((made + 1))
      done
    done
  done
done
echo "$made plans in $OUTDIR ($infeasible infeasible points skipped)"
