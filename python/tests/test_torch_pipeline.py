"""PipelineExecutor runs a plan's instructions over user stage modules: a 4-process run
(pp 2 x dp 2, gloo) of 1f1b, zb1p and interleaved plans gives the losses and the updated
weights of one process training on the whole batch."""
import math
import os
import random
import socket

import pytest

torch = pytest.importorskip("torch")

import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
import torch.nn.functional as F  # noqa: E402

import dynapipe  # noqa: E402
from dynapipe.torch import PipelineExecutor  # noqa: E402

PP, DP, VOCAB, HIDDEN, LAYERS = 2, 2, 320, 128, 4  # the gpt-tiny preset the planner costs
SCHEDULES = ["1f1b", "zb1p", "interleaved"]
ITERATIONS = 2


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = torch.nn.LayerNorm(HIDDEN), torch.nn.LayerNorm(HIDDEN)
        self.qkv, self.proj = torch.nn.Linear(HIDDEN, 3 * HIDDEN), torch.nn.Linear(HIDDEN, HIDDEN)
        self.mlp = torch.nn.Sequential(torch.nn.Linear(HIDDEN, 512), torch.nn.GELU(), torch.nn.Linear(512, HIDDEN))

    def forward(self, x):
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, 4, d // 4).permute(2, 0, 3, 1, 4)
        s = (q @ k.transpose(-1, -2) / math.sqrt(d // 4)).masked_fill(
            torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        x = x + self.proj((s.softmax(-1) @ v).transpose(1, 2).reshape(b, n, d))
        return x + self.mlp(self.ln2(x))


def full_model():
    torch.manual_seed(0)
    return torch.nn.ModuleDict({
        "tok": torch.nn.Embedding(VOCAB, HIDDEN), "pos": torch.nn.Embedding(256, HIDDEN),
        "blocks": torch.nn.ModuleList(Block() for _ in range(LAYERS)),
        "ln": torch.nn.LayerNorm(HIDDEN), "head": torch.nn.Linear(HIDDEN, VOCAB, bias=False),
    }).double()


def stage_module(model, stage, stages):
    per = LAYERS // stages
    parts = {"blocks": torch.nn.ModuleList(model["blocks"][stage * per:(stage + 1) * per])}
    if stage == 0:
        parts.update(tok=model["tok"], pos=model["pos"])
    if stage == stages - 1:
        parts.update(ln=model["ln"], head=model["head"])
    return torch.nn.ModuleDict(parts)


def data():
    rng = random.Random(5)
    return [torch.tensor([rng.randrange(VOCAB) for _ in range(rng.randint(5, 40))]) for _ in range(16)]


def padded(samples, ids, seqlen):
    tokens = torch.zeros(len(ids), seqlen, dtype=torch.long)
    labels = torch.full((len(ids), seqlen), -100, dtype=torch.long)
    for row, i in enumerate(ids):
        t = samples[i]
        tokens[row, :len(t)] = t
        labels[row, :len(t) - 1] = t[1:]
    return tokens, labels


def run_stage(module, stage, stages, x, loaded, total):
    """One stage; `loaded` is (tokens, labels) on the first and last stages, else None."""
    tokens, labels = loaded if loaded is not None else (None, None)
    if stage == 0:
        x = module["tok"](tokens) + module["pos"](torch.arange(tokens.shape[1]))
    for block in module["blocks"]:
        x = block(x)
    if stage < stages - 1:
        return x
    logits = module["head"](module["ln"](x))
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100, reduction="sum") / total


def planner(schedule):
    return dynapipe.Planner(model="gpt-tiny", pp=PP, dp=DP, cost_model="analytic:cpu", schedule=schedule)


def worker(rank, port, queue):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=PP * DP)
    groups = [dist.new_group([r * PP + d for r in range(DP)]) for d in range(PP)]
    samples = data()
    total = sum(len(t) - 1 for t in samples)
    lengths = [len(t) for t in samples]
    for schedule in SCHEDULES:
        plan = planner(schedule).plan(lengths)
        stages = max(i.stage for program in plan.instructions for i in program if i.stage is not None) + 1
        mine = sorted({i.stage for i in plan.instructions[rank] if i.stage is not None})
        model = full_model()
        modules = {s: stage_module(model, s, stages) for s in mine}
        params = [p for m in modules.values() for p in m.parameters()]
        executor = PipelineExecutor(
            modules,
            load_input=lambda mb, stage: padded(samples, mb.sample_ids, mb.shape[1]),
            forward=lambda s, m, x, loaded: run_stage(m, s, stages, x, loaded, total),
            optimizer=torch.optim.SGD(list(dict.fromkeys(params)), lr=0.5),
            rank=rank, dp_group=groups[rank % PP], dtype=torch.float64)
        losses = [executor.run(plan) for _ in range(ITERATIONS)]
        weights = {s: sum(float(p.sum()) for p in modules[s].parameters()) for s in mine}
        queue.put((schedule, rank, losses, weights, plan.schedule, stages))
    dist.destroy_process_group()


def reference(schedule_stages):
    samples = data()
    total = sum(len(t) - 1 for t in samples)
    model = full_model()
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    tokens, labels = padded(samples, range(len(samples)), max(len(t) for t in samples))
    losses = []
    for _ in range(ITERATIONS):
        loss = run_stage({"tok": model["tok"], "pos": model["pos"], "blocks": model["blocks"],
                          "ln": model["ln"], "head": model["head"]}, 0, 1, None, (tokens, labels), total)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    weights = {s: sum(float(p.sum()) for p in stage_module(model, s, schedule_stages).parameters())
               for s in range(schedule_stages)}
    return losses, weights


def test_pipeline_executor_matches_one_process():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    queue = mp.get_context("fork").SimpleQueue()
    mp.start_processes(worker, args=(port, queue), nprocs=PP * DP, start_method="fork")
    results = [queue.get() for _ in range(PP * DP * len(SCHEDULES))]
    for schedule in SCHEDULES:
        rows = [r for r in results if r[0] == schedule]
        assert {r[4] for r in rows} == {schedule}
        stages = rows[0][5]
        assert stages == (2 * PP if schedule == "interleaved" else PP)
        ref_losses, ref_weights = reference(stages)
        losses = [sum(r[2][k] for r in rows) for k in range(ITERATIONS)]
        assert losses == pytest.approx(ref_losses, rel=1e-9), schedule
        assert ref_losses[1] < ref_losses[0]  # the step changed the weights
        for schedule_, rank, _, weights, _, _ in rows:
            for stage, value in weights.items():
                assert value == pytest.approx(ref_weights[stage], rel=1e-9), (schedule, rank, stage)
