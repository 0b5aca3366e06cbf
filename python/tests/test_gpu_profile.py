"""bench/gpu_profile.py (measures a GPT's layers with PyTorch, writes a dynapipe profile):
on the CPU, a tiny grid, its profile is one the CLI plans with and its tables hold what
the script measured; the varlen fixed cost from stand-in timings (it needs a GPU's varlen
kernel); bad input is one line and exit 2."""
import importlib.util
import json
import subprocess
import sys
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")

TINY = {"name": "gpt-tiny", "kind": "gpt", "hidden": 128, "heads": 4, "kv_channels": 0, "ffn_hidden": 512,
        "layers": 4, "dec_layers": 0, "vocab": 320, "max_positions": 8192}


def run_script(source_dir, *args):
    return subprocess.run([sys.executable, str(source_dir / "bench/gpu_profile.py"), *map(str, args)],
                          capture_output=True, text=True, timeout=240)


def test_cpu_profile_is_one_the_cli_plans_with(source_dir, cli, tmp_path):
    model = tmp_path / "gpt-tiny.json"
    model.write_text(json.dumps(TINY))
    out, varlen = tmp_path / "p.json", tmp_path / "varlen.json"
    r = run_script(source_dir, "--model", model, "--out", out, "--device", "cpu", "--seqlens", "16,32,64",
                   "--max-tokens", "128", "--warmup", "0", "--repeats", "1", "--varlen-check", varlen,
                   "--varlen-seqlens", "64", "--varlen-tokens", "128", "--varlen-samples", "1,4",
                   "--varlen-mixed", "1")
    assert r.returncode == 0, r.stdout + r.stderr
    profile = json.loads(out.read_text())
    assert profile["model"] == TINY and profile["bytes_per_element"] == 4
    kinds = {layer["kind"]: layer for layer in profile["layers"]}
    assert list(kinds) == ["embedding", "layer", "head"]
    assert sorted(kinds["layer"]["points"]) == ["full", "none", "selective"]
    # batches double along each length while b * s <= 128
    shapes = [(p["batch"], p["seqlen"]) for p in kinds["layer"]["points"]["none"]]
    assert shapes == [(1, 16), (2, 16), (4, 16), (8, 16), (1, 32), (2, 32), (4, 32), (1, 64), (2, 64)]
    assert all(p["fwd_ms"] > 0 and p["bwd_ms"] > 0 for p in kinds["layer"]["points"]["full"])
    assert kinds["embedding"]["parameter_bytes"] == (320 + 8192) * 128 * 4
    assert kinds["head"]["parameter_bytes"] == 2 * 128 * 4  # the final LN; the LM head is tied
    rows = json.loads(varlen.read_text())["rows"]
    assert [(row["batch"], row["seqlen"], row["samples"], row["density"], row["kernel"]) for row in rows[:2]] == \
        [(2, 64, 2, 1.0, "dense"), (2, 64, 8, 0.25, "per sample")]
    mixed = rows[2]  # two rows of 64 tokens, each filled with samples of mixed lengths
    assert sum(mixed["lengths"]) == 128 and mixed["kernel"] == "per sample"
    assert mixed["density"] == pytest.approx(sum(n * n for n in mixed["lengths"]) / (2 * 64 * 64), abs=1e-6)

    plan = tmp_path / "plan.json"
    r = cli("plan", "--samples", source_dir / "assets/tiny_text.jsonl", "--model", "gpt-tiny",
            "--cost-model", out, "--max-seqlen", 64, "--global-batch-tokens", 512, "--out", plan, "--no-compare")
    assert r.returncode == 0, r.stderr
    assert json.loads(plan.read_text())["config"]["cost_model"] == str(out)


