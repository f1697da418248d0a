"""``ctx.backward``, ``ctx.step`` and ``ctx.log``: aware of the running ``ctx.steps``, if any."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, cast

import torch
import torch.distributed as dist

from dtwork.errors import DtworkError
from dtwork.runtime.core import group
from dtwork.runtime.loop import guards
from dtwork.runtime.loop.sync import MAX_LOGGED, StepHead, check_names, names_key, not_a_number
from dtwork.runtime.measure import memory

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState, RunningLoop


def backward(state: RankState, loss: torch.Tensor) -> None:
    """Scale for accumulation and fp16, then backward (outside autocast)."""
    loop: RunningLoop | None = state.loop
    if loop is not None and loop.k > 1 and state.config.optimizations.average_aggregated_gradients:
        loss = loss / loop.k
    scale = 1.0
    if state.scaler is not None:
        scale = float(state.scaler.get_scale())
        loss = state.scaler.scale(loss)
    if loop is not None:
        loop.before_backward()
    with torch.autocast(state.device.type, enabled=False):
        try:
            loss.backward()
        except RuntimeError as exc:  # DDP's exchange fails when a peer aborted the group
            peer = group.peer_failure(exc)
            if peer is None:
                raise
            raise peer from None
    if loop is not None:
        loop.after_backward(scale)


def optimizer_step(state: RankState, optimizer: torch.optim.Optimizer) -> bool:
    """Step at the last micro-batch of a step (scaler-aware), zero the grads, step schedules."""
    loop: RunningLoop | None = state.loop
    state.register("optimizers", optimizer)
    if loop is not None and loop.pending_optimizers:
        from dtwork.runtime.checkpoint.trial import take_pending

        with guards.restoring_state():
            take_pending(state, optimizer, loop.pending_optimizers)
    if loop is not None and not loop.is_last_micro:
        return False
    if len(state.cell_ranks) == state.world_size:  # its all-reduce would wait for ranks not running the cell
        guards.check_exchanged(optimizer, state.models)
    stepped = True
    if state.scaler is not None:
        scale = state.scaler.get_scale()
        state.scaler.step(optimizer)
        state.scaler.update()
        stepped = state.scaler.get_scale() >= scale  # a skipped step (inf/NaN gradients) backs it off
    else:
        optimizer.step()
    if loop is not None and not loop.memory_noted:  # gradients and optimizer state both exist now
        loop.memory_noted = True
        memory.note(state, loop.step)
    optimizer.zero_grad(set_to_none=True)
    if stepped:  # a step the scaler skipped moves no schedule
        for sched in state.schedulers:
            if getattr(sched, "optimizer", None) is optimizer:
                sched.step()
    if loop is not None:
        loop.stepped = stepped
    elif state.adaptive is not None:  # a hand loop over ctx.loader(adaptive=True): decide, set the LR
        state.adaptive.hand_step()
    return stepped


def log_scalars(state: RankState, scalars: dict[str, object]) -> None:
    """Inside ``ctx.steps``: averaged with the step's all-reduce. Outside: reduced at once."""
    step = cast("int | None", scalars.pop("step", None))  # the user's step, taken as given
    if not scalars:
        return
    if state.loop is not None:
        state.loop.add_log(scalars)
        return
    names = sorted(scalars)
    names_key(tuple(names))  # refuses a name no store could hold
    vec = torch.stack([_number(n, scalars[n]).to(state.device, torch.float64).reshape(()) for n in names])
    if state.config.optimizations.average_training_metrics and state.world_size > 1:
        state.require_all_ranks("ctx.log outside ctx.steps")
        vec = _agreed_mean(state, names, vec)
    if step is None:  # after a ctx.steps loop: at its last step (a test loss), else the next
        step = state.after_loop_step if state.after_loop_step is not None else state.log_step + 1
    state.log_step = step
    if state.rank == 0:
        state.publisher.record("log", state.log_step, dict(zip(names, vec.tolist(), strict=True)))
        state.publisher.flush()


def _number(name: str, value: Any) -> torch.Tensor:  # a user's value: float() tries it
    """A logged value as a 0-d tensor; anything but a real number or a one-element tensor is refused."""
    if isinstance(value, torch.Tensor):
        if value.numel() != 1 or value.is_complex():
            raise DtworkError(not_a_number(name, value))
        return value.detach()
    try:
        return torch.tensor(float(value), dtype=torch.float64)
    except (TypeError, ValueError, OverflowError):
        raise DtworkError(not_a_number(name, value)) from None


def _agreed_mean(state: RankState, names: list[str], vec: torch.Tensor) -> torch.Tensor:
    """The ranks' mean of ``vec``, sent with a hash of ``names`` in a vector of one length on
    every rank, so that ranks logging different names fail at once instead of hanging."""
    if len(names) > MAX_LOGGED:
        raise DtworkError(f"ctx.log takes at most {MAX_LOGGED} names per call; got {len(names)}")
    key = names_key(tuple(names))
    full = torch.zeros(StepHead.SIZE + MAX_LOGGED, dtype=torch.float64, device=state.device)
    full[StepHead.SIZE : StepHead.SIZE + len(names)] = vec / state.world_size  # before the sum: no overflow
    head = StepHead(names=key, names_sq=key * key)
    full[: StepHead.SIZE] = torch.tensor(head.pack(), dtype=torch.float64)
    dist.all_reduce(full)
    check_names(StepHead.unpack(full[: StepHead.SIZE].tolist()), state.log_step + 1, names, state.world_size)
    return full[StepHead.SIZE : StepHead.SIZE + len(names)]
