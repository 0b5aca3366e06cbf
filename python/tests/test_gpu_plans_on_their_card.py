"""bench/gpu_plans_on_their_card.sh (profile on the GPU, plan with that profile, replay on
the same GPU): the steps are wired to each other — the plans are priced with the profile
the first step wrote, for the preset's model, and the replay reads those plans; a failing
step stops the script; bad input is one line and exit 2. The GPU steps are stand-ins here
(a PYTHON that records its arguments): the measuring itself is tested in test_gpu_profile.py
and test_gpu_replay.py."""
import json
import os
import subprocess
import sys

import pytest

STUB = r'''
import json, shutil, sys
script, args = sys.argv[1], sys.argv[2:]
log = json.load(open(LOG)) if __import__("os").path.exists(LOG) else []
log.append([script] + args)
json.dump(log, open(LOG, "w"))
value = lambda flag: args[args.index(flag) + 1]
if script.endswith("gpu_profile.py"):
    if FAIL_PROFILE:
        sys.exit(3)
    model = json.load(open(value("--model")))
    shutil.copy(SOURCE + "/assets/profiles/" + model["name"] + ".h200.measured.json", value("--out"))
elif script.endswith("gpu_replay.py"):
    print("# point: stand-in")
else:
    sys.exit(subprocess.call([sys.executable] + sys.argv[1:]))
'''


def run_script(source_dir, tmp_path, model, fail_profile=False):
    log = tmp_path / "calls.json"
    stub = tmp_path / "python"
    stub.write_text(f"#!{sys.executable}\nimport subprocess\nLOG = {str(log)!r}\nSOURCE = {str(source_dir)!r}\n"
                    f"FAIL_PROFILE = {fail_profile}\n" + STUB)
    stub.chmod(0o755)
    env = {**os.environ, "PYTHON": str(stub), "PPS": "4", "SEQLENS": "1024", "STRATEGIES": "dynapipe packing-varlen",
           "ITERATIONS": "1", "DYNAPIPE": os.environ.get("DYNAPIPE_CLI", str(source_dir / "build/dynapipe"))}
    r = subprocess.run(["bash", str(source_dir / "bench/gpu_plans_on_their_card.sh"), model, str(tmp_path / "out")],
                       env=env, capture_output=True, text=True, timeout=240, cwd=source_dir)
    calls = json.loads(log.read_text()) if log.exists() else []
    return r, calls


@pytest.mark.parametrize("model", ["gpt-6.7b", "t5-11b"])
def test_plans_are_priced_with_the_profile_just_measured_and_replayed(source_dir, tmp_path, model):
    r, calls = run_script(source_dir, tmp_path, model)
    assert r.returncode == 0, r.stdout + r.stderr
    out = tmp_path / "out"
    profile_call, replay_call = calls[-2], calls[-1]
    assert profile_call[0] == "bench/gpu_profile.py" and replay_call[0] == "bench/gpu_replay.py"
    model_file = json.loads((out / f"{model}.model.json").read_text())
    bundled = json.loads((source_dir / f"assets/profiles/{model}.h100.measured.json").read_text())
    assert model_file == bundled["model"]
    plans = sorted((out / "plans").glob("*.json"))
    assert [p.name for p in plans] == [f"{model}-pp4-1024-dynapipe.json", f"{model}-pp4-1024-packing-varlen.json"]
    for plan in plans:
        assert json.loads(plan.read_text())["config"]["cost_model"] == str(out / f"{model}.profile.json")
    assert replay_call[-2:] == [str(p) for p in plans]
    assert "# point: stand-in" in r.stdout


def test_a_failing_step_stops_the_script(source_dir, tmp_path):
    r, calls = run_script(source_dir, tmp_path, "gpt-6.7b", fail_profile=True)
    assert r.returncode != 0
    assert [c[0] for c in calls if c[0] != "-c"] == ["bench/gpu_profile.py"]
    assert not (tmp_path / "out" / "plans").exists() or not any((tmp_path / "out" / "plans").iterdir())


def test_an_unknown_model_is_one_line_and_exit_2(source_dir, tmp_path):
    r, calls = run_script(source_dir, tmp_path, "gpt-tiny")
    assert r.returncode == 2
    assert "expected gpt-6.7b or t5-11b, got gpt-tiny" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert calls == []
