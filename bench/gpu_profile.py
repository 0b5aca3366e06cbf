#!/usr/bin/env python3
"""Measure a GPT or T5 model's per-layer costs with PyTorch on a GPU and write them as a
dynapipe profile (docs/profile-format.md), so that `dynapipe plan/simulate --cost-model
PROFILE.json` plans with real kernel times on hardware the C++ runtime does not run on.

`dynapipe profile` measures the LibTorch runtime's own layers (CPU here). This script
measures the same pieces as plain PyTorch modules, in bf16 on CUDA with PyTorch's fused
attention (flash; cuDNN's is switched off, it builds a graph per new shape), or in fp32 on
the CPU (a smoke test of the script: CPU memory is not measured, peak_bytes is 0 there):

  embedding   token + position lookup               ids [b, s] -> [b, s, h]
  layer       GPT: pre-LN layer, causal attention   [b, s, h] -> [b, s, h]        (none, selective, full)
  encoder     T5: the same, bidirectional           [b, s, h] -> [b, s, h]        (none, selective, full)
  decoder     T5: causal self- and cross-attention  [b, E + D, h] -> [b, E + D, h] (none, selective, full)
  head        final LN + tied LM head + fp32 cross-entropy           [b, s, h] -> loss

Times are medians of --repeats forward and backward passes after --warmup (CUDA events on
a GPU); stored = bytes still allocated when forward returns (the output included), peak =
the most allocated during forward + backward minus stored, as `dynapipe profile` counts.
Batches double from 1 along each length (T5 decoder: each encoder x decoder length) while
b * (s + d) <= --max-tokens; a shape that runs out of memory ends its row (the profile
format reads the missing tail as out of memory).

On CUDA each transformer layer's varlen fixed cost is measured too (`varlen_fixed_ms`,
docs/profile-format.md): up to three dense shapes of the grid, timed dense and with one
sample per row through the varlen kernel; the medians of the differences, where above 0.

--varlen-check FILE also times the transformer layers (recompute none) on packed rows:
each row of s tokens holds k samples of s / k tokens (--varlen-samples), or samples of
mixed lengths (--varlen-mixed), under block-diagonal attention (varlen flash attention on
CUDA), next to the same shape dense, to check how the planner costs such rows (the
attention density rule, docs/profile-format.md).

  python3 bench/gpu_profile.py --model gpt-6.7b.json --out h100.gpt-6.7b.json \
      --device-name h100-80g --max-tokens 131072 --varlen-check h100.varlen.json
"""
import argparse
import itertools
import json
import math
import random
import statistics
import sys
import time

import torch
import torch.nn.functional as F
import torch.utils.checkpoint

MODEL_FIELDS = ("name", "kind", "hidden", "heads", "kv_channels", "ffn_hidden", "layers",
                "dec_layers", "vocab", "max_positions")


def fail(message):
    print(f"gpu_profile: {message}", file=sys.stderr)
    sys.exit(2)


def load_model(path):
    try:
        with open(path) as f:
            spec = json.load(f)
    except (OSError, ValueError) as e:
        fail(f"--model {path}: {e}")
    missing = [k for k in MODEL_FIELDS if k not in spec]
    if missing:
        fail(f"--model {path}: missing {', '.join(missing)} (a model file, docs/models.md)")
    if spec["kind"] not in ("gpt", "t5"):
        fail(f"--model {path}: kind must be \"gpt\" or \"t5\", got {spec['kind']!r}")
    if spec["kind"] == "t5" and spec["dec_layers"] < 1:
        fail(f"--model {path}: a T5 model needs dec_layers >= 1, got {spec['dec_layers']}")
    if spec["hidden"] % spec["heads"] != 0 and not spec["kv_channels"]:
        fail(f"--model {path}: hidden {spec['hidden']} is not a multiple of heads {spec['heads']}")
    return spec


# ---------------------------------------------------------------- attention

