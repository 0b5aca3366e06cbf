#!/usr/bin/env python3
"""A small GPT trained with DDP on variable-length samples, several ways (--modes):

  dynamic  dynapipe.torch.DynamicBatchSampler: per optimizer step, the micro-batches
           DynaPipe's DP chooses (--strategy; similar lengths together, each padded to
           its own longest sample);
  fixed    the same samples per rank and step, cut into fixed-size micro-batches of
           --fixed-mb samples in index order (each padded to its longest sample);
  S        any other planner strategy name (token-based, padding, ...): the sampler
           with strategy S, the same global batches.

On CPU (default) the ranks use gloo; with --device cuda rank r trains on cuda:r over
NCCL (one GPU per rank) and attention is PyTorch's fused scaled_dot_product_attention.

Both weight each micro-batch's mean loss by collate_microbatch()'s loss_weight, so
every step's loss is the exact token mean of the whole global batch: the two runs print
the same losses and differ only in tokens/s. With --check the script also trains one
process on each whole global batch at once and verifies that both DDP runs match it
(<= --rtol relative, every step).

    PYTHONPATH=build/python /usr/bin/python3 examples/ddp_dynamic_microbatches.py --steps 20
    # one GPU, a 150M-parameter GPT, the planner told the model's shape and the GPU:
    python3 examples/ddp_dynamic_microbatches.py --device cuda --world-size 1 --dtype bfloat16 \
        --d-model 1024 --heads 16 --layers 12 --max-len 2048 --token-budget 65536 \
        --planner-model examples/gpt-150m.json --cost-model analytic:h100-80g --strategy dynapipe-padded \
        --modes dynamic,token-based,fixed
"""
import argparse
import contextlib
import json
import math
import os
import random
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F

from dynapipe.torch import DynamicBatchSampler, collate_microbatch

VOCAB = 64


class Block(torch.nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = torch.nn.LayerNorm(d), torch.nn.LayerNorm(d)
        self.qkv, self.proj = torch.nn.Linear(d, 3 * d), torch.nn.Linear(d, d)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(d, 4 * d), torch.nn.GELU(), torch.nn.Linear(4 * d, d))

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        # Causal attention: with right padding a real token never sees padding, so a
        # sample's result does not depend on what it is batched with.
        if x.is_cuda:
            att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = q @ k.transpose(-1, -2) / math.sqrt(d // self.heads)
            causal = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
            att = scores.masked_fill(causal, float("-inf")).softmax(-1) @ v
        x = x + self.proj(att.transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.ln2(x))


class TinyGPT(torch.nn.Module):
    def __init__(self, d=64, heads=4, layers=2, max_len=512):
        super().__init__()
        self.tok, self.pos = torch.nn.Embedding(VOCAB, d), torch.nn.Embedding(max_len, d)
        self.blocks = torch.nn.ModuleList(Block(d, heads) for _ in range(layers))
        self.ln = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, VOCAB, bias=False)

    def forward(self, input_ids, position_ids):
        x = self.tok(input_ids) + self.pos(position_ids)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln(x))


def make_data(n, max_len, seed):
    """Lengths with a long tail (as in multi-task data) and tokens that follow a per-
    sample arithmetic rule, so that the loss falls."""
    rng = random.Random(seed)
    lengths = [max(4, min(max_len, int(rng.lognormvariate(math.log(max_len / 8), 0.9)))) for _ in range(n)]
    data = []
    for n_tok in lengths:
        start, step = rng.randrange(VOCAB), rng.choice([1, 3, 5])
        data.append(torch.tensor([(start + step * p) % VOCAB for p in range(n_tok)]))
    return lengths, data


def step_loss(model, batches, device):
    # Summed on the device: one host sync per step, not one per micro-batch.
    total = torch.zeros((), dtype=torch.float64, device=device)
    for k, (mb, sync) in enumerate(batches):
        with sync():
            logits = model(mb["input_ids"].to(device), mb["position_ids"].to(device))
            if logits.dtype == torch.bfloat16:
                logits = logits.float()  # the loss in float32, as mixed-precision training does
            loss = F.cross_entropy(logits.flatten(0, 1), mb["labels"].to(device).flatten(), ignore_index=-100)
            (loss * mb["loss_weight"]).backward()
        total += loss.detach().double() * mb["loss_weight"]
    return total


