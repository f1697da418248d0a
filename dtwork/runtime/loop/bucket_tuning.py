"""``optimizations.auto_tune_tensor_fusion``: sweep DDP bucket sizes once, before the first training step.

``ctx.wrap`` calls :func:`tune_before_wrap` with the model it is about to wrap. On a copy of the model
(the user's weights and gradients stay untouched) every rank times forward and backward passes of a
synthetic batch under DDP at each bucket size; the slowest rank's mean step time decides, so every
rank picks the same size. The fastest becomes ``optimizations.tensor_fusion_threshold`` of ``ctx.config``
and the choice is published as an event. It runs again only after a new config is loaded.
"""

from __future__ import annotations

import copy
import time
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dtwork.runtime.loop.data import input_shape
from dtwork.shared.timing import synchronize

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState

SIZES_MB = (1.0, 4.0, 16.0, 25.0, 64.0)
WARMUP = 2
STEPS = 5


def tune_before_wrap(state: RankState, model: torch.nn.Module) -> float | None:
    """Tune the bucket size for ``model`` when the config asks and this config was not tuned yet;
    return the chosen size in MB (None when nothing ran)."""
    cfg = state.config
    if not cfg.optimizations.auto_tune_tensor_fusion or state.fusion_tuned_for is cfg:
        return None
    shape = input_shape(model)
    if shape is None:
        if state.rank == 0:
            print(
                "dtwork: auto_tune_tensor_fusion: the model's input shape is unknown (its first layer is no Linear): "
                "run %dtrain tune MODEL_EXPR --shape ... instead"
            )
        state.fusion_tuned_for = cfg
        return None
    times = {mb: _time(state, model, shape, mb) for mb in SIZES_MB}
    best = min(times, key=lambda mb: times[mb])
    state.config = cfg.with_path("optimizations.tensor_fusion_threshold", best)
    state.fusion_tuned_for = state.config
    text = ", ".join(f"{mb:g} MB {t * 1e3:.1f} ms" for mb, t in times.items())
    if state.rank == 0:  # one event for the run, not one per rank
        state.publisher.record(
            "event", 0, {}, event="tensor_fusion", message=f"auto-tuned bucket size {best:g} MB ({text})"
        )
    return best


def _time(state: RankState, model: torch.nn.Module, shape: tuple[int, ...], mb: float) -> float:
    """The slowest rank's mean seconds per forward+backward at bucket size ``mb``."""
    device = state.device
    replica = copy.deepcopy(model).to(device)
    kwargs: dict[str, Any] = {"bucket_cap_mb": mb}
    if device.type == "cuda":
        kwargs["device_ids"] = [device.index or 0]
    ddp = DDP(replica, **kwargs)
    gen = torch.Generator().manual_seed(state.rank)
    x = torch.randn((state.batch_size(), *shape), generator=gen).to(device)
    total = 0.0
    for i in range(WARMUP + STEPS):
        t0 = time.perf_counter()
        ddp(x).float().mean().backward()
        synchronize(device)
        if i >= WARMUP:
            total += time.perf_counter() - t0
    slowest = torch.tensor([total / STEPS], dtype=torch.float64, device=device)
    if state.world_size > 1:
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return float(slowest.item())
