"""Series: the data of each training figure, taken from rows as they come.

Every training figure is drawn from a series (:class:`MetricsSeries`, :class:`ThroughputSeries`,
...) that takes rows (``add``) and gives the figure's traces (``traces``). The report builds one from
all the rows of a run; the live dashboard keeps one per figure for a whole cell and redraws from it,
so a run looks the same while it trains and afterwards. Per-rank values follow "the last value of a
rank's step wins". This module holds the base, the aggregated series (metrics, adaptive batch, noise
scale) and the robust axis they share; :mod:`.rank_series` the per-rank ones (throughput, step
time, GPUs); :mod:`.training` which of them a training cell shows. No plotly figures here:
:mod:`dtwork.plots.figures` draws the traces.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, TypedDict, cast

import numpy as np
from plotly.colors import qualitative

from dtwork.plots.columns import Column, Points, Trace, pick, step_column, take, value_column
from dtwork.shared.records import Row, finite

if TYPE_CHECKING:  # typing.Self is Python 3.11+; annotations are not evaluated at run time
    from typing_extensions import Self

__all__ = [
    "ADAPTIVE_NAMES",
    "AdaptiveSeries",
    "AxisLayout",
    "EFFICIENCY_NAME",
    "GNS_INTERVAL",
    "GNS_NAMES",
    "GREY_DASH",
    "LOG_SPAN",
    "OFF_SCALE",
    "GPU_NAMES",
    "PERF_NAMES",
    "SPIKES",
    "STEP_PARTS",
    "GnsSeries",
    "MetricsSeries",
    "Series",
    "Trace",
    "colour",
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
GREY_DASH = {"line": {"dash": "dash", "color": "#888"}}  # a reference line: the global batch, a memory total
_BAND_EDGE = {"line": {"width": 0, "color": "rgba(99,110,250,0.3)"}, "showlegend": False, "hoverinfo": "skip"}
_BAND_FILL = {"fill": "tonexty", "fillcolor": "rgba(99,110,250,0.2)"}
OFF_SCALE = {  # the marks of values off a robust axis, at its edge
    "mode": "markers",
    "marker": {"symbol": "triangle-up-open", "size": 10, "color": "#c62828"},
    "cliponaxis": False,
}


class AxisLayout(TypedDict, total=False):
    """The layout of a figure's y axis that a series sets (plotly's ``layout.yaxis`` keys)."""

    type: str
    autorange: bool
    range: list[float]
    title: dict[str, str]


def colour(i: int) -> str:
    """The i-th colour of plotly's palette (ranks keep theirs across figures)."""
    palette: list[str] = qualitative.Plotly
    return palette[i % len(palette)]


class Series(abc.ABC):
    """Base of the incremental figure data: ``add`` rows, then ``traces``."""

    title = ""
    x_title = "step"
    y_title = ""
    subplots: tuple[tuple[str, str], ...] = ()  # (title, y title) of side-by-side plots, if any

    def __init__(self) -> None:
        self.version = 0  # bumped by every add that changed something

    def add(self, rows: Iterable[Mapping[str, object]]) -> Self:
        """Take rows (those of other figures, and those without a finite value, are ignored); return self.

        Rows are :class:`~dtwork.shared.records.Row`, or mappings of its shape (the store's, a
        report's JSON)."""
        changed = False
        for r in cast("Iterable[Row]", rows):
            value = r["value"]
            if value is not None and finite(value) is not None:  # a NaN or an infinity is a gap in the line
                changed = self._add(r, value) or changed
        if changed:
            self.version += 1
        return self

    @abc.abstractmethod
    def _add(self, row: Row, value: float) -> bool:
        """Take one row (``value``: its value, finite) if it concerns this figure; return whether it did."""

    @abc.abstractmethod
    def traces(self, max_points: int | None = None) -> list[Trace]:
        """The figure's traces in order; with ``max_points``, at most about that many points per
        trace (evenly spaced, the latest kept) as numpy arrays, else every point as lists."""

    def y_axis(self, traces: Sequence[Trace]) -> AxisLayout:
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

    def _add(self, row: Row, value: float) -> bool:
        name = row["name"]
        if (
            row["kind"] != "log"
            if self.names is None
            else (row["rank"] is not None or name not in self.names)
        ):
            return False
        xs, ys = self._data.get(name) or self._data.setdefault(name, (step_column(), value_column()))
        xs.append(row["step"])
        ys.append(value)
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

    def y_axis(self, traces: Sequence[Trace]) -> AxisLayout:
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

    def _add(self, row: Row, value: float) -> bool:
        return row["kind"] == "adaptive" and super()._add(row, value)  # a logged "efficiency" is the user's


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

    def _add(self, row: Row, value: float) -> bool:
        if row["name"] == "settled" and row["rank"] is None:
            if self._settled is None or row["step"] >= self._settled[0]:
                self._settled = (row["step"], bool(value))
            return True
        column = self._data.get(row["name"])
        if row["rank"] is not None or column is None:
            return False
        step = row["step"]
        column[0].append(step)
        column[1].append(value)
        if row["name"] == "b_simple":
            lo, hi = self._extent or (step, step)
            self._extent = (min(lo, step), max(hi, step))
        return True

    def traces(self, max_points: int | None = None) -> list[Trace]:
        if self._extent is None:
            return []
        array = max_points is not None

        def trace(name: str, label: str, style: dict[str, object]) -> Trace:
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
            out.append(Trace("global batch", take(x, None, array), take(y, None, array), GREY_DASH))
        bounds = robust_range(estimate.y, self._kept())
        if bounds is not None:
            off = off_scale(estimate.x, estimate.y, bounds)
            if off is not None:
                out.append(
                    Trace("off scale", take(off[0], None, array), take(off[1], None, array), OFF_SCALE)
                )
        return out

    def _kept(self) -> list[float]:
        """Values the axis always shows: the global batch, the reference of the advice."""
        return [float(self.global_batch)] if self.global_batch else []

    def y_axis(self, traces: Sequence[Trace]) -> AxisLayout:
        estimate = next((t for t in traces if t.name == "B_simple"), None)
        bounds = None if estimate is None else robust_range(estimate.y, self._kept())
        axis: AxisLayout = (
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
    xs: Points | Sequence[float], ys: Points | Sequence[float], bounds: tuple[float, float]
) -> tuple[list[float], list[float]] | None:
    """The points of (xs, ys) outside ``bounds``, moved onto the nearer edge; None when there are none."""
    lo, hi = bounds
    y = np.asarray(ys, dtype=float)
    out = np.flatnonzero((y < lo) | (y > hi))
    if not out.size:
        return None
    x = np.asarray(xs)
    return x[out].tolist(), np.where(y[out] > hi, hi, lo).tolist()
