"""examples/ddp_dynamic_microbatches.py: DDP (gloo, 2 processes) with the sampler (its DP's
micro-batches, and the token-based strategy's) and with fixed-size micro-batches reproduces,
step by step, the losses of one process training on each whole global batch (<= 1e-5
relative), so the loss weights make gradients exact."""
import json
import os
import subprocess
import sys

import pytest

pytest.importorskip("torch")


def test_ddp_losses_equal_a_single_process_over_whole_batches(source_dir, tmp_path):
    out = tmp_path / "results.json"
    r = subprocess.run(
        [sys.executable, str(source_dir / "examples/ddp_dynamic_microbatches.py"), "--steps", "3",
         "--samples", "120", "--max-len", "128", "--token-budget", "768", "--check",
         "--modes", "dynamic,token-based,fixed", "--json", str(out)],
        capture_output=True, text=True, timeout=240, env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    results = json.loads(out.read_text())
    reference = results["reference"]["losses"]
    assert len(reference) == 3
    for mode in ("dynamic", "token-based", "fixed"):
        losses = results[mode]["losses"]
        assert len(losses) == 3
        for got, want in zip(losses, reference):
            assert abs(got - want) <= 1e-5 * abs(want), (mode, got, want)
        assert results[mode]["tokens_per_s"] > 0
    # the sampler's DP split the steps into several micro-batches (not one whole batch)
    assert results["dynamic"]["microbatches_per_step"] > 1
    assert "tokens/s" in r.stdout


@pytest.mark.parametrize("args, message", [
    (["--modes", "dynamic,dynamic"], "--modes must name each mode once"),
    (["--device", "tpu"], "--device: invalid choice"),
    pytest.param(["--device", "cuda", "--world-size", "64"], "--device cuda needs --world-size GPUs (64)",
                 id="more-ranks-than-gpus"),
])
def test_bad_arguments_are_one_line_and_exit_2(source_dir, args, message):
    r = subprocess.run([sys.executable, str(source_dir / "examples/ddp_dynamic_microbatches.py"), *args],
                       capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
