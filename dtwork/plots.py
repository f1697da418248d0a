"""Pure figure builders: rank records or store rows -> plotly figures.

The live dashboard and the notebook reports draw from the same code on the same data, so a
run looks the same while it trains and afterwards: each training figure is a *series*
(:class:`MetricsSeries`, :class:`ThroughputSeries`, ...) that takes rows as they come and gives
the figure's traces; the report builds one from all of a run's rows, the dashboard keeps one per
figure for a cell and redraws from it in time bounded by the points drawn, not the rows seen.
Every figure function takes *rows* (:class:`dtwork.records.Row`, as
``RunStore.metrics(..., rank="all")`` returns them and :func:`dtwork.records.to_rows` makes them
from rank records); rows without a finite value are skipped.

Every figure is titled, has labelled axes, keeps its traces' x/y as plain lists of numbers (the
dashboard's thinned traces are numpy arrays) and
draws an empty input as an empty figure with a "no data yet" annotation instead of raising.
No widgets and no torch here.
"""

from __future__ import annotations

import abc
import bisect
import copy
import math
from array import array as Column
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.colors import qualitative
from plotly.subplots import make_subplots

if TYPE_CHECKING:  # typing.Self is Python 3.11+; annotations are not evaluated at run time
    from typing_extensions import Self

from dtwork.analysis.gns import tradeoff, tradeoff_curve
from dtwork.analysis.scaling import ScalingResult, best_bucket

__all__ = [
    "GNS_NAMES",
    "GPU_NAMES",
    "GnsSeries",
    "GpuSeries",
    "MetricsSeries",
    "NO_DATA",
    "NO_DATA_NAME",
    "PERF_NAMES",
    "Series",
    "StepTimeSeries",
    "ThroughputSeries",
    "Trace",
    "bucket_figure",
    "global_throughput",
    "gns_figure",
    "gpu_figure",
    "metrics_figure",
    "no_data_note",
    "scaling_figure",
    "stacked_figure",
    "step_time_figure",
    "throughput_figure",
    "tradeoff_figure",
]


NO_DATA = "no data yet"
NO_DATA_NAME = "dtwork-no-data"  # the name of the "no data yet" annotation
GNS_NAMES = ("b_simple", "g2", "trace_sigma")
PERF_NAMES = ("samples_per_s", "step_time", "compute_time", "comm_time", "data_time")
GPU_NAMES = ("utilization", "memory_used_mb", "memory_total_mb")
STEP_PARTS = (("compute_time", "compute"), ("comm_time", "communication wait"), ("data_time", "data loading"))
HEIGHT = 320


