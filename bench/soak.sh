#!/usr/bin/env bash
# The planner soak at full size: 10,000 random configurations through plan + lowering +
# verifier (CI runs 1,000 of the same stream as SoakTest in dynapipe_planner_tests).
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
DYNAPIPE_SOAK_CONFIGS=$count DYNAPIPE_SOAK_SEED=$first \
  build/tests/planner/dynapipe_planner_tests --gtest_filter='SoakTest.*'
echo "soak: $count configurations from seed $first in $(( $(date +%s) - start )) s"
