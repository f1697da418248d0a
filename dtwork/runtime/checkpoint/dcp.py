"""The shards of FSDP models and their optimizers, through ``torch.distributed.checkpoint`` (DCP).

``checkpoint`` writes a run with a sharded model as a folder, ``step-XXXXXXXX.dcp``: each rank
writes its own shards there (``save``; no rank gathers the whole state) and DCP reshards them
on ``load``, so a checkpoint written by 2 ranks resumes on 1 or on 4. ``dcp.async_save`` is not
used: on the default gloo group it crashes or hangs.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint import format_utils
from torch.distributed.checkpoint.api import CheckpointException

from dtwork.errors import DtworkError
from dtwork.runtime.parallel.strategy import StateDict, strategy_of

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState

METADATA = ".metadata"  # DCP's index, written by its coordinator once every rank's shards are


class ShardsUnreadable(DtworkError):
    """DCP could not read a folder's shards (on every rank: DCP gathers the failures)."""


def is_sharded_run(state: RankState) -> bool:
    """Whether some model registered on ``ctx`` is FSDP-sharded (its checkpoints are DCP folders)."""
    return any(strategy_of(m).sharded for m in state.run_modules())


def sharded_owner(state: RankState, optimizer: torch.optim.Optimizer) -> torch.nn.Module | None:
    """The FSDP model whose parameters ``optimizer`` steps, if any."""
    mine = {id(p) for g in optimizer.param_groups for p in g["params"]}
    sharded = [m for m in state.run_modules() if strategy_of(m).sharded]
    return next((m for m in sharded if any(id(p) in mine for p in m.parameters())), None)


def _states(state: RankState) -> dict[str, dict[str, StateDict]]:
    """This rank's shards of the FSDP models and their optimizers, keyed by registration index."""
    models = {
        str(i): strategy_of(m).shard_state(m)
        for i, m in enumerate(state.run_modules())
        if strategy_of(m).sharded
    }
    optims = {
        str(i): strategy_of(owner).optimizer_shard_state(owner, o)
        for i, o in enumerate(state.run_optimizers())
        if (owner := sharded_owner(state, o)) is not None
    }
    return {"models": models, "optimizers": optims}


def save(state: RankState, folder: Path) -> None:
    """Every rank writes its shards into ``folder``; returns once DCP's index is written."""
    dcp.save(_states(state), checkpoint_id=folder)


def _read(target: dict[str, dict[str, StateDict]], folder: Path) -> None:
    """Fill ``target`` (this rank's shards, as DCP keys them) from ``folder``, resharded."""
    try:
        dcp.load(target, checkpoint_id=folder)
    except (Exception, CheckpointException) as exc:  # a missing or torn shard: every rank raises
        raise ShardsUnreadable(
            f"checkpoint {folder} cannot be read ({_first_line(exc)}): it is damaged"
        ) from None


def load(state: RankState, folder: Path) -> None:
    """Read ``folder``'s shards resharded onto this world and set them on the models and optimizers."""
    target = _states(state)
    _read(target, folder)
    for key, sd in target["models"].items():
        model = state.run_modules()[int(key)]
        strategy_of(model).set_shard_state(model, sd)
    for key, sd in target["optimizers"].items():
        o = state.run_optimizers()[int(key)]
        owner = sharded_owner(state, o)
        assert owner is not None  # _states keys only optimizers that have one
        strategy_of(owner).set_optimizer_shard_state(owner, o, sd)


def model_of(state: RankState, optimizer: torch.optim.Optimizer) -> torch.nn.Module | None:
    """The run's model whose parameters ``optimizer`` steps: the FSDP one if any, else any."""
    mine = {id(p) for g in optimizer.param_groups for p in g["params"]}
    found = [m for m in state.run_modules() if any(id(p) in mine for p in m.parameters())]
    return sharded_owner(state, optimizer) or next(iter(found), None)


def load_optimizer(
    folder: Path, index: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer
) -> None:
    """Read the shards of the optimizer saved at ``index`` from ``folder`` into ``optimizer`` over
    ``model``, an optimizer made after the load, at its first step; a collective (every rank).

    DCP reads into a state of the right shapes: torch makes an empty optimizer's state with a step
    of zero gradients at lr 0, but only while no parameter has a gradient, so the gradients of the
    step under way are set aside meanwhile and put back after."""
    params = [p for g in optimizer.param_groups for p in g["params"]]
    grads = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        strategy = strategy_of(model)
        key = str(index)
        target = {"optimizers": {key: strategy.optimizer_shard_state(model, optimizer)}}
        _read(target, folder)
        strategy.set_optimizer_shard_state(model, optimizer, target["optimizers"][key])
    finally:
        for p, g in zip(params, grads, strict=True):
            p.grad = g


def _first_line(exc: BaseException) -> str:
    """The first line of a rank's own failure (a CheckpointException wraps one per failed rank)."""
    if isinstance(exc, CheckpointException) and exc.failures:
        rank, (inner, _trace) = min(exc.failures.items())
        return f"rank {rank}: {_first_line(inner)}"
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def whole(folder: Path, scratch: Path) -> dict[str, dict[int, StateDict]]:
    """The unsharded models and optimizers of a DCP folder, by index; in any process, no group."""
    format_utils.dcp_to_torch_save(folder, scratch)
    found = torch.load(scratch, map_location="cpu", weights_only=True)
    return {kind: {int(k): sd for k, sd in found.get(kind, {}).items()} for kind in ("models", "optimizers")}
