"""The per-rank series: throughput, the step time's split and GPU telemetry, each rank's values
kept apart (one line a rank, or percentile bands past ``BAND_RANKS`` ranks) beside what they sum
or average to. The base and the aggregated series are in :mod:`.series`."""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Mapping, Sequence

from dtwork.plots.bands import RankBands, banded
from dtwork.plots.columns import (
    MeanColumn,
    RankSeries,
    StepMeans,
    Steps,
    Trace,
    pick,
    step_column,
    take,
    value_column,
)
from dtwork.plots.series import (
    GREY_DASH,
    OFF_SCALE,
    SPIKES,
    STEP_PARTS,
    AxisLayout,
    Series,
    colour,
    off_scale,
    robust_range,
)
from dtwork.shared.records import Row

__all__ = ["GpuSeries", "StepTimeSeries", "ThroughputSeries", "global_throughput"]

_DASH = {"line": {"dash": "dash"}}
_RIGHT = {"xaxis": "x2", "yaxis": "y2"}  # the right-hand plot of a 1 x 2 subplot grid


def global_throughput(rows: Iterable[Mapping[str, object]]) -> tuple[list[int], list[float]]:
    """Return (steps, global samples/s): the sum over ranks of ``samples_per_s`` at each step.

    Ranks report throughput over short windows, each at its own steps, so every rank's latest
    value at or before a step is carried forward. Only steps every reporting rank has reached
    are summed, so a step still in flight on some ranks does not show as a dip.
    """
    trace = ThroughputSeries().add(rows).global_trace()
    return (list(trace[0]), list(trace[1])) if trace else ([], [])


class ThroughputSeries(Series):
    """Global samples/s (the sum over ranks, see :func:`global_throughput`) and one trace per
    rank "rank r". The global trace grows by the steps every rank has passed since the last
    call; a new rank or a step out of order recomputes it."""

    title, y_title = "Throughput", "samples/s"

    def __init__(self) -> None:
        super().__init__()
        self.ranks: dict[int, RankSeries] = {}
        self._bands = RankBands(self.ranks)  # past BAND_RANKS ranks, in place of a line per rank
        self._gx = step_column()
        self._gy = value_column()
        self._upto: int | None = None  # the global trace is final up to this step

    def _add(self, row: Row, value: float) -> bool:
        if row["rank"] is None or row["name"] != "samples_per_s":
            return False
        series = self.ranks.get(row["rank"])
        if series is None:
            series = self.ranks[row["rank"]] = RankSeries()
            self._reset()
        step = row["step"]
        if not series.set(step, value):  # a value taken before changed, or came out of order
            self._bands.reset()
            if self._upto is not None and step <= self._upto:
                self._reset()
        return True

    def _reset(self) -> None:
        self._gx, self._gy, self._upto = step_column(), value_column(), None

    def global_trace(self) -> tuple[Sequence[int], Sequence[float]] | None:
        """(steps, global samples/s), brought up to date; None before every rank overlaps."""
        if not self.ranks:
            return None
        keyed = [(series.sorted_keys(), series) for series in self.ranks.values()]
        first = max(keys[0] for keys, _ in keyed)
        last = min(keys[-1] for keys, _ in keyed)
        low = first if self._upto is None else max(first, self._upto + 1)
        if low <= last:
            new: set[int] = set()
            for keys, _ in keyed:
                new.update(keys[bisect.bisect_left(keys, low) : bisect.bisect_right(keys, last)])
            for step in sorted(new):
                self._gx.append(step)
                self._gy.append(sum(series.carried(keys, step) for keys, series in keyed))
            self._upto = last
        return (self._gx, self._gy) if self._gx else None

    def latest(self) -> dict[int, float]:
        """{rank: samples/s at the rank's highest step}."""
        return {rank: series.latest() for rank, series in sorted(self.ranks.items())}

    def total(self) -> float | None:
        """The latest global samples/s."""
        trace = self.global_trace()
        return trace[1][-1] if trace else None

    def traces(self, max_points: int | None = None) -> list[Trace]:
        array = max_points is not None
        out = []
        glob = self.global_trace()
        if glob:
            keep = pick(len(glob[0]), max_points)
            style = {"line": {"width": 3, "color": "#222"}}
            out.append(Trace("global", take(glob[0], keep, array), take(glob[1], keep, array), style))
        if banded(self.ranks):
            return out + self._bands.traces("", {}, array)
        for i, (rank, series) in enumerate(sorted(self.ranks.items())):
            x, y = series.trace(max_points, array)
            out.append(Trace(f"rank {rank}", x, y, {"line": {"color": colour(i)}}))
        return out


