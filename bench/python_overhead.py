#!/usr/bin/env python3
"""Planning from Python vs from C++ on the same global batches (issue 11: <= 5% slower).

Runs build/bench/planner_bench for one setting (Planner::plan_iteration in C++, each
iteration planning the next of the dataset's first 8 global batches) and then plans the
same 8 batches through dynapipe.Planner.plan() -- once from GlobalBatch objects and once
from plain lists of lengths (the conversion a user pays) -- and prints the medians.

    PYTHONPATH=build/python /usr/bin/python3 bench/python_overhead.py [--build build]
        [--setting plan/gpt-6.7b/pp4/seq2048/tok65536/40G] [--repetitions 15]
"""
import argparse
import json
import pathlib
import statistics
import subprocess
import time

import dynapipe

ROOT = pathlib.Path(__file__).resolve().parents[1]


def parse_setting(name):
    # plan/<model>/pp<p>/seq<max seqlen>/tok<tokens>/<GiB>G, as planner_bench names them
    _, model, pp, seq, tok, mem = name.split("/")
    return dict(model=model, pp=int(pp[2:]), max_seqlen=int(seq[3:]),
                global_batch_tokens=int(tok[3:]), memory_limit_gib=float(mem[:-1]))


def cxx_ms(bench, setting, repetitions, min_time):
    out = subprocess.run(
        [str(bench), f"--benchmark_filter=^{setting}(/real_time)?$", f"--benchmark_repetitions={repetitions}",
         f"--benchmark_min_time={min_time}", "--benchmark_format=json"],
        check=True, capture_output=True, text=True).stdout
    runs = [b for b in json.loads(out)["benchmarks"] if b.get("run_type") == "iteration"]
    return statistics.median(b["real_time"] for b in runs)  # ms (the bench's unit)


def python_ms(plan_one, batches, min_time):
    calls, start = 0, time.perf_counter()
    while True:
        for batch in batches:
            plan_one(batch)
        calls += len(batches)
        elapsed = time.perf_counter() - start
        if elapsed >= min_time:
            return elapsed / calls * 1000.0


def binding_overhead(plan_one, batches, rounds=20):
    """Wall time of plan() minus the planner's own planning_ms, on the same calls: the
    cost of the binding (argument conversion, GIL hand-off, result object), free of the
    machine's load drift that separate C++ and Python runs suffer."""
    wall = inside = 0.0
    for _ in range(rounds):
        for batch in batches:
            start = time.perf_counter()
            plan = plan_one(batch)
            wall += time.perf_counter() - start
            inside += plan.planning_ms / 1000.0
            del plan
    return (wall - inside) / (rounds * len(batches)) * 1e6, (wall - inside) / wall


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--build", default=str(ROOT / "build"))
    ap.add_argument("--setting", default="plan/gpt-6.7b/pp4/seq2048/tok65536/40G")
    ap.add_argument("--repetitions", type=int, default=15)
    ap.add_argument("--min-time", type=float, default=0.5, help="seconds per repetition")
    args = ap.parse_args()

    options = parse_setting(args.setting)
    planner = dynapipe.Planner(**options)
    samples = planner.load_samples(ROOT / "assets/flan_like_mix.jsonl.gz")
    batches = planner.global_batches(samples)[:8]  # planner_bench's kBatches
    as_lists = [(b.input_lens, b.target_lens, b.ids) for b in batches]

    bench = pathlib.Path(args.build) / "bench" / "planner_bench"
    # Rounds alternate C++ and Python so that a machine whose load changes over the run
    # (shared CI boxes) biases neither side; each figure is the median over rounds.
    cxx, py_batch, py_lists = [], [], []
    for _ in range(args.repetitions):
        cxx.append(cxx_ms(bench, args.setting, 1, args.min_time))
        py_batch.append(python_ms(planner.plan, batches, args.min_time))
        py_lists.append(python_ms(lambda b: planner.plan(b[0], b[1], ids=b[2]), as_lists,
                                  args.min_time))
    # Per-round ratios pair each Python figure with the C++ one measured just before it.
    ratio_batch = statistics.median(p / c for p, c in zip(py_batch, cxx))
    ratio_lists = statistics.median(p / c for p, c in zip(py_lists, cxx))
    cxx, py_batch, py_lists = map(statistics.median, (cxx, py_batch, py_lists))
    over_batch = binding_overhead(planner.plan, batches)
    over_lists = binding_overhead(lambda b: planner.plan(b[0], b[1], ids=b[2]), as_lists)
    print(f"setting {args.setting}, {len(batches)} batches, median of {args.repetitions} alternating rounds")
    print(f"  C++ planner_bench          {cxx:8.3f} ms/iteration")
    print(f"  Python plan(GlobalBatch)   {py_batch:8.3f} ms/iteration  (median round ratio {ratio_batch - 1:+.1%})")
    print(f"  Python plan(lists)         {py_lists:8.3f} ms/iteration  (median round ratio {ratio_lists - 1:+.1%})")
    print(f"  binding overhead (wall - planning_ms): GlobalBatch {over_batch[0]:.1f} us/call "
          f"({over_batch[1]:.2%}), lists {over_lists[0]:.1f} us/call ({over_lists[1]:.2%})")


if __name__ == "__main__":
    main()
