"""DynamicBatchSampler: per optimizer step, the micro-batches DynaPipe's DP chooses."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, List, Optional, Sequence

import torch
import torch.distributed as dist

import dynapipe


class StepBatches(list):
    """One optimizer step of one rank: a list of micro-batches (lists of sample indices).

    ``index`` is the step within the epoch; ``loss_tokens`` the loss tokens of the whole
    step over every replica (what collate_microbatch() divides by); ``plan`` the
    IterationPlan it came from (all replicas)."""

    def __init__(self, microbatches, index: int, loss_tokens: int, plan):
        super().__init__(microbatches)
        self.index = index
        self.loss_tokens = loss_tokens
        self.plan = plan


def _as_int_list(values, what: str) -> List[int]:
    if isinstance(values, torch.Tensor):
        values = values.tolist()
    out = []
    for i, v in enumerate(values):
        if isinstance(v, bool) or not hasattr(v, "__index__"):
            raise dynapipe.InvalidType(f"{what}[{i}] must be an integer, got {type(v).__name__}")
        out.append(int(v))
    return out


class DynamicBatchSampler(torch.utils.data.Sampler):
    """Yields, per optimizer step, this rank's micro-batches as chosen by DynaPipe's DP.

    Each epoch the samples are shuffled (``seed + epoch``) or kept in order, cut into
    global batches of at most ``token_budget`` tokens (all replicas together; a sample
    longer than the budget forms a batch alone), and each global batch is planned with
    ``dynapipe.Planner(pp=1, dp=num_replicas, ...)``: the exact DP splits it over the
    replicas and into micro-batches that fit the memory model (``model``,
    ``memory_limit_gib``, ``cost_model``) at the least estimated time, i.e. samples of
    similar length together. Every sample is in exactly one micro-batch of one rank per
    epoch (with ``drop_last`` the last, partial global batch is left out).

    ``lengths``: tokens per sample (the whole sequence); with ``target_lengths`` the
    sequence is input ``lengths[i]`` plus target ``target_lengths[i]`` (loss on the
    target only). Lengths are never truncated: ``max_seqlen`` defaults to the longest.
    Planning runs ``prefetch`` steps ahead in a thread (the planner releases the GIL).
    Extra keyword arguments go to dynapipe.Planner (e.g. ``strategy``, ``seqlen_multiple``).
    """

    def __init__(self, lengths: Sequence[int], token_budget: int, *,
                 target_lengths: Optional[Sequence[int]] = None,
                 model: str = "gpt-tiny", memory_limit_gib: float = 0.0,
                 cost_model: str = "analytic:a100-40g", shuffle: bool = True, seed: int = 0,
                 drop_last: bool = False, num_replicas: Optional[int] = None,
                 rank: Optional[int] = None, prefetch: int = 1, **planner_options):
        self.lengths = _as_int_list(lengths, "lengths")
        if not self.lengths:
            raise dynapipe.InvalidArgument("lengths must not be empty")
        for i, n in enumerate(self.lengths):
            if n < 1:
                raise dynapipe.InvalidArgument(f"lengths[{i}] must be >= 1, got {n}")
        self.target_lengths = None
        if target_lengths is not None:
            self.target_lengths = _as_int_list(target_lengths, "target_lengths")
            if len(self.target_lengths) != len(self.lengths):
                raise dynapipe.InvalidArgument(
                    f"target_lengths must have as many values as lengths ({len(self.lengths)}), "
                    f"got {len(self.target_lengths)}")
            for i, n in enumerate(self.target_lengths):
                if n < 1:
                    raise dynapipe.InvalidArgument(f"target_lengths[{i}] must be >= 1, got {n}")
        if num_replicas is None:
            num_replicas = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if rank is None:
            rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        if isinstance(num_replicas, bool) or not isinstance(num_replicas, int) or num_replicas < 1:
            raise dynapipe.InvalidArgument(f"num_replicas must be an integer >= 1, got {num_replicas!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < num_replicas:
            raise dynapipe.InvalidArgument(f"rank must be an integer in [0, {num_replicas}), got {rank!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 0:
            raise dynapipe.InvalidArgument(f"prefetch must be an integer >= 0, got {prefetch!r}")
        if isinstance(token_budget, bool) or not isinstance(token_budget, int) or token_budget < 1:
            raise dynapipe.InvalidArgument(f"token_budget must be an integer >= 1, got {token_budget!r}")
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last, self.prefetch = bool(shuffle), seed, bool(drop_last), prefetch
        self.token_budget = token_budget
        # Never truncate: GPT bounds input + target by max_seqlen, T5 the input alone.
        planner_options.setdefault("max_seqlen", max(self._totals()))
        if self.target_lengths is not None:
            planner_options.setdefault("max_target_len", max(self.target_lengths))
        # Planner validates every option (types, ranges, presets) with the CLI's messages.
        self.planner = dynapipe.Planner(model=model, pp=1, dp=num_replicas,
                                        global_batch_tokens=token_budget,
                                        memory_limit_gib=memory_limit_gib, cost_model=cost_model,
                                        seed=seed, **planner_options)
        self.epoch = 0
        self._resume_step = 0
        self._batches_epoch = None
        self._batches = None

    # -- data order ---------------------------------------------------------------------
    def _totals(self) -> List[int]:
        if self.target_lengths is None:
            return self.lengths
        return [a + b for a, b in zip(self.lengths, self.target_lengths)]

    def _order(self) -> List[int]:
        if not self.shuffle:
            return list(range(len(self.lengths)))
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(len(self.lengths), generator=g).tolist()

    def global_batches(self) -> List[List[int]]:
        """This epoch's global batches (sample indices), the same on every rank."""
        if self._batches_epoch == self.epoch:
            return self._batches
        totals = self._totals()
        batches, current, tokens = [], [], 0
        for i in self._order():
            if current and tokens + totals[i] > self.token_budget:
                batches.append(current)
                current, tokens = [], 0
            current.append(i)
            tokens += totals[i]
        if current and not self.drop_last:
            batches.append(current)
        elif current and not batches:
            batches.append(current)  # drop_last never empties an epoch
        # Every replica needs a sample in every step (DDP all-reduces each step): a last
        # batch with fewer samples than replicas joins the one before it.
        if len(batches) > 1 and len(batches[-1]) < self.num_replicas:
            batches[-2].extend(batches.pop())
        if len(batches[-1]) < self.num_replicas:
            raise dynapipe.InvalidArgument(
                f"{len(self.lengths)} samples cannot feed num_replicas {self.num_replicas}")
        self._batches_epoch, self._batches = self.epoch, batches
        return batches

    def __len__(self) -> int:
        return len(self.global_batches())

    # -- planning -----------------------------------------------------------------------
    def _loss_tokens(self, indices) -> int:
        if self.target_lengths is None:
            return sum(self.lengths[i] - 1 for i in indices)  # next-token prediction
        return sum(self.target_lengths[i] for i in indices)

    def plan_step(self, index: int) -> StepBatches:
        """Plans step ``index`` of this epoch (deterministic: any rank, any time)."""
        indices = self.global_batches()[index]
        inputs = [self.lengths[i] for i in indices]
        targets = None if self.target_lengths is None else [self.target_lengths[i] for i in indices]
        plan = self.planner.plan(inputs, targets, ids=indices, index=index)
        mine = [list(mb.sample_ids) for mb in plan.replicas[self.rank].microbatches]
        return StepBatches(mine, index, self._loss_tokens(indices), plan)

    def __iter__(self) -> Iterator[StepBatches]:
        n = len(self.global_batches())
        start = self._resume_step
        if self.prefetch == 0:
            for index in range(start, n):
                self._resume_step = index + 1
                yield self.plan_step(index)
        else:
            with ThreadPoolExecutor(max_workers=1) as pool:
                pending = [pool.submit(self.plan_step, i) for i in range(start, min(n, start + 1 + self.prefetch))]
                for index in range(start, n):
                    step = pending.pop(0).result()
                    ahead = index + 1 + self.prefetch
                    if ahead < n:
                        pending.append(pool.submit(self.plan_step, ahead))
                    self._resume_step = index + 1
                    yield step
        self._resume_step = 0  # the next pass starts a fresh epoch order at step 0

    # -- epochs and checkpoints ----------------------------------------------------------
    def set_epoch(self, epoch: int) -> None:
        """Selects the epoch's order. A resumed position survives set_epoch(its epoch)."""
        if epoch != self.epoch:
            self.epoch = epoch
            self._resume_step = 0

    def state_dict(self) -> dict:
        """The position: epoch and the number of steps already yielded in it."""
        return {"epoch": self.epoch, "step": self._resume_step, "seed": self.seed,
                "num_samples": len(self.lengths), "num_replicas": self.num_replicas,
                "token_budget": self.token_budget}

    def load_state_dict(self, state: dict) -> None:
        """Resumes so that the next iteration yields step ``state['step']`` of its epoch."""
        for key in ("seed", "num_samples", "num_replicas", "token_budget"):
            mine = self.state_dict()[key]
            if state.get(key) != mine:
                raise dynapipe.InvalidArgument(
                    f"state_dict {key} must match this sampler's {mine}, got {state.get(key)!r}")
        self.epoch = int(state["epoch"])
        self._resume_step = int(state["step"])
