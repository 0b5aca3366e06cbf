#!/usr/bin/env bash
# Every strategy at the issue-8 points (docs/RESULTS.md, "Issue 8: where every target
# stands"): GPT-6.7B pp 4 and pp 8 at 40 GiB, T5-11B pp 8 at 40 GiB and pp 4 at 80 GiB
# (analytic A100), max seqlen 1024 .. 8192, 65,536 tokens per global batch, each strategy
# on its own split with its best schedule. One line per point: est. iteration ms of
# dynapipe, packing, packing-varlen, token-based and dynapipe-padded, then the fastest
# other strategy and its time over dynapipe's; last, at how many points dynapipe is the
# fastest.
#
#   bench/issue8_points.sh                        # the bundled data, 3 iterations
#   SHUFFLE=1 ITERATIONS=6 bench/issue8_points.sh # the same samples in another order
#   POINTS="gpt-6.7b 4 80 assets/profiles/gpt-6.7b.h100.measured.json" bench/issue8_points.sh
#   RECOMPUTE=per-microbatch bench/issue8_points.sh  # every strategy with modes per micro-batch
#   PARTITION=joint bench/issue8_points.sh          # every strategy on its joint split (minutes)
#
# Environment: DYNAPIPE (build/dynapipe), DATA (the bundled dataset), ITERATIONS (3),
# SHUFFLE (a seed: shuffle DATA's lines first, so the global batches hold other samples;
# unset: as they are), SEQLENS (1024 2048 4096 8192), PLANNER_THREADS (0: one per hardware
# thread; the figures are the same for any count), POINTS (other points, ';'-separated, each
# "MODEL PP GIB COST_MODEL"; the default is the issue's four on analytic A100s), RECOMPUTE
# (--recompute for every strategy; default auto), PARTITION (--partition for every strategy;
# default balanced).
set -euo pipefail

DYNAPIPE=${DYNAPIPE:-build/dynapipe}
DATA=${DATA:-assets/flan_like_mix.jsonl.gz}
ITERATIONS=${ITERATIONS:-3}
SEQLENS=${SEQLENS:-"1024 2048 4096 8192"}
PLANNER_THREADS=${PLANNER_THREADS:-0}
RECOMPUTE=${RECOMPUTE:-auto}
PARTITION=${PARTITION:-balanced}
STRATEGIES=(dynapipe packing packing-varlen token-based dynapipe-padded)
DEFAULT_POINTS="gpt-6.7b 4 40 analytic:a100-40g;gpt-6.7b 8 40 analytic:a100-40g;t5-11b 8 40 analytic:a100-40g;t5-11b 4 80 analytic:a100-80g"
IFS=';' read -r -a POINT_LIST <<< "${POINTS:-$DEFAULT_POINTS}"

SOURCE=$DATA
if [ -n "${SHUFFLE:-}" ]; then
  TMP=$(mktemp -d)
  trap 'rm -rf "$TMP"' EXIT
  python3 - "$DATA" "$SHUFFLE" "$TMP/shuffled.jsonl.gz" <<'PY'
import gzip, random, sys
source, seed, target = sys.argv[1], int(sys.argv[2]), sys.argv[3]
opener = gzip.open if source.endswith(".gz") else open
lines = [l for l in opener(source, "rt").read().splitlines() if l.strip()]
random.Random(seed).shuffle(lines)
with gzip.open(target, "wt") as f:
    f.write("\n".join(lines) + "\n")
PY
  DATA=$TMP/shuffled.jsonl.gz
fi

echo "# $DYNAPIPE simulate --samples $SOURCE --iterations $ITERATIONS --schedules auto --recompute $RECOMPUTE" \
  "--partition $PARTITION" \
  "--strategies $(IFS=,; echo "${STRATEGIES[*]}")${SHUFFLE:+ (lines shuffled, seed $SHUFFLE)}"
echo "# point: ${STRATEGIES[*]} | fastest other ÷ dynapipe"
fastest=0 feasible=0
for seqlen in $SEQLENS; do
  for point in "${POINT_LIST[@]}"; do
    read -r model pp gib cost <<< "$point"
    flags=(--model "$model")
    [ "$model" = t5-11b ] && flags+=(--max-target-len 512)
    table=$("$DYNAPIPE" simulate --samples "$DATA" --iterations "$ITERATIONS" \
              --strategies "$(IFS=,; echo "${STRATEGIES[*]}")" --schedules auto "${flags[@]}" \
              --pp "$pp" --memory-limit "$gib" --cost-model "$cost" --max-seqlen "$seqlen" \
              --recompute "$RECOMPUTE" --partition "$PARTITION" --planner-threads "$PLANNER_THREADS" 2> /dev/null)
    line=$(awk -F'|' -v order="${STRATEGIES[*]}" '
      $3 ~ /auto/ { gsub(/ /, "", $2); gsub(/ /, "", $4); ms[$2] = $4 }
      END {
        n = split(order, names, " ")
        for (k = 1; k <= n; ++k) { v = ms[names[k]]; out = out (v == "" ? "-" : v) " " }
        mine = ms[names[1]]; best = ""; best_name = "-"
        for (k = 2; k <= n; ++k) {
          v = ms[names[k]]
          if (v != "" && v != "-" && (best == "" || v + 0 < best + 0)) { best = v; best_name = names[k] }
        }
        if (mine == "" || mine == "-" || best == "") { print out "| infeasible"; exit }
        printf "%s| %s %.3fx%s\n", out, best_name, best / mine, best + 0 < mine + 0 ? " (dynapipe slower)" : ""
      }' <<< "$table")
    echo "$model pp$pp ${gib}G $seqlen${POINTS:+ $(basename "$cost")}: $line"
    case "$line" in
      *infeasible*) ;;
      *"dynapipe slower"*) feasible=$((feasible + 1)) ;;
      *) feasible=$((feasible + 1)); fastest=$((fastest + 1)) ;;
    esac
  done
done
echo "dynapipe is the fastest (or tied) at $fastest of $feasible feasible points"
