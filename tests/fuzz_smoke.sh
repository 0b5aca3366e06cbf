#!/usr/bin/env bash
# Builds the libFuzzer targets with clang (address + undefined sanitizers) in their own
# build directory and runs each for DYNAPIPE_FUZZ_SECONDS (default 30) on a copy of its
# seed corpus. A crash, sanitizer report or property violation fails the test; the
# input that caused it is in the run's output (libFuzzer prints and saves it): add it to
# the seed corpus once fixed, where the unit tests replay it.
# Exits 77 (ctest: skipped) when clang or libFuzzer is not installed.
#   fuzz_smoke.sh SOURCE_DIR FUZZ_BUILD_DIR
set -uo pipefail
source_dir=$1
build_dir=$2
seconds=${DYNAPIPE_FUZZ_SECONDS:-30}
command -v clang++ >/dev/null || { echo "SKIPPED: clang++ not installed (scripts/install-deps.sh installs it)"; exit 77; }
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
printf 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }\n' >"$probe/p.cpp"
clang++ -fsanitize=fuzzer "$probe/p.cpp" -o "$probe/p" 2>/dev/null ||
  { echo "SKIPPED: clang++ cannot link libFuzzer (libclang-rt-*-dev missing)"; exit 77; }

targets=(plan_json_fuzz plan_binary_fuzz samples_fuzz profile_fuzz model_json_fuzz graph_txt_fuzz)
CXX=clang++ CC=clang cmake -S "$source_dir" -B "$build_dir" -DCMAKE_BUILD_TYPE=Release \
  -DDYNAPIPE_BUILD_FUZZ=ON -DDYNAPIPE_WITH_TORCH=OFF -DDYNAPIPE_BUILD_TESTS=OFF \
  -DDYNAPIPE_BUILD_BENCH=OFF >/dev/null || exit 1
cmake --build "$build_dir" -j2 --target "${targets[@]}" >"$build_dir/fuzz-build.log" 2>&1 ||
  { tail -n 30 "$build_dir/fuzz-build.log"; exit 1; }

corpus_of() {
  case $1 in
    plan_json_fuzz) echo "$source_dir/tests/plan/corpus/json" ;;
    plan_binary_fuzz) echo "$source_dir/tests/plan/corpus/binary" ;;
    samples_fuzz) echo "$source_dir/tests/fuzz/corpus/samples" ;;
    profile_fuzz) echo "$source_dir/tests/fuzz/corpus/profile" ;;
    model_json_fuzz) echo "$source_dir/tests/fuzz/corpus/model_json" ;;
    graph_txt_fuzz) echo "$source_dir/tests/fuzz/corpus/graph_txt" ;;
  esac
}
failed=0
for t in "${targets[@]}"; do
  work="$probe/$t"
  mkdir -p "$work/corpus"
  cp -r "$(corpus_of "$t")"/. "$work/corpus/"
  if (cd "$work" && "$build_dir/fuzz/$t" corpus -max_total_time="$seconds" -rss_limit_mb=2048 \
        -max_len=65536 -print_final_stats=1 >"$work/log" 2>&1); then
    echo "$t: $(grep -m1 'stat::number_of_executed_units' "$work/log" | awk '{print $2}') runs in ${seconds} s, no finding"
  else
    echo "$t: FINDING"
    tail -n 40 "$work/log"
    failed=1
  fi
done
exit $failed
