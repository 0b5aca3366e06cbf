"""bench/train_throughput.sh and its report: rounds run the strategies in rotated orders,
NAME@SCHEDULE trains with that schedule, and the paired table recovers each strategy's
speed over the base where the machine drifts between runs. A fake `dynapipe` stands in
for training: it writes the metrics a run would, its step times set by the test."""
import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

FAKE = textwrap.dedent("""\
    #!{python}
    # A stand-in for `dynapipe train`: logs its arguments, writes STEPS steps of metrics
    # whose time is the strategy's in SPEEDS times DRIFT to the power of earlier calls.
    import json, os, sys
    args = sys.argv[1:]
    value = lambda flag: args[args.index(flag) + 1] if flag in args else None
    state = os.environ["FAKE_STATE"]
    calls = len(open(state).read().splitlines()) if os.path.exists(state) else 0
    with open(state, "a") as f:
        f.write(json.dumps(args) + "\\n")
    base = json.loads(os.environ["SPEEDS"])[value("--strategy")]
    factor = float(os.environ.get("DRIFT", "1")) ** calls
    steps = int(value("--steps"))
    with open(value("--metrics"), "w") as out:
        for step in range(steps):
            time_s = base * factor * (3 if step == 0 else 1)
            out.write(json.dumps({{"step": step, "step_time_s": time_s, "tokens_per_s": 1000 / time_s,
                                  "real_tokens": 1000, "padded_tokens": 1000, "est_step_time_s": base,
                                  "peak_memory_above_start_bytes": 2**20, "loss": 5.0}}) + "\\n")
        out.write(json.dumps({{"summary": True, "steps": steps}}) + "\\n")
    """)


@pytest.fixture
def fake(tmp_path):
    path = tmp_path / "dynapipe"
    path.write_text(FAKE.format(python=sys.executable))
    path.chmod(path.stat().st_mode | stat.S_IEXEC)
    return path


def run(source_dir, fake, tmp_path, strategies, speeds, rounds, drift=1.0, steps=4):
    env = dict(os.environ, DYNAPIPE=str(fake), STRATEGIES=strategies, ROUNDS=str(rounds),
               STEPS=str(steps), FAKE_STATE=str(tmp_path / "calls"), SPEEDS=json.dumps(speeds),
               DRIFT=str(drift), METRICS_DIR=str(tmp_path / "metrics"))
    return subprocess.run(["bash", str(source_dir / "bench/train_throughput.sh")], capture_output=True,
                          text=True, env=env, timeout=60, cwd=source_dir)


def calls(tmp_path):
    return [json.loads(line) for line in (tmp_path / "calls").read_text().splitlines()]


def paired_row(stdout, label):
    rows = [line for line in stdout.splitlines() if line.startswith(f"| {label} |") and "steps" not in line]
    return [cell.strip() for cell in rows[-1].strip("|").split("|")]


def test_rounds_rotate_the_order(source_dir, fake, tmp_path):
    r = run(source_dir, fake, tmp_path, "a b c", {"a": 1.0, "b": 1.0, "c": 1.0}, rounds=3)
    assert r.returncode == 0, r.stderr
    order = [c[c.index("--strategy") + 1] for c in calls(tmp_path)]
    assert order == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    for k in range(3):
        assert sorted(os.listdir(tmp_path / "metrics" / f"r{k}")) == ["a.jsonl", "b.jsonl", "c.jsonl"]


def test_paired_ratios_cancel_drift_across_rotated_rounds(source_dir, fake, tmp_path):
    # Every later run 20% slower: in round 0 b runs after a, in round 1 before it.
    r = run(source_dir, fake, tmp_path, "a b", {"a": 1.0, "b": 1.0}, rounds=2, drift=1.2)
    assert r.returncode == 0, r.stderr
    row = paired_row(r.stdout, "b")
    assert row[1] == "0.83, 1.20"
    assert row[2] == "1.017x"  # the median of 1/1.2 and 1.2: equal speed, drift cancelled to 2%
    assert row[4] == "6"  # 3 timed steps per round


def test_paired_ratio_of_a_faster_strategy(source_dir, fake, tmp_path):
    r = run(source_dir, fake, tmp_path, "base fast", {"base": 1.0, "fast": 0.8}, rounds=2)
    assert r.returncode == 0, r.stderr
    row = paired_row(r.stdout, "fast")
    assert row[1:4] == ["1.25, 1.25", "1.250x", "1.250x"]
    assert "| fast | 1250 | 1.25x |" in r.stdout  # the first table: medians over rounds


def test_one_round_prints_only_the_first_table(source_dir, fake, tmp_path):
    r = run(source_dir, fake, tmp_path, "base fast", {"base": 1.0, "fast": 0.8}, rounds=1)
    assert r.returncode == 0, r.stderr
    assert "| fast | 1250 | 1.25x |" in r.stdout
    assert "Paired" not in r.stdout


def test_a_schedule_per_entry(source_dir, fake, tmp_path):
    r = run(source_dir, fake, tmp_path, "dynapipe,dynapipe@zb1p", {"dynapipe": 1.0}, rounds=1)
    assert r.returncode == 0, r.stderr
    first, second = calls(tmp_path)
    assert "--schedule" not in first
    assert second[second.index("--strategy") + 1] == "dynapipe"
    assert second[second.index("--schedule") + 1] == "zb1p"
    assert "| dynapipe@zb1p |" in r.stdout


@pytest.mark.parametrize("rounds", ["0", "two", "-1"])
def test_bad_rounds_is_one_line_and_exit_2(source_dir, fake, tmp_path, rounds):
    r = run(source_dir, fake, tmp_path, "a", {"a": 1.0}, rounds=rounds)
    assert r.returncode == 2
    assert r.stderr.strip() == f"error: ROUNDS must be a whole number >= 1, got '{rounds}'"
    assert not (tmp_path / "calls").exists()


def test_no_strategy_is_one_line_and_exit_2(source_dir, fake, tmp_path):
    r = run(source_dir, fake, tmp_path, ", ,", {}, rounds=1)
    assert r.returncode == 2
    assert r.stderr.strip() == "error: STRATEGIES names no strategy, got '   '"
    assert not (tmp_path / "calls").exists()