def _number(value: Any) -> float | None:
    """Return ``value`` as a finite float, or None (missing, NaN, infinite, not a number)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def global_throughput(rows: Iterable[Mapping[str, Any]]) -> tuple[list[int], list[float]]:
    """Return (steps, global samples/s): the sum over ranks of ``samples_per_s`` at each step.

    Ranks report throughput over short windows, each at its own steps, so every rank's latest
    value at or before a step is carried forward. Only steps every reporting rank has reached
    are summed, so a step still in flight on some ranks does not show as a dip.
    """
    trace = ThroughputSeries().add(rows).global_trace()
    return (list(trace[0]), list(trace[1])) if trace else ([], [])


# -- incremental series --------------------------------------------------------------------------
#
# Every training figure is drawn from a *series* object that takes rows as they come
# (``add``) and gives the figure's traces (``traces``) or the whole figure (``figure``). The
# report builds one from all the rows of a run; the live dashboard keeps one per figure for a
# whole cell, adds each batch of records and redraws from it: adding costs O(rows added), and a
# redraw with ``max_points`` costs O(max_points) per trace whatever the length of the run.
# Per-rank values follow "the last value of a rank's step wins"; ranks report in step order,
# and anything out of order is still drawn exactly (by a full recomputation).


class Trace(NamedTuple):
    """One trace of a figure: its name, x and y (lists, or numpy arrays when thinned) and its
    plotly style (keyword arguments of ``go.Scatter``, axes of a subplot included)."""

    name: str
    x: Any
    y: Any
    style: dict[str, Any]

    def scatter(self) -> go.Scatter:
        """The plotly trace."""
        return _line(self.x, self.y, self.name, **self.style)


def _pick(n: int, max_points: int | None) -> np.ndarray | None:
    """Return evenly spaced indices (always the last one) when ``n`` exceeds ``max_points``: an
    index array, which numpy takes at once (a redraw thins every trace of the live view)."""
    if max_points is None or n <= max_points:
        return None
    stride = -(-n // max_points)
    keep = np.arange(0, n, stride)
    if keep[-1] != n - 1:
        keep = np.append(keep, n - 1)
    return keep


def _take(seq: Sequence[Any], keep: np.ndarray | None, array: bool) -> Any:
    """Return ``seq`` (or its items at ``keep``) as a list, or as a numpy array for the widgets.

    Integer arrays come as int32 when they fit (else float64): the widget protocol sends those
    as binary buffers, while int64 arrays go as JSON lists, item by item.
    """
    if not array:
        return list(seq) if keep is None else [seq[i] for i in keep.tolist()]
    if isinstance(seq, Column) and len(seq):
        # a copy, never a view: a column exporting its buffer could not grow any more
        view = np.frombuffer(seq, dtype=np.int64 if seq.typecode == "q" else np.float64)
        out = view.copy() if keep is None else view[keep]
        del view
    else:
        out = np.asarray(seq if keep is None else [seq[i] for i in keep.tolist()])
    if out.dtype.kind in "iu":
        small = out.size == 0 or (int(out.min()) >= -(2**31) and int(out.max()) < 2**31)
        out = out.astype(np.int32 if small else np.float64)
    return out


def _steps() -> Column:
    return Column("q")


def _values() -> Column:
    return Column("d")


class _RankSeries:
    """One rank's values of one name: steps in arrival order, the last value of a step wins."""

    __slots__ = ("at", "in_order", "steps", "top", "values")

    def __init__(self) -> None:
        self.steps = _steps()
        self.values = _values()
        self.at: dict[int, int] = {}  # step -> index
        self.in_order = True  # steps strictly increasing so far
        self.top: int | None = None  # the highest step so far

    def set(self, step: int, value: float) -> bool:
        """Store ``value`` at ``step``; return False unless the step is after every step so far."""
        i = self.at.get(step)
        if i is not None:
            self.values[i] = value
            return False
        fresh = self.top is None or step > self.top
        if fresh:
            self.top = step
        self.in_order = self.in_order and fresh
        self.at[step] = len(self.steps)
        self.steps.append(step)
        self.values.append(value)
        return fresh

    def latest(self) -> float:
        """The value at the highest step."""
        if self.in_order:
            return self.values[-1]
        return self.values[self.at[self.top]]  # type: ignore[index]  # a value was set: top is a step

    def sorted_keys(self) -> Sequence[int]:
        return self.steps if self.in_order else sorted(self.steps)

    def carried(self, keys: Sequence[int], step: int) -> float:
        """The value at the last step at or before ``step`` (``keys``: sorted_keys())."""
        return self.values[self.at[keys[bisect.bisect_right(keys, step) - 1]]]

    def trace(self, keep_max: int | None, array: bool) -> tuple[Any, Any]:
        keep = _pick(len(self.steps), keep_max)
        return _take(self.steps, keep, array), _take(self.values, keep, array)


class _StepMeans:
    """Means over ranks per step of one per-rank name (the last value of a rank's step wins)."""

    __slots__ = ("by_rank", "low", "sums")

    def __init__(self) -> None:
        self.sums: dict[int, list[float]] = {}  # step -> [sum, count]
        self.by_rank: dict[int, _RankSeries] = {}
        self.low: int | None = None  # the lowest step whose mean changed since take_low()

    def add(self, step: int, rank: int, value: float) -> bool:
        """Add a value; return True when ``step`` is new for this name."""
        if self.low is None or step < self.low:
            self.low = step
        series = self.by_rank.setdefault(rank, _RankSeries())
        i = series.at.get(step)
        total = self.sums.get(step)
        if i is not None and total is not None:  # a rank's step reported again: replace it
            total[0] += value - series.values[i]
            series.set(step, value)
            return False
        series.set(step, value)
        if total is None:
            self.sums[step] = [value, 1]
            return True
        total[0] += value
        total[1] += 1
        return False

    def take_low(self) -> int | None:
        """The lowest step whose mean changed since the last call (None: none did)."""
        low, self.low = self.low, None
        return low


