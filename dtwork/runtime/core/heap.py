"""The rank's heap: what was imported before the first cell is frozen out of the collector's way.

A loop's start and each checkpoint run ``gc.collect()`` (models that earlier cells replaced must be
gone first); with torch, ipyparallel and torch._dynamo loaded, a full collection walks a few hundred
thousand import-time objects that never die. ``gc.freeze()`` moves them to the permanent generation,
so a collection walks only what cells made. Only objects that exist before the first cell are frozen:
a frozen object in a reference cycle is never freed, and a user's dropped model must be.
"""

from __future__ import annotations

import gc
import threading

_lock = threading.Lock()
_cells_began = False


def freeze_imports() -> bool:
    """Freeze what exists now unless a cell has begun (its objects must stay collectable)."""
    with _lock:
        if not _cells_began:
            gc.freeze()
        return not _cells_began


def cell_begins() -> None:
    """A cell begins: from now on nothing more is frozen."""
    global _cells_began
    with _lock:
        _cells_began = True
