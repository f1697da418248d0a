"""One strategy object per kind of wrapped model: what the loop and the checkpoints ask of a model,
so that they never test its class themselves."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.fsdp import FSDPModule
from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["DDP", "FSDP", "Strategy", "run_strategy", "strategy_of"]

# torch's state dicts, as torch types them (tensors, numbers, nested dicts and lists): passed on
# between torch and a checkpoint, never read here
StateDict = dict[str, Any]
_WHOLE = StateDictOptions(full_state_dict=True)  # every rank read the whole state: each keeps its shards


class Strategy:
    """A model replicated on every rank (DDP, or a plain module on one rank)."""

    name = "ddp"
    sharded = False  # whether each rank holds only shards (its checkpoints are DCP folders)
    scaler_kind: type[torch.amp.GradScaler] = torch.amp.GradScaler

    def set_gradient_sync(self, model: torch.nn.Module, enabled: bool) -> None:
        """Exchange gradients at the next backward (the last micro-batch) or keep them local."""
        model.require_backward_grad_sync = enabled  # type: ignore[assignment]

    # -- checkpoints: a file holds the whole state of a replicated model, the DCP folder a shard's --

    def file_state(self, model: torch.nn.Module) -> StateDict | None:
        """What a checkpoint file holds of ``model``: its whole state, as the plain module's
        (None: each rank writes its shards through DCP instead)."""
        return _module(model).state_dict()

    def set_whole_state(self, model: torch.nn.Module, state: StateDict) -> None:
        """Load a whole state dict (a checkpoint file's) into ``model``."""
        _module(model).load_state_dict(state)

    def optimizer_file_state(self, optimizer: torch.optim.Optimizer) -> StateDict | None:
        """What a checkpoint file holds of an optimizer over this kind of model's parameters."""
        return optimizer.state_dict()

    def set_whole_optimizer_state(
        self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer, state: StateDict
    ) -> None:
        """Load a whole optimizer state into ``optimizer`` (over ``model``'s parameters, if known)."""
        optimizer.load_state_dict(state)  # moves the state to each parameter's device

    def shard_state(self, model: torch.nn.Module) -> StateDict:
        """This rank's part of ``model``'s state, as DCP writes and reads it."""
        return get_model_state_dict(model)

    def set_shard_state(self, model: torch.nn.Module, state: StateDict) -> None:
        set_model_state_dict(model, state)

    def optimizer_shard_state(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> StateDict:
        """This rank's part of the state of ``optimizer`` over ``model``, as DCP writes and reads it."""
        return get_optimizer_state_dict(model, optimizer)

    def set_optimizer_shard_state(
        self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, state: StateDict
    ) -> None:
        set_optimizer_state_dict(model, optimizer, state)


class _Sharded(Strategy):
    """A model sharded with FSDP2's ``fully_shard``."""

    name = "fsdp"
    sharded = True
    # each rank sees only its shards' infs: ShardedGradScaler agrees on them across ranks
    scaler_kind = ShardedGradScaler

    def set_gradient_sync(self, model: torch.nn.Module, enabled: bool) -> None:
        """Reduce-scatter at the last micro-batch only, as DDP's ``no_sync``."""
        model.set_requires_gradient_sync(enabled)  # type: ignore[operator]

    def file_state(self, model: torch.nn.Module) -> StateDict | None:
        return None  # its shards are in the checkpoint's DCP folder

    def set_whole_state(self, model: torch.nn.Module, state: StateDict) -> None:
        set_model_state_dict(model, state, options=_WHOLE)

    def optimizer_file_state(self, optimizer: torch.optim.Optimizer) -> StateDict | None:
        return None

    def set_whole_optimizer_state(
        self, model: torch.nn.Module | None, optimizer: torch.optim.Optimizer, state: StateDict
    ) -> None:
        assert model is not None  # a sharded optimizer state is set through its model
        set_optimizer_state_dict(model, optimizer, state, options=_WHOLE)


DDP = Strategy()
FSDP = _Sharded()


def _module(model: torch.nn.Module) -> torch.nn.Module:
    """The plain module inside a DDP wrapper (a plain module is its own)."""
    inner: torch.nn.Module = getattr(model, "module", model)
    return inner


def strategy_of(model: torch.nn.Module) -> Strategy:
    """The strategy ``model`` was wrapped with."""
    return FSDP if isinstance(model, FSDPModule) else DDP


def run_strategy(models: Iterable[torch.nn.Module]) -> Strategy:
    """The run's strategy: sharded when any of its models is."""
    return FSDP if any(strategy_of(m).sharded for m in models) else DDP
