"""collate_microbatch(): one micro-batch as tensors, with the weight that makes the
accumulated loss the exact token mean of the whole optimizer step."""
from __future__ import annotations

from typing import Sequence, Union

import torch

import dynapipe

Sample = Union[torch.Tensor, Sequence[int], tuple]


def _split(sample, i):
    """(tokens, first loss position): a sequence predicts every next token (loss on
    positions 1..L-1); an (input, target) pair predicts the target only."""
    if isinstance(sample, tuple) and len(sample) == 2:
        inp, tgt = (torch.as_tensor(x, dtype=torch.long).reshape(-1) for x in sample)
        if inp.numel() < 1 or tgt.numel() < 1:
            raise dynapipe.InvalidArgument(f"sample {i}: input and target must not be empty")
        return torch.cat([inp, tgt]), inp.numel()
    tokens = torch.as_tensor(sample, dtype=torch.long).reshape(-1)
    if tokens.numel() < 2:
        raise dynapipe.InvalidArgument(f"sample {i}: a sequence needs >= 2 tokens, got {tokens.numel()}")
    return tokens, 1


def collate_microbatch(samples: Sequence[Sample], *, step_loss_tokens: int, world_size: int = 1,
                       pad_id: int = 0, ignore_index: int = -100, pack: bool = False) -> dict:
    """Tensors of one micro-batch for a causal LM, and its loss weight.

    ``samples``: token sequences (1-D tensors or lists; every next token is predicted),
    or ``(input, target)`` pairs (only target tokens are predicted). Returns a dict:

    - ``input_ids``, ``labels`` (``ignore_index`` where no loss), ``position_ids``:
      ``[B, L]`` padded to this micro-batch's longest sample (``pad_id``), or with
      ``pack=True`` ``[1, sum L]`` with the samples back to back;
    - ``cu_seqlens`` (pack only): int32 offsets ``[0, L0, L0+L1, ...]`` for varlen
      attention; ``lengths``: the samples' lengths;
    - ``loss_tokens``: tokens with a label here; ``loss_weight``:
      ``loss_tokens * world_size / step_loss_tokens``.

    With ``loss = cross_entropy(logits, labels, ignore_index=...)`` (the mean over this
    micro-batch's labelled tokens), summing ``loss * loss_weight`` over the step's
    micro-batches gives the token mean of the whole step: exactly, for any split, and
    across DDP ranks once DDP averages the gradients (hence ``world_size``).
    ``step_loss_tokens``: the step's labelled tokens over all ranks (StepBatches.loss_tokens).
    """
    if isinstance(step_loss_tokens, bool) or not isinstance(step_loss_tokens, int) or step_loss_tokens < 1:
        raise dynapipe.InvalidArgument(f"step_loss_tokens must be an integer >= 1, got {step_loss_tokens!r}")
    if isinstance(world_size, bool) or not isinstance(world_size, int) or world_size < 1:
        raise dynapipe.InvalidArgument(f"world_size must be an integer >= 1, got {world_size!r}")
    if len(samples) == 0:
        raise dynapipe.InvalidArgument("samples must not be empty")
    parts = [_split(s, i) for i, s in enumerate(samples)]
    lengths = [t.numel() for t, _ in parts]
    labels_of = []
    for tokens, first in parts:
        labels = torch.full_like(tokens, ignore_index)
        # position p predicts token p + 1: labels[p] = tokens[p + 1] where a loss applies
        labels[first - 1:-1] = tokens[first:]
        labels_of.append(labels)
    loss_tokens = sum(int((lab != ignore_index).sum()) for lab in labels_of)
    if pack:
        input_ids = torch.cat([t for t, _ in parts]).unsqueeze(0)
        labels = torch.cat(labels_of).unsqueeze(0)
        position_ids = torch.cat([torch.arange(n) for n in lengths]).unsqueeze(0)
        cu = torch.zeros(len(lengths) + 1, dtype=torch.int32)
        cu[1:] = torch.cumsum(torch.tensor(lengths, dtype=torch.int32), 0)
        extra = {"cu_seqlens": cu}
    else:
        longest = max(lengths)
        input_ids = torch.full((len(parts), longest), pad_id, dtype=torch.long)
        labels = torch.full((len(parts), longest), ignore_index, dtype=torch.long)
        for row, ((tokens, _), lab) in enumerate(zip(parts, labels_of)):
            input_ids[row, :tokens.numel()] = tokens
            labels[row, :lab.numel()] = lab
        position_ids = torch.arange(longest).unsqueeze(0).expand(len(parts), -1)
        extra = {}
    return {"input_ids": input_ids, "labels": labels, "position_ids": position_ids,
            "lengths": torch.tensor(lengths), "loss_tokens": loss_tokens,
            "loss_weight": loss_tokens * world_size / step_loss_tokens, **extra}
