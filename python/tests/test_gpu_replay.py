"""bench/gpu_replay.py (plans replayed with measured micro-batch costs): the replay of a
plan's own estimates gives its est_iteration_ms, every micro-batch of every stage is
measured, the replay itself on hand-checked timelines, the layouts of GPT and T5 stages
and of packed rows; bad input is one line and exit 2."""
import importlib.util
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")

DATA = "assets/flan_like_mix.jsonl.gz"


@pytest.fixture(scope="module")
def replay_module(source_dir):
    sys.path.insert(0, str(source_dir / "bench"))
    spec = importlib.util.spec_from_file_location("gpu_replay", source_dir / "bench/gpu_replay.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run_script(source_dir, *args):
    return subprocess.run([sys.executable, str(source_dir / "bench/gpu_replay.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=240, cwd=source_dir)


def make_plan(cli, source_dir, out, model, strategy, *extra):
    r = cli("plan", "--samples", source_dir / DATA, "--model", model, "--pp", 2,
            "--cost-model", source_dir / f"assets/profiles/{model}.cpu.json", "--max-seqlen", 256,
            "--global-batch-tokens", 2048, "--iterations", 1, "--strategy", strategy, "--no-compare",
            "--out", out, *extra)
    assert r.returncode == 0, r.stderr
    return out


def test_estimates_replay_to_the_plans_times_and_every_microbatch_is_measured(source_dir, cli, tmp_path):
    plans = [make_plan(cli, source_dir, tmp_path / f"{m}-{s}.json", m, s)
             for m in ("gpt-tiny", "t5-tiny") for s in ("dynapipe", "token-based")]
    out = tmp_path / "replay.json"
    r = run_script(source_dir, "--device", "cpu", "--samples", DATA, "--out", out, "--warmup", 0,
                   "--repeats", 1, "--rounds", 2, *plans)
    assert r.returncode == 0, r.stdout + r.stderr
    report = json.loads(out.read_text())
    assert [(x["model"], x["strategy"]) for x in report["results"]] == [
        ("gpt-tiny", "dynapipe"), ("gpt-tiny", "token-based"), ("t5-tiny", "dynapipe"), ("t5-tiny", "token-based")]
    for result in report["results"]:
        plan = json.loads(open(result["plan"]).read())
        (row,) = result["iterations"]
        assert row["est_replay_ms"] == pytest.approx(plan["iterations"][0]["est_iteration_ms"], rel=1e-9)
        (replica,) = row["replicas"]
        assert replica["microbatches"] == len(plan["iterations"][0]["replicas"][0]["microbatches"])
        # a makespan is at least its busiest device's work
        assert row["measured_ms"] == replica["measured_ms"] >= max(replica["work_measured_ms"]) > 0
        assert len(replica["work_measured_ms"]) == 2
    pieces = {m["model"]: set() for m in report["measurements"]}
    for m in report["measurements"]:
        pieces[m["model"]].add(m["piece"])
        assert len(m["fwd_ms"]) == len(m["bwd_ms"]) == 2  # one per round
    assert pieces == {"gpt-tiny": {"embedding", "layer", "head"},
                      "t5-tiny": {"embedding", "dec_embedding", "encoder", "decoder", "head"}}


def test_every_replica_is_replayed_and_the_allreduce_kept(source_dir, cli, tmp_path):
    # (its two replicas run zb1p and interleaved: 2 and 4 virtual stages over config.chunks 1)
    plan = make_plan(cli, source_dir, tmp_path / "dp2.json", "gpt-tiny", "dynapipe", "--dp", 2)
    out = tmp_path / "replay.json"
    r = run_script(source_dir, "--device", "cpu", "--samples", DATA, "--out", out, "--warmup", 0, "--repeats", 1, plan)
    assert r.returncode == 0, r.stdout + r.stderr
    (row,) = json.loads(out.read_text())["results"][0]["iterations"]
    iteration = json.loads(plan.read_text())["iterations"][0]
    assert [x["schedule"] for x in row["replicas"]] == ["zb1p", "interleaved"]
    assert [x["est_ms"] for x in row["replicas"]] == [x["est_iteration_ms"] for x in iteration["replicas"]]
    slowest = max(x["est_iteration_ms"] for x in iteration["replicas"])
    assert row["allreduce_est_ms"] == pytest.approx(iteration["est_iteration_ms"] - slowest) and row["allreduce_est_ms"] > 0
    assert row["est_replay_ms"] == pytest.approx(iteration["est_iteration_ms"], rel=1e-9)
    assert row["measured_ms"] == pytest.approx(max(x["measured_ms"] for x in row["replicas"]) + row["allreduce_est_ms"])


def test_the_plans_script_writes_what_the_replay_reads(source_dir, tmp_path, replay_module, monkeypatch):
    monkeypatch.chdir(source_dir)  # the plans name their profiles relative to it
    env = {**os.environ, "DYNAPIPE": os.environ.get("DYNAPIPE_CLI", str(source_dir / "build/dynapipe")),
           "MODELS": "gpt-6.7b t5-11b", "PPS": "4", "SEQLENS": "1024", "STRATEGIES": "dynapipe token-based",
           "ITERATIONS": "1"}
    r = subprocess.run(["bash", str(source_dir / "bench/gpu_replay_plans.sh"), str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=240, cwd=source_dir)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "4 plans in" in r.stdout
    samples = replay_module.load_samples(str(source_dir / DATA))
    for path in sorted(tmp_path.glob("*.json")):
        plan, link = replay_module.load_plan(str(path))
        assert "executors" not in plan["iterations"][0]["replicas"][0]
        iterations, wanted = replay_module.plan_jobs(plan, str(path), samples)
        rows = replay_module.evaluate(plan, link, iterations, {job: (1.0, 2.0) for job in wanted})
        assert rows[0]["est_replay_ms"] == pytest.approx(rows[0]["est_ms"], rel=1e-9), path.name


def op(stage, kind, mb, device, start):
    return {"stage": stage, "op": kind, "mb": mb, "device": device, "start_ms": start, "end_ms": start}


def test_replay_waits_for_inputs_and_messages(replay_module):
    # two stages, one micro-batch: F 1 then 2, B 4 then 3, 0.5 per message
    ops = [op(0, "F", 0, 0, 0), op(1, "F", 0, 1, 1), op(1, "B", 0, 1, 2), op(0, "B", 0, 0, 3)]
    cost = {("F", 0): 1, ("F", 1): 2, ("B", 1): 4, ("B", 0): 3}
    makespan = replay_module.replay(ops, lambda o: cost[(o["op"], o["stage"])], lambda mb, a, b: 0.5)
    assert makespan == 1 + 0.5 + 2 + 4 + 0.5 + 3
    # 1F1B over two micro-batches: device 0 runs F0 F1 B0 B1, device 1 F0 B0 F1 B1
    ops = [op(0, "F", 0, 0, 0), op(0, "F", 1, 0, 1), op(0, "B", 0, 0, 2), op(0, "B", 1, 0, 3),
           op(1, "F", 0, 1, 1), op(1, "B", 0, 1, 2), op(1, "F", 1, 1, 3), op(1, "B", 1, 1, 4)]
    cost = {"F": 1, "B": 2}
    makespan = replay_module.replay(ops, lambda o: cost[o["op"]], lambda mb, a, b: 0.0)
    # device 1: F0 [1,2] B0 [2,4] F1 [4,5] B1 [5,7]; device 0: F0 [0,1] F1 [1,2] B0 [4,6] B1 [7,9]
    assert makespan == 9
    # zero bubble: W waits for its own I only; the gradient comes from the next stage's I
    ops = [op(0, "F", 0, 0, 0), op(1, "F", 0, 1, 1), op(1, "I", 0, 1, 2), op(1, "W", 0, 1, 3),
           op(0, "I", 0, 0, 3), op(0, "W", 0, 0, 4)]
    makespan = replay_module.replay(ops, lambda o: 1.0, lambda mb, a, b: 0.0)
    assert makespan == 5  # F F I then stage 0's I [3,4] and W [4,5] beside stage 1's W


def test_stage_pieces_follow_the_plans_split(replay_module):
    t5 = {"name": "t5", "kind": "t5", "hidden": 8, "heads": 2, "kv_channels": 0, "ffn_hidden": 16, "layers": 2,
          "dec_layers": 2, "vocab": 16, "max_positions": 64}
    config = {"model": t5, "pp": 2}
    assert replay_module.Layout(config, 1).pieces == [
        {"embedding": 1, "encoder": 2}, {"decoder": 2, "dec_embedding": 1, "head": 1}]
    config["layers_per_stage"] = [3, 1]
    assert replay_module.Layout(config, 1).pieces == [
        {"embedding": 1, "encoder": 2, "decoder": 1, "dec_embedding": 1}, {"decoder": 1, "head": 1}]
    gpt = {**t5, "kind": "gpt", "layers": 5, "dec_layers": 0}
    # interleaved: device d's chunk k is virtual stage k * pp + d, earlier chunks one layer more
    assert replay_module.Layout({"model": gpt, "pp": 2}, 2).pieces == [
        {"embedding": 1, "layer": 2}, {"layer": 1}, {"layer": 1}, {"layer": 1, "head": 1}]


def test_packed_rows_become_segments_with_their_tails(replay_module):
    samples = {1: (10, 2), 2: (20, 4), 3: (5, 1)}
    gpt = {"model": {"kind": "gpt"}, "max_seqlen": 64, "max_target_len": 64}
    varlen = {"id": 0, "sample_ids": [1, 2, 3], "rows": [[1, 2], [3]], "shape": {"batch": 2, "seqlen": 40},
              "density": {"enc": 0.5, "dec": 1.0}, "real_tokens": 42}
    assert replay_module.microbatch_key(gpt, varlen, samples, "p") == (2, 40, 0, (12, 24, 4, 6, 34), None)
    dense = {"id": 0, "sample_ids": [1, 2], "shape": {"batch": 2, "seqlen": 24}, "real_tokens": 36}
    assert replay_module.microbatch_key(gpt, dense, samples, "p") == (2, 24, 0, None, None)
    # GPT truncation as truncate_lengths(): the target first (to --max-target-len), then
    # the input to what --max-seqlen leaves
    assert replay_module.sample_tokens({**gpt, "max_seqlen": 16, "max_target_len": 3}, 20, 4) == (16, 0)
    assert replay_module.sample_tokens({**gpt, "max_seqlen": 64, "max_target_len": 3}, 20, 4) == (23, 0)
    assert replay_module.sample_tokens({**gpt, "max_target_len": 0}, 70, 4) == (64, 0)
    t5 = {"model": {"kind": "t5"}, "max_seqlen": 64, "max_target_len": 3}
    # decoder row: 2 + 3 (truncated) = 5 of 8 tokens, a tail of 3; encoder row 30 of 30, none:
    # the decoder's tail joins its last sample, so both sides have one segment per sample
    row = {"id": 0, "sample_ids": [1, 2], "rows": [[1, 2]], "shape": {"batch": 1, "enc_seqlen": 30, "dec_seqlen": 8},
           "density": {"enc": 0.5, "dec": 0.5}, "real_tokens": 35}
    assert replay_module.microbatch_key(t5, row, samples, "p") == (1, 30, 8, (10, 20), (2, 6))


@pytest.mark.parametrize("what, message", [
    ("replicas", "replicated stages are not replayed"),
    ("analytic", "must be a profile JSON"),
    ("data", "holds"),
    ("ids", "which --samples does not have"),
    ("missing", "No such file"),
])
def test_bad_input_is_one_line_and_exit_2(source_dir, cli, tmp_path, what, message):
    plan = tmp_path / "plan.json"
    if what == "replicas":
        make_plan(cli, source_dir, plan, "gpt-tiny", "dynapipe", "--replicas", "2,1")
    elif what == "analytic":
        r = cli("plan", "--samples", source_dir / DATA, "--model", "gpt-tiny", "--max-seqlen", 256,
                "--global-batch-tokens", 2048, "--iterations", 1, "--no-compare", "--out", plan)
        assert r.returncode == 0, r.stderr
    elif what == "data":  # the plan's samples are not the file given
        make_plan(cli, source_dir, plan, "gpt-tiny", "dynapipe")
        other = tmp_path / "other.jsonl"
        other.write_text("".join(json.dumps({"id": i, "input_len": 7, "target_len": 1}) + "\n" for i in range(20000)))
    elif what == "ids":  # a file without the plan's samples
        make_plan(cli, source_dir, plan, "gpt-tiny", "dynapipe")
        (tmp_path / "few.jsonl").write_text(json.dumps({"id": 0, "input_len": 7, "target_len": 1}) + "\n")
    samples = {"data": tmp_path / "other.jsonl", "ids": tmp_path / "few.jsonl"}.get(what, DATA)
    out = tmp_path / "out.json"
    r = run_script(source_dir, "--device", "cpu", "--samples", samples, "--out", out, plan)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not out.exists()
