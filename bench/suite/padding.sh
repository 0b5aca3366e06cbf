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

seqlen_points
[ "$MODE" = measured ] && dev="" || dev=",device"
report --title "Padding efficiency vs max seqlen ($tokens tokens per global batch)" \
  --x max_seqlen --xlabel "max sequence length" --y padding_efficiency --ylabel "real / computed tokens" \
  --group model$dev --fmt .3f --log-x
