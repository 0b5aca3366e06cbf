"""DynaPipe: dynamic micro-batching and pipeline planning, from Python.

    import dynapipe
    planner = dynapipe.Planner(model="gpt-6.7b", pp=4, memory_limit_gib=40)
    plan = planner.plan([312, 1800, 45, 990], [4, 60, 12, 8])

The planner is the C++ core (the extension ``_dynapipe``); options, defaults and error
messages are those of ``dynapipe plan`` (see ``plan_options()``). ``dynapipe.torch``
builds dynamic micro-batches for ordinary PyTorch training loops. docs/python.md has
the whole API.
"""
from __future__ import annotations

from typing import Iterable, Optional, Sequence

from ._dynapipe import (  # noqa: F401  (re-exported)
    Error,
    ExecutionPlan,
    ExecutorProgram,
    GlobalBatch,
    Infeasible,
    Instruction,
    Internal,
    InvalidArgument,
    InvalidType,
    IterationPlan,
    MicroBatch,
    NotFound,
    ParseError,
    PeerFailure,
    Planner,
    ReplicaPlan,
    Samples,
    Timeout,
    Unsupported,
    __version__,
    device_presets,
    load_samples,
    model_presets,
    plan_options,
)

__all__ = [
    "Error", "InvalidArgument", "InvalidType", "NotFound", "ParseError", "Infeasible",
    "Unsupported", "Timeout", "PeerFailure", "Internal",
    "Planner", "IterationPlan", "ReplicaPlan", "MicroBatch", "Instruction", "ExecutorProgram",
    "ExecutionPlan", "Samples", "GlobalBatch",
    "load_samples", "plan_options", "model_presets", "device_presets", "simulate",
]


def _names(value, what: str, default: Sequence[str]) -> list:
    if value is None:
        return list(default)
    if isinstance(value, str):
        return [v for v in value.split(",") if v]
    if not all(isinstance(v, str) for v in value):
        raise InvalidType(f"{what} must be a comma list or a sequence of str")
    return list(value)


def simulate(input_lens, target_lens=None, *, strategies: Optional[Iterable[str]] = None,
             schedules: Optional[Iterable[str]] = None, **options) -> list:
    """Plans one global batch with every strategy x schedule, like `dynapipe simulate`.

    Returns one dict per pair, in order: ``strategy``, ``schedule``, ``est_iteration_ms``,
    ``padding_efficiency``, ``tokens_per_s`` (real tokens / estimated time), ``chosen``
    (the schedule `auto` picked, or the one given) and ``status`` ("ok", "infeasible" or
    "n/a" when the schedule does not apply). ``options`` are Planner's.
    """
    strategy_list = _names(strategies, "strategies",
                           ["dynapipe", "padding", "packing", "packing-varlen", "token-based"])
    schedule_list = _names(schedules, "schedules",
                           ["1f1b", "interleaved", "wait-free-cyclic", "zb1p", "auto"])
    rows = []
    for strategy in strategy_list:
        for schedule in schedule_list:
            row = {"strategy": strategy, "schedule": schedule, "est_iteration_ms": None,
                   "padding_efficiency": None, "tokens_per_s": None, "chosen": None}
            try:
                planner = Planner(**options, strategy=strategy, schedule=schedule)
                plan = planner.plan(input_lens, target_lens)
            except (Infeasible, Unsupported) as e:
                row["status"] = "infeasible" if isinstance(e, Infeasible) else "n/a"
                rows.append(row)
                continue
            real = sum(mb.real_tokens for mb in plan.microbatches)
            row.update(status="ok", est_iteration_ms=plan.est_iteration_ms,
                       padding_efficiency=plan.padding_efficiency,
                       tokens_per_s=real / (plan.est_iteration_ms / 1000.0),
                       chosen=plan.schedule)
            rows.append(row)
    return rows
