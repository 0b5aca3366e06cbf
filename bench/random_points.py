#!/usr/bin/env python3
"""Random configurations, simulated: does dynapipe beat every baseline, and does --schedule
auto plan at least as fast as every named schedule?

Each point draws a model (GPT-6.7B, T5-11B), a cost model (the analytic A100 40/80 GiB and
H100 presets, the measured H100 profile, or with --card h200 the measured H200 one), pp (2, 4, 8), dp (1, 2, 4), a max seqlen
(512 .. 8192), a global batch (16,384 .. 262,144 tokens) and a memory limit, then runs
`dynapipe simulate` on the bundled data:

  bench/random_points.py strategies --seed 1 --points 80   # dynapipe against each baseline
  bench/random_points.py iterations --seed 1 --points 20   # the same, iteration by iteration
  bench/random_points.py schedules --seed 3 --points 60    # auto against each named schedule
  bench/random_points.py strategies --seed 1 --recompute per-microbatch  # every strategy so
  bench/random_points.py strategies --seed 1 --partition joint  # every strategy on its joint split
  bench/random_points.py threads --seed 1 --points 12      # one plan on 2 threads = on 1
  bench/random_points.py iterations --cpu --seed 1         # gpt-tiny / t5-tiny on analytic:cpu

`strategies` compares each strategy's best schedule (auto) on its own layer split by
estimated tokens/s (packing-megatron's global batches hold fewer real tokens: its rows are
cut to --max-seqlen); a line ends in LOSS where another strategy's throughput is higher. `schedules` runs one strategy
(--strategy, default dynapipe) with auto and with each named schedule on the uniform split
(so only the schedule search differs); a line ends in WORSE where a named schedule plans
faster than auto. `iterations` plans --iterations global batches (default 2) with `dynapipe
plan --no-compare` for dynapipe and for each baseline but packing-megatron (whose batches hold
other samples) and compares them batch by batch, not by the mean over batches `strategies`
compares; a line per iteration, ending in LOSS where another strategy plans it faster (and
naming both layer splits where they differ: a run keeps one split, chosen over its iterations). `threads` plans --strategy's first two iterations with `dynapipe plan
--planner-threads 1` and with 4 (two threads per plan: the first DPs side by side, the later
searches run ahead) and compares the plan files but their planning times; a line ends in
DIFFERENT where they differ. Last, a count. Deterministic: the same seed gives the same
points and figures. Environment: DYNAPIPE (build/dynapipe).
"""
import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "assets", "flan_like_mix.jsonl.gz")
BASELINES = ["padding", "packing", "packing-varlen", "token-based", "packing-megatron", "dynapipe-padded"]
SAME_BATCHES = [s for s in BASELINES if s != "packing-megatron"]  # plan dynapipe's global batches
NAMED_SCHEDULES = ["1f1b", "zb1p", "critical-path", "wait-free-cyclic", "interleaved"]


def draw(rng, card="h100"):
    model = rng.choice(["gpt-6.7b", "t5-11b"])
    cost = rng.choice(["analytic:a100-40g", "analytic:a100-80g", "analytic:h100-80g", "profile"])
    if cost == "profile":
        cost = os.path.join(ROOT, "assets", "profiles", f"{model}.{card}.measured.json")
    point = {
        "model": model,
        "cost": cost,
        "pp": rng.choice([2, 4, 8]),
        "dp": rng.choice([1, 1, 2, 4]),
        "seqlen": rng.choice([512, 1024, 2048, 4096, 8192]),
        "tokens": rng.choice([16384, 32768, 65536, 131072, 262144]),
    }
    point["gib"] = 40 if "40g" in cost else rng.choice([40, 80])
    return point


def draw_cpu(rng):
    """A point of the CPU runtime's regime (`dynapipe train`'s tiny models on the
    analytic:cpu preset, no memory limit)."""
    return {
        "model": rng.choice(["gpt-tiny", "t5-tiny"]),
        "cost": "analytic:cpu",
        "pp": rng.choice([2, 2, 4]),
        "dp": rng.choice([1, 1, 2]),
        "seqlen": rng.choice([1024, 2048, 4096]),
        "tokens": rng.choice([8192, 16384, 32768]),
        "gib": 0,
    }


def describe(p):
    limit = f"{p['gib']}G" if p["gib"] else "no-limit"
    return (f"{p['model']} pp{p['pp']} dp{p['dp']} {limit} {os.path.basename(p['cost'])} "
            f"L{p['seqlen']} tokens {p['tokens']}")


