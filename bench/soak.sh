#!/usr/bin/env bash
# The planner soak at full size: 10,000 random configurations through plan + lowering +
# verifier, and COUNT / 5 of the memory-bound ones (CI runs 1,000 and 600 of the same
# streams as SoakTest in dynapipe_planner_tests).
#   bash bench/soak.sh [COUNT] [FIRST_SEED]
set -euo pipefail
cd "$(dirname "$0")/.."
count=${1:-10000}
first=${2:-1}
test -x build/tests/planner/dynapipe_planner_tests || {
  echo "soak: build first (bash scripts/build.sh dynapipe_planner_tests)" >&2
  exit 2
}
start=$(date +%s)
DYNAPIPE_SOAK_CONFIGS=$count DYNAPIPE_SOAK_EDGE_CONFIGS=$(( count / 5 )) DYNAPIPE_SOAK_SEED=$first \
  build/tests/planner/dynapipe_planner_tests --gtest_filter='SoakTest.*'
echo "soak: $count configurations and $(( count / 5 )) memory-bound ones from seed $first in $(( $(date +%s) - start )) s"
