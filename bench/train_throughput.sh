#!/usr/bin/env bash
# Measured training throughput of every strategy on this machine: `dynapipe train` on the
# same model, data and steps, one strategy after another; a Markdown table of median
# tokens/s (real tokens), step time, padding efficiency and the ratio to `packing`, and
# the tokens/s of the timed steps together (Σ tokens / Σ step time: the steps hold different
# batches, so the median step can be a different batch for each strategy).
#
# On a shared machine the speed drifts within minutes (2026-12-04 on the 2-vCPU VM: the
# same three gpt-tiny runs, in two orders, put dynapipe at 0.84x and at 1.20x
# token-based), so a comparison wants ROUNDS > 1: round k runs the strategies rotated by
# k (with ROUNDS a multiple of their count, each runs once in every position), and a
# second table pairs each strategy with the base step for step (every strategy trains the
# same global batches), per round and over all rounds (bench/train_throughput_report.py).
#
#   bench/train_throughput.sh                      # gpt-tiny, pp 2, max seqlen 2048
#   MODEL=t5-tiny STEPS=4 bench/train_throughput.sh
#   ROUNDS=3 STEPS=8 STRATEGIES="dynapipe packing-varlen token-based" bench/train_throughput.sh
#   STRATEGIES="dynapipe dynapipe@zb1p dynapipe@wait-free-cyclic" ROUNDS=3 bench/train_throughput.sh
#
# Environment: MODEL (gpt-tiny), PP (2), DP (1), MAX_SEQLEN (2048), TOKENS (16384 per
# global batch), STEPS (3), THREADS (1 per rank), DATA (the bundled dataset),
# STRATEGIES (all five; spaces or commas between names; NAME@SCHEDULE trains NAME with
# --schedule SCHEDULE), ROUNDS (1), DYNAPIPE (build/dynapipe), REPLICAS (1: none; e.g. 2,1
# runs stage 0 on two ranks, --replicas), TRAIN_FLAGS (more `train` flags, e.g.
# --release-freed-memory).
set -euo pipefail

DYNAPIPE=${DYNAPIPE:-build/dynapipe}
DATA=${DATA:-assets/flan_like_mix.jsonl.gz}
MODEL=${MODEL:-gpt-tiny}
PP=${PP:-2}
DP=${DP:-1}
MAX_SEQLEN=${MAX_SEQLEN:-2048}
TOKENS=${TOKENS:-16384}
STEPS=${STEPS:-3}
THREADS=${THREADS:-1}
REPLICAS=${REPLICAS:-1}
ROUNDS=${ROUNDS:-1}
TRAIN_FLAGS=${TRAIN_FLAGS:-}
STRATEGIES=${STRATEGIES:-"packing dynapipe packing-varlen token-based padding"}
STRATEGIES=${STRATEGIES//,/ }
if ! [[ "$ROUNDS" =~ ^[1-9][0-9]*$ ]]; then
  echo "error: ROUNDS must be a whole number >= 1, got '$ROUNDS'" >&2
  exit 2
fi
read -r -a LABELS <<< "$STRATEGIES"
if [ "${#LABELS[@]}" -eq 0 ]; then
  echo "error: STRATEGIES names no strategy, got '$STRATEGIES'" >&2
  exit 2
fi
# A receive waits for the peer's whole F+B of a micro-batch: padding's 30-row x 2048
# micro-batches take minutes on a CPU.
COMM_TIMEOUT=${COMM_TIMEOUT:-3600}
# METRICS_DIR keeps every run's metrics JSONL, as r<round>/<strategy>.jsonl (default: a
# temporary directory).
if [ -n "${METRICS_DIR:-}" ]; then
  TMP=$METRICS_DIR; mkdir -p "$TMP"
else
  TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fi

echo
echo "\`$DYNAPIPE train --data $DATA --model $MODEL --pp $PP --dp $DP --max-seqlen $MAX_SEQLEN" \
  "--global-batch-tokens $TOKENS --steps $STEPS --threads-per-rank $THREADS --replicas $REPLICAS $TRAIN_FLAGS --strategy S\`" \
  "($(nproc) cores, $(date -u +%Y-%m-%d)$( [ "$ROUNDS" -gt 1 ] && echo ", $ROUNDS rounds in rotated orders"))"
echo
count=${#LABELS[@]}
for ((round = 0; round < ROUNDS; round++)); do
  mkdir -p "$TMP/r$round"
  for ((k = 0; k < count; k++)); do
    label=${LABELS[$(( (k + round) % count ))]}
    strategy=${label%%@*}
    schedule=()
    if [[ "$label" == *@* ]]; then schedule=(--schedule "${label#*@}"); fi
    if [ "$ROUNDS" -gt 1 ]; then
      echo "running $label (round $((round + 1)) of $ROUNDS) ..." >&2
    else
      echo "running $label ..." >&2
    fi
    "$DYNAPIPE" train --data "$DATA" --model "$MODEL" --pp "$PP" --dp "$DP" --max-seqlen "$MAX_SEQLEN" \
      --global-batch-tokens "$TOKENS" --steps "$STEPS" --threads-per-rank "$THREADS" \
      --replicas "$REPLICAS" --strategy "$strategy" "${schedule[@]}" --metrics "$TMP/r$round/$label.jsonl" \
      --no-progress --comm-timeout "$COMM_TIMEOUT" $TRAIN_FLAGS > /dev/null || echo "$label failed; see above" >&2
  done
done

/usr/bin/python3 "$(dirname "$0")/train_throughput_report.py" "$TMP" "$ROUNDS" "${LABELS[@]}"