def _varlen_kernel():
    """PyTorch's varlen flash attention as f(q, k, v, cu_q, cu_k, max_q, max_k, causal);
    None where this PyTorch has none. q, k, v: [tokens, heads, head_dim]."""
    try:
        import inspect
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "is_causal" in params:
        return lambda q, k, v, cq, ck, mq, mk, causal: varlen_attn(q, k, v, cq, ck, mq, mk, is_causal=causal)
    if "window_size" in params:  # causal = nothing to the right
        return lambda q, k, v, cq, ck, mq, mk, causal: varlen_attn(
            q, k, v, cq, ck, mq, mk, window_size=(-1, 0) if causal else (-1, -1))
    return None


def dense_attention(q, k, v, causal):
    """q: [b, heads, sq, d], k, v: [b, heads, sk, d]."""
    if hasattr(F, "scaled_dot_product_attention"):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    scores = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    if causal:
        n = q.shape[-2]
        scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return scores.softmax(-1) @ v


def cumulative(lengths, device):
    return torch.tensor([0] + list(itertools.accumulate(lengths)), dtype=torch.int32, device=device)


class Attention(torch.nn.Module):
    """Self- or cross-attention as the runtime's (src/runtime/model/layers.cpp)."""

    def __init__(self, spec, cross, causal):
        super().__init__()
        h = spec["hidden"]
        self.heads, self.head_dim = spec["heads"], spec["kv_channels"] or h // spec["heads"]
        width = self.heads * self.head_dim
        self.cross, self.causal = cross, causal
        if cross:
            self.q, self.kv = torch.nn.Linear(h, width), torch.nn.Linear(h, 2 * width)
        else:
            self.qkv = torch.nn.Linear(h, 3 * width)
        self.out = torch.nn.Linear(width, h)
        self.recompute = "none"
        self.q_lengths = self.k_lengths = None  # varlen check: samples back to back in the rows
        self.offsets = None  # their cumulative offsets on the device
        self.varlen = None

    def core(self, q, k, v):
        """q: [b, sq, heads, d], k, v: [b, sk, heads, d] -> [b, sq, heads * d]."""
        b, sq, sk = q.shape[0], q.shape[1], k.shape[1]
        if self.q_lengths is None:
            out = dense_attention(*(t.transpose(1, 2) for t in (q, k, v)), self.causal).transpose(1, 2)
            return out.reshape(b, sq, -1)
        qf = q.reshape(b * sq, self.heads, self.head_dim)
        kf, vf = (t.reshape(b * sk, self.heads, self.head_dim) for t in (k, v))
        if q.is_cuda and self.varlen is not None:
            if self.offsets is None:  # made once per packing, as a data loader would hand them over
                self.offsets = (cumulative(self.q_lengths, q.device), cumulative(self.k_lengths, q.device))
            out = self.varlen(qf, kf, vf, *self.offsets, max(self.q_lengths), max(self.k_lengths), self.causal)
        else:  # each sample on its own: the same block-diagonal attention
            parts, qs, ks = [], 0, 0
            for nq, nk in zip(self.q_lengths, self.k_lengths):
                one = [t[a:a + n].transpose(0, 1).unsqueeze(0) for t, a, n in ((qf, qs, nq), (kf, ks, nk), (vf, ks, nk))]
                parts.append(dense_attention(*one, self.causal)[0].transpose(0, 1))
                qs, ks = qs + nq, ks + nk
            out = torch.cat(parts)
        return out.reshape(b, sq, -1)

    def forward(self, x, memory=None):
        b, n, _ = x.shape
        if self.cross:
            q = self.q(x).view(b, n, self.heads, self.head_dim)
            k, v = self.kv(memory).view(b, memory.shape[1], 2, self.heads, self.head_dim).unbind(2)
        else:
            q, k, v = self.qkv(x).view(b, n, 3, self.heads, self.head_dim).unbind(2)
        if self.recompute == "selective":  # the attention core again in backward
            att = torch.utils.checkpoint.checkpoint(self.core, q, k, v, use_reentrant=False)
        else:
            att = self.core(q, k, v)
        return self.out(att)


