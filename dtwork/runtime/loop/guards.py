"""Checks that turn a silent mistake in a training loop into one clear error at once."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor
from torch.optim.optimizer import register_optimizer_step_pre_hook
from torch.utils.hooks import RemovableHandle

from dtwork.errors import DtworkError

_exchanging: weakref.WeakSet[torch.optim.Optimizer] = (
    weakref.WeakSet()
)  # checked: its gradients are exchanged
_restoring = False  # an optimizer's state being made by torch's zero step: no training step to check


@contextmanager
def restoring_state() -> Iterator[None]:
    """Let an optimizer step past these guards meanwhile: torch makes an empty optimizer's state
    with a step of zero gradients at lr 0 before DCP reads a checkpoint's state into it."""
    global _restoring
    _restoring = True
    try:
        yield
    finally:
        _restoring = False


def step_only_at_last_micro(micro: Callable[[], tuple[int, int]]) -> RemovableHandle:
    """Refuse an optimizer step before the last micro-batch of an accumulating step.

    ``micro()`` gives (this micro-batch, micro-batches per step), counted from 1. A plain
    ``opt.step()`` at another micro-batch would update each replica from its own local gradient
    (DDP exchanges gradients at the last one only), so the replicas would drift apart silently.
    """

    def hook(optimizer: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        if _restoring:
            return
        i, k = micro()
        if i != k:
            raise DtworkError(
                f"optimizer step at micro-batch {i} of {k} (aggregation_frequency {k}): inside "
                "ctx.steps call ctx.backward(loss) and ctx.step(opt), which step at the last micro-batch only"
            )

    return register_optimizer_step_pre_hook(hook)


def check_replicas(models: list[torch.nn.Module], step: int, device: torch.device) -> None:
    """Refuse to go on when the ranks' replicas of the wrapped models differ (one all-reduce).

    The checksum is the sum of every parameter and of its square, in float64; replicas that
    stepped from the same exchanged gradients hold the same weights on every rank.
    """
    # FSDP parameters are shards (DTensors): each rank holds a different part, no replica
    params = [p.detach() for m in models for p in m.parameters() if not isinstance(p, DTensor)]
    if not params or not dist.is_initialized() or dist.get_world_size() < 2:
        return
    with torch.no_grad():
        total = torch.stack([p.double().sum() + p.double().square().sum() for p in params]).sum()
        spread = torch.stack([total, -total]).to(device)
        dist.all_reduce(spread, op=dist.ReduceOp.MAX)
    high, low = spread[0].item(), -spread[1].item()
    if high - low > 1e-9 * max(1.0, abs(high)):
        raise DtworkError(
            f"the model replicas differ across ranks after step {step} (checksums {low:.9g} to "
            f"{high:.9g}): every rank must call ctx.backward(loss) and ctx.step(opt) at every step; "
            "rerun the cell that wraps the model to start again from rank 0's weights"
        )


def check_exchanged(optimizer: torch.optim.Optimizer, wrapped: list[torch.nn.Module]) -> None:
    """Refuse an optimizer's first step on more than one rank when its gradients were never
    exchanged: its parameters are in no wrapped model and their gradients differ across ranks.

    The check runs once per optimizer; the all-reduce only for parameters outside ``wrapped``
    (a model wrapped by hand in DDP passes it, an unwrapped one fails it).
    """
    if optimizer in _exchanging or not dist.is_initialized() or dist.get_world_size() < 2:
        return
    ours = {id(p) for m in wrapped for p in m.parameters()}
    grads = [
        p.grad.detach()
        for group in optimizer.param_groups
        for p in group["params"]
        if p.grad is not None and id(p) not in ours and type(p.grad) is torch.Tensor  # a DTensor is sharded
    ]
    if grads:
        with torch.no_grad():
            total = torch.stack([g.double().sum() + g.double().square().sum() for g in grads]).sum()
            spread = torch.stack([total, -total])
            dist.all_reduce(spread, op=dist.ReduceOp.MAX)
        high, low = spread[0].item(), -spread[1].item()
        if high - low > 1e-9 * max(1.0, abs(high)):
            raise DtworkError(
                "the optimizer steps a model whose gradients were never exchanged across ranks (each "
                "rank would train its own replica): wrap it first, model = ctx.wrap(model), then make the optimizer"
            )
    _exchanging.add(optimizer)


def exchanged_before_step(wrapped: Callable[[], list[torch.nn.Module]]) -> RemovableHandle:
    """Run ``check_exchanged`` before every optimizer step (a plain ``opt.step()`` included)."""

    def hook(optimizer: torch.optim.Optimizer, args: tuple[object, ...], kwargs: dict[str, object]) -> None:
        if not _restoring:
            check_exchanged(optimizer, wrapped())

    return register_optimizer_step_pre_hook(hook)
