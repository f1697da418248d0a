"""Checkpoints of a trial: models, optimizers, schedulers, scaler, loop position and RNG.

What a checkpoint holds and how it is put back; where it lives is ``folders``, how its file is
written and read ``files``, a sharded model's part ``dcp``. Each model and optimizer is saved and
set as its strategy says (``parallel.strategy``). Every rank reads the same file on resume (a
shared file system across hosts); a newest checkpoint that cannot be read (torn by a crash or a
full disk) is skipped, with a warning, for the one before. ``load_state_dict`` moves model and
optimizer state to the parameters' device, and the RNG states, which torch only accepts as CPU
tensors, stay there. The RNG states of every rank are gathered into the file, so a resumed run
continues bitwise-identically on CPU.

A run with an FSDP-sharded model checkpoints to a folder, ``step-XXXXXXXX.dcp``, instead: each
rank writes its own shards with torch.distributed.checkpoint (``dcp``) and rank 0 the rest of
the payload as ``extra.pt`` (its models and optimizers ``None`` where sharded), in a temporary
folder renamed once every rank is done. It resumes on any world size (DCP reshards), and
``export_checkpoint`` makes it one ``.pt`` file with the whole state.
"""

from __future__ import annotations

import os
import random
import shutil
import tempfile
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist

from dtwork.errors import DtworkError, DtworkWarning
from dtwork.runtime.checkpoint import dcp, files, folders
from dtwork.runtime.checkpoint.files import Payload, RngState, UnreadableCheckpoint
from dtwork.runtime.checkpoint.folders import DCP, check_owner
from dtwork.runtime.parallel.strategy import DDP, StateDict, strategy_of

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState

__all__ = [
    "PENDING",
    "check_owner",  # the loop asks it before training
    "export_checkpoint",
    "load",
    "restore_rng",
    "resume_from",
    "save",
    "take_pending",
    "untaken",
    "Waiting",
]

PENDING = "pending_optimizers"  # the loop state's key: optimizer states no known optimizer took


# -- RNG -------------------------------------------------------------------------------------


def _rng_state(device: torch.device) -> RngState:
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)  # the legacy (MT19937) form: a tuple
    state: RngState = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "gauss": float(gauss),
        },
    }
    if device.type == "cuda" and torch.cuda.is_initialized():
        index = device.index if device.index is not None else torch.cuda.current_device()
        state["cuda"] = {index: torch.cuda.get_rng_state(index)}
    return state


def restore_rng(state: RngState) -> None:
    """Apply a rank's saved RNG states; CUDA ones per device index, skipped where absent."""
    torch.set_rng_state(state["torch"].cpu())
    python = state["python"]
    random.setstate((python[0], tuple(python[1]), python[2]))
    n = state["numpy"]
    keys = n["keys"].cpu().numpy().astype(np.uint32)
    np.random.set_state((n["kind"], keys, n["pos"], n["has_gauss"], n["gauss"]))
    cuda = state.get("cuda")
    if cuda is None or not torch.cuda.is_available():
        return  # a GPU checkpoint resumed without CUDA: only the CPU generators matter
    for index, rng in cuda.items():
        if int(index) < torch.cuda.device_count():
            torch.cuda.set_rng_state(rng.cpu(), int(index))


# -- save ------------------------------------------------------------------------------------


def _optimizer_model(state: RankState, optimizer: torch.optim.Optimizer) -> torch.nn.Module | None:
    """The model whose strategy saves and sets ``optimizer``'s state: a sharded one it steps, else none."""
    return dcp.sharded_owner(state, optimizer)


