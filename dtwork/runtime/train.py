"""``ctx.backward``, ``ctx.step`` and ``ctx.log``: aware of the running ``ctx.steps``, if any."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from dtwork.errors import DtworkError
from dtwork.runtime import group
from dtwork.runtime.sync import MAX_LOGGED, StepHead, check_names, names_key, not_a_number

if TYPE_CHECKING:
    from dtwork.runtime.context import Context
    from dtwork.runtime.loop import StepLoop


def backward(ctx: Context, loss: torch.Tensor) -> None:
    """Scale for accumulation and fp16, then backward (outside autocast)."""
    loop: StepLoop | None = ctx.loop
    if loop is not None and loop.k > 1 and ctx.config.optimizations.average_aggregated_gradients:
        loss = loss / loop.k
    scale = 1.0
    if ctx._scaler is not None:
        scale = float(ctx._scaler.get_scale())
        loss = ctx._scaler.scale(loss)
    if loop is not None:
        loop.before_backward()
    with torch.autocast(ctx.device.type, enabled=False):
        try:
            loss.backward()
        except RuntimeError as exc:  # DDP's exchange fails when a peer aborted the group
            peer = group.peer_failure(exc)
            if peer is None:
                raise
            raise peer from None
    if loop is not None:
        loop.after_backward(scale)


def optimizer_step(ctx: Context, optimizer: torch.optim.Optimizer) -> bool:
    """Step at the last micro-batch of a step (scaler-aware), zero the grads, step schedules."""
    loop: StepLoop | None = ctx.loop
    ctx.register("optimizers", optimizer)
    if loop is not None and not loop.is_last_micro:
        return False
    stepped = True
    if ctx._scaler is not None:
        scale = ctx._scaler.get_scale()
        ctx._scaler.step(optimizer)
        ctx._scaler.update()
        stepped = ctx._scaler.get_scale() >= scale  # a skipped step (inf/NaN gradients) backs it off
    else:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if stepped:  # a step the scaler skipped moves no schedule
        for sched in ctx.schedulers:
            if getattr(sched, "optimizer", None) is optimizer:
                sched.step()
    if loop is not None:
        loop.stepped = stepped
    return stepped


def log_scalars(ctx: Context, scalars: dict[str, Any]) -> None:
    """Inside ``ctx.steps``: averaged with the step's all-reduce. Outside: reduced at once."""
    step = scalars.pop("step", None)
    if not scalars:
        return
    if ctx.loop is not None:
        ctx.loop.add_log(scalars)
        return
    names = sorted(scalars)
    names_key(tuple(names))  # refuses a name no store could hold
    vec = torch.stack([_number(n, scalars[n]).to(ctx.device, torch.float64).reshape(()) for n in names])
    if ctx.config.optimizations.average_training_metrics and ctx.world_size > 1:
        ctx.require_all_ranks("ctx.log outside ctx.steps")
        vec = _agreed_mean(ctx, names, vec)
    ctx._log_step = step if step is not None else ctx._log_step + 1
    if ctx.rank == 0:
        ctx.publisher.record("log", ctx._log_step, dict(zip(names, vec.tolist(), strict=True)))
        ctx.publisher.flush()


def _number(name: str, value: Any) -> torch.Tensor:
    """A logged value as a 0-d tensor; anything but a real number or a one-element tensor is refused."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            raise DtworkError(not_a_number(name, value))
        return value.detach()
    try:
        return torch.tensor(float(value), dtype=torch.float64)
    except (TypeError, ValueError, OverflowError):
        raise DtworkError(not_a_number(name, value)) from None


def _agreed_mean(ctx: Context, names: list[str], vec: torch.Tensor) -> torch.Tensor:
    """The ranks' mean of ``vec``, sent with a hash of ``names`` in a vector of one length on
    every rank, so that ranks logging different names fail at once instead of hanging."""
    if len(names) > MAX_LOGGED:
        raise DtworkError(f"ctx.log takes at most {MAX_LOGGED} names per call; got {len(names)}")
    key = names_key(tuple(names))
    full = torch.zeros(StepHead.SIZE + MAX_LOGGED, dtype=torch.float64, device=ctx.device)
    full[StepHead.SIZE : StepHead.SIZE + len(names)] = vec
    head = StepHead(names=key, names_sq=key * key)
    full[: StepHead.SIZE] = torch.tensor(head.pack(), dtype=torch.float64)
    dist.all_reduce(full)
    check_names(StepHead.unpack(full[: StepHead.SIZE].tolist()), ctx._log_step + 1, names, ctx.world_size)
    return full[StepHead.SIZE : StepHead.SIZE + len(names)] / ctx.world_size
