#!/usr/bin/env bash
# Asynchronous schedules against flushing 1F1B on this machine: `dynapipe train` with
# --schedule 1f1b, pipedream, pipedream --vertical-sync and pipedream-2bw on the same
# model, data and micro-batches (padding, fixed rows per micro-batch, so every schedule
# runs the same micro-batches); a Markdown table of median tokens/s, step time, peak
# memory (RSS and the executor's held tensors, weight copies included) and the loss at
# the first and last step.
#
#   bench/async_throughput.sh                  # gpt-tiny, pp 2, 50 steps
#   STEPS=10 PP=4 bench/async_throughput.sh
#
# Environment: MODEL (gpt-tiny), PP (2), MAX_SEQLEN (256), TOKENS (4096 per global
# batch), MBS (rows per micro-batch, 4), STEPS (50), THREADS (1 per rank), LR (1e-3),
# DATA (the bundled dataset), DYNAPIPE (build/dynapipe).
set -euo pipefail

DYNAPIPE=${DYNAPIPE:-build/dynapipe}
DATA=${DATA:-assets/flan_like_mix.jsonl.gz}
MODEL=${MODEL:-gpt-tiny}
PP=${PP:-2}
MAX_SEQLEN=${MAX_SEQLEN:-256}
TOKENS=${TOKENS:-4096}
MBS=${MBS:-4}
STEPS=${STEPS:-50}
THREADS=${THREADS:-1}
LR=${LR:-1e-3}
TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT

echo
echo "\`$DYNAPIPE train --data $DATA --model $MODEL --pp $PP --max-seqlen $MAX_SEQLEN" \
  "--global-batch-tokens $TOKENS --strategy padding --micro-batch-size $MBS --steps $STEPS" \
  "--lr $LR --threads-per-rank $THREADS --schedule S\` ($(nproc) cores, $(date -u +%Y-%m-%d))"
echo
RUNS="1f1b pipedream pipedream+vsync pipedream-2bw"
for run in $RUNS; do
  schedule=${run%+vsync}
  extra=()
  [ "$run" != "$schedule" ] && extra=(--vertical-sync)
  echo "running $run ..." >&2
  "$DYNAPIPE" train --data "$DATA" --model "$MODEL" --pp "$PP" --max-seqlen "$MAX_SEQLEN" \
    --global-batch-tokens "$TOKENS" --strategy padding --micro-batch-size "$MBS" \
    --steps "$STEPS" --lr "$LR" --threads-per-rank "$THREADS" --schedule "$schedule" \
    "${extra[@]}" --metrics "$TMP/$run.jsonl" --no-progress > /dev/null ||
    echo "$run failed; see above" >&2
done

/usr/bin/python3 - "$TMP" $RUNS <<'PY'
import json, statistics, sys
tmp, runs = sys.argv[1], sys.argv[2:]
print("| schedule | tokens/s (median) | vs 1f1b | step s (median) | peak RSS MiB | held tensors MiB "
      "| micro-batches | loss step 0 | loss last step |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
base = None
for run in runs:
    try:
        steps = [json.loads(l) for l in open(f"{tmp}/{run}.jsonl")]
    except FileNotFoundError:
        continue
    steps = [m for m in steps if not m.get("summary")]
    timed = steps[1:] if len(steps) > 1 else steps  # step 0 includes warm-up
    tps = statistics.median(m["tokens_per_s"] for m in timed)
    base = base or tps
    mib = 1 << 20
    print(f"| {run.replace('+vsync', ' --vertical-sync')} | {tps:.0f} | {tps / base:.2f}x "
          f"| {statistics.median(m['step_time_s'] for m in timed):.2f} "
          f"| {max(m['peak_memory_bytes'] for m in steps) / mib:.0f} "
          f"| {max(m['held_peak_bytes'] for m in steps) / mib:.1f} "
          f"| {statistics.median(m['microbatches'] for m in steps):.0f} "
          f"| {steps[0]['loss']:.4f} | {steps[-1]['loss']:.4f} |")
PY