def simulate(binary, p, strategies, schedules, extra):
    cmd = [binary, "simulate", "--samples", DATA, "--iterations", "2", "--strategies", strategies,
           "--schedules", schedules, "--model", p["model"], "--pp", str(p["pp"]), "--dp", str(p["dp"]),
           "--memory-limit", str(p["gib"]), "--cost-model", p["cost"], "--max-seqlen", str(p["seqlen"]),
           "--global-batch-tokens", str(p["tokens"])] + extra
    if p["model"] == "t5-11b":
        cmd += ["--max-target-len", str(min(512, p["seqlen"]))]
    out = subprocess.run(cmd, capture_output=True, text=True)
    if out.returncode != 0:
        sys.exit(f"error: {' '.join(cmd)} exited {out.returncode}: {out.stderr.strip()}")
    rows = {}  # (strategy, schedule) -> (est. iteration ms, est. tokens/s)
    for line in out.stdout.splitlines():
        cells = [c.strip() for c in line.split("|")]
        if len(cells) > 4 and re.fullmatch(r"[0-9.]+", cells[3]) and re.fullmatch(r"[0-9]+", cells[4]):
            rows[(cells[1], cells[2])] = (float(cells[3]), float(cells[4]))
    return rows


def run_plan(binary, p, strategy, iterations, extra, out):
    """Writes `strategy`'s plan of p's first `iterations` global batches to `out` (`dynapipe
    plan --no-compare` with `extra` flags); False where the point is infeasible (`plan` exits
    2), and any other failure ends the run."""
    cmd = [binary, "plan", "--samples", DATA, "--iterations", str(iterations), "--no-compare",
           "--strategy", strategy, "--model", p["model"], "--pp", str(p["pp"]), "--dp", str(p["dp"]),
           "--memory-limit", str(p["gib"]), "--cost-model", p["cost"], "--max-seqlen", str(p["seqlen"]),
           "--global-batch-tokens", str(p["tokens"]), "--out", out] + extra
    if p["model"] == "t5-11b":
        cmd += ["--max-target-len", str(min(512, p["seqlen"]))]
    run = subprocess.run(cmd, capture_output=True, text=True)
    if run.returncode == 2:  # the config cannot be served (docs/errors.md)
        return False
    if run.returncode != 0:  # a crash or an internal error is not an infeasible point
        sys.exit(f"error: {' '.join(cmd)} exited {run.returncode}: {run.stderr.strip()}")
    return True


def plan_file(binary, p, strategy, recompute, threads, out):
    """The plan JSON of p's first two iterations planned on `threads`, planning times dropped
    (None where the point is infeasible)."""
    if not run_plan(binary, p, strategy, 2, ["--recompute", recompute, "--planner-threads", str(threads)], out):
        return None
    with open(out) as f:
        return re.sub(r'"\w*planning_ms":\s*[0-9.eE+-]+', "", f.read())


