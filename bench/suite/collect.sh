#!/usr/bin/env bash
# Prints the suite's tables (bench/out/*/FAMILY.md, without their command lists) as one
# Markdown section for docs/RESULTS.md, each under the command that made it.
#
#   bench/suite/collect.sh "seqlen:bench/suite/seqlen.sh" "padding:bench/suite/padding.sh --reuse bench/out/seqlen" ...
#
# Each argument is DIR_NAME:COMMAND; DIR_NAME's FAMILY.md is bench/out/DIR_NAME/*.md.
set -euo pipefail
for arg in "$@"; do
  dir=bench/out/${arg%%:*}
  cmd=${arg#*:}
  md=$(ls "$dir"/*.md | head -1)
  echo
  sed -n '1s/^# /### /p' "$md"
  echo
  echo "\`$cmd\` (per-point commands: \`$md\`)"
  # Body without the title line and the command list; its headings move three levels down.
  sed -n '2,/^<details>/p' "$md" | sed '$d' | sed 's/^## /#### /'
done