class Layer(torch.nn.Module):
    """Pre-LN transformer layer as the runtime's, dropout 0: `gpt` (causal self-attention),
    `encoder` (bidirectional), `decoder` (causal self-attention, cross-attention to the
    encoder's output; its input and output are the pipeline's [b, E + D, h], the encoder
    output first, as every decoder stage carries it)."""

    def __init__(self, spec, kind):
        super().__init__()
        h = spec["hidden"]
        self.kind = kind
        self.ln_self, self.ln_mlp = torch.nn.LayerNorm(h), torch.nn.LayerNorm(h)
        self.self_attn = Attention(spec, cross=False, causal=kind != "encoder")
        if kind == "decoder":
            self.ln_cross, self.cross_attn = torch.nn.LayerNorm(h), Attention(spec, cross=True, causal=False)
        self.fc1, self.fc2 = torch.nn.Linear(h, spec["ffn_hidden"]), torch.nn.Linear(spec["ffn_hidden"], h)
        self.recompute = "none"
        self.enc_len = 0  # decoder: E, the encoder tokens at the front of its input
        varlen = _varlen_kernel()
        for attention in self.attentions():
            attention.varlen = varlen

    def attentions(self):
        return [self.self_attn] + ([self.cross_attn] if self.kind == "decoder" else [])

    def set_recompute(self, mode):
        self.recompute = mode
        for attention in self.attentions():
            attention.recompute = mode

    def set_lengths(self, enc_lengths, dec_lengths=None):
        """Packed samples (the varlen check); None: dense rows."""
        if self.kind == "decoder":
            self.self_attn.q_lengths = self.self_attn.k_lengths = dec_lengths
            self.cross_attn.q_lengths, self.cross_attn.k_lengths = dec_lengths, enc_lengths
        else:
            self.self_attn.q_lengths = self.self_attn.k_lengths = enc_lengths
        for attention in self.attentions():
            attention.offsets = None

    def has_varlen(self):
        return self.self_attn.varlen is not None

    def drop_varlen(self):
        for attention in self.attentions():
            attention.varlen = None

    def body(self, x):
        memory = None
        if self.kind == "decoder":
            memory, x = x[:, :self.enc_len], x[:, self.enc_len:]
        x = x + self.self_attn(self.ln_self(x))
        if memory is not None:
            x = x + self.cross_attn(self.ln_cross(x), memory)
        x = x + self.fc2(F.gelu(self.fc1(self.ln_mlp(x))))
        return x if memory is None else torch.cat([memory, x], 1)

    def forward(self, x):
        if self.recompute == "full":  # keep the input only, the whole layer again in backward
            return torch.utils.checkpoint.checkpoint(self.body, x, use_reentrant=False)
        return self.body(x)


class Embedding(torch.nn.Module):
    def __init__(self, spec):
        super().__init__()
        self.tok = torch.nn.Embedding(spec["vocab"], spec["hidden"])
        self.pos = torch.nn.Embedding(spec["max_positions"], spec["hidden"])

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.tok(ids) + self.pos(positions)


class Head(torch.nn.Module):
    """Final LN + LM head tied to the token table (its parameter bytes are the LN's) +
    cross-entropy in fp32, as mixed-precision training computes it."""

    def __init__(self, spec):
        super().__init__()
        self.ln = torch.nn.LayerNorm(spec["hidden"])
        self.table = torch.nn.Parameter(torch.randn(spec["vocab"], spec["hidden"]) * 0.02)
        self.labels = None

    def forward(self, x):
        logits = self.ln(x) @ self.table.t()
        return F.cross_entropy(logits.float().flatten(0, 1), self.labels.flatten())


# ---------------------------------------------------------------- measuring

class Timer:
    def __init__(self, device):
        self.cuda = device.type == "cuda"

    def run(self, fn):
        """fn() once; (result, milliseconds)."""
        if self.cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            result = fn()
            end.record()
            end.synchronize()
            return result, start.elapsed_time(end)
        start = time.perf_counter()
        result = fn()
        return result, (time.perf_counter() - start) * 1000


