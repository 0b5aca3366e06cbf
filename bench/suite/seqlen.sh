#!/usr/bin/env bash
# Family 1: throughput vs max sequence length at a fixed global batch, every strategy.
#
#   bench/suite/seqlen.sh                         # simulated, gpt-6.7b and t5-11b
#   bench/suite/seqlen.sh --mode measured --dynapipe /tmp/dynapipe-torch
#
# Simulated: max seqlen 512–8192, 65,536 tokens per global batch, A100 (40 GiB, 80 GiB where
# nothing fits 40) and GPT-6.7B on H100 80 GiB. Measured: max seqlen 256–1024, 4,096 tokens.
# Other flags: bench/suite/common.sh.
FAMILY=seqlen
source "$(dirname "$0")/common.sh"
parse_flags "$@"

seqlen_points
# The H100 variant: same GPT points on the 80 GiB H100 model (simulated only).
if [ "$MODE" = simulated ] && [[ " $MODELS " == *" gpt "* ]]; then
  DEVICE=h100
  for L in $seqlens; do
    row "$ALL_STRATEGIES" model="$(model_name gpt)" device=h100 max_seqlen="$L" -- \
      $(model_flags gpt) --max-seqlen "$L" --global-batch-tokens "$tokens"
  done
fi
[ "$MODE" = measured ] && dev="" || dev=",device"
report --title "Throughput vs max seqlen ($tokens tokens per global batch)" \
  --x max_seqlen --xlabel "max sequence length" --y tokens_per_s --ylabel "real tokens/s" \
  --group "model$dev" --ratio dynapipe/packing --ratio dynapipe/packing-varlen \
  --ratio dynapipe/token-based --ratio dynapipe/dynapipe-padded --log-x \
  --note "tokens/s counts real (unpadded) tokens; simulated = the plan's estimate, measured = median of steps after the first."