class _Steps:
    """A sorted list of distinct steps, appended to in O(1) when steps come in order."""

    __slots__ = ("low", "seen", "steps")

    def __init__(self) -> None:
        self.steps = _steps()
        self.seen: set[int] = set()
        self.low: int | None = None  # the lowest index changed since take_low()

    def add(self, step: int) -> None:
        if step in self.seen:
            return
        self.seen.add(step)
        if not self.steps or step > self.steps[-1]:
            i = len(self.steps)
            self.steps.append(step)
        else:
            i = bisect.bisect_left(self.steps, step)
            self.steps.insert(i, step)
        if self.low is None or i < self.low:
            self.low = i

    def take_low(self) -> int:
        """The lowest index changed since the last call (the length when none was)."""
        low, self.low = self.low, None
        return len(self.steps) if low is None else low


class _MeanColumn:
    """The means of a :class:`_StepMeans` at every step of a :class:`_Steps` (0.0 where no rank
    reported), brought up to date from the first step that changed: a redraw computes the means of
    the steps that came since the last one, not of every step on screen."""

    __slots__ = ("means", "values")

    def __init__(self, means: _StepMeans) -> None:
        self.means = means
        self.values = _values()

    def update(self, steps: Sequence[int], changed: int) -> Column:
        """Bring the column up to date; ``changed``: the lowest index of ``steps`` that changed
        (inserted) since the last update. Return the column (one value per step)."""
        start = min(changed, len(self.values))
        low = self.means.take_low()
        if low is not None:
            start = min(start, bisect.bisect_left(steps, low))
        del self.values[start:]
        sums = self.means.sums
        self.values.extend(
            (t[0] / t[1]) if (t := sums.get(steps[i])) else 0.0 for i in range(start, len(steps))
        )
        return self.values


_EMPTY: dict[type, dict[str, Any]] = {}  # Series.empty() by class


class Series(abc.ABC):
    """Base of the incremental figure data: ``add`` rows, then ``traces`` or ``figure``."""

    title = ""
    x_title = "step"
    y_title = ""

    def __init__(self) -> None:
        self.version = 0  # bumped by every add that changed something

    def add(self, rows: Iterable[Mapping[str, Any]]) -> Self:
        """Take rows (those of other figures, and those without a value, are ignored); return self."""
        changed = False
        for r in rows:
            if r["value"] is not None:
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

    def empty_figure(self) -> go.Figure:
        """The titled figure without traces."""
        return _titled(go.Figure(), self.title, self.x_title, self.y_title)

    def empty(self) -> dict[str, Any]:
        """The figure without data ("no data yet") as a plotly dict, built once per kind of
        series: the live dashboard starts every cell's figures from it, without validating
        plotly's layout template twice."""
        key = type(self)
        if key not in _EMPTY:
            _EMPTY[key] = self.assemble([]).to_dict()
        return copy.deepcopy(_EMPTY[key])

    def figure(self, max_points: int | None = None) -> go.Figure:
        """The whole figure; "no data yet" when there is nothing to draw."""
        return self.assemble(self.traces(max_points))

    def assemble(self, traces: Sequence[Trace]) -> go.Figure:
        """The figure with these traces (styled, on their subplots); "no data yet" without any."""
        fig = self.empty_figure()
        fig.add_traces([t.scatter() for t in traces])
        return fig if traces else _no_data(fig)


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
        xs, ys = self._data.get(name) or self._data.setdefault(name, (_steps(), _values()))
        xs.append(row["step"])
        ys.append(row["value"])
        return True

    def traces(self, max_points: int | None = None) -> list[Trace]:
        order = list(self._data) if self.names is None else [n for n in self.names if n in self._data]
        array = max_points is not None
        out = []
        for name in order:
            xs, ys = self._data[name]
            keep = _pick(len(xs), max_points)
            out.append(Trace(name, _take(xs, keep, array), _take(ys, keep, array), {}))
        return out


