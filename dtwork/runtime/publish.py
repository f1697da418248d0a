"""Records leave the ranks through ipyparallel's datapub (works across machines).

``publish_data`` *updates* the engine's data dict of the running cell; the kernel polls it.
So that no batch is overwritten before the kernel reads it, every flush goes under a new key
``r<seq>``; the latest progress goes under ``progress`` (last one wins, which is what the
watchdog and progress bars need).
"""

from __future__ import annotations

import time
from typing import Any

from dtwork.records import Kind, Record, make_record

FLUSH_SECONDS = 0.2


def _publish(data: dict[str, Any]) -> None:
    try:
        from ipykernel.zmqshell import ZMQInteractiveShell

        # Outside an engine (a plain script, a benchmark, a unit test) records stay local: there
        # ``publish_data`` would make a kernel shell of its own, the process's shell from then on.
        if not ZMQInteractiveShell.initialized():
            return
        from ipyparallel.datapub import publish_data

        publish_data(data)
    except Exception:
        pass


class Publisher:
    """Batch records and publish them at most every ``FLUSH_SECONDS``."""

    def __init__(self, rank: int, interval: float = FLUSH_SECONDS) -> None:
        self.rank = rank
        self.interval = interval
        self._buf: list[Record] = []
        self._seq = 0
        self._last = 0.0
        self._progress: dict[str, Any] | None = None

    def record(self, kind: Kind | str, step: int | None, values: dict[str, float], **extra: Any) -> None:
        self.add(make_record(kind, step, self.rank, values, **extra))

    def add(self, record: Record) -> None:
        """Queue a record built elsewhere (``records.make_perf_record``)."""
        self._buf.append(record)
        self.maybe_flush()

    def progress(self, **fields: Any) -> None:
        self._progress = {"rank": self.rank, "time": time.time(), **fields}
        self.maybe_flush()

    def maybe_flush(self) -> None:
        if time.monotonic() - self._last >= self.interval:
            self.flush()

    def flush(self) -> None:
        self._last = time.monotonic()
        data: dict[str, Any] = {}
        if self._buf:
            data[f"r{self._seq:08d}"] = self._buf
            self._seq += 1
            self._buf = []
        if self._progress is not None:
            data["progress"] = self._progress
        if data:
            _publish(data)
