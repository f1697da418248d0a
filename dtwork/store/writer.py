"""A run's writes on their way to the store: in order, kept and retried while the store refuses them.

A full disk, a lock held by another program, a read-only or damaged file must not cost the
records the ranks send meanwhile: each write waits in a queue until the store takes it, the
user is told once what happened and what to do, and once more when the store works again.
A write the store rejects as malformed is dropped with a warning; the rest go on.

What waits is written in one transaction, with the marks of the ranks' batches it holds
(``records.Mark``): a batch's rows, events and mark are stored together or not at all, so a kernel
that attaches later reads from the ranks exactly the batches the store lacks.
"""

from __future__ import annotations

import sqlite3
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtwork.errors import DtworkError
from dtwork.shared.records import Kind, Mark, to_rows
from dtwork.store.runs import store_problem

if TYPE_CHECKING:
    from dtwork.store.runs import RunStore

__all__ = ["ROWS_MAX_SECONDS", "ROWS_SHARE", "ROWS_SECONDS", "StoreWriter", "paced"]

RETRY_SECONDS = 1.0  # a refusing store is tried again at most this often (each try may wait 5 s)
# Metric rows alone are written at most this often: a write's cost is mostly per series it touches
# (its summary and rollups), not per row, so at many ranks one write a second costs a tenth of one
# a poll. Anything else queued (an event, a cell's end, a status) writes everything at once.
ROWS_SECONDS = 1.0
# A write of rows that costs more than this share of a core over ROWS_SECONDS (hundreds of ranks'
# series) makes the next rows wait longer, up to ROWS_MAX_SECONDS: fewer, larger writes touch each
# series once for more rows (a kept cluster's ranks keep their batches for a kernel that attaches).
ROWS_SHARE = 0.03
ROWS_MAX_SECONDS = 10.0


_Place = tuple[int, int | None, int]  # where a rank's stream was stored last: run, cell, seq


@dataclass
class _Write:
    """One queued write: what to call on the store, and how many records it carries."""

    what: str  # "rows", "event", "cell", "status", "segment"
    run_id: int
    args: tuple[Any, ...]
    records: int = 1
    rows: list[dict[str, Any]] = field(default_factory=list)


