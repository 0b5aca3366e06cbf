#!/usr/bin/env bash
# Wall times of two planner_bench builds, run in turn: on this shared VM one binary's times
# swing by up to 1.5× between minutes, so two builds are only compared in alternating
# rounds (each round's first binary alternating too), by the median and the minimum of all
# their repetitions.
#
#   BASE=/tmp/base/planner_bench bench/planner_wall_times.sh               # every plan/ benchmark
#   BASE=... FILTER='short256/threads2/real_time$' ROUNDS=6 bench/planner_wall_times.sh
#
# BENCH (build/bench/planner_bench) and BASE are the two binaries; FILTER a
# --benchmark_filter regex (default '^plan/'); ROUNDS alternations (default 5) of
# REPETITIONS runs each (default 5). Prints per benchmark and binary: median and minimum
# (ms) over ROUNDS × REPETITIONS runs. Instructions, which do not drift, are
# bench/planner_instructions.sh's.
set -euo pipefail

BENCH=${BENCH:-build/bench/planner_bench}
BASE=${BASE:-}
FILTER=${FILTER:-^plan/}
ROUNDS=${ROUNDS:-5}
REPETITIONS=${REPETITIONS:-5}

if [ -z "$BASE" ]; then
  echo "error: BASE must name the planner_bench to compare with" >&2
  exit 2
fi
for binary in "$BENCH" "$BASE"; do
  if [ ! -x "$binary" ]; then
    echo "error: $binary is not an executable planner_bench; build it (bash scripts/build.sh)" >&2
    exit 2
  fi
done

# The second binary of a round ran up to ~10% slower than the first in A/A runs (the same
# build twice), so the order alternates from round to round.
for ((round = 1; round <= ROUNDS; ++round)); do
  echo "round $round of $ROUNDS" >&2
  order=("$BASE" "$BENCH")
  ((round % 2 == 0)) && order=("$BENCH" "$BASE")
  for binary in "${order[@]}"; do
    label=base
    [ "$binary" = "$BENCH" ] && label=new
    "$binary" --benchmark_filter="$FILTER" --benchmark_repetitions="$REPETITIONS" \
        --benchmark_time_unit=ms 2>/dev/null |
      awk -v label="$label" '$2 ~ /^[0-9.]+$/ && $3 == "ms" && $1 !~ /_(mean|median|stddev|cv)$/ { print $1, label, $2 }'
  done
done | python3 -c '
import collections, statistics, sys
times = collections.defaultdict(list)
for line in sys.stdin:
    name, label, ms = line.split()
    times[(name, label)].append(float(ms))
print("# benchmark: base median (min) -> new median (min), ms; change of the medians")
for name in sorted({n for n, _ in times}):
    base, new = times.get((name, "base")), times.get((name, "new"))
    if not base or not new:
        continue
    mb, mn = statistics.median(base), statistics.median(new)
    print(f"{name}: {mb:.2f} ({min(base):.2f}) -> {mn:.2f} ({min(new):.2f}); {(mn / mb - 1) * 100:+.1f}%")
'