def sampler_of(args, lengths, world, rank, strategy):
    return DynamicBatchSampler(lengths, token_budget=args.token_budget, num_replicas=world, rank=rank,
                               seed=args.seed, model=args.planner_model, cost_model=args.cost_model,
                               memory_limit_gib=args.memory_limit_gib, strategy=strategy, prefetch=1)


def use_cuda(args, rank):
    torch.cuda.set_device(rank)
    # cuDNN's fused attention (PyTorch's first choice on Hopper since 2.5) builds a graph for
    # every new input shape: ~115 ms per new [B, L] for this 12-layer model on an H200, 7x
    # the micro-batch's compute. Under dynamic micro-batching nearly every shape is new, so
    # take the flash kernel, which has no per-shape set-up.
    if not args.cudnn_attention and hasattr(torch.backends.cuda, "enable_cudnn_sdp"):
        torch.backends.cuda.enable_cudnn_sdp(False)


def device_of(args, rank):
    return torch.device(f"cuda:{rank}") if args.device == "cuda" else torch.device("cpu")


def make_model(args, device):
    return TinyGPT(d=args.d_model, heads=args.heads, layers=args.layers,
                   max_len=args.max_len).to(device=device, dtype=getattr(torch, args.dtype))


def worker(rank, args, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        use_cuda(args, rank)
    dist.init_process_group("nccl" if args.device == "cuda" else "gloo", rank=rank,
                            world_size=args.world_size)
    for mode in args.modes:
        train(rank, args, mode, results)
    dist.destroy_process_group()


def train(rank, args, mode, results):
    device = device_of(args, rank)
    lengths, data = make_data(args.samples, args.max_len, args.seed)
    torch.manual_seed(0)
    model = make_model(args, device)
    model = torch.nn.parallel.DistributedDataParallel(
        model, device_ids=[rank] if device.type == "cuda" else None)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sampler = sampler_of(args, lengths, args.world_size, rank,
                         args.strategy if mode in ("dynamic", "fixed") else mode)
    losses, tokens, microbatches, elapsed = [], 0, 0, 0.0
    for step in sampler:
        if step.index >= args.warmup + args.steps:
            break
        if mode == "fixed":
            mine = sorted(i for mb in step for i in mb)
            groups = [mine[a:a + args.fixed_mb] for a in range(0, len(mine), args.fixed_mb)]
        else:
            groups = list(step)
        start = time.perf_counter()
        batches = []
        for k, group in enumerate(groups):
            mb = collate_microbatch([data[i] for i in group], step_loss_tokens=step.loss_tokens,
                                    world_size=args.world_size)
            # Gradients are all-reduced once per step, on the last micro-batch.
            batches.append((mb, model.no_sync if k < len(groups) - 1 else contextlib.nullcontext))
        opt.zero_grad()
        loss = step_loss(model, batches, device).reshape(1)
        opt.step()
        dist.all_reduce(loss)  # each rank holds world_size x its share of the token mean
        losses.append(loss.item() / args.world_size)  # .item() waits for the device
        if step.index >= args.warmup:  # warm-up steps (kernel choice, allocator) untimed
            elapsed += time.perf_counter() - start
            tokens += sum(lengths[i] for i in sampler.global_batches()[step.index])
            microbatches += len(groups)
    counts = torch.tensor([microbatches], device=device)
    dist.all_reduce(counts)
    if rank == 0:
        results.put({"mode": mode, "losses": losses, "tokens_per_s": tokens / elapsed,
                     "microbatches_per_step": counts.item() / args.world_size / max(1, args.steps),
                     "peak_gib": torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None})
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)