class GnsSeries(Series):
    """B_simple against step, with the global batch as a dashed line when given."""

    title, y_title = "Gradient noise scale", "B_simple (samples)"

    def __init__(self, global_batch: int | None = None) -> None:
        super().__init__()
        self.global_batch = global_batch
        self._xs = _steps()
        self._ys = _values()
        self._extent: tuple[int, int] | None = None  # (first, last) step

    def _add(self, row: Mapping[str, Any]) -> bool:
        if row["rank"] is not None or row["name"] != "b_simple":
            return False
        step = row["step"]
        self._xs.append(step)
        self._ys.append(row["value"])
        lo, hi = self._extent or (step, step)
        self._extent = (min(lo, step), max(hi, step))
        return True

    def traces(self, max_points: int | None = None) -> list[Trace]:
        if not self._xs or self._extent is None:
            return []
        array = max_points is not None
        keep = _pick(len(self._xs), max_points)
        out = [Trace("B_simple", _take(self._xs, keep, array), _take(self._ys, keep, array), {})]
        if self.global_batch:
            x, y = list(self._extent), [float(self.global_batch)] * 2
            out.append(Trace("global batch", _take(x, None, array), _take(y, None, array), _GREY_DASH))
        return out


_GREY_DASH = {"line": {"dash": "dash", "color": "#888"}}
_RIGHT = {"xaxis": "x2", "yaxis": "y2"}  # the right-hand plot of a 1 x 2 subplot grid


class ThroughputSeries(Series):
    """Global samples/s (the sum over ranks, see :func:`global_throughput`) and one trace per
    rank "rank r". The global trace grows by the steps every rank has passed since the last
    call; a new rank or a step out of order recomputes it."""

    title, y_title = "Throughput", "samples/s"

    def __init__(self) -> None:
        super().__init__()
        self.ranks: dict[int, _RankSeries] = {}
        self._gx = _steps()
        self._gy = _values()
        self._upto: int | None = None  # the global trace is final up to this step

    def _add(self, row: Mapping[str, Any]) -> bool:
        if row["rank"] is None or row["name"] != "samples_per_s":
            return False
        series = self.ranks.get(row["rank"])
        if series is None:
            series = self.ranks[row["rank"]] = _RankSeries()
            self._reset()
        step = row["step"]
        if not series.set(step, row["value"]) and self._upto is not None and step <= self._upto:
            self._reset()
        return True

    def _reset(self) -> None:
        self._gx, self._gy, self._upto = _steps(), _values(), None

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
            keep = _pick(len(glob[0]), max_points)
            style = {"line": {"width": 3, "color": "#222"}}
            out.append(Trace("global", _take(glob[0], keep, array), _take(glob[1], keep, array), style))
        for i, (rank, series) in enumerate(sorted(self.ranks.items())):
            x, y = series.trace(max_points, array)
            out.append(Trace(f"rank {rank}", x, y, {"line": {"color": _colour(i)}}))
        return out


class StepTimeSeries(Series):
    """Compute, communication wait and data-loading time per step stacked (means over ranks),
    and the measured step time dashed. A part no rank measured is left out; at a step where
    only some parts were measured the missing ones count as 0."""

    title, y_title = "Step time split (mean over ranks)", "seconds per step"

    def __init__(self) -> None:
        super().__init__()
        self._parts = {name: _StepMeans() for name, _ in STEP_PARTS}
        self._union = _Steps()  # steps of the parts
        self._measured = _StepMeans()
        self._measured_steps = _Steps()
        # the means on the steps, kept up to date between redraws
        self._part_means = {name: _MeanColumn(means) for name, means in self._parts.items()}
        self._measured_means = _MeanColumn(self._measured)

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
        keep = _pick(len(steps), max_points)
        for name, label in STEP_PARTS:
            means = self._part_means[name].update(steps, changed)  # every part: they share `changed`
            if self._parts[name].sums:
                out.append(
                    Trace(
                        label, _take(steps, keep, array), _take(means, keep, array), {"stackgroup": "split"}
                    )
                )
        measured = self._measured_steps.steps
        if measured:
            means = self._measured_means.update(measured, self._measured_steps.take_low())
            keep = _pick(len(measured), max_points)
            out.append(
                Trace(
                    "step time",
                    _take(measured, keep, array),
                    _take(means, keep, array),
                    {"line": {"dash": "dash"}},
                )
            )
        return out


