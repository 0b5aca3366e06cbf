# shellcheck shell=bash
# Shared by the bench/suite/*.sh entry scripts (sourced, not run). Each script sets FAMILY,
# calls parse_flags "$@", runs points with row/point, then writes its table and plot.
#
# Flags of every entry script:
#   --mode simulated|measured   simulated: `dynapipe plan --summary-json` at the paper's model
#                               sizes on the analytic GPU models; measured: `dynapipe train` of
#                               the tiny models on this CPU (needs a LibTorch build)
#   --samples FILE              samples file (default: the bundled assets/flan_like_mix.jsonl.gz)
#   --out DIR                   where FAMILY.md, FAMILY.svg and records.jsonl go (bench/out/FAMILY)
#   --models gpt,t5             which model families (default both)
#   --iterations N              simulated: global batches planned per point (default 3)
#   --steps N                   measured: training steps per point (default 3; the first is
#                               warm-up and left out of the medians)
#   --dynapipe BIN              the binary (default build/dynapipe)
#   --reuse DIR                 run nothing: tabulate DIR/records.jsonl (another family's points
#                               at the same settings, e.g. padding.sh --reuse bench/out/seqlen)
set -euo pipefail

SUITE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
MODE=simulated
SAMPLES=assets/flan_like_mix.jsonl.gz
OUT=""
MODELS="gpt t5"
ITERATIONS=3
STEPS=3
DYNAPIPE=${DYNAPIPE:-build/dynapipe}
REUSE=""
DEVICE=a100   # simulated cost model family; a100 falls back from 40 to 80 GiB, h100 is 80 GiB

usage() {
  sed -n '/^# Flags of every/,/^set -euo/p' "$SUITE_DIR/common.sh" | sed '$d; s/^# \{0,1\}//' >&2
  exit 2
}

parse_flags() {
  while [ $# -gt 0 ]; do
    case $1 in
      --mode) MODE=$2; shift 2 ;;
      --samples) SAMPLES=$2; shift 2 ;;
      --out) OUT=$2; shift 2 ;;
      --models) MODELS=${2//,/ }; shift 2 ;;
      --iterations) ITERATIONS=$2; shift 2 ;;
      --steps) STEPS=$2; shift 2 ;;
      --dynapipe) DYNAPIPE=$2; shift 2 ;;
      --reuse) REUSE=$2; shift 2 ;;
      -h|--help) usage ;;
      *) echo "error: unknown flag $1" >&2; usage ;;
    esac
  done
  case $MODE in simulated|measured) ;; *) echo "error: --mode must be simulated or measured" >&2; exit 2 ;; esac
  OUT=${OUT:-bench/out/$FAMILY}
  mkdir -p "$OUT"
  RECORDS=$OUT/records.jsonl
  if [ -n "$REUSE" ]; then
    [ "$(realpath "$REUSE/records.jsonl")" = "$(realpath "$RECORDS")" ] || cp "$REUSE/records.jsonl" "$RECORDS"
  else
    : > "$RECORDS"
  fi
  TMP=$(mktemp -d)
  trap 'rm -rf "$TMP"' EXIT
}

# The paper's model sizes (simulated) or the tiny CPU models (measured). T5 targets in the
# bundled data are at most 300 tokens: --max-target-len 512 truncates none and keeps padding
# and packing from sizing decoder rows for --max-seqlen.
model_flags() {
  case $MODE/$1 in
    simulated/gpt) echo --model gpt-6.7b --pp 4 ;;
    simulated/t5) echo --model t5-11b --pp 8 --max-target-len 512 ;;
    measured/gpt) echo --model gpt-tiny --pp 2 ;;
    measured/t5) echo --model t5-tiny --pp 2 --max-target-len 512 ;;
  esac
}

model_name() { model_flags "$1" | awk '{print $2}'; }