def iteration_ms(binary, p, strategy, iterations, extra, out):
    """Each iteration's estimated ms of `strategy`'s plan of p's first `iterations` global
    batches, and the layer split the plan keeps for all of them (None where the point is
    infeasible)."""
    if not run_plan(binary, p, strategy, iterations, extra, out):
        return None
    with open(out) as f:
        plan = json.load(f)
    split = plan["config"].get("layers_per_stage", "uniform")  # absent: the uniform split
    return [it["est_iteration_ms"] for it in plan["iterations"]], split


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("compare", choices=["strategies", "iterations", "schedules", "threads"])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--iterations", type=int, default=2, help="iterations: global batches planned per point")
    parser.add_argument("--points", type=int, default=40)
    parser.add_argument("--strategy", default="dynapipe", help="schedules: the strategy planned")
    parser.add_argument("--card", choices=["h100", "h200"], default="h100",
                        help="the measured profiles a point drawn with one uses (the same draws either way)")
    parser.add_argument("--cpu", action="store_true",
                        help="draw gpt-tiny / t5-tiny points on analytic:cpu, without a memory limit, instead")
    parser.add_argument("--recompute", default="auto",
                        help="--recompute for every strategy (auto, per-microbatch, none, selective, full)")
    parser.add_argument("--partition", default="balanced", choices=["uniform", "balanced", "joint"],
                        help="strategies: --partition for every strategy (joint: minutes per point)")
    args = parser.parse_args()
    binary = os.environ.get("DYNAPIPE", os.path.join(ROOT, "build", "dynapipe"))
    if not os.access(binary, os.X_OK):
        sys.exit(f"error: {binary} is not an executable dynapipe; build it (bash scripts/build.sh)")
    if args.points <= 0:
        sys.exit(f"error: --points must be > 0, got {args.points}")
    if args.iterations <= 0:
        sys.exit(f"error: --iterations must be > 0, got {args.iterations}")

    rng = random.Random(args.seed)
    if args.compare == "iterations":
        # The same global batches for every strategy but packing-megatron (its rows are cut
        # to --max-seqlen, so its batches hold other samples): iteration by iteration.
        planned = behind = behind_on_other_split = 0
        extra = ["--recompute", args.recompute, "--partition", args.partition]
        with tempfile.TemporaryDirectory() as work:
            for _ in range(args.points):
                p = draw_cpu(rng) if args.cpu else draw(rng, args.card)
                out = os.path.join(work, "plan.json")
                planned_mine = iteration_ms(binary, p, "dynapipe", args.iterations, extra, out)
                if planned_mine is None:
                    print(f"{describe(p)}: infeasible", flush=True)
                    continue
                mine, my_split = planned_mine
                others, splits = {}, {}
                for strategy in SAME_BATCHES:
                    planned_other = iteration_ms(binary, p, strategy, args.iterations, extra, out)
                    if planned_other is not None:
                        others[strategy], splits[strategy] = planned_other
                for i, ms in enumerate(mine):
                    planned += 1
                    name, best = min(((s, v[i]) for s, v in others.items()), key=lambda kv: kv[1],
                                     default=(None, float("inf")))
                    slower = best < ms
                    behind += slower
                    figures = f"dynapipe {ms:.1f} ms" + (f", fastest other {name} {best:.1f} ({best / ms:.4f}x)"
                                                       if name else ", no other strategy fits")
                    # A run keeps one layer split for every iteration, each strategy the split
                    # fastest over its iterations: a loss on another split can be that choice's.
                    note = ""
                    if slower and splits[name] != my_split:
                        behind_on_other_split += 1
                        note = f" (layer splits differ: dynapipe {my_split}, {name} {splits[name]})"
                    print(f"{describe(p)} iteration {i}: {figures}{' LOSS' if slower else ''}{note}", flush=True)
        print(f"{planned - behind} of {planned} iterations planned: dynapipe the fastest (or tied); "
              f"of the {behind} behind, {behind_on_other_split} on another layer split than dynapipe's")
        return
    if args.compare == "threads":
        same = feasible = 0
        with tempfile.TemporaryDirectory() as work:
            for _ in range(args.points):
                p = draw_cpu(rng) if args.cpu else draw(rng, args.card)
                one = plan_file(binary, p, args.strategy, args.recompute, 1, os.path.join(work, "one.json"))
                several = plan_file(binary, p, args.strategy, args.recompute, 4, os.path.join(work, "four.json"))
                if one is None and several is None:
                    print(f"{describe(p)}: infeasible", flush=True)
                    continue
                feasible += 1
                same += one == several
                print(f"{describe(p)}: {'same' if one == several else 'DIFFERENT'}", flush=True)
        print(f"{same} of {feasible} feasible points: the same plan on 1 and on 2 threads per plan")
        return
    feasible = behind = 0
    label = "LOSS" if args.compare == "strategies" else "WORSE"
    for _ in range(args.points):
        p = draw_cpu(rng) if args.cpu else draw(rng, args.card)
        if args.compare == "strategies":
            rows = simulate(binary, p, ",".join(["dynapipe"] + BASELINES), "auto",
                            ["--recompute", args.recompute, "--partition", args.partition])
            mine = rows.get(("dynapipe", "auto"))
            others = {s: row for (s, _), row in rows.items() if s != "dynapipe"}
        else:
            rows = simulate(binary, p, args.strategy, ",".join(["auto"] + NAMED_SCHEDULES),
                            ["--partition", "uniform", "--recompute", args.recompute])
            mine = rows.get((args.strategy, "auto"))
            others = {sched: row for (_, sched), row in rows.items() if sched != "auto"}
        if mine is None or not others:
            print(f"{describe(p)}: infeasible", flush=True)
            continue
        feasible += 1
        if args.compare == "strategies":  # by throughput: the strategies' batches may differ
            name, (best_ms, best_tps) = max(others.items(), key=lambda kv: kv[1][1])
            slower = best_tps > mine[1]
            figures = (f"dynapipe {mine[1]:.0f} tokens/s ({mine[0]:.1f} ms), fastest other {name} "
                       f"{best_tps:.0f} ({best_ms:.1f} ms; {mine[1] / best_tps:.4f}x)")
        else:  # the same batches: by iteration time
            name, (best_ms, _) = min(others.items(), key=lambda kv: kv[1][0])
            slower = best_ms < mine[0]
            figures = (f"{args.strategy} auto {mine[0]:.1f} ms, fastest other {name} {best_ms:.1f} "
                       f"({best_ms / mine[0]:.4f}x)")
        behind += slower
        print(f"{describe(p)}: {figures}{' ' + label if slower else ''}", flush=True)
    print(f"{feasible - behind} of {feasible} feasible points: "
          + ("dynapipe the fastest (or tied)" if args.compare == "strategies"
             else "auto at least as fast as every named schedule"))


if __name__ == "__main__":
    main()
