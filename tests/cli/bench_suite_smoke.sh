#!/usr/bin/env bash
# Smoke test of bench/suite: one family (planning time, GPT only) in simulated mode on the
# tiny text samples; it must write a Markdown table with a row per point and a parseable SVG.
set -euo pipefail
binary=$1
root=$2
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
bash "$root/bench/suite/planning_time.sh" --dynapipe "$binary" --samples "$root/assets/tiny_text.jsonl" \
  --iterations 1 --models gpt --out "$out" 2> "$out/log" || { cat "$out/log"; exit 1; }
rows=$(grep -c '^| [0-9]' "$out/planning_time.md")
[ "$rows" = 5 ] || { echo "expected 5 table rows, got $rows"; cat "$out/planning_time.md"; exit 1; }
/usr/bin/python3 -c 'import sys, xml.dom.minidom as m; m.parse(sys.argv[1])' "$out/planning_time.svg"
echo "bench suite smoke: ok"
