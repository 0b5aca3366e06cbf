"""`cmake --install build --component python` gives an importable package (outside the
build tree), with the stub and dynapipe.torch."""
import os
import subprocess
import sys

import pytest


def test_install_component_imports(tmp_path):
    build = os.environ.get("DYNAPIPE_BUILD_DIR")
    if not build:
        pytest.skip("run by ctest (needs DYNAPIPE_BUILD_DIR)")
    cmake = os.environ.get("CMAKE_COMMAND", "cmake")
    r = subprocess.run([cmake, "--install", build, "--component", "python", "--prefix", str(tmp_path)],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    site = next(tmp_path.glob("lib/python3*/dist-packages"))
    files = {p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()}
    assert {"dynapipe/__init__.py", "dynapipe/_dynapipe.pyi", "dynapipe/py.typed",
            "dynapipe/torch/__init__.py", "dynapipe/torch/sampler.py"} <= files
    assert any(f.startswith("dynapipe/_dynapipe.") and f.endswith(".so") for f in files)
    env = dict(os.environ, PYTHONPATH=str(site))
    code = ("import dynapipe; assert dynapipe.__file__.startswith(%r); "
            "print(len(dynapipe.Planner().plan([100, 200]).microbatches))" % str(site))
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) >= 1
