"""The session's handle on its run store: one connection, opened when first needed, made again
(with the current run copied in) when the store's file was deleted or moved."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

from dtwork.store.runs import STORE_ERRORS, RunStore


class StoreHandle:
    """The run store of one file, shared by the notebook's thread and a watcher's."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self._store: RunStore | None = None
        self._lock = threading.Lock()  # the watcher's thread and the notebook's both write

    def get(self, run_id: int | None) -> RunStore:
        """The open store; made again first (``run_id`` copied into it) if its file went away."""
        with self._lock:
            if self._store is not None and self._store.vanished():
                self._store = self._recreate(self._store, run_id)
            if self._store is None:
                self._store = RunStore(self.file)
            return self._store

    def _recreate(self, old: RunStore, run_id: int | None) -> RunStore:
        """The store file went away (deleted, its folder moved): make it again and copy the run
        into it from the old file, which the open connection still reads."""
        new = RunStore(self.file)
        try:
            copied = old.copy_run(run_id, new) if run_id is not None else {}
        except BaseException:
            new.close()
            raise
        old.close()
        what = f": run {run_id} is in it again ({copied['metrics']} metric rows)" if copied else ""
        print(f"dtwork: the run store {self.file} was deleted or moved; made it again{what}", file=sys.stderr)
        return new

    def check(self, run_id: int | None) -> None:
        """Make the store again now if its file went away, before something else reads it."""
        if self._store is not None:
            try:
                self.get(run_id)
            except STORE_ERRORS:
                pass  # the writer says what is wrong at its next write

    def close(self) -> None:
        if self._store is not None:
            self._store.close()
            self._store = None
