"""PipelineExecutor: runs one rank's instruction list of an IterationPlan with
torch.distributed, over the user's own stage modules -- DynaPipe's pipeline without the
C++ runtime (docs/plan-format.md has the instruction semantics)."""
from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch
import torch.distributed as dist

import dynapipe


class PipelineExecutor:
    """Executes ``plan.instructions[rank]`` on this process.

    ``stages``: ``{stage: module}`` for the (virtual) stages this rank holds.
    ``load_input(microbatch, stage)`` returns what a stage needs from a micro-batch's
    samples (token ids on the first stage, labels on the last; ``microbatch`` is a
    dynapipe.MicroBatch: pad to ``microbatch.shape``). ``forward(stage, module, x,
    loaded)`` runs a stage: ``x`` is the incoming activation (None on stage 0) and the
    result is the outgoing activation, of the planned shape ``[batch, seqlen, hidden]``,
    or on the last stage the micro-batch's loss, already weighted (summed over the
    iteration's micro-batches and replicas it must give the loss you want; e.g. sum of
    token losses / all target tokens of the global batch).
    ``ReduceGrads`` sums gradients over the replicas of this stage (``dp_group``);
    ``OptimizerStep`` steps ``optimizer`` and zeroes the gradients.
    BackwardInput computes the weight gradients too (PyTorch's autograd does both at once),
    so BackwardWeight is a no-op: zb1p plans run correctly, without their zero bubble.
    """

    def __init__(self, stages: Dict[int, torch.nn.Module], *, load_input: Callable[[Any, int], Any],
                 forward: Callable[[int, torch.nn.Module, Optional[torch.Tensor], Any], torch.Tensor],
                 optimizer: Optional[torch.optim.Optimizer] = None, rank: Optional[int] = None,
                 dp_group=None, dtype: torch.dtype = torch.float32):
        self.stages = dict(stages)
        self.load_input, self.forward_fn = load_input, forward
        self.optimizer, self.dp_group, self.dtype = optimizer, dp_group, dtype
        self.rank = dist.get_rank() if rank is None else rank

    def run(self, plan: "dynapipe.IterationPlan") -> float:
        """Runs this rank's program of ``plan``; returns the sum of the losses its last
        stage computed (0.0 on other stages)."""
        program = plan.instructions[self.rank]
        microbatches = {}
        for replica in plan.replicas:
            for executor in replica.executors:
                if executor.rank == self.rank:
                    microbatches = {mb.id: mb for mb in replica.microbatches}
        buffers: Dict[int, Any] = {}
        pending: Dict[int, Any] = {}
        saved: Dict[tuple, tuple] = {}  # (mb, stage) -> (input leaf or None, output)
        loss_sum = 0.0
        for ins in program:
            op = ins.op
            if op == "LoadInput":
                buffers[ins.buffer] = self.load_input(microbatches[ins.mb], ins.stage)
            elif op == "Forward":
                # inputs: the activation (stages > 0), then the loaded input, if any.
                inputs = [buffers[b] for b in ins.inputs]
                x = None
                if ins.stage > 0:
                    # Each stage's graph ends at its input, so that the stage's own
                    # Backward instruction computes (and sends) the input gradient.
                    x = inputs.pop(0).detach().requires_grad_()
                loaded = inputs[0] if inputs else None
                out = self.forward_fn(ins.stage, self.stages[ins.stage], x, loaded)
                saved[(ins.mb, ins.stage)] = (x, out)
                if ins.buffer is not None:
                    self._check_shape(out, ins)
                    buffers[ins.buffer] = out.detach()
                else:
                    loss_sum += float(out.detach())
            elif op in ("Backward", "BackwardInput"):
                x, out = saved.pop((ins.mb, ins.stage))
                if ins.inputs:
                    torch.autograd.backward(out, grad_tensors=buffers[ins.inputs[0]])
                else:
                    out.backward()
                if ins.buffer is not None:
                    grad = x.grad if x is not None and x.grad is not None else torch.zeros_like(x)
                    self._check_shape(grad, ins)
                    buffers[ins.buffer] = grad
            elif op == "BackwardWeight":
                pass
            elif op in ("SendActivationStart", "SendGradStart"):
                self._check_shape(buffers[ins.buffer], ins)
                pending[ins.buffer] = dist.isend(buffers[ins.buffer].contiguous(), ins.peer)
            elif op in ("RecvActivationStart", "RecvGradStart"):
                buffers[ins.buffer] = torch.empty(ins.shape, dtype=self.dtype)
                pending[ins.buffer] = dist.irecv(buffers[ins.buffer], ins.peer)
            elif op.endswith("Finish"):
                pending.pop(ins.buffer).wait()
            elif op == "FreeBuffer":
                del buffers[ins.buffer]
            elif op == "ReduceGrads":
                if self.dp_group is not None:
                    for module in self.stages.values():
                        for p in module.parameters():
                            if p.grad is None:
                                p.grad = torch.zeros_like(p)
                            dist.all_reduce(p.grad, group=self.dp_group)
            elif op == "OptimizerStep":
                if self.optimizer is not None:
                    self.optimizer.step()
                    self.optimizer.zero_grad()
            else:
                raise dynapipe.Unsupported(f"instruction {op} is not supported by PipelineExecutor")
        return loss_sum

    @staticmethod
    def _check_shape(tensor, ins):
        if list(tensor.shape) != list(ins.shape):
            raise dynapipe.InvalidArgument(
                f"{ins.op} of mb {ins.mb} stage {ins.stage}: the tensor must have the planned shape "
                f"{list(ins.shape)}, got {list(tensor.shape)}")
