#!/usr/bin/env bash
# `dynapipe partition` end to end: --summary-json is one JSON line with PipeDream's optimum;
# --model exports a transformer's layers (the straight pipeline on a fast link is the
# balanced split, 9,10,13,16 for T5-11B at 1024/256 tokens, as tests/cost checks); the
# exported graph.txt reads back to the same stages. `plan`'s table shows the split each
# strategy planned on, the one its plan file records.
#   partition_cli.sh DYNAPIPE SOURCE_DIR
set -euo pipefail
dynapipe=$1
root=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

"$dynapipe" partition --graph-txt "$root/assets/pipedream-profiles/vgg16.graph.txt" --workers 4 --bandwidth 1e9 \
  --summary-json >"$work/summary"
[ "$(wc -l <"$work/summary")" = 1 ] || fail "--summary-json printed more than one line"
grep -q '^{"time_per_stage":0\.20552089[0-9]*,"stages":\[{"replicas":3,"states":\[0,17\],' "$work/summary" ||
  fail "vgg16 4 workers: $(cat "$work/summary")"

"$dynapipe" partition --model t5-11b --seqlen 1024 --dec-seqlen 256 --workers 4 --bandwidth 1e15 --straight \
  --summary-json --write-graph-txt "$work/t5.graph.txt" >"$work/t5"
states=$(grep -o '"states":\[[0-9]*,[0-9]*\]' "$work/t5" | tr -d '"states:[]' | tr '\n' ' ')
[ "$states" = "0,9 9,19 19,32 32,48 " ] || fail "t5-11b straight stages: $states"
[ "$(grep -c -- '-- stage_id=' "$work/t5.graph.txt")" = 49 ] || fail "exported graph lacks stage ids"
"$dynapipe" partition --graph-txt "$work/t5.graph.txt" --workers 4 --bandwidth 1e15 --straight --summary-json >"$work/again"
again=$(grep -o '"states":\[[0-9]*,[0-9]*\]' "$work/again" | tr -d '"states:[]' | tr '\n' ' ')
[ "$again" = "$states" ] || fail "re-read graph.txt stages: $again"
# T5-11B pp 8 at 40 GiB, 2048 / 512: balanced's split is not uniform (docs/partition.md).
plan_layers() {  # PARTITION: the dynapipe row's layers/stage column, then the plan file's
  "$dynapipe" plan --samples "$root/assets/flan_like_mix.jsonl.gz" --model t5-11b --pp 8 --memory-limit 40 \
    --cost-model analytic:a100-40g --max-seqlen 2048 --max-target-len 512 --global-batch-tokens 65536 \
    --iterations 1 --partition "$1" --no-compare --out "$work/plan.json" >"$work/plan.txt"
  grep '^| dynapipe ' "$work/plan.txt" | awk -F'|' '{ gsub(/ /, "", $10); print $10 }'
  tr -d ' \n' <"$work/plan.json" | grep -o '"layers_per_stage":\[[0-9,]*\]' | tr -d '"layers_per_stage:[]' || true
}
balanced=$(plan_layers balanced | tr '\n' ' ')
[ "$balanced" = "4,4,4,4,5,9,9,9 4,4,4,4,5,9,9,9 " ] || fail "plan --partition balanced layers: $balanced"
uniform=$(plan_layers uniform | tr '\n' ' ')
[ "$uniform" = "6,6,6,6,6,6,6,6 " ] || fail "plan --partition uniform layers (no layers_per_stage in the file): $uniform"
# On an interactive stderr joint's search shows a progress line (it can take tens of
# seconds); `script` gives the command a terminal where util-linux has it.
if command -v script >/dev/null; then
  script -qec "'$dynapipe' plan --samples '$root/assets/flan_like_mix.jsonl.gz' --model gpt-6.7b --pp 4 \
    --memory-limit 40 --max-seqlen 1024 --global-batch-tokens 65536 --iterations 1 --partition joint \
    --no-compare --out '$work/joint.json'" /dev/null >"$work/tty.txt" 2>&1 || fail "plan --partition joint on a terminal"
  grep -aq 'choosing the layer split: [0-9]* splits planned' "$work/tty.txt" || fail "no progress line for joint's search"
fi
echo "partition cli ok"
