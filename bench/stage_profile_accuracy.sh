#!/usr/bin/env bash
# profile -> plan -> train (issue 12): per config a whole-stage profile
# (`dynapipe profile --stages --pp P --max-seqlen L`), then at once `dynapipe train` with it
# (bench/cost_accuracy.sh, one config), so both see a similar machine. Prints the
# cost_accuracy table (median error over steps 1-5, worst step in brackets) with the profile's
# seconds and the load average before the profile and after the train.
#
#   bench/stage_profile_accuracy.sh                          # gpt-tiny, t5-tiny; pp 1, 2; 1024, 2048
#   MODELS=gpt-tiny PPS=2 SEQLENS=1024 bench/stage_profile_accuracy.sh
#
# Environment: DYNAPIPE (build/dynapipe), MODELS, PPS, SEQLENS, STEPS (6), PROFILE_FLAGS
# (extra `dynapipe profile` flags), OUT_DIR (keeps profiles and metrics; default a temp dir).
set -euo pipefail

DYNAPIPE=${DYNAPIPE:-build/dynapipe}
MODELS=${MODELS:-"gpt-tiny t5-tiny"}
PPS=${PPS:-"1 2"}
SEQLENS=${SEQLENS:-"1024 2048"}
STEPS=${STEPS:-6}
PROFILE_FLAGS=${PROFILE_FLAGS:-}
if [ -n "${OUT_DIR:-}" ]; then
  TMP=$OUT_DIR; mkdir -p "$TMP"
else
  TMP=$(mktemp -d); trap 'rm -rf "$TMP"' EXIT
fi
load() { cut -d' ' -f1 /proc/loadavg; }

echo
echo "\`$DYNAPIPE profile --stages --pp P --model M --max-seqlen L $PROFILE_FLAGS\`, then"
echo "bench/cost_accuracy.sh with it ($(nproc) cores, $(date -u +%Y-%m-%d))"
echo
echo "| config | memory error | est / measured MiB | step time error | est / measured s | tokens/s | profile s | load before / after |"
echo "|---|---:|---:|---:|---:|---:|---:|---:|"
for model in $MODELS; do
  for pp in $PPS; do
    for seqlen in $SEQLENS; do
      name="$model-pp$pp-$seqlen"
      before=$(load)
      start=$(date +%s)
      echo "profiling $name ..." >&2
      # shellcheck disable=SC2086
      "$DYNAPIPE" profile --stages --pp "$pp" --model "$model" --max-seqlen "$seqlen" \
        --out "$TMP/$name.json" --no-progress $PROFILE_FLAGS >&2
      seconds=$(( $(date +%s) - start ))
      row=$(MODELS=$model PPS=$pp SEQLENS=$seqlen STEPS=$STEPS COST_MODEL="$TMP/$name.json" \
            METRICS_DIR="$TMP" DYNAPIPE=$DYNAPIPE "$(dirname "$0")/cost_accuracy.sh" | grep "^| $name " || true)
      echo "${row:-| $name | failed |||||} $seconds | $before / $(load) |"
    done
  done
done
