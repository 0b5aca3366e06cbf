#!/usr/bin/env bash
# Checks every #include "dynapipe/<m>/..." against cmake/DynapipeLayers.cmake and that
# LibTorch / c10d headers appear only under src/runtime/.
set -euo pipefail
root=${1:-$(dirname "$0")/..}
cd "$root"
declare -A allowed
while read -r line; do
  if [[ $line =~ ^set\(DYNAPIPE_LAYER_([a-z_]+)[[:space:]]*(.*)\)$ ]]; then
    allowed[${BASH_REMATCH[1]}]="${BASH_REMATCH[2]}"
  fi
done < cmake/DynapipeLayers.cmake
status=0
for module in "${!allowed[@]}"; do
  for dir in "include/dynapipe/$module" "src/$module"; do
    [ -d "$dir" ] || continue
    while IFS=: read -r file _ include; do
      dep=$(sed -E 's|.*"dynapipe/([a-z_]+)/.*|\1|' <<<"$include")
      if [ "$dep" != "$module" ] && ! grep -qw -- "$dep" <<<"${allowed[$module]}"; then
        echo "$file: module '$module' includes '$dep' (allowed: ${allowed[$module]:-none})"
        status=1
      fi
    done < <(grep -rn --include='*.h' --include='*.cpp' -E '#include "dynapipe/[a-z_]+/' "$dir" || true)
  done
done
if grep -rln -E '#include <(torch|ATen|c10|c10d)/' include src python 2>/dev/null | grep -v '^src/runtime/'; then
  echo "torch headers outside src/runtime/ (listed above)"
  status=1
fi
[ $status -eq 0 ] && echo "layering ok"
exit $status
