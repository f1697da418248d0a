"""Records leave the ranks through ipyparallel's datapub (works across machines).

``publish_data`` *updates* the engine's data dict of the running cell; the kernel polls it.
So that no batch is overwritten before the kernel reads it, every flush goes under a new key
``r<seq>:<stream>`` (``records.batch_key``); the latest progress goes under ``progress`` (last one wins, which is what the
watchdog and progress bars need).

A publish that fails (a record the transport cannot serialise, a closed socket) loses nothing
at once: the batches are kept under their keys and sent again with the next flush, up to
``MAX_KEPT`` records (past it the oldest batches are dropped, and counted). The rank says so
once, as a ``DtworkWarning`` in the cell's output, and once more when its records go through again.

Progress that a rank recorded just before it blocked (a collective waiting for a stalled rank, a
long evaluation) would never leave it, since flushes ride on the rank's own calls: a keeper thread
sends the newest progress when the rank itself has not flushed for an interval, so the kernel's
watchdog compares the steps the ranks really reached, not the ones each happened to send last.
"""

from __future__ import annotations

import sys
import threading
import time
import warnings
import weakref

from dtwork.errors import DtworkWarning
from dtwork.runtime.core.journal import Journal
from dtwork.shared.records import Kind, Record, batch_key, make_record
from dtwork.shared.timing import FLUSH_SECONDS

MAX_KEPT = 10_000  # records a rank keeps while its publishes fail (a few minutes of a busy loop)


def _in_engine() -> bool:
    """Whether this process runs in a kernel shell whose data messages reach a kernel."""
    try:
        from ipykernel.zmqshell import ZMQInteractiveShell
        from IPython import get_ipython
    except ImportError:  # no kernel machinery at all: nobody to send to
        return False
    # Outside an engine (a plain script, a benchmark, a unit test, a terminal shell) records stay
    # local: there ``publish_data`` would make a kernel shell of its own, or fail. The shell's own
    # class is asked, since a plain InteractiveShell makes ``ZMQInteractiveShell.initialized()`` true.
    return isinstance(get_ipython(), ZMQInteractiveShell)


def _publish(data: dict[str, object]) -> None:
    """Send ``data`` to the kernel; raise what the transport raises."""
    if not _in_engine():
        return
    from ipyparallel.datapub import publish_data

    publish_data(data)


class Publisher:
    """Batch records and publish them at most every ``FLUSH_SECONDS``; keep them while that fails."""

    def __init__(
        self, rank: int, interval: float = FLUSH_SECONDS, max_kept: int = MAX_KEPT, keeper: bool | None = None
    ) -> None:
        self.rank = rank
        self.interval = interval
        self.max_kept = max_kept
        self._buf: list[Record] = []
        self._unsent: dict[str, list[Record]] = {}  # batches by key, oldest first, until published
        self._seq = 0
        self._last = time.monotonic()  # the first batch goes out an interval after the rank starts
        self._progress: dict[str, object] | None = None
        self._progress_sent: dict[str, object] | None = None  # the progress the kernel has
        self._sending = threading.Lock()  # the rank's flushes and the keeper's publishes, one at a time
        self._keeper = _in_engine() if keeper is None else keeper  # started with the first progress
        self.failing: str | None = None  # why the last publish failed, until one succeeds
        self.dropped = 0  # records dropped past ``max_kept`` while publishing failed
        # the cell's batches, for a kernel that attaches after its kernel died (an engine's only)
        self.journal = Journal(rank, keeping=_in_engine())

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
        """A cell begins: the last one's progress is not sent again (its age would read as a stall);
        under the lock, so that the keeper cannot send it with the new cell's messages."""
        with self._sending:
            self._progress = None
            self.journal.begin()

    def end_cell(self, error: BaseException | None) -> None:
        """A cell ended (``error``: how it failed): its last records leave with it, its journal says so."""
        if self._buf:
            self.flush()
        self.journal.end(error)

    def progress(self, **fields: object) -> None:
        self._progress = {"rank": self.rank, "time": time.time(), **fields}
        if self._keeper is True:
            self._keeper = False
            threading.Thread(
                target=_keep_up, args=(weakref.ref(self),), name="dtwork-progress", daemon=True
            ).start()
        self.maybe_flush()

    def send_progress_if_stuck(self) -> bool:
        """Send the newest progress if the rank has not flushed for an interval (the rank is blocked
        or busy outside its loop's calls); whether it was sent. Records stay for the rank's own flush."""
        progress = self._progress
        if (
            progress is None
            or progress is self._progress_sent
            or time.monotonic() - self._last < self.interval
        ):
            return False
        with self._sending:
            if progress is not self._progress or time.monotonic() - self._last < self.interval:
                return False  # the rank moved on or flushed meanwhile
            try:
                _publish({"progress": progress})
            except Exception:  # the rank's own next flush says what fails
                return False
            self._progress_sent = progress
        return True

    def send(self, data: dict[str, object]) -> None:
        """Publish ``data`` now, beside the records (a rank stopped at ``breakpoint()``); raise what
        the transport raises."""
        with self._sending:
            _publish(data)

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last >= self.interval:
            self.flush()

    def flush(self) -> None:
        with self._sending:
            self._flush()

    def _flush(self) -> None:
        self._last = time.monotonic()
        if self._buf:
            self._unsent[batch_key(self._seq, self.journal.stream)] = self._buf
            self.journal.add(self._seq, self._buf)
            self._seq += 1
            self._buf = []
        data: dict[str, object] = dict(self._unsent)
        progress = self._progress
        if progress is not None:
            data["progress"] = progress
        if not data:
            return
        try:
            _publish(data)
        except Exception as exc:  # the transport's errors vary (pickling, sockets): keep, say, retry
            self._keep(exc)
            return
        self._unsent = {}
        self._progress_sent = progress
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


def _keep_up(publisher: weakref.ref[Publisher]) -> None:
    """The keeper thread: every interval, the newest progress of a rank that stopped flushing."""
    while (pub := publisher()) is not None:
        interval = pub.interval
        pub.send_progress_if_stuck()
        del pub  # a publisher the rank dropped (a new group) ends its keeper
        time.sleep(max(interval, 0.05))