class GpuSeries(Series):
    """GPU utilization (%) and memory used (MB) per rank against step, side by side, with the
    largest memory total as a dashed line over the memory steps."""

    title = "GPUs"

    def __init__(self) -> None:
        super().__init__()
        self._util: dict[int, _RankSeries] = {}
        self._memory: dict[int, _RankSeries] = {}
        self._totals: dict[int, _RankSeries] = {}
        self._total: float | None = None  # the largest memory total
        self._memory_steps: tuple[int, int] | None = None  # (first, last) memory step

    def _add(self, row: Mapping[str, Any]) -> bool:
        rank, name = row["rank"], row["name"]
        table = {"utilization": self._util, "memory_used_mb": self._memory, "memory_total_mb": self._totals}
        if rank is None or name not in table:
            return False
        series = table[name].setdefault(rank, _RankSeries())
        fresh = series.set(row["step"], row["value"])
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

    def empty_figure(self) -> go.Figure:
        fig = make_subplots(rows=1, cols=2, subplot_titles=("utilization", "memory"))
        _titled(fig, self.title, "step", "")
        fig.update_yaxes(title_text="utilization (%)", row=1, col=1)
        fig.update_yaxes(title_text="memory used (MB)", row=1, col=2)
        return fig

    def traces(self, max_points: int | None = None) -> list[Trace]:
        array = max_points is not None
        out = []
        for i, (rank, series) in enumerate(sorted(self._util.items())):
            x, y = series.trace(max_points, array)
            out.append(Trace(f"rank {rank} utilization", x, y, {"line": {"color": _colour(i)}}))
        for i, (rank, series) in enumerate(sorted(self._memory.items())):
            x, y = series.trace(max_points, array)
            out.append(
                Trace(f"rank {rank} memory", x, y, {"line": {"color": _colour(i), "dash": "dot"}, **_RIGHT})
            )
        if self._total is not None and self._memory_steps is not None:
            x, y = list(self._memory_steps), [self._total] * 2
            out.append(
                Trace("memory total", _take(x, None, array), _take(y, None, array), {**_GREY_DASH, **_RIGHT})
            )
        return out


# -- shared layout -------------------------------------------------------------------------------


def _colour(i: int) -> str:
    palette = qualitative.Plotly
    return palette[i % len(palette)]


# The layout part of plotly's default template, which is all that line charts use: the full
# template (defaults for every trace type) costs ~10 ms of validation per figure widget.
_TEMPLATE_KEYS = (
    "autotypenumbers", "colorway", "font", "hovermode", "hoverlabel", "paper_bgcolor", "plot_bgcolor",
    "xaxis", "yaxis", "annotationdefaults", "title",
)  # fmt: skip
_TEMPLATE: list[go.layout.Template] = []


def _template() -> go.layout.Template:
    if not _TEMPLATE:
        layout = pio.templates["plotly"].layout.to_plotly_json()
        _TEMPLATE.append(go.layout.Template(layout={k: layout[k] for k in _TEMPLATE_KEYS if k in layout}))
    return _TEMPLATE[0]


def _titled(fig: go.Figure, title: str, x: str, y: str, *, log_x: bool = False) -> go.Figure:
    """Set the title, axis titles and the shared look; ``uirevision`` keeps zoom across redraws."""
    fig.update_layout(
        template=_template(),
        title={"text": title},
        height=HEIGHT,
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        uirevision="dtwork",
        legend={"orientation": "h", "y": -0.25},
    )
    fig.update_xaxes(title_text=x, type="log" if log_x else None)
    fig.update_yaxes(title_text=y)
    return fig


def no_data_note(text: str = NO_DATA) -> dict[str, Any]:
    """The centred "no data yet" annotation (named NO_DATA_NAME)."""
    return {
        "name": NO_DATA_NAME,
        "text": text,
        "x": 0.5,
        "y": 0.5,
        "xref": "paper",
        "yref": "paper",
        "showarrow": False,
        "font": {"size": 16, "color": "#888"},
    }


_STACKED: dict[tuple[type, ...], dict[str, Any]] = {}  # stacked_figure() by series classes


def row_axes(row: int) -> tuple[str, str]:
    """The x and y axis names of a stacked figure's row (1-based): ("x", "y"), ("x2", "y2"), ..."""
    suffix = "" if row == 1 else str(row)
    return f"x{suffix}", f"y{suffix}"