def save(state: RankState, loop_state: Mapping[str, object]) -> Path | None:
    """Write a checkpoint of everything the trial registered on ``ctx``; return its path (rank 0)."""
    sharded = dcp.is_sharded_run(state)
    rngs: list[RngState | None] = [None] * state.world_size
    dist.all_gather_object(rngs, _rng_state(state.device))
    path = folders.run_directory(state) / f"step-{loop_state['step']:08d}{DCP if sharded else '.pt'}"
    payload: dict[str, object] = {}
    if state.rank == 0:
        optimizers = []
        for o in state.run_optimizers():
            owner = _optimizer_model(state, o)
            optimizers.append((DDP if owner is None else strategy_of(owner)).optimizer_file_state(o))
        payload = {
            "format": files.FORMAT,
            "run": folders.run_name(state),
            "loop": loop_state,
            "rng": rngs,
            "models": [strategy_of(m).file_state(m) for m in state.run_modules()],
            "optimizers": optimizers,
            "schedulers": [s.state_dict() for s in state.run_schedulers()],
            "scaler": state.scaler.state_dict() if state.scaler is not None else None,
            "gns": state.gns_state.state_dict() if state.gns_state is not None else None,
            "world_size": state.world_size,
        }
        folders.private_folder(path.parent)
        folders.claim(state, path.parent)
    if sharded:
        _save_sharded(state, path, payload)
    elif state.rank == 0:
        files.write(payload, path)
    if state.rank == 0:
        folders.after_the_others(path)
        folders.prune(path.parent, state.config.checkpoint.keep)
    dist.barrier()
    return path if state.rank == 0 else None


def _save_sharded(state: RankState, path: Path, payload: Mapping[str, object]) -> None:
    """Write the ``.dcp`` folder ``path`` under a temporary name, renamed once every rank's shards
    and rank 0's ``extra.pt`` are on disk: a crash leaves no folder or a whole one."""
    tmp = path.with_name(f".{path.name}.tmp")
    if state.rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)  # a crashed earlier attempt at this step
        tmp.mkdir(mode=0o700)
    dist.barrier()
    try:
        dcp.save(state, tmp)
        if state.rank == 0:
            files.write(payload, tmp / files.EXTRA)
    except BaseException:
        if state.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()
    if state.rank == 0:
        shutil.rmtree(path, ignore_errors=True)  # this step written again (a rerun cell)
        os.replace(tmp, path)
        files.fsync_folder(path.parent)


# -- load ------------------------------------------------------------------------------------


def resume_from(state: RankState, resume: object) -> tuple[Path, dict[str, Any]] | None:
    """Load what ``resume=`` names (see ``folders.find``) and return its path and loop state; None
    for ``True`` when this run has no checkpoint yet. A newest checkpoint that cannot be read is
    skipped with a warning naming it, for the one before (a crash or a full disk mid-write)."""
    found = folders.candidates(state, resume)
    for i, path in enumerate(reversed(found)):
        try:
            return path, load(state, path)
        except UnreadableCheckpoint as exc:
            if i == len(found) - 1:
                raise
            if state.rank == 0:
                warnings.warn(
                    f"{exc}; resuming from the one before, {found[-2 - i]}", DtworkWarning, stacklevel=2
                )
    return None


def load(state: RankState, path: Path) -> dict[str, Any]:
    """Restore models, optimizers, schedulers, scaler and GNS state; return the loop state (the
    loop's own dict: its position, ``rng`` and ``PENDING``).

    The RNG state is returned (not applied) so the loop applies it once the data iterator is
    positioned exactly where the checkpoint was taken.
    """
    sharded = path.suffix == DCP and path.is_dir()
    payload = files.read_sharded(path) if sharded else files.read(path)
    written = payload["world_size"]
    if written != state.world_size and not sharded:
        raise DtworkError(
            f"checkpoint {path} was written by {written} ranks, this cluster has {state.world_size}: "
            f"resume on the same world size"
        )
    if written != state.world_size and state.rank == 0:
        warnings.warn(
            f"checkpoint {path} was written by {written} ranks and resumes on {state.world_size}: "
            f"weights and optimizer state reshard exactly; random streams and a sampler's split differ",
            DtworkWarning,
            stacklevel=2,
        )
    if sharded:
        try:
            dcp.load(state, path)
        except dcp.ShardsUnreadable as exc:
            raise UnreadableCheckpoint(str(exc)) from None
    for m, sd in zip(state.run_modules(), payload["models"], strict=False):
        if sd is not None:  # None: sharded, loaded from the DCP folder
            strategy_of(m).set_whole_state(m, sd)
    known = state.run_optimizers()
    for o, osd in zip(known, payload["optimizers"], strict=False):
        owner = _optimizer_model(state, o)
        if osd is not None:
            (DDP if owner is None else strategy_of(owner)).set_whole_optimizer_state(owner, o, osd)
    for s, ssd in zip(state.run_schedulers(), payload["schedulers"], strict=False):
        s.load_state_dict(ssd)
    if state.scaler is not None and payload["scaler"] is not None:
        state.scaler.load_state_dict(payload["scaler"])
    gns = payload.get("gns")
    if state.gns_state is not None and gns:
        state.gns_state.load_state_dict(gns)
    # a plain torch.optim optimizer made in the resuming cell is known from its first ctx.step:
    # the loop hands it the state then (``PENDING``), before its first update
    pending = [
        Waiting(path, i, sd)
        for i, sd in enumerate(payload["optimizers"])
        if i >= len(known) and (sd is not None or sharded)
    ]
    return {**payload["loop"], "rng": payload["rng"][state.rank % written], PENDING: pending}


