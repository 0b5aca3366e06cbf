#!/usr/bin/env bash
# Family 3: padding efficiency (real tokens / tokens computed) per strategy and max seqlen.
#
#   bench/suite/padding.sh                        # simulated: max seqlen 512–8192, 65,536 tokens
#   bench/suite/padding.sh --mode measured --dynapipe /tmp/dynapipe-torch   # 256–1024, 4,096
#
# Padding depends on the micro-batches only, so both modes should agree at equal settings;
# the measured mode counts what the executors actually ran. The points are family 1's:
# `--reuse bench/out/seqlen` tabulates them without running again. Other flags: common.sh.
FAMILY=padding
source "$(dirname "$0")/common.sh"
parse_flags "$@"

if [ "$MODE" = simulated ]; then
  seqlens="512 1024 2048 4096 8192"; tokens=65536
else
  seqlens="256 512 1024"; tokens=4096
fi
for m in $MODELS; do
  for L in $seqlens; do
    echo "$m max seqlen $L" >&2
    row "$ALL_STRATEGIES" model="$(model_name "$m")" device=a100 max_seqlen="$L" -- \
      $(model_flags "$m") --max-seqlen "$L" --global-batch-tokens "$tokens"
  done
done
[ "$MODE" = measured ] && dev="" || dev=",device"
report --title "Padding efficiency vs max seqlen ($tokens tokens per global batch)" \
  --x max_seqlen --xlabel "max sequence length" --y padding_efficiency --ylabel "real / computed tokens" \
  --group model$dev --fmt .3f --log-x
