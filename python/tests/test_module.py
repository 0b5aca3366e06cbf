"""The dynapipe module's API: inputs of every kind, plan contents, codecs, GIL release."""
import array
import json
import sys
import threading
import time

import pytest

import dynapipe

INPUTS = [312, 1800, 45, 990, 100, 2000, 64, 700]
TARGETS = [4, 60, 12, 8, 1, 10, 30, 2]


@pytest.fixture(scope="module")
def planner():
    return dynapipe.Planner(model="gpt-6.7b", pp=4, memory_limit_gib=40)


def test_defaults_are_the_clis():
    defaults = {row["name"]: row["default"] for row in dynapipe.plan_options()}
    assert dynapipe.Planner().options == defaults
    assert defaults["model"] == "gpt-tiny" and defaults["pp"] == 1
    assert defaults["strategy"] == "dynapipe" and defaults["schedule"] == "auto"
    assert [row["flag"] for row in dynapipe.plan_options()][:4] == ["--model", "--tp", "--pp", "--dp"]


def test_every_sample_in_exactly_one_microbatch(planner):
    plan = planner.plan(INPUTS, TARGETS, ids=[10 * i for i in range(len(INPUTS))], index=3)
    assert plan.index == 3
    assert sorted(plan.sample_ids) == [10 * i for i in range(len(INPUTS))]
    seen = sorted(i for mb in plan.microbatches for i in mb.sample_ids)
    assert seen == sorted(plan.sample_ids)
    lens = {10 * i: INPUTS[i] + TARGETS[i] for i in range(len(INPUTS))}
    for mb in plan.microbatches:
        batch, seqlen = mb.shape
        # dynapipe (the default) cuts varlen micro-batches: one row of all their samples.
        assert batch == 1
        assert seqlen >= sum(lens[i] for i in mb.sample_ids) and seqlen % 8 == 0
        assert mb.real_tokens == sum(lens[i] for i in mb.sample_ids)
        assert len(mb.est_fwd_ms) == len(mb.est_bwd_ms) == 4
    computed = sum(mb.shape[0] * mb.shape[1] for mb in plan.microbatches)
    assert plan.padding_efficiency == pytest.approx(sum(lens.values()) / computed)
    assert plan.est_iteration_ms > 0 and plan.schedule


def test_instructions_per_rank(planner):
    plan = planner.plan(INPUTS, TARGETS)
    assert len(plan.instructions) == 4
    ops = {"LoadInput", "Forward", "Backward", "BackwardInput", "BackwardWeight",
           "SendActivationStart", "SendActivationFinish", "RecvActivationStart",
           "RecvActivationFinish", "SendGradStart", "SendGradFinish", "RecvGradStart",
           "RecvGradFinish", "FreeBuffer", "ReduceGrads", "OptimizerStep"}
    n_mb = len(plan.microbatches)
    for rank, program in enumerate(plan.instructions):
        assert {i.op for i in program} <= ops
        forwards = [i for i in program if i.op == "Forward"]
        assert sorted(i.mb for i in forwards) == list(range(n_mb))
        assert program[-1].op == "OptimizerStep"
        for i in program:
            if i.op.startswith(("Send", "Recv")):
                assert i.peer in (rank - 1, rank + 1) and len(i.shape) == 3
    assert plan.instructions[0][0].op == "LoadInput"
    assert plan.replicas[0].executors[2].instructions == plan.instructions[2]


def test_one_plan_on_several_threads_is_the_plan_on_one(planner):
    ref = planner.plan(INPUTS, TARGETS)
    got = planner.plan(INPUTS, TARGETS, threads=3)
    ref.planning_ms = got.planning_ms = 0
    assert got.to_bytes() == ref.to_bytes()
    with pytest.raises(dynapipe.InvalidArgument, match="threads must be >= 0"):
        planner.plan(INPUTS, TARGETS, threads=-1)


def test_sequence_kinds_give_the_same_plan(planner):
    ref = planner.plan(INPUTS, TARGETS)
    ref.planning_ms = 0
    variants = [
        (tuple(INPUTS), tuple(TARGETS)),
        (array.array("i", INPUTS), array.array("H", TARGETS)),
        (memoryview(array.array("q", INPUTS)), array.array("b", TARGETS)),
        (iter(INPUTS), (t for t in TARGETS)),
    ]
    np = pytest.importorskip("numpy")
    variants += [(np.array(INPUTS, dtype=np.int64), np.array(TARGETS, dtype=np.uint32)),
                 (np.repeat(np.array(INPUTS, dtype=np.int32), 2)[::2], np.array(TARGETS, dtype=np.int16))]
    try:
        import torch
        variants.append((torch.tensor(INPUTS), torch.tensor(TARGETS, dtype=torch.int32)))
    except ImportError:
        pass
    for inputs, targets in variants:
        got = planner.plan(inputs, targets)
        got.planning_ms = 0
        assert got.to_bytes() == ref.to_bytes(), type(inputs)


