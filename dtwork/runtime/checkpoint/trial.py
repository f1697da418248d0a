"""Checkpoints of a trial: models, optimizers, schedulers, scaler, loop position and RNG.

Each run keeps its own folder, ``<checkpoint directory>/<run>/step-XXXXXXXX.pt``, where
``<run>`` is ``run-<id>`` for a run of the kernel's store (``ctx.run_id``), else the config's
name (or ``default``). A loop that starts a new run mid-cell (a new ``ctx.wrap`` in a cell after
the run trained) writes to ``pending-<token>-<n>`` until the next cell's start, when rank 0
renames it to ``run-<id>`` (``adopt``); a kernel that died before then leaves it under that name
(in the run's segment data), and ``resume="pending-<token>-<n>"`` loads it. Rank 0 writes a checkpoint durably (``write``: a temp file, fsynced,
renamed, the folder fsynced; owner-only, as the files hold the whole training state) and
keeps the newest K of its own run; other runs' folders are never touched. Every rank reads
the same file on resume (a shared file system across hosts); a newest checkpoint that cannot
be read (torn by a crash or a full disk) is skipped, with a warning, for the one before.

A run folder names its owner, the run and the kernel's store, in ``run.json``: two notebooks
whose stores both have a run 7 and share one checkpoint directory (an absolute ``host_path``)
would otherwise prune and resume each other's checkpoints; a run whose folder another store's
run owns is refused before it trains. Folders without ``run.json`` belong to anyone.

A resume loads the newest checkpoint of the same run, or the one named: a ``step-*.pt`` file,
a run folder, or a run (``7``, ``"run-7"``, a folder name under the checkpoint directory).
Files load with ``weights_only=True``: a payload holds only tensors and plain containers (the
numpy RNG state is stored as a tensor), so no code runs from a checkpoint. Everything loads
onto the CPU first; ``load_state_dict`` moves model and optimizer state to the parameters'
device, and the RNG states, which torch only accepts as CPU tensors, stay there. The RNG
states of every rank are gathered into the file, so a resumed run continues
bitwise-identically on CPU.

A run with an FSDP-sharded model checkpoints to a folder, ``step-XXXXXXXX.dcp``, instead: each
rank writes its own shards with torch.distributed.checkpoint (``dcp``) and rank 0 the rest of
the payload as ``extra.pt`` (its models and optimizers ``None`` where sharded), in a temporary
folder renamed once every rank is done. It resumes on any world size (DCP reshards), and
``export_checkpoint`` makes it one ``.pt`` file with the whole state.
"""

from __future__ import annotations

import errno
import json
import os
import pickle
import random
import re
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    set_model_state_dict,
    set_optimizer_state_dict,
)

from dtwork.errors import DtworkError, DtworkWarning
from dtwork.runtime.checkpoint import dcp
from dtwork.runtime.parallel.strategy import strategy_of

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState

STEP_FILE = re.compile(r"step-(\d+)\.(?:pt|dcp)")  # a file, or a folder of DCP shards
DCP = ".dcp"
PENDING = "pending_optimizers"  # the loop state's key: optimizer states no known optimizer took
EXTRA = "extra.pt"  # in a .dcp folder: the payload less the sharded models and optimizers
RUN_REF = re.compile(r"(?:run-)?(\d+)")
FORMAT = 2  # payload layout; 1 had the numpy RNG state as an ndarray and no "run"
OWNER = "run.json"  # in a run folder: the run and the store it belongs to


def directory(state: RankState) -> Path:
    """The checkpoint directory of the config (holding one folder per run)."""
    return Path(state.config.checkpoint.directory)


def run_name(state: RankState) -> str:
    """This run's folder name: ``run-<id>`` when the kernel named the run, else the config's name
    (a pending folder while a run begun mid-cell has no id on the ranks yet)."""
    if state.run_folder is not None:
        return state.run_folder
    run_id = state.run_id
    if run_id is not None:
        return f"run-{int(run_id)}"
    name = re.sub(r"[^A-Za-z0-9_.-]+", "-", state.config.name or "").strip(".-")
    return name or "default"


def run_directory(state: RankState) -> Path:
    return directory(state) / run_name(state)


def check_owner(state: RankState, folder: Path | None = None) -> None:
    """Refuse a run folder (this run's, by default) that a run of another store owns."""
    store = state.run_store
    if store is None:  # no kernel store (a script of its own): every folder is its to use
        return
    folder = run_directory(state) if folder is None else folder
    try:
        owner = json.loads((folder / OWNER).read_text())
    except (OSError, ValueError):
        return  # no owner yet (or unreadable): anyone's
    if isinstance(owner, dict) and owner.get("store") not in (None, store):
        raise DtworkError(
            f"checkpoint folder {folder} holds run {owner.get('run')} of the run store {owner['store']}, "
            f"not of this one ({store}): give this experiment a checkpoint directory of its own "
            f"(checkpoint.directory or checkpoint_storage.host_path in its config)"
        )


