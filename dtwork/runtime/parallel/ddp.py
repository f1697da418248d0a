"""``ctx.wrap``: the model on the rank's device, in DDP, with the configured bucket and hook."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dtwork.runtime.core import group
from dtwork.runtime.measure import handloop
from dtwork.runtime.measure.ddp_hooks import (
    MeasureState,
    attach_measure,
    count_forward,
    inner_hook,
    measure_hook,
    measure_state,
)

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState


def wrap_model(
    state: RankState, model: torch.nn.Module, *, gns: bool | None = None, **ddp_kwargs: Any
) -> DDP:
    """Move ``model`` to ``ctx.device`` and wrap it in DDP.

    The bucket size is ``optimizations.tensor_fusion_threshold`` (MB); the communication hook
    is the configured compression wrapped by the measuring hook (step timing, and with
    ``gns`` — or ``gns: true`` in the config — the norms for the gradient noise scale).
    """
    opt = state.config.optimizations
    model = model.to(state.device)
    ddp_kwargs.setdefault("bucket_cap_mb", opt.tensor_fusion_threshold)
    if state.device.type == "cuda":
        ddp_kwargs.setdefault("device_ids", [state.device.index or 0])
    wrapped = DDP(model, process_group=group.models_group(), **ddp_kwargs)
    comp = opt.gradient_compression
    hook, hook_state = inner_hook(comp.type, comp.rank, comp.start_iter)
    use_gns = state.config.gns.enabled if gns is None else bool(gns)
    measuring = MeasureState(
        inner=hook, inner_state=hook_state, gns=use_gns, rank=state.rank, world_size=state.world_size
    )
    wrapped.register_comm_hook(measuring, measure_hook)
    wrapped.register_forward_pre_hook(_counter(measuring))
    wrapped.register_forward_pre_hook(_follow_group)
    attach_measure(wrapped, measuring)
    state.gns, state.gns_state = None, None  # a new wrap starts a new estimate
    handloop.attach(state)
    wrapped._dtwork_kwargs = ddp_kwargs  # type: ignore[assignment]
    return wrapped


def rebind(model: torch.nn.Module) -> None:
    """Rebuild a wrapped model's DDP state on the current (new) default group, in place, so that
    the cell's variables keep working; rank 0's weights are broadcast as at the first wrap."""
    measuring = measure_state(model)
    if not isinstance(model, DDP) or measuring is None:
        return
    fresh = DDP(model.module, process_group=group.models_group(), **getattr(model, "_dtwork_kwargs", {}))
    measuring.reset()
    fresh.register_comm_hook(measuring, measure_hook)
    fresh.register_forward_pre_hook(_counter(measuring))
    fresh.register_forward_pre_hook(_follow_group)
    model.__dict__.update(fresh.__dict__)


def _follow_group(module: torch.nn.Module, args: tuple[object, ...]) -> None:
    """After the group was rebuilt (a failed cell), rebind at the next forward: every rank runs it
    at the same point, whatever models each rank still holds."""
    if isinstance(module, DDP) and module.process_group is not (group.models_group() or dist.group.WORLD):
        rebind(module)


def _counter(state: MeasureState) -> Callable[[torch.nn.Module, tuple[object, ...]], None]:
    return lambda _module, args: count_forward(state, args)