class Bench:
    def __init__(self, args, spec, device, dtype):
        self.args, self.spec, self.device, self.dtype = args, spec, device, dtype
        self.timer = Timer(device)
        self.cuda = device.type == "cuda"

    def inputs(self, kind, b, s, d):
        """Random input and output gradient, made on the device (the CPU would take
        seconds for the largest shapes)."""
        h, on = self.spec["hidden"], dict(device=self.device, dtype=self.dtype)
        if kind == "embedding":
            return torch.randint(0, self.spec["vocab"], (b, s), device=self.device), torch.randn(b, s, h, **on)
        x = torch.randn(b, s + d, h, **on).requires_grad_()
        return (x, None) if kind == "head" else (x, torch.randn(b, s + d, h, **on))

    def point(self, module, kind, b, s, d=0):
        """One shape (decoder: s encoder and d decoder tokens per row): {batch, seqlen,
        [dec_seqlen,] fwd_ms, bwd_ms, stored_bytes, peak_bytes}."""
        x, dy = self.inputs(kind, b, s, d)
        if kind == "head":
            module.labels = torch.randint(0, self.spec["vocab"], (b, s), device=self.device)
        if kind == "decoder":
            module.enc_len = s
        fwd, bwd = [], []
        for i in range(self.args.warmup + self.args.repeats):
            if x.requires_grad:
                x.grad = None
            out, f_ms = self.timer.run(lambda: module(x))
            _, b_ms = self.timer.run(lambda: out.backward(dy))  # dy None: the head's scalar loss
            del out
            if i >= self.args.warmup:
                fwd.append(f_ms)
                bwd.append(b_ms)
        stored = peak = 0
        if self.cuda:  # one more pass with the allocator watched; parameter grads exist
            if x.requires_grad:
                x.grad = None
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            out = module(x)
            stored = torch.cuda.memory_allocated(self.device) - before
            out.backward(dy)
            del out
            torch.cuda.synchronize()
            peak = max(0, torch.cuda.max_memory_allocated(self.device) - before - stored)
        point = {"batch": b, "seqlen": s}
        if kind == "decoder":
            point["dec_seqlen"] = d
        point.update({"fwd_ms": round(statistics.median(fwd), 4), "bwd_ms": round(statistics.median(bwd), 4),
                      "stored_bytes": int(stored), "peak_bytes": int(peak)})
        return point

    def table(self, module, kind, label, rows):
        """rows: (seqlen, dec_seqlen) pairs (0: no decoder); batches double from 1 along
        each while b * (s + d) <= --max-tokens."""
        points = []
        for s, d in rows:
            b = 1
            while b * (s + d) <= self.args.max_tokens:
                what = f"{label} b={b} s={s}" + (f" d={d}" if d else "")
                try:
                    points.append(self.point(module, kind, b, s, d))
                except torch.cuda.OutOfMemoryError if self.cuda else MemoryError:
                    print(f"  {what}: out of memory, the row ends here", flush=True)
                    module.zero_grad(set_to_none=False)
                    torch.cuda.empty_cache()
                    break
                p = points[-1]
                if self.args.verbose:
                    print(f"  {what}: fwd {p['fwd_ms']:.3f} ms, bwd {p['bwd_ms']:.3f} ms, "
                          f"stored {p['stored_bytes'] / 2**20:.1f} MiB, peak {p['peak_bytes'] / 2**20:.1f} MiB",
                          flush=True)
                b *= 2
        return points


def parameter_bytes(module, element):
    return sum(p.numel() for p in module.parameters()) * element