def _claim(state: RankState, folder: Path) -> None:
    """Write the folder's owner (rank 0, at its first checkpoint) when the kernel named a store."""
    store = state.run_store
    if store is None or (folder / OWNER).exists():
        return
    tmp = folder / f".{OWNER}.tmp"
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(json.dumps({"run": run_name(state), "store": store}))
    os.replace(tmp, folder / OWNER)


def adopt(state: RankState, folder: str, run_id: int) -> None:
    """Rename a run's pending folder to ``run-<id>`` and its owner file with it (rank 0; the
    directory is shared across hosts). A folder already there is kept, and the pending one too."""
    src, dst = directory(state) / folder, directory(state) / f"run-{int(run_id)}"
    if state.rank != 0 or not src.is_dir():
        return  # its loop took no checkpoint
    if dst.exists():
        warnings.warn(
            f"run {run_id}'s checkpoints stay in {src}: {dst} exists already; resume={folder!r} loads them",
            DtworkWarning,
            stacklevel=2,
        )
        return
    os.rename(src, dst)
    if state.run_store is not None and (dst / OWNER).exists():
        tmp = dst / f".{OWNER}.tmp"
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
            f.write(json.dumps({"run": dst.name, "store": state.run_store}))
        os.replace(tmp, dst / OWNER)
    _fsync_folder(directory(state))


def private_folder(folder: Path) -> None:
    """Create the run folder (and the checkpoint directory) owner-only where this call creates them."""
    for d in (folder.parent, folder):
        if not d.is_dir():
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o700)


# -- RNG -------------------------------------------------------------------------------------


def _rng_state(device: torch.device) -> dict[str, Any]:
    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    assert isinstance(keys, np.ndarray)  # the legacy (MT19937) form: a tuple
    state: dict[str, Any] = {
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


def restore_rng(state: dict[str, Any]) -> None:
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


def _module(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)


def save(state: RankState, loop_state: dict[str, Any]) -> Path | None:
    """Write a checkpoint of everything the trial registered on ``ctx``; return its path (rank 0)."""
    sharded = dcp.is_sharded_run(state)
    rngs: list[Any] = [None] * state.world_size
    dist.all_gather_object(rngs, _rng_state(state.device))
    path = run_directory(state) / f"step-{loop_state['step']:08d}{DCP if sharded else '.pt'}"
    payload: dict[str, Any] = {}
    if state.rank == 0:
        payload = {
            "format": FORMAT,
            "run": run_name(state),
            "loop": loop_state,
            "rng": rngs,
            "models": [
                None if strategy_of(m).sharded else _module(m).state_dict() for m in state.run_modules()
            ],
            "optimizers": [
                None if dcp.sharded_owner(state, o) is not None else o.state_dict()
                for o in state.run_objects("optimizers")
            ],
            "schedulers": [s.state_dict() for s in state.run_objects("schedulers")],
            "scaler": state.scaler.state_dict() if state.scaler is not None else None,
            "gns": state.gns_state.state_dict() if state.gns_state is not None else None,
            "world_size": state.world_size,
        }
        private_folder(path.parent)
        _claim(state, path.parent)
    if sharded:
        _save_sharded(state, path, payload)
    elif state.rank == 0:
        write(payload, path)
    if state.rank == 0:
        _after_the_others(path)
        prune(path.parent, state.config.checkpoint.keep)
    dist.barrier()
    return path if state.rank == 0 else None


def _save_sharded(state: RankState, path: Path, payload: dict[str, Any]) -> None:
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
            write(payload, tmp / EXTRA)
    except BaseException:
        if state.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)
        raise
    dist.barrier()
    if state.rank == 0:
        shutil.rmtree(path, ignore_errors=True)  # this step written again (a rerun cell)
        os.replace(tmp, path)
        _fsync_folder(path.parent)


def write(payload: dict[str, Any], path: Path) -> None:
    """Write ``payload`` to ``path`` so that a crash leaves the old file or the whole new one: a
    0600 temp file written, flushed and fsynced, renamed over ``path``, then the folder fsynced
    (which makes the rename itself durable). On failure the temp file is removed."""
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            torch.save(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)  # a partial file would only take the space a retry needs
        if isinstance(exc, Exception):
            raise _write_error(path, payload, exc) from exc
        raise
    _fsync_folder(path.parent)


