#!/usr/bin/env bash
# Family 4: ablations on the same global batches.
#  - micro-batching: dynapipe's DP vs token-based vs packing (schedule auto);
#  - schedules on dynapipe's variable micro-batches: 1F1B vs the adaptive wait-free cyclic
#    schedule vs zero-bubble (zb1p), and `auto` (the planner's best of all).
#
#   bench/suite/ablation.sh                       # simulated: max seqlen 1024–4096, 65,536 tokens
#   bench/suite/ablation.sh --mode measured --dynapipe /tmp/dynapipe-torch   # 512–1024, 4,096
#
# Other flags: bench/suite/common.sh.
FAMILY=ablation
source "$(dirname "$0")/common.sh"
parse_flags "$@"

if [ "$MODE" = simulated ]; then
  seqlens="1024 2048 4096"; tokens=65536
else
  seqlens="512 1024"; tokens=4096
fi
for m in $MODELS; do
  for L in $seqlens; do
    echo "$m max seqlen $L" >&2
    common=(model="$(model_name "$m")" max_seqlen="$L" -- $(model_flags "$m") --max-seqlen "$L"
            --global-batch-tokens "$tokens")
    for s in dynapipe token-based packing; do
      row "$s" variant="$s" "${common[@]}" --schedule auto
    done
    for sched in 1f1b wait-free-cyclic zb1p; do
      row dynapipe variant="dynapipe/$sched" "${common[@]}" --schedule "$sched"
    done
  done
done
report --title "Ablations: micro-batching and schedules" --series variant \
  --x max_seqlen --xlabel "max sequence length" --y tokens_per_s --ylabel "real tokens/s" \
  --ratio dynapipe/packing --chart bar \
  --note "Columns dynapipe, token-based, packing: micro-batching with the planner's best schedule (auto). Columns dynapipe/S: dynapipe's micro-batches with schedule S fixed (wait-free-cyclic is DynaPipe's adaptive schedule)."
