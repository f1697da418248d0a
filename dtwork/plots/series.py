"""Series: the data of each training figure, taken from rows as they come.

Every training figure is drawn from a series (:class:`MetricsSeries`, :class:`ThroughputSeries`,
...) that takes rows (``add``) and gives the figure's traces (``traces``). The report builds one from
all the rows of a run; the live dashboard keeps one per figure for a whole cell and redraws from it,
so a run looks the same while it trains and afterwards. Per-rank values follow "the last value of a
rank's step wins". No plotly figures here: :mod:`dtwork.plots.figures` draws the traces.
"""

from __future__ import annotations

import abc
import bisect
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
from plotly.colors import qualitative

from dtwork.plots.bands import RankBands, banded
from dtwork.plots.columns import (
    Column,
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
from dtwork.shared.records import finite

if TYPE_CHECKING:  # typing.Self is Python 3.11+; annotations are not evaluated at run time
    from typing_extensions import Self

__all__ = [
    "ADAPTIVE_NAMES",
    "AdaptiveSeries",
    "EFFICIENCY_NAME",
    "GNS_INTERVAL",
    "GNS_NAMES",
    "LOG_SPAN",
    "GPU_NAMES",
    "PERF_NAMES",
    "STEP_PARTS",
    "GnsSeries",
    "GpuSeries",
    "MetricsSeries",
    "Series",
    "StepTimeSeries",
    "ThroughputSeries",
    "Trace",
    "colour",
    "global_throughput",
    "off_scale",
    "robust_range",
]

GNS_NAMES = ("b_simple", "g2", "trace_sigma")
# an adaptive-batch decision's values drawn over time (runtime/loop/adaptive.py records them)
ADAPTIVE_NAMES = ("global_batch", "lr_factor", "efficiency", "goodput_predicted", "goodput_current")
EFFICIENCY_NAME = "scaling_efficiency"  # a "scaling" row the session writes; shown beside throughput
PERF_NAMES = ("samples_per_s", "step_time", "compute_time", "comm_time", "data_time")
GPU_NAMES = ("utilization", "memory_used_mb", "memory_total_mb")
STEP_PARTS = (("compute_time", "compute"), ("comm_time", "communication wait"), ("data_time", "data loading"))
GNS_INTERVAL = ("b_simple_lo", "b_simple_hi")  # the low and high edge of B_simple's interval
NOT_SETTLED = ", not yet settled"  # the GNS axis title's note while the interval is still wide
LOG_SPAN = 100.0  # a metrics panel whose positive values span more than this ratio is drawn on a log axis
ROBUST_MIN_POINTS = 8  # values a robust axis needs before it leaves plotly's autorange
SPIKES = "spikes (off scale)"  # the step-time figure's marks for steps far above the typical one
_DASH = {"line": {"dash": "dash"}}
_GREY_DASH = {"line": {"dash": "dash", "color": "#888"}}
_BAND_EDGE = {"line": {"width": 0, "color": "rgba(99,110,250,0.3)"}, "showlegend": False, "hoverinfo": "skip"}
_BAND_FILL = {"fill": "tonexty", "fillcolor": "rgba(99,110,250,0.2)"}
_OFF_SCALE = {
    "mode": "markers",
    "marker": {"symbol": "triangle-up-open", "size": 10, "color": "#c62828"},
    "cliponaxis": False,
}
_RIGHT = {"xaxis": "x2", "yaxis": "y2"}  # the right-hand plot of a 1 x 2 subplot grid


def colour(i: int) -> str:
    """The i-th colour of plotly's palette (ranks keep theirs across figures)."""
    palette = qualitative.Plotly
    return palette[i % len(palette)]


def global_throughput(rows: Iterable[Mapping[str, Any]]) -> tuple[list[int], list[float]]:
    """Return (steps, global samples/s): the sum over ranks of ``samples_per_s`` at each step.

    Ranks report throughput over short windows, each at its own steps, so every rank's latest
    value at or before a step is carried forward. Only steps every reporting rank has reached
    are summed, so a step still in flight on some ranks does not show as a dip.
    """
    trace = ThroughputSeries().add(rows).global_trace()
    return (list(trace[0]), list(trace[1])) if trace else ([], [])


class Series(abc.ABC):
    """Base of the incremental figure data: ``add`` rows, then ``traces``."""

    title = ""
    x_title = "step"
    y_title = ""
    subplots: tuple[tuple[str, str], ...] = ()  # (title, y title) of side-by-side plots, if any

    def __init__(self) -> None:
        self.version = 0  # bumped by every add that changed something

    def add(self, rows: Iterable[Mapping[str, Any]]) -> Self:
        """Take rows (those of other figures, and those without a finite value, are ignored); return self."""
        changed = False
        for r in rows:
            if finite(r["value"]) is not None:  # a NaN or an infinity is a gap in the line
                changed = self._add(r) or changed
        if changed:
            self.version += 1
        return self

    @abc.abstractmethod
    def _add(self, row: Mapping[str, Any]) -> bool:
        """Take one row if it concerns this figure; return whether it did."""

    @abc.abstractmethod
    def traces(self, max_points: int | None = None) -> list[Trace]:
        """The figure's traces in order; with ``max_points``, at most about that many points per
        trace (evenly spaced, the latest kept) as numpy arrays, else every point as lists."""

    def y_axis(self, traces: Sequence[Trace]) -> dict[str, Any]:
        """The y axis' layout that fits ``traces`` (these traces: plotly's own autorange)."""
        return {}


class MetricsSeries(Series):
    """Aggregated metrics (rank None) against step, one trace per name, in first-seen order
    (or the order of ``names``); noise-scale names are left out unless named."""

    title, y_title = "Metrics", "value"

    def __init__(self, names: Sequence[str] | None = None) -> None:
        super().__init__()
        self.names = None if names is None else list(names)
        self._data: dict[str, tuple[Column, Column]] = {}

    def _add(self, row: Mapping[str, Any]) -> bool:
        name = row["name"]
        if (
            row["kind"] != "log"
            if self.names is None
            else (row["rank"] is not None or name not in self.names)
        ):
            return False
        xs, ys = self._data.get(name) or self._data.setdefault(name, (step_column(), value_column()))
        xs.append(row["step"])
        ys.append(row["value"])
        return True

    def traces(self, max_points: int | None = None) -> list[Trace]:
        order = list(self._data) if self.names is None else [n for n in self.names if n in self._data]
        array = max_points is not None
        out = []
        for name in order:
            xs, ys = self._data[name]
            keep = pick(len(xs), max_points)
            out.append(Trace(name, take(xs, keep, array), take(ys, keep, array), {}))
        return out

    def y_axis(self, traces: Sequence[Trace]) -> dict[str, Any]:
        """A log axis when every value is positive and they span more than LOG_SPAN (a loss
        falling by decades is a flat line at 0 on a linear axis), else a linear one."""
        values = [np.asarray(t.y, dtype=float) for t in traces if len(t.y)]
        if not values:
            return {"type": "linear"}
        low = min(float(v.min()) for v in values)
        high = max(float(v.max()) for v in values)
        return {"type": "log" if low > 0 and high / low > LOG_SPAN else "linear"}


class AdaptiveSeries(MetricsSeries):
    """The adaptive batch's decisions against step: the global batch, the LR factor, the
    efficiency and the predicted and measured goodput (a log axis spans their scales)."""

    title, y_title = "Adaptive batch", "value"

    def __init__(self) -> None:
        super().__init__(ADAPTIVE_NAMES)

    def _add(self, row: Mapping[str, Any]) -> bool:
        return row["kind"] == "adaptive" and super()._add(row)  # a logged "efficiency" is the user's


class GnsSeries(Series):
    """B_simple against step with its interval as a band (when the records carry one), the global
    batch as a dashed line when given, on a robust axis: values far outside the bulk are marked at
    the axis' edge instead of setting its scale (:func:`robust_range`). While the records say the
    estimate has not settled (its interval still wide), the axis' title says so."""

    title, y_title = "Gradient noise scale", "B_simple (samples)"

    def __init__(self, global_batch: int | None = None) -> None:
        super().__init__()
        self.global_batch = global_batch
        self._data: dict[str, tuple[Column, Column]] = {
            name: (step_column(), value_column()) for name in ("b_simple", *GNS_INTERVAL)
        }
        self._extent: tuple[int, int] | None = None  # (first, last) step of B_simple
        self._settled: tuple[int, bool] | None = None  # (step, settled) of the latest "settled" value

    def _add(self, row: Mapping[str, Any]) -> bool:
        if row["name"] == "settled" and row["rank"] is None:
            if self._settled is None or row["step"] >= self._settled[0]:
                self._settled = (row["step"], bool(row["value"]))
            return True
        column = self._data.get(row["name"])
        if row["rank"] is not None or column is None:
            return False
        step = row["step"]
        column[0].append(step)
        column[1].append(row["value"])
        if row["name"] == "b_simple":
            lo, hi = self._extent or (step, step)
            self._extent = (min(lo, step), max(hi, step))
        return True

    def traces(self, max_points: int | None = None) -> list[Trace]:
        if self._extent is None:
            return []
        array = max_points is not None

        def trace(name: str, label: str, style: dict[str, Any]) -> Trace:
            xs, ys = self._data[name]
            keep = pick(len(xs), max_points)
            return Trace(label, take(xs, keep, array), take(ys, keep, array), style)

        estimate = trace("b_simple", "B_simple", {"line": {"color": colour(0)}})
        out = [estimate]
        if all(len(self._data[name][0]) for name in GNS_INTERVAL):  # "tonexty" fills down to the low edge
            out.append(trace(GNS_INTERVAL[0], "interval low", _BAND_EDGE))
            out.append(
                trace(GNS_INTERVAL[1], "95% interval", {**_BAND_EDGE, **_BAND_FILL, "showlegend": True})
            )
        if self.global_batch:
            x, y = list(self._extent), [float(self.global_batch)] * 2
            out.append(Trace("global batch", take(x, None, array), take(y, None, array), _GREY_DASH))
        bounds = robust_range(estimate.y, self._kept())
        if bounds is not None:
            off = off_scale(estimate.x, estimate.y, bounds)
            if off is not None:
                out.append(
                    Trace("off scale", take(off[0], None, array), take(off[1], None, array), _OFF_SCALE)
                )
        return out

    def _kept(self) -> list[float]:
        """Values the axis always shows: the global batch, the reference of the advice."""
        return [float(self.global_batch)] if self.global_batch else []

    def y_axis(self, traces: Sequence[Trace]) -> dict[str, Any]:
        estimate = next((t for t in traces if t.name == "B_simple"), None)
        bounds = None if estimate is None else robust_range(estimate.y, self._kept())
        axis: dict[str, Any] = (
            {"autorange": True} if bounds is None else {"range": list(bounds), "autorange": False}
        )
        unsettled = self._settled is not None and not self._settled[1]
        axis["title"] = {"text": f"{self.y_title}{NOT_SETTLED if unsettled else ''}"}
        return axis


def robust_range(values: Sequence[float], keep: Sequence[float] = ()) -> tuple[float, float] | None:
    """The y range that shows the bulk of ``values``, or None when plotly's autorange does.

    The bulk lies within Tukey's far fences, quartiles -/+ 3 IQR (at least 10% of the median). With
    a value outside them (a spike of the noise scale when |G|^2 comes near 0) the range is the
    bulk's, padded by 5% and widened to hold ``keep``. Fewer than ROBUST_MIN_POINTS values: None.
    """
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size < ROBUST_MIN_POINTS:
        return None
    q1, median, q3 = np.percentile(v, [25, 50, 75])
    spread = max(q3 - q1, 0.1 * abs(median))  # a nearly constant series still has room to vary
    low, high = q1 - 3 * spread, q3 + 3 * spread
    inside = v[(v >= low) & (v <= high)]
    if inside.size == v.size:
        return None
    lo, hi = float(inside.min()), float(inside.max())
    for k in keep:
        lo, hi = min(lo, k), max(hi, k)
    pad = 0.05 * (hi - lo) or 0.05 * abs(hi) or 1.0
    return lo - pad, hi + pad


def off_scale(
    xs: Sequence[Any], ys: Sequence[Any], bounds: tuple[float, float]
) -> tuple[list[Any], list[float]] | None:
    """The points of (xs, ys) outside ``bounds``, moved onto the nearer edge; None when there are none."""
    lo, hi = bounds
    y = np.asarray(ys, dtype=float)
    out = np.flatnonzero((y < lo) | (y > hi))
    if not out.size:
        return None
    x = np.asarray(xs)
    return x[out].tolist(), np.where(y[out] > hi, hi, lo).tolist()


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

    def _add(self, row: Mapping[str, Any]) -> bool:
        if row["rank"] is None or row["name"] != "samples_per_s":
            return False
        series = self.ranks.get(row["rank"])
        if series is None:
            series = self.ranks[row["rank"]] = RankSeries()
            self._reset()
        step = row["step"]
        if not series.set(step, row["value"]):  # a value taken before changed, or came out of order
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

    def _add(self, row: Mapping[str, Any]) -> bool:
        rank, name, step = row["rank"], row["name"], row["step"]
        if rank is None:
            return False
        if name == "step_time":
            if self._measured.add(step, rank, row["value"]):
                self._measured_steps.add(step)
            return True
        means = self._parts.get(name)
        if means is None:
            return False
        if means.add(step, rank, row["value"]):
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
                out.append(Trace(SPIKES, take(off[0], None, array), take(off[1], None, array), _OFF_SCALE))
        return out

    def y_axis(self, traces: Sequence[Trace]) -> dict[str, Any]:
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

    def _add(self, row: Mapping[str, Any]) -> bool:
        rank, name = row["rank"], row["name"]
        table = {"utilization": self._util, "memory_used_mb": self._memory, "memory_total_mb": self._totals}
        if rank is None or name not in table:
            return False
        series = table[name].setdefault(rank, RankSeries())
        fresh = series.set(row["step"], row["value"])
        if not fresh and name in self._bands:
            self._bands[name].reset()
        if name == "memory_total_mb":
            value = row["value"]
            if fresh:
                self._total = value if self._total is None else max(self._total, value)
            else:  # a replaced value may have been the largest
                self._total = max(max(s.values) for s in self._totals.values())
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
                Trace("memory total", take(x, None, array), take(y, None, array), {**_GREY_DASH, **_RIGHT})
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


BASE_FIGURES = ("metrics", "throughput", "step_time")  # a training cell's rows, always shown
KIND_FIGURES = ("gpu", "gns", "adaptive")  # shown once they have data, in this order


def cell_series(global_batch: int | None = None) -> dict[str, Series]:
    """A training cell's series by figure key: the live dashboard and the view a reopened notebook
    reads back from the store draw the same ones."""
    return {
        "metrics": MetricsSeries(),
        "throughput": ThroughputSeries(),
        "step_time": StepTimeSeries(),
        "gpu": GpuSeries(),
        "gns": GnsSeries(global_batch),
        "adaptive": AdaptiveSeries(),
    }