def _fsync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # some file systems (network, FUSE) cannot sync a folder: the data is
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _tensor_bytes(value: Any) -> int:
    """The bytes of the tensors in a payload: about the size its file needs."""
    if isinstance(value, torch.Tensor):
        return value.nelement() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _write_error(path: Path, payload: dict[str, Any], exc: Exception) -> DtworkError:
    """One line for a checkpoint that could not be written; a full disk says so with the numbers."""
    needed = _tensor_bytes(payload)
    try:
        free = shutil.disk_usage(path.parent).free
    except OSError:
        free = None
    chain: BaseException | None = exc
    no_space = False
    while chain is not None and not no_space:
        no_space = getattr(chain, "errno", None) == errno.ENOSPC or "No space left" in str(chain)
        chain = chain.__cause__ or chain.__context__
    if no_space or (free is not None and free < needed):
        shown = f"{free / 2**20:.1f} MiB" if free is not None else "unknown"
        return DtworkError(
            f"checkpoint {path} not written: no space left in {path.parent} (it needs about "
            f"{needed / 2**20:.1f} MiB, {shown} free); free some space or set checkpoint.directory "
            f"to a larger disk (the partial file was removed)"
        )
    return DtworkError(
        f"checkpoint {path} not written: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    )


def _after_the_others(path: Path) -> None:
    """Give a new checkpoint a modification time after every other one of its run (written order)."""
    others = [p.stat().st_mtime_ns for p in checkpoints(path.parent) if p != path]
    if others and path.stat().st_mtime_ns <= max(others):
        os.utime(path, ns=(max(others) + 1, max(others) + 1))


def checkpoints(folder: Path) -> list[Path]:
    """A run folder's checkpoints, oldest first: in the order written, then by step."""
    found = []
    for path in folder.glob("step-*"):
        match = STEP_FILE.fullmatch(path.name)
        try:
            if match:
                found.append((path.stat().st_mtime_ns, int(match.group(1)), path))
        except FileNotFoundError:  # pruned by rank 0 meanwhile
            continue
    return [path for _, _, path in sorted(found)]


def prune(folder: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest checkpoints of one run folder."""
    for old in checkpoints(folder)[:-keep]:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


# -- find and load ---------------------------------------------------------------------------


def latest(state: RankState) -> Path | None:
    """The newest checkpoint of this run, None when it has none."""
    found = checkpoints(run_directory(state))
    return found[-1] if found else None


def find(state: RankState, resume: Any) -> Path | None:
    """The checkpoint a ``resume=`` argument names; None for ``True`` when this run has none yet.

    ``True``: this run's newest. An int or ``"run-N"``: run N's newest. A path: that file, or the
    newest in that folder. Another string: the folder of that name under the checkpoint directory.
    """
    found = candidates(state, resume)
    return found[-1] if found else None


def candidates(state: RankState, resume: Any) -> list[Path]:
    """What ``find`` picks from, oldest first: a run's checkpoints, or the one file named."""
    if resume is True:
        check_owner(state)
        return checkpoints(run_directory(state))
    root = directory(state)
    if isinstance(resume, int) and not isinstance(resume, bool):
        folder = root / f"run-{resume}"
        check_owner(state, folder)  # run N of this store, not another's
    elif isinstance(resume, str) and RUN_REF.fullmatch(resume):
        folder = root / f"run-{RUN_REF.fullmatch(resume).group(1)}"  # type: ignore[union-attr]
        check_owner(state, folder)
    elif isinstance(resume, (str, os.PathLike)):
        given = Path(resume).expanduser()
        if given.is_file() or (given.is_dir() and given.suffix == DCP):
            return [given]
        folder = given if given.is_dir() else root / given
    else:
        raise DtworkError(
            f"resume={resume!r}: pass True (this run), a run id, a run folder, a step-*.pt file or step-*.dcp folder"
        )
    found = checkpoints(folder)
    if not found:
        runs = sorted(p.name for p in root.glob("*") if p.is_dir()) if root.is_dir() else []
        raise DtworkError(
            f"resume={resume!r}: no checkpoint in {folder}; runs with a folder in {root}: "
            f"{', '.join(runs) or 'none'}"
        )
    return found


class UnreadableCheckpoint(DtworkError):
    """A checkpoint file that cannot be read at all (truncated, torn, not a zip archive)."""


def resume_from(state: RankState, resume: Any) -> tuple[Path, dict[str, Any]] | None:
    """Load what ``resume=`` names (see ``find``) and return its path and loop state; None for
    ``True`` when this run has no checkpoint yet. A newest checkpoint that cannot be read is
    skipped with a warning naming it, for the one before (a crash or a full disk mid-write)."""
    found = candidates(state, resume)
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


def read(path: Path) -> dict[str, Any]:
    """Load a checkpoint file onto the CPU with ``weights_only=True``; one clear error if refused."""
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise DtworkError(
            f"checkpoint {path} holds objects that weights_only loading refuses ({str(exc).splitlines()[0]}); "
            f"if you trust the file, allow them with torch.serialization.add_safe_globals([...]) on every rank"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UnreadableCheckpoint(
            f"checkpoint {path} cannot be read ({first}): it is truncated or damaged"
        ) from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise DtworkError(
            f"{path} is not a dtwork checkpoint of format {FORMAT}: resume from a checkpoint this "
            f"dtwork version wrote"
        )
    return payload


def read_sharded(path: Path) -> dict[str, Any]:
    """The ``extra.pt`` of a ``.dcp`` folder; a folder missing a part is an unreadable checkpoint."""
    missing = [name for name in (dcp.METADATA, EXTRA) if not (path / name).is_file()]
    if missing:
        raise UnreadableCheckpoint(
            f"checkpoint {path} cannot be read (no {' or '.join(missing)}): it is incomplete or damaged"
        )
    return read(path / EXTRA)


def load(state: RankState, path: Path) -> dict[str, Any]:
    """Restore models, optimizers, schedulers, scaler and GNS state; return the loop state.

    The RNG state is returned (not applied) so the loop applies it once the data iterator is
    positioned exactly where the checkpoint was taken.
    """
    sharded = path.suffix == DCP and path.is_dir()
    payload = read_sharded(path) if sharded else read(path)
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
    whole = StateDictOptions(full_state_dict=True)  # every rank read the whole state: each keeps its shards
    for m, sd in zip(state.run_modules(), payload["models"], strict=False):
        if sd is None:  # sharded: loaded from the DCP folder
            continue
        if strategy_of(m).sharded:
            set_model_state_dict(m, sd, options=whole)
        else:
            _module(m).load_state_dict(sd)
    known = state.run_objects("optimizers")
    for o, sd in zip(known, payload["optimizers"], strict=False):
        owner = dcp.sharded_owner(state, o)
        if sd is None:
            continue
        if owner is not None:
            set_optimizer_state_dict(owner, o, sd, options=whole)
        else:
            o.load_state_dict(sd)  # moves the state to each parameter's device
    for s, sd in zip(state.run_objects("schedulers"), payload["schedulers"], strict=False):
        s.load_state_dict(sd)
    if state.scaler is not None and payload["scaler"] is not None:
        state.scaler.load_state_dict(payload["scaler"])
    if state.gns_state is not None and payload.get("gns"):
        state.gns_state.load_state_dict(payload["gns"])
    # a plain torch.optim optimizer made in the resuming cell is known from its first ctx.step:
    # the loop hands it the state then (``pending_optimizers``), before its first update
    pending = [sd for sd in payload["optimizers"][len(known) :] if sd is not None]
    return {**payload["loop"], "rng": payload["rng"][state.rank % written], PENDING: pending}


def take_pending(state: RankState, optimizer: torch.optim.Optimizer, pending: list[dict[str, Any]]) -> bool:
    """Load the next optimizer state a resume could not place into ``optimizer`` at its first
    ``ctx.step``, when it is one of the run's and has taken no step yet; return whether it did."""
    if not pending or optimizer.state or not any(o is optimizer for o in state.run_objects("optimizers")):
        return False
    optimizer.load_state_dict(pending.pop(0))  # moves the state to each parameter's device
    if state.rank == 0:
        print(
            f"dtwork: restored the checkpoint's optimizer state into {type(optimizer).__name__} at its first ctx.step"
        )
    return True


def export_checkpoint(source: str | os.PathLike[str], out: str | os.PathLike[str]) -> Path:
    """Write a ``step-*.dcp`` checkpoint folder (or a run folder's newest) as one ``.pt`` file.

    The file holds the whole models and optimizers, in the format of an unsharded run's
    checkpoint: ``torch.load(out, weights_only=True)["models"][0]`` loads into the plain model,
    ``resume=out`` resumes a run of the same world size. Any process; no process group needed.
    """
    src = Path(source).expanduser()
    if src.is_dir() and src.suffix != DCP:
        found = [p for p in checkpoints(src) if p.suffix == DCP]
        if not found:
            raise DtworkError(
                f"no step-*.dcp checkpoint in {src}: pass a .dcp folder or a run folder holding one"
            )
        src = found[-1]
    if not src.is_dir():
        raise DtworkError(
            f"{src} is not a step-*.dcp checkpoint folder: pass one, or a run folder holding one"
        )
    payload = read_sharded(src)
    with tempfile.TemporaryDirectory() as scratch:
        whole = dcp.whole(src, Path(scratch) / "whole.pt")
    for kind, found_kind in whole.items():
        for i, sd in found_kind.items():
            payload[kind][i] = sd
    target = Path(out).expanduser()
    target.parent.mkdir(parents=True, exist_ok=True)
    write(payload, target)
    return target
