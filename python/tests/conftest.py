"""Shared fixtures of the dynapipe pytest suites (run by ctest, label `python`).

ctest sets PYTHONPATH to build/python, DYNAPIPE_CLI to the built `dynapipe` and
DYNAPIPE_SOURCE_DIR to the repository; run by hand:
    PYTHONPATH=build/python DYNAPIPE_CLI=build/dynapipe /usr/bin/python3 -m pytest python/tests
"""
import os
import pathlib
import subprocess

import pytest

SOURCE_DIR = pathlib.Path(os.environ.get("DYNAPIPE_SOURCE_DIR",
                                         pathlib.Path(__file__).resolve().parents[2]))


@pytest.fixture(scope="session")
def source_dir():
    return SOURCE_DIR


@pytest.fixture(scope="session")
def cli():
    path = os.environ.get("DYNAPIPE_CLI", str(SOURCE_DIR / "build" / "dynapipe"))
    if not os.path.exists(path):
        pytest.fail(f"the dynapipe CLI is needed at {path} (set DYNAPIPE_CLI)")

    def run(*args):
        return subprocess.run([path, *map(str, args)], capture_output=True, text=True)

    return run


def kwargs_to_flags(options):
    """Planner keyword arguments -> the CLI flags they stand for (plan_options())."""
    import dynapipe
    flag_of = {row["name"]: row["flag"] for row in dynapipe.plan_options()}
    flags = []
    for name, value in options.items():
        flags += [flag_of[name], str(value)]
    return flags
