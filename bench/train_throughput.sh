#!/usr/bin/env bash
# Measured training throughput of every strategy on this machine: `dynapipe train` on the
# same model, data and steps, one strategy after another; a Markdown table of median
# tokens/s (real tokens), step time, padding efficiency and the ratio to `packing`, and
# the tokens/s of the timed steps together (Σ tokens / Σ step time: the steps hold different
# batches, so the median step can be a different batch for each strategy).
#
#   bench/train_throughput.sh                      # gpt-tiny, pp 2, max seqlen 2048
#   MODEL=t5-tiny STEPS=4 bench/train_throughput.sh
#
# Environment: MODEL (gpt-tiny), PP (2), DP (1), MAX_SEQLEN (2048), TOKENS (16384 per
# global batch), STEPS (3), THREADS (1 per rank), DATA (the bundled dataset),
# STRATEGIES (all five; spaces or commas between names), DYNAPIPE (build/dynapipe), REPLICAS (1: none; e.g. 2,1 runs
# stage 0 on two ranks, --replicas), TRAIN_FLAGS (more `train` flags, e.g.
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
TRAIN_FLAGS=${TRAIN_FLAGS:-}
STRATEGIES=${STRATEGIES:-"packing dynapipe packing-varlen token-based padding"}
STRATEGIES=${STRATEGIES//,/ }
# A receive waits for the peer's whole F+B of a micro-batch: padding's 30-row x 2048
# micro-batches take minutes on a CPU.
COMM_TIMEOUT=${COMM_TIMEOUT:-3600}
# METRICS_DIR keeps every run's metrics JSONL (default: a temporary directory).
if [ -n "${METRICS_DIR:-}" ]; then
  TMP=$METRICS_DIR; mkdir -p "$TMP"
else
  TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fi

echo
echo "\`$DYNAPIPE train --data $DATA --model $MODEL --pp $PP --dp $DP --max-seqlen $MAX_SEQLEN" \
  "--global-batch-tokens $TOKENS --steps $STEPS --threads-per-rank $THREADS --replicas $REPLICAS $TRAIN_FLAGS --strategy S\`" \
  "($(nproc) cores, $(date -u +%Y-%m-%d))"
echo
for strategy in $STRATEGIES; do
  echo "running $strategy ..." >&2
  "$DYNAPIPE" train --data "$DATA" --model "$MODEL" --pp "$PP" --dp "$DP" --max-seqlen "$MAX_SEQLEN" \
    --global-batch-tokens "$TOKENS" --steps "$STEPS" --threads-per-rank "$THREADS" \
    --replicas "$REPLICAS" --strategy "$strategy" --metrics "$TMP/$strategy.jsonl" --no-progress \
    --comm-timeout "$COMM_TIMEOUT" $TRAIN_FLAGS > /dev/null || echo "$strategy failed; see above" >&2
done

/usr/bin/python3 - "$TMP" $STRATEGIES <<'EOF'
import json, statistics, sys
tmp, strategies = sys.argv[1], sys.argv[2:]
rows = {}
for s in strategies:
    try:
        steps = [json.loads(l) for l in open(f"{tmp}/{s}.jsonl")]
    except FileNotFoundError:
        continue
    steps = [m for m in steps if not m.get("summary")]
    if not steps:
        continue
    # Step 0 includes warm-up (first allocations, planning the first plans): report the rest.
    timed = steps[1:] if len(steps) > 1 else steps
    real = sum(m["real_tokens"] for m in steps)
    padded = sum(m["padded_tokens"] for m in steps)
    rows[s] = dict(
        tps=statistics.median(m["tokens_per_s"] for m in timed),
        # Steps hold different batches: the whole timed run's rate weighs them by time.
        total_tps=sum(m["real_tokens"] for m in timed) / sum(m["step_time_s"] for m in timed),
        step=statistics.median(m["step_time_s"] for m in timed),
        est=statistics.median(m["est_step_time_s"] for m in timed),
        eff=real / padded if padded else 0.0,
        peak=max(m["peak_memory_above_start_bytes"] for m in steps) / 2**20,
        loss=steps[-1]["loss"])
if not rows:
    sys.exit("error: no strategy trained (see the errors above)")
# The ratio column is to packing, or to the first strategy that trained without it.
base_name = "packing" if "packing" in rows else next(iter(rows))
base = rows[base_name]["tps"]
print(f"| strategy | tokens/s (median) | vs {base_name} | step s (median) | est. step s | padding eff. | peak MiB above start | final loss | tokens/s (timed steps together) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
for s, r in rows.items():
    print(f"| {s} | {r['tps']:.0f} | {r['tps'] / base:.2f}x | {r['step']:.2f} | {r['est']:.2f} "
          f"| {r['eff']:.3f} | {r['peak']:.0f} | {r['loss']:.4f} | {r['total_tps']:.0f} |")
EOF
