"""What the live dashboard has been handed: the cell's records in its series, the ranks' progress.

``feed`` and ``progress`` come from whatever thread polls the ranks and only hand the data over;
the dashboard's drawer reads what was fed (:meth:`Intake.read_queued`), thinning the perf records to
the rate the store keeps them, and takes a :class:`Snapshot` of what a redraw needs under the lock.
A cell too long for its series to keep every row (:attr:`dtwork.plots.long_cell.LongCell.long`) is
drawn from the rollups kept beside them, as a fresh reader of the store draws it: memory stays bounded.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple, cast

from dtwork import plots
from dtwork.plots.long_cell import LongCell, bump
from dtwork.shared.records import Row, to_rows
from dtwork.store.perf_thinner import PerfThinner
from dtwork.widgets.header import RankProgress

__all__ = ["BUILD_SHARE", "ETA_WINDOW", "Changed", "Intake", "Snapshot"]

ETA_WINDOW = 20  # recent steps averaged for a rank's seconds per step
# A long cell's figures are drawn again from its rollups at most as often as keeps that within this
# share of a core (hundreds of ranks' series: a tenth of a second each), however often the header
# and the bars redraw.
BUILD_SHARE = 0.03


class Changed(NamedTuple):
    """A figure whose series changed since it was last drawn: its version, traces and y axis."""

    version: int
    traces: list[plots.Trace]
    axis: plots.AxisLayout


class Snapshot(NamedTuple):
    """What a redraw needs, copied under the lock."""

    figures: dict[str, Changed]  # by figure key
    progress: dict[int, RankProgress]
    rates: dict[int, float]  # samples/s by rank
    total: float | None  # global samples/s
    etas: dict[int, float | None]  # seconds left by rank
    build_cpu: float  # seconds of CPU the long cell's figures took to draw again (0: not drawn again)


class Intake:
    """The cell's series and the ranks' progress, fed from any thread, read by the drawer."""

    clock = staticmethod(time.monotonic)  # when a long cell's figures may be drawn again (tests set it)

    def __init__(self, ranks: int, global_batch: int | None, max_points: int) -> None:
        self.series = plots.cell_series(global_batch)
        # every row as rollups too: the series are drawn from them once the cell is long
        self.long = LongCell(global_batch, ETA_WINDOW, world_size=ranks)
        # the long cell's version its series were last drawn from, and when they may be drawn again
        self._built: tuple[int, float] = (0, 0.0)
        self.builds = 0  # how often the long cell's series were drawn again
        self.max_points = max_points  # per trace drawn: a redraw costs what is on screen
        self.rows_fed = 0
        self.efficiency: float | None = None  # the session's live scaling-efficiency estimate
        self.last_step: int | None = None  # of the last row fed
        self.dirty = False  # something to draw since the last snapshot
        self._perf_rate = PerfThinner(ranks)  # the perf records drawn, as the store keeps them
        self._lock = threading.Lock()  # guards the data below
        self._queued: list[Iterable[Mapping[str, object]]] = []
        self._progress: dict[int, RankProgress] = {}
        self._first_progress: dict[int, tuple[float, int]] = {}
        self._drawn: dict[str, int] = {}  # the version of each series last drawn

    def feed(self, records: Iterable[Mapping[str, object]]) -> None:
        """Hand over rank records (or store rows) to be read. Thread-safe."""
        with self._lock:
            self._queued.append(records)

    def progress(self, progress_by_rank: Mapping[int, Mapping[str, object]]) -> None:
        """Take the ranks' latest progress ({rank: {step, total, time, phase, ...}}). Thread-safe."""
        with self._lock:
            for rank, info in progress_by_rank.items():
                mine = self._progress[int(rank)] = cast(RankProgress, dict(info))
                step, t = mine.get("step"), mine.get("time")
                if step is not None and t is not None:
                    self._first_progress.setdefault(int(rank), (float(t), int(step)))
            self.dirty = True

    def read_queued(self) -> None:
        """Read what ``feed`` handed over into the series."""
        with self._lock:
            queued, self._queued = self._queued, []
        for records in queued:
            self.add(records)

    def read_all(self) -> None:
        """Read what was fed and the perf records still held back: the cell has ended."""
        self.read_queued()
        self.add(self._perf_rate.flush(), thin=False)

    def add(self, records: Iterable[Mapping[str, object]], thin: bool = True) -> None:
        """Put the records' rows in the series (perf records at the rate the store keeps them)."""
        rows = to_rows(self._perf_rate(records) if thin else records)
        if not rows:
            return
        by_kind: dict[str, list[Row]] = {}
        for row in rows:
            by_kind.setdefault(row["kind"], []).append(row)
        with self._lock:
            was_long = self.long.long
            self.long.add(rows)
            if not was_long:  # the long cell's series are drawn again from its rollups (_build)
                for kind, kind_rows in by_kind.items():
                    for key in plots.KIND_SERIES.get(kind, ()):
                        self.series[key].add(kind_rows)
                if self.long.long:  # too long to keep every row: let go of them
                    self._build(force=True)
            self.rows_fed += len(rows)
            for row in rows:
                if row["kind"] == "scaling" and row["name"] == plots.EFFICIENCY_NAME:
                    self.efficiency = row["value"]
            self.last_step = rows[-1]["step"]
            self.dirty = True

    def _build(self, force: bool = False) -> float:
        """Draw the long cell's series again from its rollups, if rows came since and (unless ``force``)
        the last drawing's cost within ``BUILD_SHARE`` allows (caller holds the lock); in place, so that
        whoever holds ``series`` reads the new ones. Return the CPU seconds it took."""
        version, due = self._built
        if not self.long.long or version == self.long.version or not (force or self.clock() >= due):
            return 0.0
        cpu = time.thread_time()
        self.series.update(bump(self.series, self.long.series()))
        spent = time.thread_time() - cpu
        self._built = (self.long.version, self.clock() + spent / BUILD_SHARE)
        self.builds += 1
        return spent

    def drawn(self, key: str, version: int) -> None:
        """Note that the figure ``key`` was drawn at its series' ``version``."""
        self._drawn[key] = version

    def snapshot(self) -> Snapshot:
        """Copy what a redraw needs under the lock: the changed figures' traces (bounded in size
        by ``max_points``), the progress, the rates and the ETAs."""
        with self._lock:
            self.dirty = False
            build_cpu = self._build()
            figures = {}
            for key, series in self.series.items():
                if series.version != self._drawn.get(key, 0):
                    traces = series.traces(self.max_points)
                    figures[key] = Changed(series.version, traces, series.y_axis(traces))
            progress = self._progress_copy()
            throughput = self.series["throughput"]
            assert isinstance(throughput, plots.ThroughputSeries)
            rates = self.long.latest() if self.long.long else throughput.latest()  # buckets: no latest value
            return Snapshot(
                figures,
                progress,
                rates,
                sum(rates.values()) if self.long.long and rates else throughput.total(),
                {r: self._eta(r, p) for r, p in progress.items()},
                build_cpu,
            )

    def static_parts(
        self, keys: Sequence[str]
    ) -> tuple[list[tuple[plots.Series, list[plots.Trace]]], dict[int, RankProgress]]:
        """The series of ``keys`` with their traces (as plain lists), and the progress: what a
        finished cell's static figure is drawn from."""
        with self._lock:
            self._build(force=True)
            parts = [
                (self.series[key], [_as_lists(t) for t in self.series[key].traces(self.max_points)])
                for key in keys
            ]
            return parts, self._progress_copy()

    def _progress_copy(self) -> dict[int, RankProgress]:
        return {r: cast(RankProgress, dict(p)) for r, p in self._progress.items()}

    def _seconds_per_step(self, rank: int, info: RankProgress) -> float | None:
        """Return the rank's seconds per step: from its progress so far, else its recent step times."""
        first = self._first_progress.get(rank)
        step, t = info.get("step"), info.get("time")
        if first is not None and step is not None and t is not None and step > first[1] and t > first[0]:
            return (float(t) - first[0]) / (int(step) - first[1])
        step_time = self.series["step_time"]
        assert isinstance(step_time, plots.StepTimeSeries)
        source = self.long if self.long.long else step_time
        times = source.recent_step_times(rank, ETA_WINDOW)
        return sum(times) / len(times) if times else None

    def _eta(self, rank: int, info: RankProgress) -> float | None:
        """Seconds left for ``rank`` (caller holds the lock)."""
        step, total = info.get("step"), info.get("total")
        per_step = self._seconds_per_step(rank, info)
        if step is None or total is None or per_step is None:
            return None
        return max(0, int(total) - int(step)) * per_step


def _as_lists(trace: plots.Trace) -> plots.Trace:
    """The trace with plain lists: plotly JSON that any reader of a notebook takes as it is."""
    return trace._replace(x=list(trace.x.tolist()), y=list(trace.y.tolist()))
