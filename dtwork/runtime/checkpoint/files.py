"""A checkpoint file on disk: what it holds, written durably, read with ``weights_only=True``.

Rank 0 writes a checkpoint durably (``write``: a temp file, fsynced, renamed, the folder fsynced;
owner-only, as the files hold the whole training state). Files load with ``weights_only=True``:
a payload holds only tensors and plain containers (the numpy RNG state is stored as a tensor), so
no code runs from a checkpoint. Everything loads onto the CPU first. A file that cannot be read at
all (torn by a crash or a full disk) raises ``UnreadableCheckpoint``, which a resume skips.
"""

from __future__ import annotations

import errno
import os
import pickle
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TypedDict, cast

import torch

from dtwork.errors import DtworkError
from dtwork.runtime.checkpoint import dcp
from dtwork.runtime.parallel.strategy import StateDict

FORMAT = 2  # payload layout; 1 had the numpy RNG state as an ndarray and no "run"
EXTRA = "extra.pt"  # in a .dcp folder: the payload less the sharded models and optimizers


class NumpyRng(TypedDict):
    """numpy's legacy (MT19937) state, its keys as a tensor so that ``weights_only`` loads it."""

    kind: str
    keys: torch.Tensor
    pos: int
    has_gauss: int
    gauss: float


class _RngBase(TypedDict):
    torch: torch.Tensor
    python: tuple[int, Sequence[int], float | None]  # random.getstate(); a list once loaded
    numpy: NumpyRng


class RngState(_RngBase, total=False):
    """One rank's random streams; ``cuda``: the device's, by index, where CUDA ran."""

    cuda: dict[int, torch.Tensor]


class Payload(TypedDict):
    """What one checkpoint file holds (``FORMAT``); a model or optimizer ``None`` where its shards
    are in the ``.dcp`` folder beside it."""

    format: int
    run: str
    loop: dict[str, object]  # the loop's position (step, epoch, micro-batch, adaptive batch)
    rng: list[RngState]  # every rank's, by rank
    models: list[StateDict | None]
    optimizers: list[StateDict | None]
    schedulers: list[StateDict]
    scaler: StateDict | None
    gns: StateDict | None
    world_size: int


class UnreadableCheckpoint(DtworkError):
    """A checkpoint file that cannot be read at all (truncated, torn, not a zip archive)."""


def write(payload: Mapping[str, object], path: Path) -> None:
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
    fsync_folder(path.parent)


def fsync_folder(folder: Path) -> None:
    """Make a rename in ``folder`` durable (where the file system can sync a folder)."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    except OSError as exc:  # some file systems (network, FUSE) cannot sync a folder: the data is
        if exc.errno not in (errno.EINVAL, errno.ENOTSUP):
            raise
    finally:
        os.close(fd)


def _tensor_bytes(value: object) -> int:
    """The bytes of the tensors in a payload: about the size its file needs."""
    if isinstance(value, torch.Tensor):
        return value.nelement() * value.element_size()
    if isinstance(value, dict):
        return sum(_tensor_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_tensor_bytes(v) for v in value)
    return 0


def _write_error(path: Path, payload: Mapping[str, object], exc: Exception) -> DtworkError:
    """One line for a checkpoint that could not be written; a full disk says so with the numbers."""
    needed = _tensor_bytes(payload)
    try:
        free: int | None = shutil.disk_usage(path.parent).free
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


def read(path: Path) -> Payload:
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
    return cast(Payload, payload)


def read_sharded(path: Path) -> Payload:
    """The ``extra.pt`` of a ``.dcp`` folder; a folder missing a part is an unreadable checkpoint."""
    missing = [name for name in (dcp.METADATA, EXTRA) if not (path / name).is_file()]
    if missing:
        raise UnreadableCheckpoint(
            f"checkpoint {path} cannot be read (no {' or '.join(missing)}): it is incomplete or damaged"
        )
    return read(path / EXTRA)
