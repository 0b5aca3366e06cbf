#!/usr/bin/env bash
# Two "hosts" on one machine: rank 0 and rank 1 of a --pp 2 job run in two network
# namespaces joined by a veth pair, each with its own address, joining through
# RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT with GLOO_SOCKET_IFNAME set to its veth end.
#  1. The losses equal those of the same job launched on one host.
#  2. Rank 0's rendezvous store listens on MASTER_ADDR only, not on every interface.
#  3. Killing the rank on the other "host" ends rank 0 within 60 s, naming the rank.
# Needs root and `ip netns`; otherwise exits 77 (ctest: skipped) saying why.
#   multi_host_test.sh DYNAPIPE_BINARY SAMPLES_FILE
set -uo pipefail
binary=$1
data=$2
skip() { echo "SKIPPED: $*"; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root for ip netns"
command -v ip >/dev/null || skip "no ip command (iproute2)"

id=$$
ns_a=dynapipe-a-$id ns_b=dynapipe-b-$id
veth_a=dpa$((id % 100000)) veth_b=dpb$((id % 100000))
net=10.213.$((id % 250))
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
ip netns add "$ns_a" 2>/dev/null || skip "ip netns add failed (no network namespaces here)"
ip netns add "$ns_b"
ip link add "$veth_a" netns "$ns_a" type veth peer name "$veth_b" netns "$ns_b" ||
  skip "cannot create a veth pair"
ip -n "$ns_a" addr add "$net.1/24" dev "$veth_a"
ip -n "$ns_b" addr add "$net.2/24" dev "$veth_b"
for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
ip -n "$ns_a" link set "$veth_a" up
ip -n "$ns_b" link set "$veth_b" up

job=(train --data "$data" --model gpt-tiny --pp 2 --max-seqlen 256 --global-batch-tokens 2048
     --seed 3 --no-progress --comm-timeout 120 --store-timeout 120)
fail() { echo "FAIL: $*"; for f in "$work"/*.err; do echo "--- $f"; tail -n 5 "$f"; done; exit 1; }
losses() { grep -v '"summary"' "$1" | sed -n 's/.*"loss": *\([-0-9.e+]*\).*/\1/p'; }

# One host, launched by the command itself.
"$binary" "${job[@]}" --steps 3 --metrics "$work/one.jsonl" >/dev/null 2>"$work/one.err" ||
  fail "single-host run failed"

# Two hosts.
run_rank() {  # rank namespace interface steps metrics
  ip netns exec "$2" env RANK="$1" WORLD_SIZE=2 MASTER_ADDR="$net.1" MASTER_PORT=29517 \
    GLOO_SOCKET_IFNAME="$3" "$binary" "${job[@]}" --steps "$4" --metrics "$5" \
    >"$work/rank$1.out" 2>"$work/rank$1.err"
}
run_rank 0 "$ns_a" "$veth_a" 3 "$work/two.jsonl" & pids+=($!)
run_rank 1 "$ns_b" "$veth_b" 3 /dev/null & pids+=($!)
wait "${pids[0]}" || fail "rank 0 on host a failed"
wait "${pids[1]}" || fail "rank 1 on host b failed"
[ -n "$(losses "$work/one.jsonl")" ] || fail "no losses in the single-host metrics"
[ "$(losses "$work/one.jsonl")" = "$(losses "$work/two.jsonl")" ] ||
  fail "losses differ: one host $(losses "$work/one.jsonl" | tr '\n' ' '), two hosts $(losses "$work/two.jsonl" | tr '\n' ' ')"
echo "two hosts trained with the single-host losses: $(losses "$work/two.jsonl" | tr '\n' ' ')"

# Kill the rank on the other host mid-run.
pids=()
run_rank 0 "$ns_a" "$veth_a" 1000 "$work/kill.jsonl" & pids+=($!)
run_rank 1 "$ns_b" "$veth_b" 1000 /dev/null & pids+=($!)
for _ in $(seq 1 600); do
  [ -s "$work/kill.jsonl" ] && break
  sleep 0.1
done
[ -s "$work/kill.jsonl" ] || fail "the two-host job made no step in 60 s"
listening=$(ip netns exec "$ns_a" ss -Hltn "sport = :29517" | awk '{print $4}')
[ "$listening" = "$net.1:29517" ] || fail "the store listens on '$listening', expected $net.1:29517 only"
echo "rank 0's store listens on $listening only"
ip netns pids "$ns_b" | xargs -r kill -9
start=$(date +%s)
wait "${pids[0]}"
code=$?
took=$(( $(date +%s) - start ))
[ "$code" != 0 ] || fail "rank 0 exited 0 after its peer was killed"
[ "$took" -le 60 ] || fail "rank 0 took ${took} s to end after its peer died"
grep -q "rank 1" "$work/rank0.err" || fail "rank 0's error does not name rank 1"
echo "killing rank 1 ended rank 0 in ${took} s (exit $code): $(grep -m1 'error' "$work/rank0.err")"