def measure(args, spec, device, dtype, element):
    """Every kind's table; (layers, {kind: the layer module}, bench)."""
    bench = Bench(args, spec, device, dtype)
    gpt = spec["kind"] == "gpt"
    layers, modules = [], {}
    start = time.perf_counter()

    embedding = Embedding(spec).to(device=device, dtype=dtype)
    print("embedding", flush=True)
    lengths = args.seqlens if gpt else sorted(set(args.seqlens) | set(args.dec_seqlens))
    layers.append({"kind": "embedding", "parameter_bytes": parameter_bytes(embedding, element),
                   "points": {"none": bench.table(embedding, "embedding", "embedding", [(s, 0) for s in lengths])}})
    del embedding

    for kind in ["layer"] if gpt else ["encoder", "decoder"]:
        module = Layer(spec, "gpt" if gpt else kind).to(device=device, dtype=dtype)
        rows = [(s, d) for s in args.seqlens for d in (args.dec_seqlens if kind == "decoder" else [0])]
        points = {}
        for mode in ("none", "selective", "full"):
            print(f"{kind}, recompute {mode}", flush=True)
            module.set_recompute(mode)
            points[mode] = bench.table(module, kind, f"{kind} {mode}", rows)
        module.set_recompute("none")
        layers.append({"kind": kind, "parameter_bytes": parameter_bytes(module, element), "points": points})
        modules[kind] = module

    head = Head(spec).to(device=device, dtype=dtype)
    print("head", flush=True)
    head_points = bench.table(head, "head", "head", [(s, 0) for s in (args.seqlens if gpt else args.dec_seqlens)])
    ln_bytes = parameter_bytes(head.ln, element)  # the table is the token table's copy (tied)
    layers.append({"kind": "head", "parameter_bytes": ln_bytes, "points": {"none": head_points}})
    del head
    print(f"measured in {time.perf_counter() - start:.1f} s", flush=True)
    return layers, modules, bench


