#!/usr/bin/env bash
# Plans priced for the card they run on, in one call on a GPU machine: measure a model's
# layers on this GPU (bench/gpu_profile.py), plan the issue-8 family with that profile
# (bench/gpu_replay_plans.sh: every strategy, its own split, --schedule auto), and replay
# every plan's micro-batches on the same GPU (bench/gpu_replay.py). This answers whether
# the order of the strategies that the replay of plans made on another card's profile gave
# (docs/RESULTS.md, "GPU: the issue-8 plans replayed") holds when the planner knows the card.
#
#   bench/gpu_plans_on_their_card.sh gpt-6.7b OUTDIR      # on the GPU machine
#
# Needs a dynapipe CLI there (DYNAPIPE; a torch-free build is enough: planning only) and
# PyTorch with CUDA. Environment: DYNAPIPE (build/dynapipe), DEVICE_NAME (the profile's
# device.name; default the GPU's), ROUNDS (3), PPS, SEQLENS, GIB (as gpu_replay_plans.sh),
# PROFILE_TIMEOUT / REPLAY_TIMEOUT (seconds; 300 / 330: a step cut short keeps what it
# wrote). Files: OUTDIR/<model>.profile.json, OUTDIR/plans/, OUTDIR/replay.json and a log
# of each step.
set -euo pipefail

if [ $# -ne 2 ]; then
  echo "usage: $0 MODEL OUTDIR   (MODEL: gpt-6.7b or t5-11b)" >&2
  exit 2
fi
MODEL=$1
OUTDIR=$2
case $MODEL in
  gpt-6.7b | t5-11b) ;;
  *) echo "error: MODEL: expected gpt-6.7b or t5-11b, got $MODEL" >&2; exit 2 ;;
esac
cd "$(dirname "$0")/.."
DYNAPIPE=${DYNAPIPE:-build/dynapipe}
ROUNDS=${ROUNDS:-3}
PROFILE_TIMEOUT=${PROFILE_TIMEOUT:-300}
REPLAY_TIMEOUT=${REPLAY_TIMEOUT:-330}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUTDIR/plans"
profile=$OUTDIR/$MODEL.profile.json
name_flag=()
if [ -n "${DEVICE_NAME:-}" ]; then name_flag=(--device-name "$DEVICE_NAME"); fi
profile_flags=()
if [ "$MODEL" = t5-11b ]; then profile_flags=(--dec-seqlens 32,128,512 --max-tokens 65536 --repeats 3); fi

# The model file: the bundled H100 profile's model entry (the same shapes as the preset).
"$PYTHON" -c 'import json, sys; json.dump(json.load(open(sys.argv[1]))["model"], open(sys.argv[2], "w"))' \
  "assets/profiles/$MODEL.h100.measured.json" "$OUTDIR/$MODEL.model.json"
SECONDS=0
timeout "$PROFILE_TIMEOUT" "$PYTHON" bench/gpu_profile.py --model "$OUTDIR/$MODEL.model.json" \
  --out "$profile" "${name_flag[@]}" "${profile_flags[@]}" > "$OUTDIR/profile.log" 2>&1
echo "profiled $MODEL in $SECONDS s: $profile"

SECONDS=0
case $MODEL in
  gpt-*) PROFILE_GPT=$profile MODELS=$MODEL DYNAPIPE=$DYNAPIPE bash bench/gpu_replay_plans.sh "$OUTDIR/plans" ;;
  t5-*) PROFILE_T5=$profile MODELS=$MODEL DYNAPIPE=$DYNAPIPE bash bench/gpu_replay_plans.sh "$OUTDIR/plans" ;;
esac > "$OUTDIR/plans.log" 2>&1
echo "planned in $SECONDS s: $(tail -1 "$OUTDIR/plans.log")"

SECONDS=0
timeout "$REPLAY_TIMEOUT" "$PYTHON" bench/gpu_replay.py --rounds "$ROUNDS" --warmup 1 --repeats 2 --seed 2 \
  --samples "${DATA:-assets/flan_like_mix.jsonl.gz}" --out "$OUTDIR/replay.json" "$OUTDIR"/plans/*.json \
  > "$OUTDIR/replay.log" 2>&1
echo "replayed in $SECONDS s"
sed -n '/^# point/,$p' "$OUTDIR/replay.log"
