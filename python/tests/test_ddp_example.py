"""examples/ddp_dynamic_microbatches.py: DDP (gloo, 2 processes) with the sampler and with
fixed-size micro-batches reproduces, step by step, the losses of one process training on
each whole global batch (<= 1e-5 relative), so the loss weights make gradients exact."""
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
         "--json", str(out)],
        capture_output=True, text=True, timeout=240, env=dict(os.environ))
    assert r.returncode == 0, r.stdout + r.stderr
    results = json.loads(out.read_text())
    reference = results["reference"]["losses"]
    assert len(reference) == 3
    for mode in ("dynamic", "fixed"):
        losses = results[mode]["losses"]
        assert len(losses) == 3
        for got, want in zip(losses, reference):
            assert abs(got - want) <= 1e-5 * abs(want), (mode, got, want)
        assert results[mode]["tokens_per_s"] > 0
    # the sampler's DP split the steps into several micro-batches (not one whole batch)
    assert results["dynamic"]["microbatches_per_step"] > 1
    assert "tokens/s" in r.stdout