def test_gpt_without_targets_plans_whole_sequences():
    planner = dynapipe.Planner(max_seqlen=1024)
    plan = planner.plan([100, 2000, 300])
    assert plan.truncated_ids == [1]
    mb_of = {i: mb for mb in plan.microbatches for i in mb.sample_ids}
    assert mb_of[1].shape[1] >= 1024  # one varlen row: it may share it with the others
    assert sum(mb.real_tokens for mb in plan.microbatches) == 100 + 1024 + 300
    assert sum(mb.target_tokens for mb in plan.microbatches) == 0


def test_t5_shapes_have_three_dims():
    plan = dynapipe.Planner(model="t5-tiny", pp=2).plan([100, 300], [10, 20])
    for mb in plan.microbatches:
        assert len(mb.shape) == 3 and mb.shape[2] >= 2
    assert json.loads(plan.to_json())["replicas"][0]["microbatches"][0]["shape"].keys() == {
        "batch", "enc_seqlen", "dec_seqlen"}


def test_bytes_and_json_round_trip(planner):
    plan = planner.plan(INPUTS, TARGETS)
    back = dynapipe.IterationPlan.from_bytes(plan.to_bytes())
    assert back == plan
    assert back.to_json() == plan.to_json()
    assert back.to_bytes()[:4] == b"DPPL"
    doc = json.loads(plan.to_json(indent=-1))
    assert doc["est_iteration_ms"] == plan.est_iteration_ms
    assert len(doc["replicas"][0]["executors"]) == 4


def test_dp_replicas_split_the_batch():
    planner = dynapipe.Planner(pp=2, dp=2)
    plan = planner.plan(INPUTS, TARGETS)
    assert len(plan.replicas) == 2 and len(plan.instructions) == 4
    per_replica = [sorted(i for mb in r.microbatches for i in mb.sample_ids) for r in plan.replicas]
    assert sorted(per_replica[0] + per_replica[1]) == list(range(len(INPUTS)))
    assert all(per_replica)
    assert [mb.replica for mb in plan.microbatches] == sorted(mb.replica for mb in plan.microbatches)


def test_token_budget_bounds_token_based_micro_batches():
    plan = dynapipe.Planner(pp=2, strategy="token-based", token_budget=2048).plan(INPUTS, TARGETS)
    assert plan.microbatches
    for mb in plan.microbatches:
        batch, seqlen = mb.shape
        # A sample alone may exceed the budget; a micro-batch of several never does.
        assert batch == 1 or batch * seqlen <= 2048
    assert dynapipe.Planner(strategy="token-based", token_budget=2048).options["token_budget"] == 2048


def test_replicated_stages_take_micro_batches_round_robin():
    plan = dynapipe.Planner(pp=2, replicas="2,1", strategy="padding", micro_batch_size=2).plan(INPUTS, TARGETS)
    executors = plan.replicas[0].executors
    assert [(e.rank, e.device, e.stage_replica) for e in executors] == [(0, 0, 0), (1, 0, 1), (2, 1, 0)]
    mbs = len(plan.replicas[0].microbatches)
    assert mbs >= 2
    for e in executors[:2]:
        forwards = [i.mb for i in e.instructions if i.op == "Forward"]
        assert set(forwards) == {mb for mb in range(mbs) if mb % 2 == e.stage_replica}
    with pytest.raises(ValueError, match=r"--replicas must have one count per stage \(--pp 2\), got 3"):
        dynapipe.Planner(pp=2, replicas="2,1,1")


def test_samples_and_global_batches(source_dir):
    path = source_dir / "tests/cli/data/small.jsonl"
    samples = dynapipe.load_samples(path)
    assert len(samples) == 8 and samples.ids == list(range(8))
    assert samples.input_lens[:3] == [120, 300, 1800] and samples.tasks[:2] == ["nli", "qa"]
    planner = dynapipe.Planner(global_batch_tokens=4096, max_seqlen=4096)
    batches = planner.global_batches(planner.load_samples(path))
    assert [i for b in batches for i in b.ids] == samples.ids
    for b in batches:
        assert sum(b.input_lens) + sum(b.target_lens) <= 4096 or len(b) == 1
    assert [b.index for b in batches] == list(range(len(batches)))


