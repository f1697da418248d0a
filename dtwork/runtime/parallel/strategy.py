"""One strategy object per kind of wrapped model: what the loop and the checkpoints ask of a model,
so that they never test its class themselves."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["DDP", "FSDP", "Strategy", "run_strategy", "strategy_of"]


class Strategy:
    """A model replicated on every rank (DDP, or a plain module on one rank)."""

    name = "ddp"
    sharded = False  # whether each rank holds only shards (its checkpoints are DCP folders)
    scaler_kind: type[torch.amp.GradScaler] = torch.amp.GradScaler

    def set_gradient_sync(self, model: torch.nn.Module, enabled: bool) -> None:
        """Exchange gradients at the next backward (the last micro-batch) or keep them local."""
        model.require_backward_grad_sync = enabled  # type: ignore[assignment]


class _Sharded(Strategy):
    """A model sharded with FSDP2's ``fully_shard``."""

    name = "fsdp"
    sharded = True
    # each rank sees only its shards' infs: ShardedGradScaler agrees on them across ranks
    scaler_kind = ShardedGradScaler

    def set_gradient_sync(self, model: torch.nn.Module, enabled: bool) -> None:
        """Reduce-scatter at the last micro-batch only, as DDP's ``no_sync``."""
        model.set_requires_gradient_sync(enabled)  # type: ignore[operator]


DDP = Strategy()
FSDP = _Sharded()


def strategy_of(model: torch.nn.Module) -> Strategy:
    """The strategy ``model`` was wrapped with."""
    return FSDP if isinstance(model, FSDPModule) else DDP


def run_strategy(models: Iterable[torch.nn.Module]) -> Strategy:
    """The run's strategy: sharded when any of its models is."""
    return FSDP if any(strategy_of(m).sharded for m in models) else DDP
