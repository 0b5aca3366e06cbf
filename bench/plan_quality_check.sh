#!/usr/bin/env bash
# Prints dynapipe's estimated iteration ms at the 16 points of docs/RESULTS.md's issue-8
# table (GPT-6.7B pp 4 and pp 8 at 40 GiB, T5-11B pp 8 40 GiB and pp 4 80 GiB, max seqlen
# 1024 .. 8192), one line per point, so two planners' plans can be compared with diff:
#
#   DYNAPIPE=/tmp/dynapipe_base bench/plan_quality_check.sh > /tmp/before.txt
#   bench/plan_quality_check.sh > /tmp/after.txt
#   paste /tmp/before.txt /tmp/after.txt     # "after" must be the same or lower everywhere
#
# From the repository root, after a build. A planning change that alters which candidates
# are searched must not make any point slower.
set -euo pipefail

DYNAPIPE=${DYNAPIPE:-build/dynapipe}
for seqlen in 1024 2048 4096 8192; do
  for point in "gpt-6.7b 4 40 a100-40g" "gpt-6.7b 8 40 a100-40g" "t5-11b 8 40 a100-40g" \
               "t5-11b 4 80 a100-80g"; do
    read -r model pp gib gpu <<< "$point"
    flags=(--model "$model")
    [ "$model" = t5-11b ] && flags+=(--max-target-len 512)
    # The est. iter ms column of dynapipe's auto row ("-" or empty: infeasible there).
    ms=$("$DYNAPIPE" simulate --samples assets/flan_like_mix.jsonl.gz --iterations 3 \
           --strategies dynapipe --schedules auto "${flags[@]}" --pp "$pp" \
           --memory-limit "$gib" --cost-model "analytic:$gpu" --max-seqlen "$seqlen" \
           2> /dev/null |
         awk -F'|' '$2 ~ /dynapipe/ && $3 ~ /auto/ {gsub(/ /, "", $4); print $4; exit}') \
      || true
    echo "$model pp$pp ${gib}G $seqlen ${ms:-infeasible}"
  done
done