def test_simulate_lists_strategy_schedule_pairs():
    rows = dynapipe.simulate(INPUTS, TARGETS, model="gpt-6.7b", pp=4, memory_limit_gib=40,
                             strategies="dynapipe,padding", schedules=["1f1b", "auto"])
    assert [(r["strategy"], r["schedule"]) for r in rows] == [
        ("dynapipe", "1f1b"), ("dynapipe", "auto"), ("padding", "1f1b"), ("padding", "auto")]
    ok = [r for r in rows if r["status"] == "ok"]
    assert ok and all(r["est_iteration_ms"] > 0 for r in ok)
    by = {(r["strategy"], r["schedule"]): r for r in ok}
    # auto keeps the best feasible schedule, so it is never slower than a fixed one.
    if ("dynapipe", "1f1b") in by:
        assert by[("dynapipe", "auto")]["est_iteration_ms"] <= by[("dynapipe", "1f1b")]["est_iteration_ms"]


def test_planning_releases_the_gil(source_dir):
    # While a worker thread plans, the main thread keeps running Python. Were the GIL
    # held through plan(), the main thread would stall for every call: its long gaps
    # (> 5 ms) would cover nearly all of the worker's time instead of a small part
    # (what remains is the OS scheduling a busy machine).
    planner = dynapipe.Planner(model="gpt-6.7b", pp=4, memory_limit_gib=40,
                               global_batch_tokens=262144)
    samples = planner.load_samples(source_dir / "assets/flan_like_mix.jsonl.gz")
    batch = planner.global_batches(samples)[0]
    ticks = []
    worker = threading.Thread(target=lambda: [planner.plan(batch) for _ in range(5)])
    old = sys.getswitchinterval()
    sys.setswitchinterval(0.001)
    try:
        start = time.perf_counter()
        worker.start()
        while worker.is_alive():
            ticks.append(time.perf_counter())
            time.sleep(0)
        worker.join()
        busy = time.perf_counter() - start
    finally:
        sys.setswitchinterval(old)
    stalled = sum(b - a for a, b in zip(ticks, ticks[1:]) if b - a > 0.005)
    assert stalled < 0.5 * busy, (stalled, busy)


def test_per_microbatch_recompute_mixes_modes():
    # a few long samples need full recomputation at 40 GiB; per micro-batch, the short
    # ones run lighter and the iteration plans faster than with one mode for all
    inputs, targets = [4000] * 3 + [3000] * 4 + [120] * 60 + [900] * 10, [0] * 77
    one = dynapipe.Planner(model="gpt-6.7b", pp=4, memory_limit_gib=40, max_seqlen=4096)
    mixed = dynapipe.Planner(model="gpt-6.7b", pp=4, memory_limit_gib=40, max_seqlen=4096,
                             recompute="per-microbatch")
    before, after = one.plan(inputs, targets), mixed.plan(inputs, targets)
    assert {mb.recompute for mb in before.microbatches} == {"full"}
    assert {mb.recompute for mb in after.microbatches} == {"none", "selective", "full"}
    assert after.est_iteration_ms < before.est_iteration_ms
    with pytest.raises(dynapipe.InvalidArgument, match="per-microbatch"):
        dynapipe.Planner(model="gpt-6.7b", recompute="per-batch")


def test_cost_model_queries():
    planner = dynapipe.Planner(model="gpt-6.7b", pp=4, memory_limit_gib=40)
    assert planner.cost_model == "analytic:a100-40g" and planner.num_stages == 4
    small, big = planner.stage_cost(1, (1, 512)), planner.stage_cost(1, (4, 512))
    assert 0 < small["fwd_ms"] < big["fwd_ms"] and small["bwd_ms"] > small["fwd_ms"]
    assert big["stored_bytes"] > small["stored_bytes"] > 0 and big["static_bytes"] == small["static_bytes"]
    # full recomputation stores less and recomputes the forward in the backward
    full = planner.stage_cost(1, (4, 512), recompute="full")
    assert full["stored_bytes"] < big["stored_bytes"] and full["bwd_ms"] > big["bwd_ms"]
    # the plan's estimates are the cost model's for the micro-batch shapes (stage 1 of 4)
    plan = planner.plan(INPUTS, TARGETS)
    for mb in plan.microbatches:
        assert mb.recompute in ("none", "selective", "full")
        if mb.recompute == "none":
            assert mb.est_fwd_ms[1] == pytest.approx(planner.stage_cost(1, mb.shape)["fwd_ms"])
    assert "gpt-6.7b" in dynapipe.model_presets() and "a100-40g" in dynapipe.device_presets()
    with pytest.raises(dynapipe.InvalidArgument, match=r"stage must be in \[0, 3\], got 4"):
        planner.stage_cost(4, (1, 8))
    with pytest.raises(dynapipe.InvalidArgument, match=r"shape must be \(batch, seqlen\), got 3 values"):
        planner.stage_cost(0, (1, 8, 8))
    with pytest.raises(dynapipe.InvalidArgument, match="recompute must be one of"):
        planner.stage_cost(0, (1, 8), recompute="half")
