#!/usr/bin/env python3
"""Replay plans with measured costs: time every micro-batch of each plan's iterations on
a GPU (bf16, flash attention; the same PyTorch layers as bench/gpu_profile.py), then run
the plan's own schedule (each device's op order from its timeline) again with those
times in place of the planner's estimates. This checks what the planner's choice is worth
on real kernels: the micro-batches each strategy cut, with their real shapes, padding and
block-diagonal (varlen) attention, on the schedule it chose.

What is measured: per micro-batch and recompute mode, the forward and backward of one
transformer layer of each kind (GPT layer; T5 encoder, decoder), of the embedding and of
the head (final LN, tied LM head, fp32 loss). A stage's op costs the sum of its pieces
(its layers x one layer's time: the layers of a kind are the same shape). Zero-bubble ops
split a measured backward as the plan split its estimate (I and W in the timeline's
proportion). Messages cost the plan's rule (latency + bytes / link bandwidth, taken from
the profile named in the plan). Each plan is also replayed with its own estimates: that
replay must give the plan's est_iteration_ms, which checks the replay itself.

Micro-batches are laid out as the runtime lays them out: a micro-batch with a `density`
is varlen (each row packs its samples back to back, attention block-diagonal per sample,
a row's unused tail one more segment); without one it is dense: packed rows (`packing`)
attend across their samples, every other sample has its own row padded to the shape.
Identical micro-batches are measured once per round; each round goes through all
measurements of a model in a new shuffled order, so a slow minute of the GPU does not fall
on one strategy, and a micro-batch's time is the median of its rounds (--rounds).

  python3 bench/gpu_replay.py --samples assets/flan_like_mix.jsonl.gz \\
      --out replay.json plans/*.json

Plans: `dynapipe plan --cost-model PROFILE.json --out P.json` (a profile cost model: its
device gives the link figures). With dp > 1 every replica is replayed and the iteration
takes the slowest plus the plan's own estimate of the gradient all-reduce (not measured).
The CPU (--device cpu, fp32, per-sample attention) is a smoke test of the script, not a
measurement.
"""
import argparse
import gzip
import json
import random
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import gpu_profile as gp  # noqa: E402  (the layers, the timer)


def fail(message):
    print(f"gpu_replay: {message}", file=sys.stderr)
    sys.exit(2)


def load_samples(path):
    """id -> (input_len, target_len)."""
    opener = gzip.open if path.endswith(".gz") else open
    samples = {}
    try:
        with opener(path, "rt") as f:
            for line_no, line in enumerate(f, 1):
                if not line.strip():
                    continue
                try:
                    d = json.loads(line)
                    samples[int(d["id"])] = (int(d["input_len"]), int(d["target_len"]))
                except (ValueError, KeyError, TypeError) as e:
                    fail(f"--samples {path}:{line_no}: expected {{id, input_len, target_len}} ({e})")
    except OSError as e:
        fail(f"--samples {path}: {e.strerror}")
    return samples


def load_plan(path):
    try:
        with open(path) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"{path}: {e}")
    if plan.get("format") != "dynapipe-plan":
        fail(f"{path}: not a plan (format {plan.get('format')!r}, expected \"dynapipe-plan\")")
    config = plan["config"]
    if config.get("stage_replicas"):
        fail(f"{path}: replicated stages are not replayed")
    try:
        with open(config["cost_model"]) as f:
            profile = json.load(f)
        link = {"latency_ms": float(profile["device"]["link_latency_ms"]),
                "bandwidth_gbs": float(profile["device"]["link_bandwidth_gbs"]),
                "bytes_per_element": int(profile["bytes_per_element"])}
    except (OSError, ValueError, KeyError, TypeError) as e:
        fail(f"{path}: its cost model {config['cost_model']!r} must be a profile JSON "
             f"(the link figures come from its device) ({type(e).__name__}: {e})")
    return plan, link


# ---------------------------------------------------------------- layout

