"""How often the kernel keeps a rank's perf record: a bounded rate, however many ranks publish.

Every rank publishes a perf record about every ``BASE_SECONDS`` (``runtime.timing.PERF_SECONDS``).
Past ``RATE_RANKS`` ranks the kernel keeps one per rank every ``perf_interval(n)`` seconds
(``BASE_SECONDS * n / RATE_RANKS``): the mean of the values of the records it folds, at the step and
time of the last of them. So the store and the dashboard take at most ``RATE_RANKS / BASE_SECONDS``
perf records a second in all, while the run's aggregate (the mean over each window) is kept; the
scaling-efficiency estimate still reads every record.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dtwork.shared.timing import PERF_SECONDS as BASE_SECONDS

__all__ = ["BASE_SECONDS", "RATE_RANKS", "PerfThinner", "perf_interval"]

RATE_RANKS = 32  # up to this many ranks every perf record is kept


def perf_interval(world_size: int) -> float:
    """Seconds between two kept perf records of one rank: ``max(0.1, 0.1 * n / 32)``."""
    return max(BASE_SECONDS, BASE_SECONDS * world_size / RATE_RANKS)


class _Window:
    """The perf records of one rank folded since the last one kept."""

    def __init__(self, start: float) -> None:
        self.start = start  # the time of the last record kept
        self.count = 0
        self.sums: dict[str, float] = {}
        self.last: Mapping[str, Any] | None = None

    def add(self, rec: Mapping[str, Any]) -> None:
        values = {name: float(value) for name, value in rec["values"].items()}  # raises before a change
        for name, value in values.items():
            self.sums[name] = self.sums.get(name, 0.0) + value
        self.count += 1
        self.last = rec

    def mean(self) -> dict[str, Any]:
        """The last record with each value the mean over the window's records."""
        assert self.last is not None
        values = {name: total / self.count for name, total in self.sums.items()}
        return {**self.last, "values": values}


class PerfThinner:
    """Fold each rank's perf records into one every ``perf_interval(world_size)`` seconds (by the
    records' own time); records of other kinds pass unchanged, in order."""

    def __init__(self, world_size: int) -> None:
        self.interval = perf_interval(world_size)
        self._windows: dict[int, _Window] = {}

    def __call__(self, records: Iterable[Any]) -> list[Any]:
        """The records to keep of ``records``."""
        if self.interval <= BASE_SECONDS:
            return list(records)
        out: list[Any] = []
        for rec in records:
            if not isinstance(rec, Mapping) or rec.get("kind") != "perf":
                out.append(rec)
                continue
            try:
                kept = self._fold(rec)
            except (KeyError, TypeError, ValueError):  # malformed: the store's writer says so
                kept = [rec]
            out += kept
        return out

    def _fold(self, rec: Mapping[str, Any]) -> list[Mapping[str, Any]]:
        """Fold one perf record into its rank's window; return what is kept now."""
        rank, t = int(rec["rank"]), float(rec["time"])
        window = self._windows.get(rank)
        if window is None:  # a rank's first record shows at once
            self._windows[rank] = _Window(t)
            return [rec]
        window.add(rec)
        # a hundredth of the interval early: ranks' timers jitter around BASE_SECONDS
        if t - window.start < self.interval * 0.99:
            return []
        self._windows[rank] = _Window(t)
        return [window.mean()]

    def flush(self) -> list[dict[str, Any]]:
        """The folded records still waiting for their window to end (a cell's last), one per rank."""
        out = [w.mean() for _, w in sorted(self._windows.items()) if w.count]
        self._windows = {rank: _Window(w.start) for rank, w in self._windows.items()}
        return out