def packed_rows(s, rows, per, rng):
    """Sample lengths filling `rows` rows of s tokens: `per` equal samples each, or (per 0)
    lengths drawn log-normally around s / 16, the last one of a row taking what is left."""
    lengths = []
    for _ in range(rows):
        if per:
            lengths += [s // per] * per
            continue
        left = s
        while left > 0:
            n = min(left, max(8, int(rng.lognormvariate(math.log(s / 16), 1.0))))
            lengths.append(n)
            left -= n
    return lengths


def targets_of(enc_lengths, s, d):
    """Decoder lengths for packed samples: each row of s encoder tokens gets d decoder
    tokens, shared in proportion to its samples' encoder lengths (at least 1 each)."""
    out, row, used = [], [], 0
    for n in enc_lengths:
        row.append(n)
        used += n
        if used == s:
            share = [max(1, n * d // s) for n in row]
            share[share.index(max(share))] += d - sum(share)
            out += share
            row, used = [], 0
    return out


def density(lengths, rows, length):
    return round(sum(n * n for n in lengths) / (rows * length * length), 6)


def varlen_check(args, modules, bench):
    """The transformer layers (recompute none) on rows of s tokens packing samples back to
    back: k equal samples per row (--varlen-samples), then --varlen-mixed micro-batches of
    mixed lengths. A T5 decoder row has s // 8 decoder tokens, shared by its samples."""
    repeats, args.repeats = args.repeats, args.varlen_repeats
    rng = random.Random(0)
    results = []
    for s in args.varlen_seqlens:
        b = max(1, args.varlen_tokens // s)
        cases = [per for per in args.varlen_samples if s % per == 0] + [0] * args.varlen_mixed
        for per in cases:
            enc = packed_rows(s, b, per, rng) if per != 1 else None
            for kind, layer in modules.items():
                d = max(8, s // 8) if kind == "decoder" else 0
                dec = targets_of(enc, s, d) if enc and d else None
                if d and dec and min(dec) < 1:
                    continue
                layer.set_lengths(enc, dec)
                try:
                    p = bench.point(layer, kind, b, s, d)
                except Exception as e:  # noqa: BLE001 - a varlen kernel this PyTorch rejects
                    if not layer.has_varlen() or enc is None:
                        raise
                    print(f"  varlen flash attention failed ({type(e).__name__}: {e}); samples one by one", flush=True)
                    layer.drop_varlen()
                    p = bench.point(layer, kind, b, s, d)
                layer.set_lengths(None, None)
                lengths = enc or [s] * b
                p.update({"layer": kind, "samples": len(lengths), "density": density(lengths, b, s), "lengths": lengths})
                if d:
                    p["dec_density"] = density(dec or [d] * b, b, d)
                    p["dec_lengths"] = dec or [d] * b
                p["kernel"] = "dense" if enc is None else (
                    "varlen flash" if bench.cuda and layer.has_varlen() else "per sample")
                results.append(p)
                print(f"  varlen {kind} b={b} s={s}" + (f" d={d}" if d else "") +
                      f" samples={p['samples']} density={p['density']:.4f}" +
                      (f"/{p['dec_density']:.4f}" if d else "") +
                      f": fwd {p['fwd_ms']:.3f} ms, bwd {p['bwd_ms']:.3f} ms ({p['kernel']})", flush=True)
    args.repeats = repeats
    return results


def varlen_fixed(args, modules, bench):
    """Each transformer layer's fixed cost of the varlen kernels (recompute none): rows of
    one sample each (the same arithmetic as dense rows) timed dense and varlen on up to
    three shapes of the grid. {kind: (fwd_ms, bwd_ms)}, the medians of varlen - dense,
    at least 0; empty where the layers have no varlen kernel (the CPU)."""
    longest = max(args.seqlens)
    shapes = [(b, s) for b, s in ((4, 1024), (2, 2048), (1, 4096)) if s <= longest]
    shapes = shapes or [(1, longest)]
    out = {}
    for kind, layer in modules.items():
        if not (bench.cuda and layer.has_varlen()):
            continue
        d = min(128, max(args.dec_seqlens)) if kind == "decoder" else 0
        fwd, bwd = [], []
        for b, s in shapes:
            if b * (s + d) > args.max_tokens:
                continue
            try:
                dense = bench.point(layer, kind, b, s, d)
                layer.set_lengths([s] * b, [d] * b if d else None)
                varlen = bench.point(layer, kind, b, s, d)
            except Exception as e:  # noqa: BLE001 - a varlen kernel this PyTorch rejects
                print(f"  {kind}: varlen fixed cost not measured ({type(e).__name__}: {e})", flush=True)
                fwd, bwd = [], []
                break
            finally:
                layer.set_lengths(None, None)
            fwd.append(varlen["fwd_ms"] - dense["fwd_ms"])
            bwd.append(varlen["bwd_ms"] - dense["bwd_ms"])
            print(f"  {kind} b={b} s={s}" + (f" d={d}" if d else "") +
                  f": varlen - dense fwd {fwd[-1]:+.3f} ms, bwd {bwd[-1]:+.3f} ms", flush=True)
        if fwd:
            out[kind] = (max(0.0, statistics.median(fwd)), max(0.0, statistics.median(bwd)))
    return out


def with_varlen_fixed(layers, fixed):
    """The layer entries with `varlen_fixed_ms` (docs/profile-format.md) where measured > 0."""
    out = []
    for entry in layers:
        f, b = fixed.get(entry["kind"], (0.0, 0.0))
        if f > 0 or b > 0:
            entry = {"kind": entry["kind"], "parameter_bytes": entry["parameter_bytes"],
                     "varlen_fixed_ms": {"fwd": round(f, 4), "bwd": round(b, 4)}, "points": entry["points"]}
        out.append(entry)
    return out


def int_list(text):
    try:
        values = [int(v) for v in text.split(",") if v]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a comma list of integers, got {text!r}")
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected integers >= 1, got {text!r}")
    return values


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a GPT or T5 model file (docs/models.md)")
    ap.add_argument("--out", required=True, help="the profile to write")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--device-name", default=None, help="the profile's device.name (default: the GPU's name)")
    ap.add_argument("--seqlens", type=int_list, default=int_list("64,128,256,512,1024,2048,4096,8192"),
                    help="sequence lengths (T5: encoder)")
    # From 8, as `dynapipe profile` grids them: the bundled data's median target is 3 tokens,
    # and varlen rows of many short targets fold to decoder lengths below 32, which a grid
    # from 32 extrapolated linearly (docs/RESULTS.md, "Short targets in the profile grid").
    ap.add_argument("--dec-seqlens", type=int_list, default=int_list("8,16,32,64,128,256,512"),
                    help="T5: decoder lengths")
    ap.add_argument("--max-tokens", type=int, default=131072, help="b * s at most per measured shape")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--link-gbs", type=float, default=450.0, help="device.link_bandwidth_gbs (not measured)")
    ap.add_argument("--link-latency-ms", type=float, default=0.005)
    ap.add_argument("--allreduce-gbs", type=float, default=360.0)
    ap.add_argument("--varlen-check", help="also write the packed-row timings here")
    ap.add_argument("--varlen-seqlens", type=int_list, default=int_list("2048,8192"))
    ap.add_argument("--varlen-samples", type=int_list, default=int_list("1,2,4,8,16"))
    ap.add_argument("--varlen-tokens", type=int, default=16384, help="tokens per packed micro-batch")
    ap.add_argument("--varlen-mixed", type=int, default=0, help="also this many micro-batches of mixed lengths per seqlen")
    ap.add_argument("--varlen-repeats", type=int, default=5, help="timed passes per packed shape")
    ap.add_argument("--verbose", action="store_true", help="a line per measured shape")
    args = ap.parse_args()
    if args.max_tokens < 1 or args.warmup < 0 or args.repeats < 1:
        ap.error("--max-tokens and --repeats must be >= 1, --warmup >= 0")
    if len(set(args.seqlens)) < 2:
        ap.error(f"--seqlens needs >= 2 distinct lengths, got {args.seqlens}")
    spec = load_model(args.model)
    for flag, lengths in (("--seqlens", args.seqlens), ("--dec-seqlens", args.dec_seqlens)):
        if max(lengths) > spec["max_positions"]:
            ap.error(f"{flag}: {max(lengths)} is over the model's max_positions {spec['max_positions']}")
    if spec["kind"] == "t5" and len(set(args.dec_seqlens)) < 2:
        ap.error(f"--dec-seqlens needs >= 2 distinct lengths for a T5 model, got {args.dec_seqlens}")
    if args.device == "cuda" and not torch.cuda.is_available():
        fail("--device cuda: this PyTorch sees no GPU (use --device cpu for a smoke test)")

    device = torch.device(args.device)
    dtype, element = (torch.bfloat16, 2) if device.type == "cuda" else (torch.float32, 4)
    torch.manual_seed(0)
    if device.type == "cuda":
        if hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
            torch.backends.cuda.enable_cudnn_sdp(False)
        props = torch.cuda.get_device_properties(device)
        name, memory = args.device_name or props.name, props.total_memory
        print(f"{props.name}, {memory / 2**30:.1f} GiB, torch {torch.__version__}, bf16", flush=True)
    else:
        name, memory = args.device_name or "cpu", 0
        print(f"cpu, torch {torch.__version__}, fp32 (memory not measured)", flush=True)

    layers, modules, bench = measure(args, spec, device, dtype, element)
    for entry in layers:
        for mode, points in entry["points"].items():
            if len({p["batch"] for p in points}) < 2 or len({p["seqlen"] for p in points}) < 2:
                fail(f"{entry['kind']} {mode}: fewer than two batches or seqlens fit; "
                     "raise --max-tokens or give longer --seqlens")
    print("varlen fixed cost", flush=True)
    layers = with_varlen_fixed(layers, varlen_fixed(args, modules, bench))
    device_entry = {"name": name, "memory_bytes": int(memory) or 24 * 2**30,
                    "link_bandwidth_gbs": args.link_gbs, "link_latency_ms": args.link_latency_ms,
                    "allreduce_bandwidth_gbs": args.allreduce_gbs}
    profile = {"format": "dynapipe-profile", "version": 1,
               "model": {k: spec[k] for k in MODEL_FIELDS}, "device": device_entry,
               "bytes_per_element": element, "layers": layers}
    try:
        with open(args.out, "w") as f:
            json.dump(profile, f, indent=1)
    except OSError as e:
        fail(f"--out {args.out}: {e.strerror}")
    print(f"wrote {args.out}", flush=True)
    if args.varlen_check:
        rows = varlen_check(args, modules, bench)
        try:
            with open(args.varlen_check, "w") as f:
                json.dump({"device": name, "model": spec["name"], "rows": rows}, f, indent=1)
        except OSError as e:
            fail(f"--varlen-check {args.varlen_check}: {e.strerror}")
        print(f"wrote {args.varlen_check}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