class Layout:
    """Which pieces each virtual stage holds, with `chunks` virtual stages per device."""

    def __init__(self, config, chunks):
        model = config["model"]
        self.gpt = model["kind"] == "gpt"
        self.enc_layers = model["layers"]
        total = model["layers"] + (0 if self.gpt else model["dec_layers"])
        pp = config["pp"]
        per_device = config.get("layers_per_stage") or [total // pp + (d < total % pp) for d in range(pp)]
        per_virtual = [0] * (pp * chunks)
        for d, n in enumerate(per_device):
            for k in range(chunks):
                per_virtual[k * pp + d] = n // chunks + (k < n % chunks)
        self.pieces = []  # per virtual stage: {piece: count}
        first = 0
        for v, n in enumerate(per_virtual):
            pieces = {}
            if v == 0:
                pieces["embedding"] = 1
            enc = max(0, min(first + n, self.enc_layers) - first) if not self.gpt else 0
            dec = n - enc if not self.gpt else 0
            if self.gpt:
                pieces["layer"] = n
            else:
                if enc:
                    pieces["encoder"] = enc
                if dec:
                    pieces["decoder"] = dec
                if first <= self.enc_layers < first + n:
                    pieces["dec_embedding"] = 1
            if v == len(per_virtual) - 1:
                pieces["head"] = 1
            self.pieces.append({k: c for k, c in pieces.items() if c})
            first += n


def sample_tokens(config, inp, tgt):
    """(encoder or GPT tokens, decoder tokens) of one sample after truncation, as
    truncate_lengths() (src/data/truncation.cpp) cuts them."""
    max_seqlen = config["max_seqlen"]
    max_target = config["max_target_len"] or max_seqlen
    if config["model"]["kind"] == "gpt":
        target = min(tgt, max_target, max_seqlen - 1)
        return min(inp, max_seqlen - target) + target, 0
    return min(inp, max_seqlen), min(tgt, max_target)


def with_tail(lengths, width, where):
    """A row's segments with its unused tail as one more segment."""
    used = sum(lengths)
    if used > width:
        fail(f"{where}: a row of {used} tokens in a shape of {width}")
    return lengths + ([width - used] if used < width else [])


def microbatch_key(config, mb, samples, path):
    """(b, s, d, varlen enc lengths or None, varlen dec lengths or None): what to measure."""
    shape = mb["shape"]
    gpt = config["model"]["kind"] == "gpt"
    b = shape["batch"]
    s = shape["seqlen"] if gpt else shape["enc_seqlen"]
    d = 0 if gpt else shape["dec_seqlen"]
    rows = mb.get("rows") or [[i] for i in mb["sample_ids"]]
    missing = [i for row in rows for i in row if i not in samples]
    if missing:
        fail(f"{path}: micro-batch {mb['id']} holds sample {missing[0]}, which --samples does not have "
             f"(is --samples the plan's data?)")
    tokens = [[sample_tokens(config, *samples[i]) for i in row] for row in rows]
    real = sum(e + t for row in tokens for e, t in row)
    if real != mb["real_tokens"]:
        fail(f"{path}: micro-batch {mb['id']} holds {real} tokens by --samples, the plan says "
             f"{mb['real_tokens']} (is --samples the plan's data?)")
    if len(rows) > b:
        fail(f"{path}: micro-batch {mb['id']} has {len(rows)} rows in a batch of {b}")
    if "density" not in mb:
        return b, s, d, None, None
    enc, dec = [], []
    where = f"{path}: micro-batch {mb['id']}"
    for row in tokens:
        if not d:
            enc += with_tail([e for e, _ in row], s, where)
            continue
        # the decoder's cross-attention pairs segment k of both sides: a tail on one side
        # only joins that side's last sample
        e_row, d_row = with_tail([e for e, _ in row], s, where), with_tail([t for _, t in row], d, where)
        if len(e_row) > len(d_row):
            e_row = e_row[:-2] + [e_row[-2] + e_row[-1]]
        elif len(d_row) > len(e_row):
            d_row = d_row[:-2] + [d_row[-2] + d_row[-1]]
        enc, dec = enc + e_row, dec + d_row
    for _ in range(b - len(rows)):
        enc.append(s)
        if d:
            dec.append(d)
    return b, s, d, tuple(enc), (tuple(dec) if d else None)


# ---------------------------------------------------------------- measuring

class Embedding(gp.Embedding):
    """Positions wrap at the table's end: a varlen row may hold more tokens than
    max_positions (its samples start their positions over; the cost is the same)."""

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device) % self.pos.num_embeddings
        return self.tok(ids) + self.pos(positions)


