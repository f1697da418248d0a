"""Which run stores the ``/dtwork/`` routes read: the server's own and every notebook folder's.

A kernel records its runs in ``.dtwork/runs.sqlite`` beside its notebook (its working folder), so a
notebook in a subfolder has a store of its own. The panel lists the runs of every store under the
Jupyter root, found by a bounded walk (hidden folders but ``.dtwork``, ``node_modules`` and the like
skipped, a few levels deep, a few thousand folders at most) whose result is kept for
``RESCAN_SECONDS``: the panel polls every 2 s, and a walk of a large tree must not follow each poll.

A store is named on the wire by its key: ``""`` for the server's default store (``$DTWORK_STORE``,
else the root's ``.dtwork/runs.sqlite``), else the folder holding ``.dtwork/``, relative to the root
(``"."``: the root's own folder when ``$DTWORK_STORE`` names another file).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from dtwork.server.wire import NotFound
from dtwork.store.runs import default_store_path

STORE_FILE = Path(".dtwork") / "runs.sqlite"
SCAN_DEPTH = 4  # folder levels below the root that are looked in
SCAN_FOLDERS = 2000  # folders looked in at most per walk
MAX_STORES = 32  # stores listed at most (each is opened at every poll)
RESCAN_SECONDS = 30.0  # how long a walk's result is used before the next walk
SKIPPED = frozenset({"node_modules", "__pycache__", "site-packages", "venv", "env", "build", "dist"})


@dataclass(frozen=True)
class Scan:
    """The stores found under a root: ``(key, path)`` pairs, the default's first, and a note saying
    where else to look when the walk stopped at one of its bounds."""

    stores: tuple[tuple[str, Path], ...]
    note: str | None
    at: float


_scans: dict[str, Scan] = {}
_lock = threading.Lock()


def _same(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve()
    except OSError:
        return False


def walk(root_dir: str) -> Scan:
    """Look for ``.dtwork/runs.sqlite`` in the root and its folders, breadth first, within bounds."""
    root = Path(root_dir)
    default = default_store_path(root_dir)
    found: list[tuple[str, Path]] = [("", default)]
    queue: deque[tuple[Path, int]] = deque([(root, 0)])
    seen = 0
    note = None
    while queue:
        folder, depth = queue.popleft()
        seen += 1
        if seen > SCAN_FOLDERS:
            note = (
                f"the search for run stores stopped after {SCAN_FOLDERS} folders under the Jupyter root: "
                "a notebook's runs not listed here are shown by dtwork runs --store ITS_FOLDER"
            )
            break
        path = folder / STORE_FILE
        if path.is_file() and not _same(path, default):
            if len(found) > MAX_STORES:
                note = f"only {MAX_STORES} run stores are listed: dtwork runs --store FOLDER shows the others"
                break
            key = folder.relative_to(root).as_posix()
            found.append((key, path))
        if depth >= SCAN_DEPTH:
            continue
        try:
            with os.scandir(folder) as entries:
                subs = sorted(
                    e.name
                    for e in entries
                    if not e.name.startswith(".")
                    and e.name not in SKIPPED
                    and e.is_dir(follow_symlinks=False)
                )
        except OSError:  # unreadable, or removed meanwhile
            continue
        queue.extend((folder / name, depth + 1) for name in subs)
    return Scan(tuple(found), note, time.monotonic())


def stores(root_dir: str, rescan: bool = False) -> Scan:
    """The stores under ``root_dir``, walked again when asked or when the last walk is old."""
    with _lock:
        scan = _scans.get(root_dir)
        if rescan or scan is None or time.monotonic() - scan.at > RESCAN_SECONDS:
            scan = _scans[root_dir] = walk(root_dir)
        return scan


def resolve(root_dir: str, key: str, fallback: bool = False) -> Path:
    """The store file a key names: ``""`` the default store, else ``<root>/<key>/.dtwork/runs.sqlite``
    (a folder inside the root; with ``fallback``, the default store when that folder has none)."""
    if not key:
        return default_store_path(root_dir)
    rel = PurePosixPath(key)
    if rel.is_absolute() or ".." in rel.parts or "\\" in key or "\x00" in key or len(key) > 1024:
        raise NotFound(f"malformed store {key[:40]!r}: a folder relative to the Jupyter root")
    root = Path(root_dir)
    path = root.joinpath(*rel.parts) / STORE_FILE
    try:
        inside = path.resolve().is_relative_to(root.resolve())
    except OSError:
        inside = False
    if inside and path.is_file():
        return path
    if fallback:
        return default_store_path(root_dir)
    raise NotFound(f"no run store in folder {key[:200]!r} (its .dtwork/runs.sqlite)")
