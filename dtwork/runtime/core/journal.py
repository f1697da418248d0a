"""The batches a rank published in its current cell, kept until its next cell begins.

A kept cluster's cell trains on when its kernel dies, and ipyparallel's hub drops what the rank
publishes while no client listens. So the rank keeps its cell's batches (each with the seq of its
datapub key, under the cell's ``stream`` token) and how the cell ended; a kernel that attaches reads
them on the rank's side channel (``runtime/debug/stacks.py``) past what its store already holds.

The whole cell is kept rather than what a kernel acknowledged: the normal path then costs the rank
no message and the kernel nothing, and a kernel that dies between a write and its acknowledgement
cannot lose a batch. Memory stays bounded: past ``max_memory`` records the cell's later batches are
appended to a file in the rank's temp folder (readable by its user only), removed when the next
cell begins; the file holds what the store holds for the cell, no more.
"""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time
import uuid
from pathlib import Path

from dtwork.shared.records import Record

MAX_MEMORY = 20_000  # records held in memory per cell (a few MB); the rest go to the spill file
PAGE = 20_000  # records one answer to the kernel carries at most


def _token() -> str:
    return uuid.uuid4().hex[:12]


class Journal:
    """One rank's batches of its current cell: in memory up to ``max_memory`` records, then a file."""

    def __init__(
        self, rank: int, max_memory: int = MAX_MEMORY, folder: str | None = None, keeping: bool = True
    ) -> None:
        self.max_memory = max_memory
        self.keeping = keeping  # False outside an engine (a script, a benchmark): no kernel can attach
        self.path = Path(folder or tempfile.gettempdir()) / f"dtwork-journal-{os.getpid()}-{rank}.jsonl"
        self._lock = threading.Lock()  # the rank's flushes add, its side-channel thread reads
        self._held: list[tuple[int, list[Record]]] = []
        self._held_records = 0
        self.spilled = 0  # batches in the spill file
        self.stream = _token()
        self.started = time.time()
        self.ended: dict[str, str | None] | None = None  # {"status", "error"} once the cell ended

    def begin(self) -> None:
        """A cell begins: a new stream, the last cell's batches (and spill file) dropped."""
        with self._lock:
            self._held, self._held_records, self.spilled = [], 0, 0
            self.path.unlink(missing_ok=True)
            self.stream, self.started, self.ended = _token(), time.time(), None

    def add(self, seq: int, batch: list[Record]) -> None:
        """Keep a batch the rank publishes under ``seq``."""
        if not self.keeping:
            return
        with self._lock:
            if self.spilled or self._held_records + len(batch) > self.max_memory:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
                with os.fdopen(fd, "a") as f:
                    f.write(json.dumps([seq, batch], default=str) + "\n")
                self.spilled += 1
            else:
                self._held.append((seq, batch))
                self._held_records += len(batch)

    def end(self, error: BaseException | None) -> None:
        """The cell ended, well or with ``error`` (a KeyboardInterrupt: interrupted)."""
        status = "ok" if error is None else "interrupted" if isinstance(error, KeyboardInterrupt) else "error"
        why = None if error is None else f"{type(error).__name__}: {error}"
        with self._lock:
            self.ended = {"status": status, "error": why}

    def since(self, after: int, most: int = PAGE) -> dict[str, object]:
        """The cell's batches with a seq past ``after``, up to about ``most`` records (one batch at
        least when ``most`` > 0), its stream, start and end; ``more``: batches are left past these."""
        with self._lock:
            out: list[tuple[int, list[Record]]] = []
            count, more = 0, False
            for seq, batch in self._batches():
                if seq <= after:
                    continue
                if count + len(batch) > most and (out or most <= 0):
                    more = True
                    break
                out.append((seq, batch))
                count += len(batch)
            return {
                "stream": self.stream,
                "started": self.started,
                "ended": self.ended,
                "batches": out,
                "more": more,
            }

    def _batches(self) -> list[tuple[int, list[Record]]]:
        spilled: list[tuple[int, list[Record]]] = []
        if self.spilled:
            with self.path.open() as f:
                spilled = [(int(seq), batch) for seq, batch in map(json.loads, f)]
        return [*self._held, *spilled]