def stacked_figure(series: Sequence[Series]) -> dict[str, Any]:
    """Empty figures of ``series`` as the rows of one figure, as a plotly dict: each row titled, its
    axes titled and "no data yet" in its middle (an annotation named NO_DATA_NAME on the row's axes),
    and one empty trace per row (no name, no legend entry) so that plotly draws its axes; one legend,
    its traces grouped by row. The live dashboard draws several series in one figure
    widget: a redraw then updates them all in one message instead of one per figure. Built once per
    kind of series (plotly's layout validation is slow)."""
    key = tuple(type(s) for s in series)
    if key not in _STACKED:
        n = len(series)
        fig = make_subplots(
            rows=n, cols=1, subplot_titles=[s.title for s in series], vertical_spacing=0.3 / n
        )
        fig.update_layout(
            template=_template(),
            height=HEIGHT * n,
            margin={"l": 60, "r": 20, "t": 40, "b": 50},
            uirevision="dtwork",
            legend={"groupclick": "toggleitem", "tracegroupgap": 24, "traceorder": "grouped"},
        )
        for row, s in enumerate(series, 1):
            fig.update_xaxes(title_text=s.x_title, row=row, col=1)
            fig.update_yaxes(title_text=s.y_title, row=row, col=1)
            xa, ya = row_axes(row)
            fig.add_annotation(**{**no_data_note(), "xref": f"{xa} domain", "yref": f"{ya} domain"})
            # plotly draws no axes for a row without a trace: an empty one keeps every row on screen
            fig.add_trace(
                go.Scatter(x=[], y=[], name="", xaxis=xa, yaxis=ya, showlegend=False, hoverinfo="skip")
            )
        _STACKED[key] = fig.to_dict()
    return copy.deepcopy(_STACKED[key])


def _no_data(fig: go.Figure, text: str = NO_DATA) -> go.Figure:
    """Add the "no data yet" annotation."""
    fig.add_annotation(**no_data_note(text))
    return fig


def _line(x: Sequence[float], y: Sequence[float], name: str, **kw: Any) -> go.Scatter:
    """A line trace; numpy arrays stay arrays (plotly validates lists item by item, slowly)."""
    x = x if isinstance(x, np.ndarray) else list(x)
    y = y if isinstance(y, np.ndarray) else list(y)
    return go.Scatter(x=x, y=y, name=name, mode=kw.pop("mode", "lines"), **kw)


# -- training figures ----------------------------------------------------------------------------


def metrics_figure(rows: Iterable[Mapping[str, Any]], names: Sequence[str] | None = None) -> go.Figure:
    """Plot each aggregated metric against step, one trace per metric named after it.

    ``names`` picks and orders the metrics; by default every aggregated metric except the
    noise-scale ones (see :func:`gns_figure`), in the order they first appear.
    """
    return MetricsSeries(names).add(rows).figure()


def throughput_figure(rows: Iterable[Mapping[str, Any]]) -> go.Figure:
    """Plot global samples/s (the sum over ranks at each step) and one trace per rank "rank r"."""
    return ThroughputSeries().add(rows).figure()


def step_time_figure(rows: Iterable[Mapping[str, Any]]) -> go.Figure:
    """Stack compute, communication wait and data-loading time per step (means over ranks).

    A part no rank measured (e.g. communication wait on a backend without timing) is left out;
    a step where only some parts were measured counts the missing ones as 0. The measured
    step time is drawn as a dashed line: the gap above the stack is time not accounted for.
    """
    return StepTimeSeries().add(rows).figure()


def gpu_figure(rows: Iterable[Mapping[str, Any]]) -> go.Figure:
    """Plot GPU utilization (%) and memory used (MB) against step, per rank, side by side."""
    return GpuSeries().add(rows).figure()


def gns_figure(rows: Iterable[Mapping[str, Any]], global_batch: int | None = None) -> go.Figure:
    """Plot the gradient noise scale B_simple = tr(Sigma)/|G|^2 against step.

    With ``global_batch`` a dashed line marks the current global batch: well below B_simple
    wastes steps, well above wastes examples (McCandlish et al. 2018, arXiv:1812.06162).
    """
    return GnsSeries(global_batch).add(rows).figure()


