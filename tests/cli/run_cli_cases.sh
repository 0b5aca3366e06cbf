#!/usr/bin/env bash
# Runs tests/cli/cases.txt against the dynapipe binary: exit code, a final one-line
# "error: ..." on stderr that contains the expected text, and no output file left behind.
set -uo pipefail
binary=$1
here=$(cd "$(dirname "$0")" && pwd)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
passed=0 failed=0 skipped=0 n=0
# Subcommands this build has (profile and train need LibTorch); cases of others are skipped.
commands=$("$binary" --help 2>&1)
while IFS= read -r line; do
  [[ -z "$line" || "$line" == \#* ]] && continue
  n=$((n + 1))
  expected_code=$(cut -d'|' -f1 <<<"$line" | xargs)
  expected_text=$(cut -d'|' -f2 <<<"$line" | sed 's/^ *//;s/ *$//')
  args=$(cut -d'|' -f3- <<<"$line" | sed 's/^ *//')
  if ! grep -qE "^ +${args%% *}( |$)" <<<"$commands"; then
    skipped=$((skipped + 1))
    continue
  fi
  out="$work/out$n.json"
  args=${args//\{DATA\}/$here/data}
  args=${args//@OUT@/$out}
  # shellcheck disable=SC2086
  "$binary" $args >"$work/stdout" 2>"$work/stderr"
  code=$?
  problem=""
  [ "$code" = "$expected_code" ] || problem="exit code $code, expected $expected_code"
  if [ -z "$problem" ] && [ "$expected_text" != "-" ] && ! grep -qF -- "$expected_text" "$work/stderr"; then
    problem="stderr lacks '$expected_text'"
  fi
  if [ -z "$problem" ] && [ "$code" != 0 ]; then
    # Informational lines may precede it; the error itself is the one last line.
    errors=$(grep -c '^error: ' "$work/stderr")
    last=$(tail -n 1 "$work/stderr")
    [[ "$errors" = 1 && "$last" == error:* ]] || problem="expected exactly one final 'error:' line"
    [ ! -e "$out" ] || problem="$out was written despite the error"
  fi
  if [ -n "$problem" ]; then
    failed=$((failed + 1))
    echo "FAIL: dynapipe $args: $problem"
    sed 's/^/  stderr: /' "$work/stderr" | head -5
  else
    passed=$((passed + 1))
  fi
done <"$here/cases.txt"
echo "cli cases: $passed passed, $failed failed, $skipped skipped (subcommand not built)"
[ "$failed" -eq 0 ]