def paced(every: float, spent: float) -> float:
    """Seconds rows alone wait after a write that took ``spent`` seconds of CPU: ``every``, or as
    long as keeps writes within ``ROWS_SHARE`` of a core, at most ``ROWS_MAX_SECONDS`` (``every`` 0:
    every flush writes)."""
    if every <= 0:
        return every
    return max(every, min(ROWS_MAX_SECONDS, spent / ROWS_SHARE))


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class StoreWriter:
    """The session's writes to its store, in order; what the store refuses waits for the next try."""

    def __init__(
        self,
        store: Callable[[], RunStore],
        path: Path,
        say: Callable[[str], None] = _say,
        rows_every: float = ROWS_SECONDS,
    ) -> None:
        self._store = store
        self.rows_every = rows_every
        self.path = path
        self._say = say
        self._queue: list[_Write] = []
        self._lock = threading.Lock()
        self.problem: str | None = None  # the line the user was told, while the store refuses writes
        self._failed_at = 0.0
        self._wrote_at = 0.0  # when the queue was last written out (monotonic)
        self.rows_interval = rows_every  # seconds rows alone wait now: rows_every, longer for costly writes
        self._warned: set[str] = set()
        self._marks: dict[tuple[int, str], _Place] = {}  # the queued batches' last seq by (rank, stream)
        # Held while a batch's records and its mark are queued: no flush in between stores one alone.
        self.holding = threading.RLock()

    # -- queueing ------------------------------------------------------------------------------

    @property
    def unsaved(self) -> int:
        """How many records (rows, events, cell and run updates) wait for the store."""
        with self._lock:
            return sum(w.records for w in self._queue)

    def records(self, run_id: int, seq: int | None, records: Iterable[object]) -> None:
        """Queue the ranks' records (messages from the ranks, checked here): their values as metric
        rows, their events as events."""
        good: list[Mapping[str, Any]] = []
        writes: list[_Write] = []
        for rec in records:
            if not isinstance(rec, Mapping) or not isinstance(rec.get("kind", ""), str):
                self._warn("not a record", f"a rank sent {str(rec)[:80]!r}")
                continue
            if rec.get("kind") == Kind.EVENT:
                writes.append(
                    _Write("event", run_id, (str(rec.get("event", "rank")), str(rec.get("message", "")), rec))
                )
            elif not isinstance(rec.get("values"), Mapping):
                self._warn("no values", f"a {rec.get('kind')} record without values: {str(dict(rec))[:80]}")
            else:
                good.append(rec)
        rows = [{**row, "cell_seq": seq} for row in to_rows(good)]
        if rows:
            writes.insert(0, _Write("rows", run_id, (), records=len(rows), rows=rows))
        with self._lock:
            self._queue.extend(writes)

    def mark(self, run_id: int, cell_seq: int | None, marks: Iterable[Mark]) -> None:
        """Note batches whose records were queued (under ``holding``): their marks go with them."""
        with self._lock:
            for rank, stream, seq in marks:
                self._marks[(rank, stream)] = (run_id, cell_seq, seq)

    def fresh(self, mark: Mark) -> bool:
        """Whether the batch ``mark`` is neither stored nor queued (a batch sent twice is kept once)."""
        rank, stream, seq = mark
        with self._lock:
            queued = self._marks.get((rank, stream))
        if queued is not None:
            return seq > queued[2]
        stored = self._store().delivered(rank, stream)
        return stored is None or seq > stored["seq"]

    def event(self, run_id: int, kind: str, message: str, data: Mapping[str, object] | None = None) -> None:
        with self._lock:
            self._queue.append(_Write("event", run_id, (kind, message, data)))

    def segment(
        self,
        run_id: int,
        cell_seq: int | None,
        first_step: int,
        changed: list[str],
        data: Mapping[str, object],
    ) -> None:
        with self._lock:
            self._queue.append(_Write("segment", run_id, (cell_seq, first_step, changed, data)))

    def finish_cell(self, run_id: int, seq: int, status: str, error: str | None = None) -> None:
        with self._lock:
            self._queue.append(_Write("cell", run_id, (seq, status, error)))

    def run_status(self, run_id: int, status: str, *, ended: bool = True) -> None:
        with self._lock:
            self._queue.append(_Write("status", run_id, (status, ended)))

    def lost(self, why: str) -> None:
        """Give up what still waits (the session ends): say how many records are lost, and why."""
        with self._lock:
            waiting, self._queue, self._marks = sum(w.records for w in self._queue), [], {}
        if waiting:
            self._say(f"dtwork: {waiting} records could not be written: {why}")

    # -- writing -------------------------------------------------------------------------------

    def flush(self, *, force: bool = False, rows_now: bool = False) -> bool:
        """Write what waits, in order; return True when nothing is left.

        Unless ``force``: metric rows alone wait until ``rows_interval`` seconds after the last write
        (unless ``rows_now``: a cell ended), and after a refusal the store is tried again only after
        ``RETRY_SECONDS``.
        """
        with self.holding, self._lock:
            if not self._queue and not self._marks:
                return True
            now = time.monotonic()
            if not force and self.problem is not None and now - self._failed_at < RETRY_SECONDS:
                return False
            rows_wait = not (force or rows_now) and now - self._wrote_at < self.rows_interval
            if rows_wait and all(w.what == "rows" for w in self._queue):
                return False
            self._wrote_at, cpu = now, time.thread_time()
            try:
                self._write_all()
            except (sqlite3.Error, OSError, DtworkError) as exc:  # DtworkError: the store did not open
                self._failed_at = time.monotonic()
                if self.problem is None:
                    self.problem = store_problem(exc, self.path)
                    waiting = sum(w.records for w in self._queue)
                    self._say(
                        f"dtwork: {self.problem}; {waiting} records are kept and written when it works again"
                    )
                return False
            self.rows_interval = paced(self.rows_every, time.thread_time() - cpu)
            if self.problem is not None:
                self.problem = None
                self._say(f"dtwork: the run store {self.path} takes writes again: every kept record is saved")
            return True

    def _write_all(self) -> None:
        """Write the queue and the batches' marks in one transaction; empty them once it committed."""
        store = self._store()
        with store.db.write():
            at = 0
            while at < len(self._queue):
                self._write(self._merged(at), store)
                at += 1
            for (rank, stream), (run_id, cell, seq) in self._marks.items():
                store.mark_delivered(run_id, cell, [(rank, stream, seq)])
        self._queue, self._marks = [], {}

    def _merged(self, at: int) -> _Write:
        """The queued write at ``at``, with the metric rows of the same run right behind it joined in."""
        first = self._queue[at]
        while first.what == "rows" and len(self._queue) > at + 1:
            nxt = self._queue[at + 1]
            if nxt.what != "rows" or nxt.run_id != first.run_id:
                break
            first.rows.extend(nxt.rows)
            first.records += nxt.records
            del self._queue[at + 1]
        return first

    def _write(self, w: _Write, store: RunStore) -> None:
        try:
            if w.what == "rows":
                store.add_metrics(w.run_id, w.rows)
            elif w.what == "event":
                store.add_event(w.run_id, *w.args)
            elif w.what == "cell":
                store.finish_cell(w.run_id, *w.args)
            elif w.what == "segment":
                cell_seq, first, changed, data = w.args
                store.add_segment(w.run_id, cell_seq=cell_seq, first_step=first, changed=changed, data=data)
            else:
                store.set_run_status(w.run_id, w.args[0], ended=w.args[1])
        # The store refused this write's content (a malformed row, text SQLite cannot encode):
        # the others go on.
        except (DtworkError, UnicodeEncodeError) as exc:
            if w.what == "rows" and len(w.rows) > 1:
                for row in w.rows:  # one by one (a savepoint each), in the flush's transaction
                    self._write(_Write("rows", w.run_id, (), rows=[row]), store)
                return
            self._warn(w.what, f"the store refused a {w.what} write: {exc}")

    def _warn(self, key: str, text: str) -> None:
        """Say once per kind of problem that something malformed was dropped."""
        if key not in self._warned:
            self._warned.add(key)
            self._say(f"dtwork: warning: dropped {text} (further ones are dropped silently)")