def reference(args):
    """One process, each whole global batch as one micro-batch (weight 1)."""
    torch.set_num_threads(args.threads)
    if args.device == "cuda":
        use_cuda(args, 0)
    device = device_of(args, 0)
    lengths, data = make_data(args.samples, args.max_len, args.seed)
    torch.manual_seed(0)
    model = make_model(args, device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    sampler = sampler_of(args, lengths, args.world_size, 0, args.strategy)  # the global batches only
    losses = []
    for index, batch in enumerate(sampler.global_batches()[:args.warmup + args.steps]):
        total = sum(lengths[i] - 1 for i in batch)
        mb = collate_microbatch([data[i] for i in batch], step_loss_tokens=total)
        opt.zero_grad()
        losses.append(step_loss(model, [(mb, contextlib.nullcontext)], device).item())
        opt.step()
    return losses


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20, help="timed steps")
    ap.add_argument("--warmup", type=int, default=0, help="untimed steps before them (losses kept)")
    ap.add_argument("--samples", type=int, default=2000)
    ap.add_argument("--max-len", type=int, default=256)
    ap.add_argument("--token-budget", type=int, default=8192, help="tokens per optimizer step, all ranks")
    ap.add_argument("--fixed-mb", type=int, default=8, help="samples per micro-batch of the fixed run")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--dtype", choices=["float32", "float64", "bfloat16"], default="float32")
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                    help="cuda: rank r on cuda:r, NCCL (needs --world-size GPUs)")
    ap.add_argument("--cudnn-attention", action="store_true",
                    help="cuda: let PyTorch pick cuDNN's attention (a graph per new shape)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads per process")
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--modes", default="dynamic,fixed",
                    help="comma list: dynamic, fixed, or a planner strategy (token-based, ...)")
    ap.add_argument("--strategy", default="dynapipe-padded",
                    help="the planner strategy of 'dynamic' (padded micro-batches: dynapipe-padded)")
    ap.add_argument("--planner-model", default="gpt-tiny", help="model preset or JSON the planner costs")
    ap.add_argument("--cost-model", default="analytic:cpu", help="the planner's cost model")
    ap.add_argument("--memory-limit-gib", type=float, default=0.0,
                    help="the planner's memory limit per device (0: the cost model's device)")
    ap.add_argument("--check", action="store_true", help="compare with one process over whole batches")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--json", help="write the results here")
    args = ap.parse_args()
    args.modes = [m for m in args.modes.split(",") if m]
    if not args.modes or len(set(args.modes)) != len(args.modes):
        ap.error(f"--modes must name each mode once, got {','.join(args.modes)!r}")
    if args.device == "cuda" and torch.cuda.device_count() < args.world_size:
        ap.error(f"--device cuda needs --world-size GPUs ({args.world_size}), "
                 f"this machine has {torch.cuda.device_count()}")

    # fork (CPU only, nothing run in this process yet) spares each rank importing torch;
    # CUDA cannot be forked.
    method = "fork" if sys.platform.startswith("linux") and args.device == "cpu" else "spawn"
    queue = mp.get_context(method).SimpleQueue()
    mp.start_processes(worker, args=(args, free_port(), queue), nprocs=args.world_size,
                       start_method=method)
    results = {}
    for _ in args.modes:
        r = queue.get()
        results[r["mode"]] = r
    if args.check:
        results["reference"] = {"mode": "reference", "losses": reference(args)}

    print(f"{'step':>4}  " + "  ".join(f"{m:>12}" for m in results))
    for k in range(len(results[args.modes[0]]["losses"])):
        print(f"{k:>4}  " + "  ".join(f"{r['losses'][k]:12.6f}" for r in results.values()))
    for mode in args.modes:
        r = results[mode]
        peak = f", peak {r['peak_gib']:.1f} GiB" if r.get("peak_gib") is not None else ""
        print(f"{mode:>12}: {r['tokens_per_s']:9.0f} tokens/s, {r['microbatches_per_step']:.1f} micro-batches/step{peak}")
    for mode in args.modes[1:]:
        print(f"{args.modes[0]} vs {mode}: "
              f"{results[args.modes[0]]['tokens_per_s'] / results[mode]['tokens_per_s']:.2f}x tokens/s")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f)
    if args.check:
        ref = results["reference"]["losses"]
        worst = max(abs(a - b) / abs(b) for mode in args.modes
                    for a, b in zip(results[mode]["losses"], ref))
        ok = worst <= args.rtol and all(len(results[m]["losses"]) == len(ref) for m in args.modes)
        print(f"check: largest relative loss difference to one process over whole batches {worst:.2e} "
              f"({'ok' if ok else 'FAILED'}, rtol {args.rtol:g})")
        return 0 if ok else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
