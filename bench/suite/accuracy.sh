#!/usr/bin/env bash
# Family 6: cost-model accuracy, estimated vs measured iteration time and peak memory.
#
#   bench/suite/accuracy.sh --mode measured --dynapipe /tmp/dynapipe-torch
#   bench/suite/accuracy.sh                       # simulated: the two CPU cost models compared
#
# Measured: `dynapipe train` of gpt-tiny and t5-tiny at pp 1 and 2 (dynapipe strategy, max
# seqlen 512, 4,096 tokens per global batch) planned with `analytic:cpu` and with the
# bundled measured profiles; per run |est - measured| / measured of the median step time
# and peak memory. Simulated mode has nothing measured: it plans the same settings with both
# cost models and reports how far their iteration-time estimates are apart. Measured mode
# also trains with `analytic:cpu --refine-cost-model` for 8 steps (plans made after the
# first measured steps use the learnt factors; medians leave out step 0 as everywhere).
# Other flags: bench/suite/common.sh.
FAMILY=accuracy
source "$(dirname "$0")/common.sh"
parse_flags "$@"

L=512
tokens=4096
for m in $MODELS; do
  name=$m-tiny   # both modes: the tiny models the bundled profiles measured
  flags=(--model "$name" --max-seqlen "$L" --global-batch-tokens "$tokens")
  [ "$m" = t5 ] && flags+=(--max-target-len 512)
  for pp in 1 2; do
    for cm in analytic:cpu "assets/profiles/$name.cpu.measured.json"; do
      echo "$name pp $pp $cm" >&2
      point model="$name" pp="$pp" cost_model="$cm" strategy=dynapipe -- \
        "${flags[@]}" --pp "$pp" --cost-model "$cm" --strategy dynapipe
    done
    if [ "$MODE" = measured ]; then
      echo "$name pp $pp analytic:cpu refined" >&2
      saved_steps=$STEPS
      STEPS=8
      point model="$name" pp="$pp" cost_model="analytic:cpu+refine" strategy=dynapipe -- \
        "${flags[@]}" --pp "$pp" --cost-model analytic:cpu --strategy dynapipe --refine-cost-model
      STEPS=$saved_steps
    fi
  done
done
/usr/bin/python3 "$SUITE_DIR/accuracy_report.py" "$RECORDS" "$OUT/$FAMILY" "$MODE"
echo "wrote $OUT/$FAMILY.md and $OUT/$FAMILY.svg" >&2
