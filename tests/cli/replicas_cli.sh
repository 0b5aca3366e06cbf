#!/usr/bin/env bash
# --replicas end to end: `dynapipe partition --out` JSON feeds `plan --replicas` (one
# program per stage-replica in the plan, its stage count checked against --pp), and
# `train` joining a torchrun-style job whose WORLD_SIZE is not dp x sum(replicas) stops
# with one line and exit 2 before it connects anywhere.
#   replicas_cli.sh DYNAPIPE SOURCE_DIR
set -euo pipefail
dynapipe=$1
root=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }
data="$root/tests/cli/data/small.jsonl"

# A hand-written partition (the shape `partition --out` writes) and the partitioner's own.
echo '{"time_per_stage": 1.0, "stages": [{"replicas": 2, "states": [0, 2]}, {"replicas": 1, "states": [2, 4]}]}' \
  >"$work/two.json"
"$dynapipe" plan --samples "$data" --model gpt-tiny --pp 2 --replicas "$work/two.json" --max-seqlen 512 \
  --global-batch-tokens 2048 --iterations 1 --out "$work/plan.json" --no-compare >/dev/null
grep -q '"stage_replicas": \[' "$work/plan.json" || fail "plan config lacks stage_replicas"
[ "$(grep -c '"stage_replica": 1' "$work/plan.json")" = 1 ] || fail "expected one executor of stage-replica 1"

# gpt-tiny's 4 layers over 3 workers at 3 GB/s: layer 0 (with the embedding) alone, the
# rest on two replicas.
"$dynapipe" partition --model gpt-tiny --seqlen 512 --workers 3 --bandwidth 3e9 --out "$work/p.json" >/dev/null
replicas=$(grep -o '"replicas": [0-9]*' "$work/p.json" | grep -o '[0-9]*$' | tr '\n' ',')
[ "$replicas" = "1,2," ] || fail "partition replicas: $replicas"
stages=2
"$dynapipe" plan --samples "$data" --model gpt-tiny --pp "$stages" --replicas "$work/p.json" --max-seqlen 512 \
  --global-batch-tokens 2048 --iterations 1 --out "$work/plan2.json" --no-compare >/dev/null ||
  fail "plan --replicas with partition output ($stages stages)"
tr -d ' \n' <"$work/plan2.json" | grep -q '"stage_replicas":\[1,2\]' || fail "plan config lacks stage_replicas 1,2"
wrong=$((stages + 1))
set +e
"$dynapipe" plan --samples "$data" --model gpt-tiny --pp "$wrong" --replicas "$work/p.json" \
  --out "$work/never.json" 2>"$work/err"
code=$?
set -e
[ "$code" = 2 ] || fail "stage count mismatch: exit $code"
grep -q "^error: --replicas must have one count per stage (--pp $wrong), got $stages stages in $work/p.json" \
  "$work/err" || fail "stage count mismatch message: $(cat "$work/err")"
[ ! -e "$work/never.json" ] || fail "plan written despite the error"

if "$dynapipe" --help 2>&1 | grep -qE '^ +train( |$)'; then
  set +e
  RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 "$dynapipe" train --data "$data" --model gpt-tiny \
    --pp 2 --replicas 2,1 --steps 1 --no-progress 2>"$work/err"
  code=$?
  set -e
  [ "$code" = 2 ] || fail "WORLD_SIZE mismatch: exit $code, stderr $(cat "$work/err")"
  [ "$(tail -n 1 "$work/err")" = "error: WORLD_SIZE must be --dp x the sum of --replicas = 1 x (2 + 1) = 3, got 2" ] ||
    fail "WORLD_SIZE mismatch message: $(cat "$work/err")"
fi
echo "replicas cli ok"
