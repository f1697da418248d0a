"""Records leave the ranks through ipyparallel's datapub (works across machines).

``publish_data`` *updates* the engine's data dict of the running cell; the kernel polls it.
So that no batch is overwritten before the kernel reads it, every flush goes under a new key
``r<seq>``; the latest progress goes under ``progress`` (last one wins, which is what the
watchdog and progress bars need).

A publish that fails (a record the transport cannot serialise, a closed socket) loses nothing
at once: the batches are kept under their keys and sent again with the next flush, up to
``MAX_KEPT`` records (past it the oldest batches are dropped, and counted). The rank says so
once, as a ``DtworkWarning`` in the cell's output, and once more when its records go through again.
"""

from __future__ import annotations

import sys
import time
import warnings

from dtwork.errors import DtworkWarning
from dtwork.shared.records import Kind, Record, make_record
from dtwork.shared.timing import FLUSH_SECONDS

MAX_KEPT = 10_000  # records a rank keeps while its publishes fail (a few minutes of a busy loop)


def _publish(data: dict[str, object]) -> None:
    """Send ``data`` to the kernel; raise what the transport raises."""
    try:
        from ipykernel.zmqshell import ZMQInteractiveShell
        from IPython import get_ipython
    except ImportError:  # no kernel machinery at all: nobody to send to
        return
    # Outside an engine (a plain script, a benchmark, a unit test, a terminal shell) records stay
    # local: there ``publish_data`` would make a kernel shell of its own, or fail. The shell's own
    # class is asked, since a plain InteractiveShell makes ``ZMQInteractiveShell.initialized()`` true.
    if not isinstance(get_ipython(), ZMQInteractiveShell):
        return
    from ipyparallel.datapub import publish_data

    publish_data(data)


class Publisher:
    """Batch records and publish them at most every ``FLUSH_SECONDS``; keep them while that fails."""

    def __init__(self, rank: int, interval: float = FLUSH_SECONDS, max_kept: int = MAX_KEPT) -> None:
        self.rank = rank
        self.interval = interval
        self.max_kept = max_kept
        self._buf: list[Record] = []
        self._unsent: dict[str, list[Record]] = {}  # batches by key, oldest first, until published
        self._seq = 0
        self._last = time.monotonic()  # the first batch goes out an interval after the rank starts
        self._progress: dict[str, object] | None = None
        self.failing: str | None = None  # why the last publish failed, until one succeeds
        self.dropped = 0  # records dropped past ``max_kept`` while publishing failed

    @property
    def unsent(self) -> int:
        """Records waiting to be published (flushed but refused, or not flushed yet)."""
        return len(self._buf) + sum(len(batch) for batch in self._unsent.values())

    def record(self, kind: Kind | str, step: int | None, values: dict[str, float], **extra: object) -> None:
        self.add(make_record(kind, step, self.rank, values, **extra))

    def add(self, record: Record) -> None:
        """Queue a record built elsewhere (``records.make_perf_record``)."""
        self._buf.append(record)
        self.maybe_flush()

    def new_cell(self) -> None:
        """A cell begins: the last one's progress is not sent again (its age would read as a stall)."""
        self._progress = None

    def progress(self, **fields: object) -> None:
        self._progress = {"rank": self.rank, "time": time.time(), **fields}
        self.maybe_flush()

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last >= self.interval:
            self.flush()

    def flush(self) -> None:
        self._last = time.monotonic()
        if self._buf:
            self._unsent[f"r{self._seq:08d}"] = self._buf
            self._seq += 1
            self._buf = []
        data: dict[str, object] = dict(self._unsent)
        if self._progress is not None:
            data["progress"] = self._progress
        if not data:
            return
        try:
            _publish(data)
        except Exception as exc:  # the transport's errors vary (pickling, sockets): keep, say, retry
            self._keep(exc)
            return
        self._unsent = {}
        if self.failing is not None:
            self.failing = None
            lost = f" ({self.dropped} older ones were dropped)" if self.dropped else ""
            print(f"dtwork: rank {self.rank} publishes its records again{lost}", file=sys.stderr)
            self.dropped = 0

    def _keep(self, exc: Exception) -> None:
        """Keep the refused batches for the next flush, dropping the oldest past ``max_kept``."""
        while len(self._unsent) > 1 and self.unsent > self.max_kept:
            self.dropped += len(self._unsent.pop(next(iter(self._unsent))))
        if self.failing is None:
            self.failing = f"{type(exc).__name__}: {exc}"
            warnings.warn(
                f"rank {self.rank} could not send its records to the kernel ({self.failing}): "
                f"they are kept (up to {self.max_kept}, oldest dropped first) and sent with the next flush",
                DtworkWarning,
                stacklevel=2,
            )
