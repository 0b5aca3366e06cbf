#!/usr/bin/env bash
# The paper's regime (docs/RESULTS.md, issue 9): `dynapipe tune` on 8 A100-40GB with the
# authors' measured tables, the flan-zsopt mix and 65,536-token global batches, per model
# and max seqlen; prints the best configuration per strategy, the dynapipe ÷
# packing-megatron ratio, the ablations of the baseline (one cause at a time) and the wall
# time of each plain tune.
#
#   bench/paper_regime.sh                 # gpt-6.7b and t5-11b at 2048, 4096, 8192
#   MODELS=gpt-6.7b SEQLENS=2048 bench/paper_regime.sh
#
# Environment: DYNAPIPE (build/dynapipe), MODELS, SEQLENS, GPUS (8), MEMORY (35.16 GiB,
# the artifact's 36,000 MiB), SAMPLES (20000, seed 0).
set -euo pipefail

DYNAPIPE=${DYNAPIPE:-build/dynapipe}
MODELS=${MODELS:-"gpt-6.7b t5-11b"}
SEQLENS=${SEQLENS:-"2048 4096 8192"}
GPUS=${GPUS:-8}
MEMORY=${MEMORY:-35.16}
SAMPLES=${SAMPLES:-20000}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

"$DYNAPIPE" data synth --mix flan-zsopt --samples "$SAMPLES" --seed 0 --out "$TMP/zsopt.jsonl.gz" >/dev/null 2>&1

ratio() {  # best dynapipe-padded (the paper's method) and dynapipe (varlen) ÷ best packing-megatron
  /usr/bin/python3 -c 'import json, sys
s = json.load(open(sys.argv[1]))["strategies"]
m = s.get("packing-megatron")
if not m:
    print("baseline infeasible")
else:
    print(", ".join("%s %.2fx" % (k, s[k]["est_tokens_per_s"] / m["est_tokens_per_s"])
                    for k in ("dynapipe-padded", "dynapipe") if k in s))' "$1"
}

for model in $MODELS; do
  for seqlen in $SEQLENS; do
    common=(--model "$model" --cost-model a100-measured --memory-limit "$MEMORY" --gpus "$GPUS"
            --max-seqlen "$seqlen")
    echo "### $model, max seqlen $seqlen"
    echo
    start=$(date +%s.%N)
    "$DYNAPIPE" tune --samples "$TMP/zsopt.jsonl.gz" "${common[@]}" | tail -n +3
    end=$(date +%s.%N)
    "$DYNAPIPE" tune --samples "$TMP/zsopt.jsonl.gz" "${common[@]}" --summary-json >"$TMP/base.json"
    printf '\ntune wall time %.2f s; ÷ packing-megatron: %s\n' "$(echo "$end - $start" | bc)" "$(ratio "$TMP/base.json")"
    pair=(--strategies dynapipe-padded,dynapipe,packing-megatron --summary-json)
    "$DYNAPIPE" tune --samples "$TMP/zsopt.jsonl.gz" "${common[@]}" "${pair[@]}" --megatron-token-batches >"$TMP/a.json"
    "$DYNAPIPE" tune --samples "$TMP/zsopt.jsonl.gz" "${common[@]}" "${pair[@]}" --megatron-free-recompute >"$TMP/b.json"
    "$DYNAPIPE" tune --samples assets/flan_like_mix.jsonl.gz "${common[@]}" "${pair[@]}" >"$TMP/c.json"
    echo "ablations: token batches $(ratio "$TMP/a.json"), free recompute $(ratio "$TMP/b.json"), flan-like data $(ratio "$TMP/c.json")"
    if [ "$model" = t5-11b ]; then
      "$DYNAPIPE" tune --samples "$TMP/zsopt.jsonl.gz" "${common[@]}" "${pair[@]}" --max-target-len 520 >"$TMP/d.json"
      echo "ablation: decoder rows of 520 $(ratio "$TMP/d.json")"
    fi
    echo
  done
done