# point KEY=VALUE... -- FLAGS...: one plan (simulated) or one training run (measured) with
# FLAGS, appended to $RECORDS with the keys, the exact command and its results.
point() {
  local kv=()
  while [ "$1" != "--" ]; do kv+=("$1"); shift; done
  shift
  [ -n "$REUSE" ] && return 0
  local cmd rc=0 metrics=-
  if [ "$MODE" = simulated ]; then
    cmd=("$DYNAPIPE" plan --samples "$SAMPLES" "$@" --iterations "$ITERATIONS" --no-compare
         --summary-json --out "$TMP/plan.json")
  else
    metrics=$TMP/metrics.jsonl
    rm -f "$metrics"
    # nice: the CPU is shared; one intra-op thread per rank keeps ranks from oversubscribing.
    cmd=(nice -n 5 "$DYNAPIPE" train --data "$SAMPLES" "$@" --steps "$STEPS" --threads-per-rank 1
         --metrics "$metrics" --no-progress)
  fi
  echo "  ${cmd[*]}" >&2
  "${cmd[@]}" > "$TMP/stdout" 2> "$TMP/stderr" || rc=$?
  local shown="${cmd[*]}"
  /usr/bin/python3 "$SUITE_DIR/record.py" "$RECORDS" "$rc" "$TMP/stdout" "$TMP/stderr" "$metrics" \
    "${shown//$TMP//tmp}" mode="$MODE" "${kv[@]}"
}

# row "STRATEGIES" KEY=VALUE... -- FLAGS...: one point per strategy. Simulated rows run at
# 40 GiB on analytic:a100-40g and, if every strategy is infeasible there, again at 80 GiB on
# analytic:a100-80g (DEVICE=h100: 80 GiB on analytic:h100-80g only). Measured rows use
# train's default cost model (analytic:cpu).
row() {
  local strategies=$1
  shift
  if [ "$MODE" = measured ]; then
    for s in $strategies; do point strategy="$s" cost_model=analytic:cpu "$@" --strategy "$s"; done
    return
  fi
  local kv=()
  while [ "$1" != "--" ]; do kv+=("$1"); shift; done
  shift
  [ -n "$REUSE" ] && return 0
  local mems="40 80" saved=$RECORDS
  [ "$DEVICE" = h100 ] && mems=80
  for mem in $mems; do
    RECORDS=$TMP/row.jsonl
    : > "$RECORDS"
    for s in $strategies; do
      point strategy="$s" memory_gib="$mem" cost_model="analytic:$DEVICE-${mem}g" "${kv[@]}" -- \
        "$@" --strategy "$s" --memory-limit "$mem" --cost-model "analytic:$DEVICE-${mem}g"
    done
    RECORDS=$saved
    if grep -qv '"error"' "$TMP/row.jsonl" || [ "$mem" = 80 ]; then break; fi
  done
  cat "$TMP/row.jsonl" >> "$RECORDS"
}

# report ARGS...: FAMILY.md and FAMILY.svg from $RECORDS (see report.py for ARGS).
report() {
  /usr/bin/python3 "$SUITE_DIR/report.py" --records "$RECORDS" --out "$OUT/$FAMILY" --mode "$MODE" "$@"
  echo "wrote $OUT/$FAMILY.md and $OUT/$FAMILY.svg" >&2
}

ALL_STRATEGIES="packing dynapipe packing-varlen token-based padding dynapipe-padded"

# Families 1 and 3 share their points: every strategy at each max seqlen of the mode.
# Sets seqlens and tokens for the caller's report.
seqlen_points() {
  if [ "$MODE" = simulated ]; then
    seqlens="512 1024 2048 4096 8192"; tokens=65536
  else
    seqlens="256 512 1024"; tokens=4096
  fi
  local m L
  for m in $MODELS; do
    for L in $seqlens; do
      echo "$m max seqlen $L" >&2
      row "$ALL_STRATEGIES" model="$(model_name "$m")" device=a100 max_seqlen="$L" -- \
        $(model_flags "$m") --max-seqlen "$L" --global-batch-tokens "$tokens"
    done
  done
}
