#!/usr/bin/env bash
# Family 5: planning time per iteration vs global batch size (dynapipe strategy, max seqlen
# 2048). Planning always runs on this CPU: simulated mode times `dynapipe plan` for the
# paper's model sizes; measured mode reads the planning_ms that `dynapipe train` reports
# for the tiny models. bench/planner_bench times the same planner under Google Benchmark.
#
#   bench/suite/planning_time.sh                  # 16k–262k tokens
#   bench/suite/planning_time.sh --mode measured --dynapipe /tmp/dynapipe-torch   # 2k–8k
#
# Other flags: bench/suite/common.sh.
FAMILY=planning_time
source "$(dirname "$0")/common.sh"
ITERATIONS=10   # timings on a shared VM are noisy: average more iterations (--iterations overrides)
parse_flags "$@"

if [ "$MODE" = simulated ]; then
  batches="16384 32768 65536 131072 262144"; L=2048
else
  batches="2048 4096 8192"; L=512
fi
for m in $MODELS; do
  for B in $batches; do
    echo "$m global batch $B" >&2
    row dynapipe model="$(model_name "$m")" global_batch_tokens="$B" -- \
      $(model_flags "$m") --max-seqlen "$L" --global-batch-tokens "$B"
  done
done
y=planning_ms
[ "$MODE" = simulated ] && y=planning_ms,p99_planning_ms
report --title "Planning time per iteration (max seqlen $L)" --series model --group mode \
  --x global_batch_tokens --xlabel "global batch (tokens)" --y "$y" --ylabel "ms per iteration" \
  --fmt .2f --log-x \
  --note "Wall time on a shared 2-vCPU VM; planning_ms = mean over the planned iterations (simulated) or median over steps after the first (measured)."