class Measurer:
    def __init__(self, spec, device, dtype, warmup, repeats):
        self.spec, self.device, self.dtype = spec, device, dtype
        self.warmup, self.repeats = warmup, repeats
        self.timer = gp.Timer(device)
        gpt = spec["kind"] == "gpt"
        self.modules = {"embedding": Embedding(spec), "head": gp.Head(spec)}
        for kind in ["layer"] if gpt else ["encoder", "decoder"]:
            self.modules[kind] = gp.Layer(spec, "gpt" if gpt else kind)
        for m in self.modules.values():
            m.to(device=device, dtype=dtype)

    def time(self, piece, mode, key):
        """(fwd ms, bwd ms) medians of one piece on one micro-batch."""
        b, s, d, enc, dec = key
        h = self.spec["hidden"]
        on = dict(device=self.device, dtype=self.dtype)
        kind = "embedding" if piece == "dec_embedding" else piece
        module = self.modules[kind]
        if kind == "embedding":
            n = d if piece == "dec_embedding" else s
            x, dy = torch.randint(0, self.spec["vocab"], (b, n), device=self.device), torch.randn(b, n, h, **on)
        elif kind == "head":
            n = s if d == 0 else d
            x, dy = torch.randn(b, n, h, **on).requires_grad_(), None
            module.labels = torch.randint(0, self.spec["vocab"], (b, n), device=self.device)
        else:
            width = s + (d if kind == "decoder" else 0)
            x, dy = torch.randn(b, width, h, **on).requires_grad_(), torch.randn(b, width, h, **on)
            module.enc_len = s
            module.set_recompute(mode)
            module.set_lengths(enc, dec if kind == "decoder" else None)
        fwd, bwd = [], []
        for i in range(self.warmup + self.repeats):
            if x.requires_grad:
                x.grad = None
            out, f_ms = self.timer.run(lambda: module(x))
            _, b_ms = self.timer.run(lambda out=out: out.backward(dy))
            del out
            if i >= self.warmup:
                fwd.append(f_ms)
                bwd.append(b_ms)
        module.zero_grad(set_to_none=True)
        if kind in ("layer", "encoder", "decoder"):
            module.set_lengths(None, None)
        return statistics.median(fwd), statistics.median(bwd)


# ---------------------------------------------------------------- replay

def boundary_elements(config, layout, key, v):
    """Elements of the activation leaving virtual stage v: [b, s, h], or [b, E + D, h]
    once a T5 decoder layer has run (docs/plan-format.md, "Tensor shapes")."""
    b, s, d = key[:3]
    holds_decoder = any("decoder" in layout.pieces[u] for u in range(v + 1))
    return b * (s + (d if holds_decoder else 0)) * config["model"]["hidden"]


def replay(ops, cost, comm):
    """Makespan of the plan's per-device op order with op costs cost(op) and message
    times comm(mb, from_stage, to_stage)."""
    by_device = {}
    for op in sorted(ops, key=lambda o: (o["start_ms"], o["stage"])):
        by_device.setdefault(op["device"], []).append(op)
    device_of = {}
    for op in ops:
        device_of[(op["stage"], op["mb"])] = op["device"]
    last_stage = max(op["stage"] for op in ops)
    done = {}  # (op, mb, stage) -> end time
    free = {dev: 0.0 for dev in by_device}
    nxt = {dev: 0 for dev in by_device}
    remaining = len(ops)

    def ready(op):
        """Time op's inputs are there, or None if one is not done yet."""
        mb, v, kind = op["mb"], op["stage"], op["op"]
        deps = []
        if kind == "F" and v > 0:
            deps.append((("F", mb, v - 1), v - 1, v))
        if kind in ("B", "I"):
            deps.append((("F", mb, v), None, None))
            if v < last_stage:
                grad = ("I", mb, v + 1) if ("I", mb, v + 1) in keys else ("B", mb, v + 1)
                deps.append((grad, v + 1, v))
        if kind == "W":
            deps.append((("I", mb, v), None, None))
        t = 0.0
        for dep, src, dst in deps:
            if dep not in done:
                return None
            extra = comm(mb, src, dst) if src is not None and device_of[(src, mb)] != device_of[(dst, mb)] else 0.0
            t = max(t, done[dep] + extra)
        return t

    keys = {(op["op"], op["mb"], op["stage"]) for op in ops}
    while remaining:
        progressed = False
        for dev, queue in by_device.items():
            while nxt[dev] < len(queue):
                op = queue[nxt[dev]]
                t = ready(op)
                if t is None:
                    break
                start = max(free[dev], t)
                free[dev] = start + cost(op)
                done[(op["op"], op["mb"], op["stage"])] = free[dev]
                nxt[dev] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            raise RuntimeError("the plan's op order deadlocks in replay")
    return max(free.values())


