#!/usr/bin/env bash
# dynapipe without LibTorch hands train and profile to dynapipe-torch beside it: dynapipe
# itself must not load LibTorch, its --help lists both, their own --help and errors come
# through, and without dynapipe-torch the command fails with one line (exit 2).
set -uo pipefail
binary=$1
dir=$(dirname "$binary")
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

[ -x "$dir/dynapipe-torch" ] || fail "no dynapipe-torch beside $binary"
if ldd "$binary" | grep -q libtorch; then fail "$binary links LibTorch"; fi
help=$("$binary" --help)
for command in train profile; do
  grep -qE "^ +$command +" <<<"$help" || fail "dynapipe --help does not list $command"
done
train_help=$("$binary" train --help)
grep -q -- "--threads-per-rank" <<<"$train_help" || fail "train --help is not train's"
"$binary" profile --repeats 0 --model gpt-tiny --out "$work/p.json" 2>"$work/err"
code=$?
[ "$code" = 2 ] || fail "profile with a bad flag exited $code, expected 2"
grep -q "^error: --repeats must be >= 1, got 0" "$work/err" || fail "profile's error: $(cat "$work/err")"

# Alone, without dynapipe-torch beside it.
cp "$binary" "$work/dynapipe"
"$work/dynapipe" train --steps 1 2>"$work/err"
code=$?
[ "$code" = 2 ] || fail "train without dynapipe-torch exited $code, expected 2"
[ "$(wc -l <"$work/err")" = 1 ] || fail "expected one line: $(cat "$work/err")"
grep -q "^error: dynapipe train runs in $work/dynapipe-torch" "$work/err" || fail "$(cat "$work/err")"
"$work/dynapipe" plan --help >/dev/null || fail "plan needs dynapipe-torch"
echo "torch handoff: ok"
