#!/usr/bin/env bash
# Family 2: throughput vs global batch size at a fixed max seqlen, every strategy.
#
#   bench/suite/batch.sh                          # simulated: 16k–131k tokens, max seqlen 2048
#   bench/suite/batch.sh --mode measured --dynapipe /tmp/dynapipe-torch   # 2k–8k tokens, 512
#
# Other flags: bench/suite/common.sh.
FAMILY=batch
source "$(dirname "$0")/common.sh"
parse_flags "$@"

if [ "$MODE" = simulated ]; then
  batches="16384 32768 65536 131072"; L=2048
else
  batches="2048 4096 8192"; L=512
fi
for m in $MODELS; do
  for B in $batches; do
    echo "$m global batch $B" >&2
    row "$ALL_STRATEGIES" model="$(model_name "$m")" global_batch_tokens="$B" -- \
      $(model_flags "$m") --max-seqlen "$L" --global-batch-tokens "$B"
  done
done
report --title "Throughput vs global batch (max seqlen $L)" \
  --x global_batch_tokens --xlabel "global batch (tokens)" --y tokens_per_s --ylabel "real tokens/s" \
  --ratio dynapipe/packing --log-x \
  --note "tokens/s counts real (unpadded) tokens; simulated = the plan's estimate, measured = median of steps after the first."