class StepTimeSeries(Series):
    """Compute, communication wait and data-loading time per step stacked (means over ranks),
    and the measured step time dashed. A part no rank measured is left out; at a step where
    only some parts were measured the missing ones count as 0."""

    title, y_title = "Step time split (mean over ranks)", "seconds per step"

    def __init__(self) -> None:
        super().__init__()
        self._parts = {name: StepMeans() for name, _ in STEP_PARTS}
        self._union = Steps()  # steps of the parts
        self._measured = StepMeans()
        self._measured_steps = Steps()
        # the means on the steps, kept up to date between redraws
        self._part_means = {name: MeanColumn(means) for name, means in self._parts.items()}
        self._measured_means = MeanColumn(self._measured)

    def _add(self, row: Row, value: float) -> bool:
        rank, name, step = row["rank"], row["name"], row["step"]
        if rank is None:
            return False
        if name == "step_time":
            if self._measured.add(step, rank, value):
                self._measured_steps.add(step)
            return True
        means = self._parts.get(name)
        if means is None:
            return False
        if means.add(step, rank, value):
            self._union.add(step)
        return True

    def recent_step_times(self, rank: int, n: int) -> list[float]:
        """The last ``n`` step times rank ``rank`` reported, in arrival order."""
        series = self._measured.by_rank.get(rank)
        return list(series.values[-n:]) if series else []

    def traces(self, max_points: int | None = None) -> list[Trace]:
        array = max_points is not None
        out = []
        steps = self._union.steps
        changed = self._union.take_low()
        keep = pick(len(steps), max_points)
        for name, label in STEP_PARTS:
            means = self._part_means[name].update(steps, changed)  # every part: they share `changed`
            if self._parts[name].sums:
                out.append(
                    Trace(label, take(steps, keep, array), take(means, keep, array), {"stackgroup": "split"})
                )
        measured = self._measured_steps.steps
        if measured:
            means = self._measured_means.update(measured, self._measured_steps.take_low())
            keep = pick(len(measured), max_points)
            step_time = Trace("step time", take(measured, keep, array), take(means, keep, array), _DASH)
            out.append(step_time)
            # a few slow steps (a checkpoint, a first compile) would flatten the typical step to
            # slivers: the axis shows the bulk and marks them at its top
            bounds = robust_range(step_time.y)
            off = None if bounds is None else off_scale(step_time.x, step_time.y, bounds)
            if off is not None:
                out.append(Trace(SPIKES, take(off[0], None, array), take(off[1], None, array), OFF_SCALE))
        return out

    def y_axis(self, traces: Sequence[Trace]) -> AxisLayout:
        """From 0 to the top of the typical step times, spikes off scale (marked); else autorange."""
        step_time = next((t for t in traces if t.name == "step time"), None)
        bounds = None if step_time is None else robust_range(step_time.y)
        return {"autorange": True} if bounds is None else {"range": [0.0, bounds[1]], "autorange": False}


class GpuSeries(Series):
    """GPU utilization (%) and memory used (MB) per rank against step, side by side, with the
    largest memory total as a dashed line over the memory steps."""

    title = "GPUs"
    subplots = (("utilization", "utilization (%)"), ("memory", "memory used (MB)"))

    def __init__(self) -> None:
        super().__init__()
        self._util: dict[int, RankSeries] = {}
        self._memory: dict[int, RankSeries] = {}
        self._bands = {"utilization": RankBands(self._util), "memory_used_mb": RankBands(self._memory)}
        self._totals: dict[int, RankSeries] = {}
        self._total: float | None = None  # the largest memory total
        self._memory_steps: tuple[int, int] | None = None  # (first, last) memory step

    def _add(self, row: Row, value: float) -> bool:
        rank, name = row["rank"], row["name"]
        table = {"utilization": self._util, "memory_used_mb": self._memory, "memory_total_mb": self._totals}
        if rank is None or name not in table:
            return False
        series = table[name].get(rank)
        if series is None:
            series = table[name][rank] = RankSeries()
        at = series.at.get(row["step"])
        replaced = None if at is None else series.values[at]
        fresh = series.set(row["step"], value)
        if not fresh and name in self._bands:
            self._bands[name].reset()
        if name == "memory_total_mb":
            # only the largest replaced by less needs every value again (a long cell's buckets
            # replace values thousands of times a drawing)
            if replaced is not None and replaced == self._total and value < replaced:
                self._total = max(max(s.values) for s in self._totals.values())
            else:
                self._total = value if self._total is None else max(self._total, value)
        elif name == "memory_used_mb":
            step = row["step"]
            lo, hi = self._memory_steps or (step, step)
            self._memory_steps = (min(lo, step), max(hi, step))
        return True

    def traces(self, max_points: int | None = None) -> list[Trace]:
        array = max_points is not None
        if banded(self._util) or banded(self._memory):
            out = self._bands["utilization"].traces("utilization ", {}, array)
            out += self._bands["memory_used_mb"].traces("memory ", _RIGHT, array)
        else:
            out = self._rank_traces(max_points, array)
        if self._total is not None and self._memory_steps is not None:
            x, y = list(self._memory_steps), [self._total] * 2
            out.append(
                Trace("memory total", take(x, None, array), take(y, None, array), {**GREY_DASH, **_RIGHT})
            )
        return out

    def _rank_traces(self, max_points: int | None, array: bool) -> list[Trace]:
        out = []
        for i, (rank, series) in enumerate(sorted(self._util.items())):
            x, y = series.trace(max_points, array)
            out.append(Trace(f"rank {rank} utilization", x, y, {"line": {"color": colour(i)}}))
        for i, (rank, series) in enumerate(sorted(self._memory.items())):
            x, y = series.trace(max_points, array)
            out.append(
                Trace(f"rank {rank} memory", x, y, {"line": {"color": colour(i), "dash": "dot"}, **_RIGHT})
            )
        return out
