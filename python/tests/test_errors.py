"""Bad input raises a dynapipe.Error naming the argument; bad options carry the CLI's message."""
import array
import math

import pytest

import dynapipe
from conftest import kwargs_to_flags

SMALL = "tests/cli/data/small.jsonl"

# (Planner keyword arguments, exception class): the CLI given the same flags exits 2
# with the same message.
BAD_OPTIONS = [
    (dict(pp=0), dynapipe.InvalidArgument),
    (dict(pp=2000), dynapipe.InvalidArgument),
    (dict(dp=0), dynapipe.InvalidArgument),
    (dict(max_seqlen=0), dynapipe.InvalidArgument),
    (dict(global_batch_tokens=0), dynapipe.InvalidArgument),
    (dict(memory_limit_gib=-1), dynapipe.InvalidArgument),
    (dict(seqlen_multiple=0), dynapipe.InvalidArgument),
    (dict(strategy="magic"), dynapipe.InvalidArgument),
    (dict(schedule="magic"), dynapipe.InvalidArgument),
    (dict(model="gpt-7b"), dynapipe.NotFound),
    (dict(cost_model="analytic:tpu-v9"), dynapipe.NotFound),
    (dict(model="gpt-6.7b", pp=33), dynapipe.InvalidArgument),
    (dict(model="gpt-6.7b", pp=1, memory_limit_gib=40), dynapipe.Infeasible),
]


@pytest.mark.parametrize("options,error", BAD_OPTIONS, ids=lambda v: str(v))
def test_bad_option_raises_the_cli_message(cli, source_dir, tmp_path, options, error):
    with pytest.raises(error) as raised:
        dynapipe.Planner(**options)
    out = tmp_path / "plan.json"
    r = cli("plan", "--samples", source_dir / SMALL, "--out", out, "--no-compare",
            *kwargs_to_flags(options))
    assert r.returncode == 2
    assert not out.exists()
    assert r.stderr.strip().splitlines()[-1] == f"error: {raised.value}"


def test_error_classes():
    assert issubclass(dynapipe.InvalidArgument, dynapipe.Error)
    assert issubclass(dynapipe.InvalidArgument, ValueError)
    assert issubclass(dynapipe.InvalidType, dynapipe.InvalidArgument)
    assert issubclass(dynapipe.InvalidType, TypeError)
    for name in ["NotFound", "ParseError", "Infeasible", "Unsupported", "Timeout",
                 "PeerFailure", "Internal"]:
        assert issubclass(getattr(dynapipe, name), dynapipe.Error)


def test_nan_and_inf_limits_are_rejected():
    for value in [math.nan, math.inf, -math.inf]:
        with pytest.raises(dynapipe.InvalidArgument, match=r"^--memory-limit must be a number"):
            dynapipe.Planner(memory_limit_gib=value)


@pytest.mark.parametrize("options,message", [
    (dict(pp="4"), "pp must be an integer, got str"),
    (dict(pp=4.0), "pp must be an integer, got float"),
    (dict(pp=True), "pp must be an integer, got bool"),
    (dict(memory_limit_gib="40"), "memory_limit_gib must be a number, got str"),
    (dict(model=3), "model must be a str or os.PathLike, got int"),
    (dict(seed=-1), "seed must be >= 0, got -1"),
    (dict(pp=1 << 70), "pp must fit in a 64-bit signed integer"),
])
def test_wrong_option_type_names_the_argument(options, message):
    with pytest.raises(dynapipe.Error) as raised:
        dynapipe.Planner(**options)
    assert str(raised.value).startswith(message)


def test_unknown_option_lists_the_known_ones():
    with pytest.raises(dynapipe.InvalidType, match=r"unknown option 'stages': expected one of model, tp, pp"):
        dynapipe.Planner(stages=4)


@pytest.fixture(scope="module")
def planner():
    return dynapipe.Planner()


@pytest.mark.parametrize("args,kwargs,error,message", [
    (([10, -5],), {}, dynapipe.InvalidArgument, "input_lens[1] must be >= 1, got -5"),
    (([10, 0],), {}, dynapipe.InvalidArgument, "input_lens[1] must be >= 1, got 0"),
    (([10, 20], [1, -1]), {}, dynapipe.InvalidArgument, "target_lens[1] must be >= 0, got -1"),
    (([10, 20], [1]), {}, dynapipe.InvalidArgument, "target_lens must have as many values as input_lens (2), got 1"),
    (([],), {}, dynapipe.InvalidArgument, "input_lens must not be empty"),
    (([10, 2.5],), {}, dynapipe.InvalidType, "input_lens[1] must be an integer, got float"),
    (("abc",), {}, dynapipe.InvalidType, "input_lens must be a sequence of integers, got str"),
    ((12,), {}, dynapipe.InvalidType, "input_lens must be a sequence of integers, got int"),
    ((array.array("d", [1.0]),), {}, dynapipe.InvalidType, "input_lens must hold integers"),
    (([10, 20],), {"ids": [1]}, dynapipe.InvalidArgument, "ids must have as many values as input_lens (2), got 1"),
    (([10, 20],), {"ids": [3, 3]}, dynapipe.InvalidArgument, "ids must be unique, got 3 twice"),
    (([10],), {"index": -1}, dynapipe.InvalidArgument, "index must be >= 0, got -1"),
])
def test_bad_lengths_name_the_argument(planner, args, kwargs, error, message):
    with pytest.raises(error) as raised:
        planner.plan(*args, **kwargs)
    assert message in str(raised.value)


def test_global_batch_takes_no_lengths(planner, source_dir):
    batch = planner.global_batches(planner.load_samples(source_dir / SMALL))[0]
    with pytest.raises(dynapipe.InvalidArgument, match="must be None when planning a GlobalBatch"):
        planner.plan(batch, index=2)


def test_numpy_arrays_are_checked():
    np = pytest.importorskip("numpy")
    planner = dynapipe.Planner()
    with pytest.raises(dynapipe.InvalidArgument, match="input_lens must be one-dimensional, got 2"):
        planner.plan(np.ones((2, 2), dtype=np.int64))
    with pytest.raises(dynapipe.InvalidType, match="input_lens must hold integers"):
        planner.plan(np.ones(3, dtype=np.float32))


def test_t5_needs_target_lens():
    with pytest.raises(dynapipe.InvalidArgument, match="target_lens must be given .* t5-tiny"):
        dynapipe.Planner(model="t5-tiny").plan([10, 20])


def test_missing_and_malformed_files(source_dir):
    with pytest.raises(dynapipe.NotFound, match="no-such.jsonl"):
        dynapipe.load_samples("no-such.jsonl")
    with pytest.raises(dynapipe.ParseError, match=r"malformed.jsonl:2"):
        dynapipe.load_samples(source_dir / "tests/cli/data/malformed.jsonl")
    with pytest.raises(dynapipe.InvalidType, match="path must be a str or os.PathLike, got int"):
        dynapipe.load_samples(3)


def test_corrupt_plan_bytes_raise_parse_error():
    plan = dynapipe.Planner().plan([100, 200, 300])
    data = plan.to_bytes()
    with pytest.raises(dynapipe.ParseError):
        dynapipe.IterationPlan.from_bytes(data[:-3])
    with pytest.raises(dynapipe.ParseError):
        dynapipe.IterationPlan.from_bytes(b"XXXX" + data[4:])
    with pytest.raises(dynapipe.InvalidType, match="data must be bytes, got str"):
        dynapipe.IterationPlan.from_bytes("DPPL")
    with pytest.raises(dynapipe.ParseError, match="where.json"):
        dynapipe.ExecutionPlan.from_json("{", "where.json")
