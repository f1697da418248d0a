"""The memory a rank holds for training: its parameters, gradients and optimizer state.

Counted as the bytes of the tensors this rank holds (for FSDP's DTensors, the local shard), so
the same numbers on CPU and GPU show what sharding saved; on a GPU, the allocator's peak too.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.tensor import DTensor

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState

NAMES = (("param_bytes", "parameters"), ("grad_bytes", "gradients"), ("optimizer_bytes", "optimizer state"))


def tensor_bytes(t: torch.Tensor) -> int:
    """The bytes this rank holds for ``t``: its local shard for a DTensor."""
    local = t.to_local() if isinstance(t, DTensor) else t
    return local.numel() * local.element_size()


def held(
    models: Iterable[torch.nn.Module], optimizers: Iterable[torch.optim.Optimizer], device: torch.device
) -> dict[str, float]:
    """Bytes of the models' parameters and gradients and the optimizers' state on this rank;
    ``peak_bytes`` (the allocator's high-water mark) on a GPU."""
    params = {id(p): p for m in models for p in m.parameters()}
    values: dict[str, float] = {
        "param_bytes": sum(tensor_bytes(p) for p in params.values()),
        "grad_bytes": sum(tensor_bytes(p.grad) for p in params.values() if p.grad is not None),
        "optimizer_bytes": sum(
            tensor_bytes(v)
            for o in optimizers
            for s in o.state.values()
            for v in s.values()
            if isinstance(v, torch.Tensor)
        ),
    }
    if device.type == "cuda" and torch.cuda.is_initialized():
        values["peak_bytes"] = torch.cuda.max_memory_allocated(device)
    return values


def _size(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"


def describe(values: Mapping[str, float]) -> str:
    """ "parameters 1.0 MiB, gradients 1.0 MiB, optimizer state 2.0 MiB (GPU peak 3.1 GiB)"."""
    text = ", ".join(f"{label} {_size(values[key])}" for key, label in NAMES if key in values)
    return text + (f" (GPU peak {_size(values['peak_bytes'])})" if "peak_bytes" in values else "")


def note(state: RankState, step: int) -> dict[str, float]:
    """Record what this rank holds (an own "memory" event, with the values) at a loop's first
    optimizer step, when gradients and optimizer state both exist; rank 0 prints it under FSDP."""
    values = held(state.models, state.optimizers, state.device)
    text = describe(values)
    state.publisher.record("event", step, values, event="memory", message=f"rank {state.rank} holds {text}")
    if state.rank == 0 and any(isinstance(m, FSDPModule) for m in state.models):  # what sharding saved
        print(f"dtwork: memory on rank 0: {text}")
    return values
