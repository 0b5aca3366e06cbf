"""Dynamic micro-batching for ordinary PyTorch training loops (no pipeline needed).

    sampler = DynamicBatchSampler(lengths, token_budget=65536, model="gpt-small",
                                  num_replicas=world_size, rank=rank, seed=0)
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for step in sampler:                      # one optimizer step
            for i, indices in enumerate(step):    # the micro-batches the DP chose
                mb = collate_microbatch([dataset[j] for j in indices],
                                        step_loss_tokens=step.loss_tokens,
                                        world_size=world_size)
                loss = model_loss(mb) * mb["loss_weight"]
                loss.backward()                   # (DDP: no_sync() but on the last)
            optimizer.step(); optimizer.zero_grad()

PipelineExecutor runs an IterationPlan's instructions over your own stage modules.
Needs PyTorch (Debian: python3-torch). docs/python.md has the details.
"""
from .collate import collate_microbatch  # noqa: F401
from .pipeline import PipelineExecutor  # noqa: F401
from .sampler import DynamicBatchSampler, StepBatches  # noqa: F401

__all__ = ["DynamicBatchSampler", "StepBatches", "PipelineExecutor", "collate_microbatch"]
