#!/usr/bin/env bash
# How far the planner's estimates are from what `dynapipe train` measures: peak memory
# (the plan's est_peak_memory_bytes against the ranks' resident peak above their start)
# and step time, for gpt-tiny and t5-tiny at pp 1 and 2, max seqlen 1024 and 2048.
# A Markdown table: per config the median error over steps 1-5 (step 0 is warm-up), the
# worst step in brackets, the median MiB and seconds, and the median tokens/s.
#
#   bench/cost_accuracy.sh                                   # analytic:cpu, all 8 configs
#   COST_MODEL=gpt.json MODELS=gpt-tiny bench/cost_accuracy.sh
#
# Environment: DYNAPIPE (build/dynapipe), DATA (the bundled dataset), MODELS
# ("gpt-tiny t5-tiny"), PPS ("1 2"), SEQLENS ("1024 2048"), TOKENS (8192 per global
# batch), STEPS (6), COST_MODEL (analytic:cpu; a file name with {model} in it is expanded
# per model, e.g. "prof-{model}.json"), METRICS_DIR (keeps the metrics JSONL), TRAIN_FLAGS
# (more `train` flags, e.g. --release-freed-memory).
set -euo pipefail

DYNAPIPE=${DYNAPIPE:-build/dynapipe}
DATA=${DATA:-assets/flan_like_mix.jsonl.gz}
MODELS=${MODELS:-"gpt-tiny t5-tiny"}
PPS=${PPS:-"1 2"}
SEQLENS=${SEQLENS:-"1024 2048"}
TOKENS=${TOKENS:-8192}
STEPS=${STEPS:-6}
COST_MODEL=${COST_MODEL:-analytic:cpu}
if [ -n "${METRICS_DIR:-}" ]; then
  TMP=$METRICS_DIR; mkdir -p "$TMP"
else
  TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fi

echo
echo "\`$DYNAPIPE train --data $DATA --model M --pp P --strategy dynapipe --max-seqlen L" \
  "--global-batch-tokens $TOKENS --steps $STEPS --cost-model $COST_MODEL ${TRAIN_FLAGS:-}\` ($(nproc) cores, $(date -u +%Y-%m-%d))"
echo
configs=()
for model in $MODELS; do
  for pp in $PPS; do
    for seqlen in $SEQLENS; do
      name="$model-pp$pp-$seqlen"
      echo "running $name ..." >&2
      "$DYNAPIPE" train --data "$DATA" --model "$model" --pp "$pp" --strategy dynapipe --max-seqlen "$seqlen" \
        --global-batch-tokens "$TOKENS" --steps "$STEPS" --cost-model "${COST_MODEL//\{model\}/$model}" \
        --metrics "$TMP/$name.jsonl" --no-progress ${TRAIN_FLAGS:-} > /dev/null || echo "$name failed; see above" >&2
      configs+=("$name")
    done
  done
done

/usr/bin/python3 - "$TMP" "${configs[@]}" <<'EOF'
import json, statistics, sys
tmp, configs = sys.argv[1], sys.argv[2:]
print("| config | memory error | est / measured MiB | step time error | est / measured s | tokens/s |")
print("|---|---:|---:|---:|---:|---:|")
for name in configs:
    try:
        steps = [json.loads(l) for l in open(f"{tmp}/{name}.jsonl")]
    except FileNotFoundError:
        continue
    steps = [m for m in steps if not m.get("summary")][1:6]
    if not steps:
        continue
    def column(est, measured):
        errors = [(m[est] - m[measured]) / m[measured] for m in steps]
        worst = max(errors, key=abs)
        return f"{statistics.median(errors) * 100:+.0f}% ({worst * 100:+.0f}%)"
    mib = lambda key: statistics.median(m[key] for m in steps) / 2**20
    sec = lambda key: statistics.median(m[key] for m in steps)
    print(f"| {name} | {column('est_peak_memory_bytes', 'peak_memory_above_start_bytes')} "
          f"| {mib('est_peak_memory_bytes'):.0f} / {mib('peak_memory_above_start_bytes'):.0f} "
          f"| {column('est_step_time_s', 'step_time_s')} "
          f"| {sec('est_step_time_s'):.2f} / {sec('step_time_s'):.2f} | {sec('tokens_per_s'):.0f} |")
EOF
