"""Checkpoints of a trial: models, optimizers, schedulers, scaler, loop position and RNG.

Rank 0 writes ``<directory>/step-XXXXXXXX.pt`` (atomically: a temp file then rename) and
keeps the newest K; every rank reads the same file on resume (a shared file system across
hosts). The RNG states of every rank are gathered into it, so a resumed run continues
bitwise-identically on CPU.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist


def directory(ctx: Any) -> Path:
    return Path(ctx.config.checkpoint.directory)


def _rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state()
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state(state["cuda"])


def _module(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def save(ctx: Any, loop_state: dict[str, Any]) -> Path | None:
    """Write a checkpoint of everything the trial registered on ``ctx``; return its path (rank 0)."""
    rngs: list[Any] = [None] * ctx.world_size
    dist.all_gather_object(rngs, _rng_state())
    path = directory(ctx) / f"step-{loop_state['step']:08d}.pt"
    if ctx.rank == 0:
        payload = {
            "loop": loop_state,
            "rng": rngs,
            "models": [_module(m).state_dict() for m in ctx.models],
            "optimizers": [o.state_dict() for o in ctx.optimizers],
            "schedulers": [s.state_dict() for s in ctx.schedulers],
            "scaler": ctx._scaler.state_dict() if ctx._scaler is not None else None,
            "gns": ctx.gns_state.state_dict() if ctx.gns_state is not None else None,
            "world_size": ctx.world_size,
        }
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        torch.save(payload, tmp)
        os.replace(tmp, path)
        _prune(path.parent, ctx.config.checkpoint.keep)
    dist.barrier()
    return path if ctx.rank == 0 else None


def _prune(folder: Path, keep: int) -> None:
    for old in sorted(folder.glob("step-*.pt"))[:-keep]:
        old.unlink(missing_ok=True)


def latest(ctx: Any) -> Path | None:
    found = sorted(directory(ctx).glob("step-*.pt"))
    return found[-1] if found else None


def load(ctx: Any, path: Path) -> dict[str, Any]:
    """Restore models, optimizers, schedulers, scaler and GNS state; return the loop state.

    The RNG state is returned (not applied) so the loop applies it once the data iterator is
    positioned exactly where the checkpoint was taken.
    """
    payload = torch.load(path, map_location=ctx.device, weights_only=False)
    if payload["world_size"] != ctx.world_size:
        from dtwork.errors import DtworkError

        raise DtworkError(
            f"checkpoint {path} was written by {payload['world_size']} ranks, this cluster has {ctx.world_size}: "
            f"resume on the same world size"
        )
    for m, sd in zip(ctx.models, payload["models"], strict=False):
        _module(m).load_state_dict(sd)
    for o, sd in zip(ctx.optimizers, payload["optimizers"], strict=False):
        o.load_state_dict(sd)
    for s, sd in zip(ctx.schedulers, payload["schedulers"], strict=False):
        s.load_state_dict(sd)
    if ctx._scaler is not None and payload["scaler"] is not None:
        ctx._scaler.load_state_dict(payload["scaler"])
    if ctx.gns_state is not None and payload.get("gns"):
        ctx.gns_state.load_state_dict(payload["gns"])
    return {**payload["loop"], "rng": payload["rng"][ctx.rank]}


def restore_rng(state: dict[str, Any]) -> None:
    _set_rng_state(state)