@dataclass(frozen=True)
class Waiting:
    """A checkpoint's optimizer state that no optimizer known at the load took: the next optimizer
    of the run that a ``ctx.step`` meets with no state of its own takes it, before its update."""

    path: Path  # the checkpoint
    index: int  # the optimizer's place among the run's when saved (its key in a DCP folder)
    whole: StateDict | None  # the whole state, from the file; None: its shards, in the DCP folder


def take_pending(state: RankState, optimizer: torch.optim.Optimizer, pending: list[Waiting]) -> bool:
    """Load the next optimizer state a resume could not place into ``optimizer`` at its first
    ``ctx.step``, when it is one of the run's and has taken no step yet; return whether it did.
    The same rule for a ``.pt`` file and a ``.dcp`` folder (read then, by every rank at once)."""
    if not pending or optimizer.state or not any(o is optimizer for o in state.run_optimizers()):
        return False
    waiting = pending.pop(0)
    if waiting.whole is not None:
        owner = _optimizer_model(state, optimizer)
        (DDP if owner is None else strategy_of(owner)).set_whole_optimizer_state(
            owner, optimizer, waiting.whole
        )
    else:
        model = dcp.model_of(state, optimizer)
        assert model is not None  # a run's optimizer steps a run's model
        dcp.load_optimizer(waiting.path, waiting.index, model, optimizer)
    if state.rank == 0:
        print(
            f"dtwork: restored the checkpoint's optimizer state into {type(optimizer).__name__} "
            f"at its first ctx.step (from {waiting.path.name})"
        )
    return True


def untaken(pending: list[Waiting]) -> str:
    """The line naming the optimizer states a resume left untaken when the loop ends."""
    where = pending[0].path
    which = ", ".join(f"#{w.index}" for w in pending)
    return (
        f"dtwork: the resumed checkpoint {where} held {len(pending)} optimizer state(s) ({which}) that "
        "no optimizer of this run took, so those optimizers started fresh: step each optimizer with "
        "ctx.step(opt) (or make it with ctx.optimizer) so its state is restored"
    )


def export_checkpoint(source: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write a ``step-*.dcp`` checkpoint folder (or a run folder's newest) as one ``.pt`` file.

    The file holds the whole models and optimizers, in the format of an unsharded run's
    checkpoint: ``torch.load(out, weights_only=True)["models"][0]`` loads into the plain model,
    ``resume=out`` resumes a run of the same world size. Any process; no process group needed.
    """
    src = Path(source).expanduser()
    if src.is_dir() and src.suffix != DCP:
        found = [p for p in folders.checkpoints(src) if p.suffix == DCP]
        if not found:
            raise DtworkError(
                f"no step-*.dcp checkpoint in {src}: pass a .dcp folder or a run folder holding one"
            )
        src = found[-1]
    if not src.is_dir():
        raise DtworkError(
            f"{src} is not a step-*.dcp checkpoint folder: pass one, or a run folder holding one"
        )
    payload: Payload = files.read_sharded(src)
    with tempfile.TemporaryDirectory() as scratch:
        whole = dcp.whole(src, Path(scratch) / "whole.pt")
    for i, sd in whole.get("models", {}).items():
        payload["models"][i] = sd
    for i, sd in whole.get("optimizers", {}).items():
        payload["optimizers"][i] = sd
    target = Path(out).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    files.write(payload, target)
    return target
