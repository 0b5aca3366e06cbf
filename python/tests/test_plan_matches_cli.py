"""Plans from Python equal `dynapipe plan`'s byte for byte (same samples, options, seed)."""
import pytest

import dynapipe
from conftest import kwargs_to_flags

CASES = [
    # the CLI suite's small GPT case: pp 4, several iterations
    ("tests/cli/data/small.jsonl",
     dict(model="gpt-6.7b", pp=4, max_seqlen=4096, global_batch_tokens=4096)),
    # truncation (max_seqlen 512 cuts many samples), dp 2, a fixed schedule, a seed
    ("assets/flan_like_mix.jsonl.gz",
     dict(model="gpt-tiny", pp=2, dp=2, max_seqlen=512, global_batch_tokens=16384,
          schedule="1f1b", iterations=3, seed=7, memory_limit_gib=0.5)),
    # T5 (encoder-decoder), a baseline strategy
    ("assets/flan_like_mix.jsonl.gz",
     dict(model="t5-tiny", pp=2, max_seqlen=1024, max_target_len=128, global_batch_tokens=8192,
          strategy="packing", iterations=2)),
]


@pytest.mark.parametrize("path,options", CASES, ids=["gpt-small", "gpt-dp2-trunc", "t5-packing"])
def test_plan_bytes_equal_cli(cli, source_dir, tmp_path, path, options):
    samples_path = source_dir / path
    out = tmp_path / "plan.json"
    r = cli("plan", "--samples", samples_path, "--out", out, "--no-compare",
            *kwargs_to_flags(options))
    assert r.returncode == 0, r.stderr
    cli_plan = dynapipe.ExecutionPlan.from_json(out.read_text(), str(out))

    planner = dynapipe.Planner(**options)
    # Lengths as in the file (untruncated), so that Python's truncation is exercised;
    # batch membership as the CLI forms it (truncated token counts).
    raw = dynapipe.load_samples(samples_path, max_seqlen=1 << 24)
    raw_input = dict(zip(raw.ids, raw.input_lens))
    raw_target = dict(zip(raw.ids, raw.target_lens))
    batches = planner.global_batches(planner.load_samples(samples_path))
    assert len(batches) == len(cli_plan.iterations) > 0

    for batch, expected in zip(batches, cli_plan.iterations):
        ids = batch.ids
        got = planner.plan([raw_input[i] for i in ids], [raw_target[i] for i in ids],
                           ids=ids, index=batch.index)
        assert got.truncated_ids == batch.truncated_ids
        # Planning wall time is the one field that differs from run to run.
        got.planning_ms = 0
        expected.planning_ms = 0
        assert got.to_bytes() == expected.to_bytes()
        assert got.to_json() == expected.to_json()
        # The GlobalBatch overload plans the same.
        again = planner.plan(batch)
        again.planning_ms = 0
        assert again.to_bytes() == expected.to_bytes()


def test_execution_plan_json_round_trips_the_cli_file(cli, source_dir, tmp_path):
    out = tmp_path / "plan.json"
    r = cli("plan", "--samples", source_dir / "tests/cli/data/small.jsonl", "--out", out,
            "--no-compare", "--model", "gpt-6.7b", "--pp", "4", "--max-seqlen", "4096",
            "--global-batch-tokens", "4096")
    assert r.returncode == 0, r.stderr
    text = out.read_text()
    assert dynapipe.ExecutionPlan.from_json(text).to_json(indent=1) == text