def plan_jobs(plan, path, samples):
    """[(iteration, [(replica, its stage layout, keys per mb)])] and the set of (piece,
    mode, key) to measure."""
    config = plan["config"]
    wanted, iterations = set(), []
    for it in plan["iterations"]:
        replicas = []
        for rep in it["replicas"]:
            # under --schedule auto each replica has its own schedule: an interleaved one
            # runs more virtual stages than config.chunks says
            layout = Layout(config, (max(o["stage"] for o in rep["timeline"]) + 1) // config["pp"])
            keys = [microbatch_key(config, mb, samples, path) for mb in rep["microbatches"]]
            for key in keys:
                for stage in layout.pieces:
                    for piece in stage:
                        wanted.add((piece, mode_of(piece, rep), key))
            replicas.append((rep, layout, keys))
        iterations.append((it, replicas))
    return iterations, wanted


def mode_of(piece, replica):
    """The recompute mode a piece runs in: the replica's for transformer layers."""
    return replica["recompute"] if piece in ("layer", "encoder", "decoder") else "none"


def evaluate_replica(config, link, layout, rep, keys, measured):
    """One replica's iteration: its estimate, the replay of its estimates and of the
    measurements, and each device's work (estimated, measured)."""
    ops = rep["timeline"]
    est = {(o["op"], o["mb"], o["stage"]): o["end_ms"] - o["start_ms"] for o in ops}

    def stage_cost(mb, v):
        f = bw = 0.0
        for piece, count in layout.pieces[v].items():
            pf, pb = measured[(piece, mode_of(piece, rep), keys[mb])]
            f, bw = f + count * pf, bw + count * pb
        return f, bw

    def measured_cost(op):
        f, bw = stage_cost(op["mb"], op["stage"])
        if op["op"] == "F":
            return f
        if op["op"] == "B":
            return bw
        i, w = est.get(("I", op["mb"], op["stage"]), 0.0), est.get(("W", op["mb"], op["stage"]), 0.0)
        share = i / (i + w) if i + w > 0 else 1.0
        return bw * (share if op["op"] == "I" else 1 - share)

    def comm(mb, src, dst):
        elements = boundary_elements(config, layout, keys[mb], min(src, dst))
        return link["latency_ms"] + elements * link["bytes_per_element"] / (link["bandwidth_gbs"] * 1e6)

    devices = sorted({o["device"] for o in ops})
    return {"schedule": rep["schedule"], "recompute": rep["recompute"], "microbatches": len(keys),
            "est_ms": rep["est_iteration_ms"],
            "est_replay_ms": replay(ops, lambda o: o["end_ms"] - o["start_ms"], comm),
            "measured_ms": replay(ops, measured_cost, comm),
            "work_est_ms": [sum(o["end_ms"] - o["start_ms"] for o in ops if o["device"] == d) for d in devices],
            "work_measured_ms": [sum(measured_cost(o) for o in ops if o["device"] == d) for d in devices]}


def evaluate(plan, link, iterations, measured):
    """Per iteration: the plan's estimate and both replays (the slowest replica, then the
    gradient all-reduce as the plan estimated it: what its iteration estimate adds to its
    slowest replica's), and every replica's own figures."""
    out = []
    for it, replicas in iterations:
        rows = [evaluate_replica(plan["config"], link, layout, rep, keys, measured) for rep, layout, keys in replicas]
        allreduce = max(0.0, it["est_iteration_ms"] - max(r["est_ms"] for r in rows))
        out.append({"iteration": it["index"], "est_ms": it["est_iteration_ms"],
                    "est_replay_ms": max(r["est_replay_ms"] for r in rows) + allreduce,
                    "measured_ms": max(r["measured_ms"] for r in rows) + allreduce,
                    "allreduce_est_ms": allreduce, "replicas": rows})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("plans", nargs="+", help="plan JSON files (dynapipe plan --out) on a profile cost model")
    ap.add_argument("--samples", required=True, help="the samples file the plans were made from")
    ap.add_argument("--out", required=True, help="results JSON to write")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--rounds", type=int, default=1,
                    help="measure every micro-batch this many times, each round in a new shuffled order, "
                         "and take the median of the rounds")
    ap.add_argument("--seed", type=int, default=0, help="the shuffled orders of the measurements")
    args = ap.parse_args()
    if args.warmup < 0 or args.repeats < 1 or args.rounds < 1:
        ap.error("--repeats and --rounds must be >= 1, --warmup >= 0")
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: this PyTorch sees no GPU (use --device cpu for a smoke test)")
    samples = load_samples(args.samples)

    groups = {}  # model (as JSON text) -> {plan path: (plan, link, iterations, wanted)}
    for path in args.plans:
        plan, link = load_plan(path)
        model_text = json.dumps(plan["config"]["model"], sort_keys=True)
        groups.setdefault(model_text, {})[path] = (plan, link) + plan_jobs(plan, path, samples)
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    torch.manual_seed(0)
    if device.type == "cuda":
        if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
            torch.backends.cuda.enable_cudnn_sdp(False)
        print(f"{torch.cuda.get_device_name(device)}, torch {torch.__version__}, bf16", flush=True)
    else:
        print(f"cpu, torch {torch.__version__}, fp32 (a smoke test)", flush=True)

    results, raw = [], []
    for model_text, group in sorted(groups.items()):
        spec = json.loads(model_text)
        wanted = sorted(set().union(*(v[3] for v in group.values())), key=repr)
        measurer = Measurer(spec, device, dtype, args.warmup, args.repeats)
        start = time.perf_counter()
        rounds = {job: [] for job in wanted}
        rng = random.Random(args.seed)
        for r in range(args.rounds):
            rng.shuffle(wanted)
            for n, job in enumerate(wanted, 1):
                try:
                    rounds[job].append(measurer.time(*job))
                except torch.cuda.OutOfMemoryError if device.type == "cuda" else MemoryError:
                    fail(f"{spec['name']}: {job[0]} ({job[1]}) on b={job[2][0]} s={job[2][1]} d={job[2][2]} ran out of memory")
                if n % 500 == 0 or n == len(wanted):
                    print(f"  {spec['name']}: round {r + 1} of {args.rounds}, {n} of {len(wanted)} measurements, "
                          f"{time.perf_counter() - start:.0f} s", flush=True)
        del measurer
        measured = {job: (statistics.median(f for f, _ in values), statistics.median(b for _, b in values))
                    for job, values in rounds.items()}
        raw.extend({"model": spec["name"], "piece": job[0], "recompute": job[1], "batch": job[2][0],
                    "seqlen": job[2][1], "dec_seqlen": job[2][2],
                    "segments": len(job[2][3]) if job[2][3] else 0,
                    "fwd_ms": [round(f, 4) for f, _ in values], "bwd_ms": [round(b, 4) for _, b in values]}
                   for job, values in sorted(rounds.items(), key=lambda kv: repr(kv[0])))
        if device.type == "cuda":
            torch.cuda.empty_cache()
        for path, (plan, link, iterations, _) in group.items():
            rows = evaluate(plan, link, iterations, measured)
            config = plan["config"]
            results.append({"plan": path, "model": spec["name"], "strategy": config["strategy"], "pp": config["pp"],
                            "max_seqlen": config["max_seqlen"], "memory_limit_gib": config["memory_limit_gib"],
                            "iterations": rows})
            est, est_replay, meas = (mean_of(rows, k) for k in ("est_ms", "est_replay_ms", "measured_ms"))
            print(f"{Path(path).name}: {config['strategy']}, est {est:.1f} ms (replayed {est_replay:.1f}), "
                  f"measured costs {meas:.1f} ms ({meas / est:.3f}x the estimate)", flush=True)
        write(args.out, device, results, raw)  # after each model: a run cut short keeps what it measured
    print(f"wrote {args.out}", flush=True)
    print_points(results)
    return 0


