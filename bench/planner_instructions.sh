#!/usr/bin/env bash
# Instructions one plan takes, per planner_bench benchmark: callgrind's count of what
# Planner::plan_iteration() executes on the benchmark's first global batch. Unlike the
# benchmark's times it does not drift with the VM's load (shared 2-vCPU machines swing
# ±15% between runs of one binary), so it is the figure to compare two builds by.
#
#   bench/planner_instructions.sh                          # build/bench/planner_bench
#   BASE=/tmp/base/build/bench/planner_bench bench/planner_instructions.sh   # and a baseline
#   FILTER='short256|tok16384' bench/planner_instructions.sh  # only those matching (grep -E)
#
# The counts include the allocator's: compare binaries linked alike (the planner benches link
# jemalloc since 2026-12-05, bench/CMakeLists.txt; earlier figures are on the C library's malloc).
#
# Prints one line per benchmark: its name, millions of instructions (and with BASE the
# baseline's and the change). Needs valgrind (apt-get install valgrind); valgrind runs ~50×
# slower, a few seconds per benchmark and binary (the seven take ~1 minute each binary).
set -euo pipefail

BENCH=${BENCH:-build/bench/planner_bench}
BASE=${BASE:-}
FILTER=${FILTER:-}

if ! command -v valgrind > /dev/null; then
  echo "error: valgrind not found; install it (apt-get install valgrind)" >&2
  exit 2
fi
for binary in "$BENCH" ${BASE:+"$BASE"}; do
  if [ ! -x "$binary" ]; then
    echo "error: $binary is not an executable planner_bench; build it (bash scripts/build.sh)" >&2
    exit 2
  fi
done

# Millions of instructions in plan_iteration() for one benchmark (its first iteration).
instructions() {
  local binary=$1 name=$2 collected
  collected=$(valgrind --tool=callgrind --callgrind-out-file=/dev/null \
                "--toggle-collect=dynapipe::Planner::plan_iteration(dynapipe::GlobalBatch const&) const" \
                "$binary" --benchmark_filter="^${name}\$" --benchmark_min_time=0.001 2>&1 |
              awk '/Collected :/ { print $4 }')
  if [ -z "$collected" ]; then
    echo "error: no callgrind count for $name from $binary" >&2
    exit 1
  fi
  awk -v n="$collected" 'BEGIN { printf "%.1f", n / 1e6 }'
}

mapfile -t names < <("$BENCH" --benchmark_list_tests | grep '^plan/' | grep -E -e "$FILTER")
if [ "${#names[@]}" -eq 0 ]; then
  echo "error: no plan/ benchmark matches FILTER '$FILTER'" >&2
  exit 2
fi
echo "# M instructions in Planner::plan_iteration (callgrind), first batch of each benchmark"
for name in "${names[@]}"; do
  mine=$(instructions "$BENCH" "$name")
  if [ -n "$BASE" ]; then
    base=$(instructions "$BASE" "$name")
    awk -v n="$name" -v a="$base" -v b="$mine" \
      'BEGIN { printf "%s: %s M (base %s M, %+.1f%%)\n", n, b, a, (b / a - 1) * 100 }'
  else
    echo "$name: $mine M"
  fi
done
