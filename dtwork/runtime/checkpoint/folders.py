"""Where a run's checkpoints live: one folder per run, its owner, its checkpoints in order.

Each run keeps its own folder, ``<checkpoint directory>/<run>/step-XXXXXXXX.pt``, where
``<run>`` is ``run-<id>`` for a run of the kernel's store (``ctx.run_id``), else the config's
name (or ``default``). A loop that starts a new run mid-cell (a new ``ctx.wrap`` in a cell after
the run trained) writes to ``pending-<token>-<n>`` until the next cell's start, when rank 0
renames it to ``run-<id>`` (``adopt``); a kernel that died before then leaves it under that name
(in the run's segment data), and ``resume="pending-<token>-<n>"`` loads it. Rank 0 keeps the
newest K checkpoints of its own run (``prune``); other runs' folders are never touched.

A run folder names its owner, the run and the kernel's store, in ``run.json``: two notebooks
whose stores both have a run 7 and share one checkpoint directory (an absolute ``host_path``)
would otherwise prune and resume each other's checkpoints; a run whose folder another store's
run owns is refused before it trains. Folders without ``run.json`` belong to anyone.

A resume loads the newest checkpoint of the same run, or the one named: a ``step-*.pt`` file,
a run folder, or a run (``7``, ``"run-7"``, a folder name under the checkpoint directory).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from dtwork.errors import DtworkError, DtworkWarning
from dtwork.runtime.checkpoint.files import fsync_folder

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState

STEP_FILE = re.compile(r"step-(\d+)\.(?:pt|dcp)")  # a file, or a folder of DCP shards
DCP = ".dcp"
RUN_REF = re.compile(r"(?:run-)?(\d+)")
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


def _write_owner(folder: Path, run: str, store: str) -> None:
    tmp = folder / f".{OWNER}.tmp"
    with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as f:
        f.write(json.dumps({"run": run, "store": store}))
    os.replace(tmp, folder / OWNER)


def claim(state: RankState, folder: Path) -> None:
    """Write the folder's owner (rank 0, at its first checkpoint) when the kernel named a store."""
    store = state.run_store
    if store is None or (folder / OWNER).exists():
        return
    _write_owner(folder, run_name(state), store)


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
        _write_owner(dst, dst.name, state.run_store)
    fsync_folder(directory(state))


def private_folder(folder: Path) -> None:
    """Create the run folder (and the checkpoint directory) owner-only where this call creates them."""
    for d in (folder.parent, folder):
        if not d.is_dir():
            d.mkdir(parents=True, exist_ok=True)
            os.chmod(d, 0o700)


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


def after_the_others(path: Path) -> None:
    """Give a new checkpoint a modification time after every other one of its run (written order)."""
    others = [p.stat().st_mtime_ns for p in checkpoints(path.parent) if p != path]
    if others and path.stat().st_mtime_ns <= max(others):
        os.utime(path, ns=(max(others) + 1, max(others) + 1))


def prune(folder: Path, keep: int) -> None:
    """Delete all but the ``keep`` newest checkpoints of one run folder."""
    for old in checkpoints(folder)[:-keep]:
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)


def latest(state: RankState) -> Path | None:
    """The newest checkpoint of this run, None when it has none."""
    found = checkpoints(run_directory(state))
    return found[-1] if found else None


def find(state: RankState, resume: object) -> Path | None:
    """The checkpoint a ``resume=`` argument names; None for ``True`` when this run has none yet.

    ``True``: this run's newest. An int or ``"run-N"``: run N's newest. A path: that file, or the
    newest in that folder. Another string: the folder of that name under the checkpoint directory.
    """
    found = candidates(state, resume)
    return found[-1] if found else None


def candidates(state: RankState, resume: object) -> list[Path]:
    """What ``find`` picks from, oldest first: a run's checkpoints, or the one file named."""
    if resume is True:
        check_owner(state)
        return checkpoints(run_directory(state))
    root = directory(state)
    if isinstance(resume, int) and not isinstance(resume, bool):
        folder = root / f"run-{resume}"
        check_owner(state, folder)  # run N of this store, not another's
    elif isinstance(resume, str) and (ref := RUN_REF.fullmatch(resume)):
        folder = root / f"run-{ref.group(1)}"
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