def mean_of(rows, key):
    return statistics.fmean(row[key] for row in rows)


def print_points(results):
    """One line per point (model, pp, max seqlen, memory) planned by several strategies:
    each one's mean iteration ms, estimated / measured, and the fastest other strategy over
    dynapipe by both."""
    points = {}
    for r in results:
        key = (r["model"], r["pp"], r["max_seqlen"], r["memory_limit_gib"])
        points.setdefault(key, {})[r["strategy"]] = (mean_of(r["iterations"], "est_ms"),
                                                     mean_of(r["iterations"], "measured_ms"))
    print("# point: strategy est/measured ms ... | fastest other / dynapipe: estimated, measured")
    for key, by in sorted(points.items()):
        memory = f"{key[3]:g} GiB" if key[3] else "the device's memory"
        line = f"{key[0]} pp {key[1]} {key[2]} {memory}: " + ", ".join(
            f"{s} {e:.1f}/{m:.1f}" for s, (e, m) in by.items())
        others = {s: v for s, v in by.items() if s != "dynapipe"}
        if "dynapipe" in by and others:
            e0, m0 = by["dynapipe"]
            fe = min(others, key=lambda s: others[s][0])
            fm = min(others, key=lambda s: others[s][1])
            line += f" | {fe} {others[fe][0] / e0:.3f}x, {fm} {others[fm][1] / m0:.3f}x"
        print(line, flush=True)


def write(path, device, results, raw):
    try:
        with open(path, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                       "torch": torch.__version__, "results": results, "measurements": raw}, f)
    except OSError as e:
        fail(f"--out {path}: {e.strerror}")


if __name__ == "__main__":
    sys.exit(main())