def test_t5_profile_has_encoder_decoder_tables_the_cli_plans_with(source_dir, cli, tmp_path):
    t5 = {**TINY, "name": "t5-tiny", "kind": "t5", "layers": 2, "dec_layers": 2}
    model, out, varlen = tmp_path / "t5-tiny.json", tmp_path / "t5.json", tmp_path / "varlen.json"
    model.write_text(json.dumps(t5))
    r = run_script(source_dir, "--model", model, "--out", out, "--device", "cpu", "--seqlens", "16,32",
                   "--dec-seqlens", "8,16", "--max-tokens", "96", "--warmup", "0", "--repeats", "1",
                   "--varlen-check", varlen, "--varlen-seqlens", "64", "--varlen-tokens", "64",
                   "--varlen-samples", "1,4")
    assert r.returncode == 0, r.stdout + r.stderr
    kinds = {layer["kind"]: layer for layer in json.loads(out.read_text())["layers"]}
    assert list(kinds) == ["embedding", "encoder", "decoder", "head"]
    decoder = [(p["batch"], p["seqlen"], p["dec_seqlen"]) for p in kinds["decoder"]["points"]["none"]]
    assert decoder == [(1, 16, 8), (2, 16, 8), (4, 16, 8), (1, 16, 16), (2, 16, 16), (1, 32, 8), (2, 32, 8),
                       (1, 32, 16), (2, 32, 16)]  # b * (s + d) <= 96
    assert [p["seqlen"] for p in kinds["head"]["points"]["none"]] == [8, 8, 8, 8, 16, 16, 16]  # decoder lengths
    assert sorted({p["seqlen"] for p in kinds["embedding"]["points"]["none"]}) == [8, 16, 32]
    rows = json.loads(varlen.read_text())["rows"]
    # encoder and decoder, dense then four samples per row sharing the row's 8 decoder tokens
    assert [(row["layer"], row["samples"], row["density"], row.get("dec_seqlen")) for row in rows] == [
        ("encoder", 1, 1.0, None), ("decoder", 1, 1.0, 8), ("encoder", 4, 0.25, None), ("decoder", 4, 0.25, 8)]
    assert rows[3]["dec_lengths"] == [2, 2, 2, 2] and rows[3]["kernel"] == "per sample"
    r = cli("plan", "--samples", source_dir / "assets/tiny_text.jsonl", "--model", "t5-tiny", "--cost-model", out,
            "--max-seqlen", 32, "--max-target-len", 16, "--global-batch-tokens", 256, "--out", tmp_path / "plan.json",
            "--no-compare")
    assert r.returncode == 0, r.stderr


@pytest.mark.parametrize("model, args, message", [
    ({**TINY, "kind": "bert"}, [], 'kind must be "gpt" or "t5"'),
    ({**TINY, "kind": "t5", "dec_layers": 0}, [], "a T5 model needs dec_layers >= 1"),
    ({**TINY, "kind": "t5", "dec_layers": 2}, ["--dec-seqlens", "16"], "--dec-seqlens needs >= 2 distinct lengths"),
    ({k: v for k, v in TINY.items() if k != "vocab"}, [], "missing vocab"),
    (TINY, ["--seqlens", "64"], "--seqlens needs >= 2 distinct lengths"),
    (TINY, ["--seqlens", "64,16384"], "16384 is over the model's max_positions 8192"),
])
def test_bad_input_is_one_line_and_exit_2(source_dir, tmp_path, model, args, message):
    path = tmp_path / "model.json"
    path.write_text(json.dumps(model))
    r = run_script(source_dir, "--model", path, "--out", tmp_path / "p.json", "--device", "cpu", *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert message in r.stderr
    assert not (tmp_path / "p.json").exists()


class StandInLayer:
    """A layer whose varlen kernel costs fwd_extra / bwd_extra over dense (per shape)."""

    def __init__(self, extras):
        self.extras, self.lengths = extras, None

    def has_varlen(self):
        return True

    def set_lengths(self, enc, dec=None):
        self.lengths = (enc, dec)


class StandInBench:
    cuda = True

    def point(self, layer, kind, b, s, d=0):
        enc, dec = layer.lengths or (None, None)
        fwd, bwd = 1.0 + b * s / 1000, 2.0 + b * s / 500  # dense
        if enc is not None:
            assert enc == [s] * b and (dec == [d] * b if d else dec is None)  # one sample per row
            extra = layer.extras[(b, s)]
            fwd, bwd = fwd + extra[0], bwd + extra[1]
        return {"fwd_ms": fwd, "bwd_ms": bwd}


def test_varlen_fixed_cost_is_the_median_excess_over_dense_rows(source_dir):
    spec = importlib.util.spec_from_file_location("gpu_profile", source_dir / "bench/gpu_profile.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    args = SimpleNamespace(seqlens=[64, 1024, 2048, 4096], dec_seqlens=[32, 512], max_tokens=131072)
    decoder = StandInLayer({(4, 1024): (0.5, 0.1), (2, 2048): (0.4, 0.3), (1, 4096): (0.9, -0.2)})
    encoder = StandInLayer({(4, 1024): (-0.1, -0.2), (2, 2048): (0.0, -0.1), (1, 4096): (-0.3, 0.05)})
    fixed = module.varlen_fixed(args, {"encoder": encoder, "decoder": decoder}, StandInBench())
    assert fixed["decoder"] == pytest.approx((0.5, 0.1)) and fixed["encoder"] == (0.0, 0.0)
    assert decoder.lengths == (None, None)  # dense again afterwards
    layers = [{"kind": k, "parameter_bytes": 1, "points": {}} for k in ("embedding", "encoder", "decoder", "head")]
    written = module.with_varlen_fixed(layers, fixed)
    assert [list(entry) for entry in written] == [["kind", "parameter_bytes", "points"]] * 2 + \
        [["kind", "parameter_bytes", "varlen_fixed_ms", "points"], ["kind", "parameter_bytes", "points"]]
    assert written[2]["varlen_fixed_ms"] == {"fwd": 0.5, "bwd": 0.1}
    # Without a varlen kernel (the CPU) nothing is measured.
    assert module.varlen_fixed(args, {"decoder": decoder}, SimpleNamespace(cuda=False)) == {}