# -- analysis figures ----------------------------------------------------------------------------


def scaling_figure(result: ScalingResult | None) -> go.Figure:
    """Plot throughput against ranks with the ideal line, and efficiency and comm share beside it.

    Ideal throughput is (n/n0) T(n0), i.e. n T(1) with a 1-rank baseline; efficiency is
    T(n) / ideal(n); comm share is communication time / step time (both as fractions).
    """
    fig = make_subplots(rows=1, cols=2, subplot_titles=("throughput", "efficiency"))
    mode = result.mode if result is not None else "scaling"
    _titled(fig, f"{mode.capitalize()} scaling", "ranks", "")
    fig.update_yaxes(title_text="samples/s", row=1, col=1)
    fig.update_yaxes(title_text="fraction", tickformat=".0%", rangemode="tozero", row=1, col=2)
    if result is None or not result.points:
        return _no_data(fig)
    sizes = [p.world_size for p in result.points]
    fig.update_xaxes(tickvals=sizes)
    fig.update_layout(title={"text": f"{mode.capitalize()} scaling<br><sup>{result.headline()}</sup>"})
    ideal, eff, comm = result.ideal(), result.efficiencies(), result.comm_share()
    fig.add_trace(_line(sizes, [p.throughput for p in result.points], "measured", mode="lines+markers"), 1, 1)
    fig.add_trace(_line(sizes, [ideal[n] for n in sizes], "ideal", line={"dash": "dash"}), 1, 1)
    fig.add_trace(_line(sizes, [eff[n] for n in sizes], "efficiency", mode="lines+markers"), 1, 2)
    fig.add_trace(_line(sizes, [comm[n] for n in sizes], "comm share", mode="lines+markers"), 1, 2)
    return fig


def bucket_figure(results: Mapping[float, float] | None) -> go.Figure:
    """Plot step time against DDP bucket size (MB, log x) and mark the fastest bucket."""
    fig = _titled(go.Figure(), "DDP bucket size", "bucket size (MB)", "step time (s)", log_x=True)
    if not results:
        return _no_data(fig)
    points = sorted((float(mb), float(seconds)) for mb, seconds in results.items())
    fig.add_trace(_line([mb for mb, _ in points], [t for _, t in points], "step time", mode="lines+markers"))
    best = best_bucket(results)
    fig.add_trace(
        _line(
            [float(best)],
            [float(results[best])],
            "fastest",
            mode="markers",
            marker={"size": 14, "symbol": "star"},
        )
    )
    return fig


def _geometric(lo: float, hi: float, n: int) -> list[float]:
    ratio = (hi / lo) ** (1.0 / (n - 1))
    return [lo * ratio**i for i in range(n)]


def tradeoff_figure(b_noise: float | None, current_batch: float | None = None) -> go.Figure:
    """Plot the steps/examples trade-off (S/S_min - 1)(E/E_min - 1) = 1, the current batch marked.

    Each batch size B gives S/S_min = 1 + B_noise/B and E/E_min = 1 + B/B_noise (McCandlish
    et al. 2018, eq. 2.11); the curve spans B_noise/64 .. 64 B_noise on log axes.
    """
    title = "Steps vs examples trade-off"
    fig = _titled(go.Figure(), title, "examples / minimum examples", "steps / minimum steps")
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    b = _number(b_noise)
    if b is None or b <= 0:
        return _no_data(fig)
    fig.update_layout(title={"text": f"{title} (B_noise ~ {b:.0f})"})
    curve = tradeoff_curve(b, _geometric(b / 64, b * 64, 129))
    text = [f"B = {batch:.0f}" for batch, _, _ in curve]
    fig.add_trace(_line([e for _, _, e in curve], [s for _, s, _ in curve], "trade-off", text=text))
    s, e = tradeoff(b, b)
    fig.add_trace(_line([e], [s], "B = B_noise", mode="markers", marker={"size": 9, "color": "#888"}))
    batch = _number(current_batch)
    if batch is not None and batch > 0:
        s, e = tradeoff(b, batch)
        marker = {"size": 14, "symbol": "star"}
        fig.add_trace(_line([e], [s], f"current batch {batch:.0f}", mode="markers", marker=marker))
    return fig
