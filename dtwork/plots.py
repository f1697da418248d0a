"""Pure figure builders: rank records or store rows -> plotly figures.

The live dashboard and the notebook reports call the same functions on the same data, so a
run looks the same while it trains and afterwards. Every figure function takes *rows*
(``{"step", "rank", "name", "value", "time"}``, as ``RunStore.metrics(..., rank="all")``
returns them); :func:`rows_from_records` turns rank records into rows the way the store does
("log" and "gns" records become aggregated rows with rank None, the others per-rank rows).

Every figure is titled, has labelled axes, keeps its traces' x/y as plain lists of numbers and
draws an empty input as an empty figure with a "no data yet" annotation instead of raising.
No widgets and no torch here.
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.colors import qualitative
from plotly.subplots import make_subplots

from dtwork.analysis.gns import tradeoff, tradeoff_curve
from dtwork.analysis.scaling import ScalingResult, best_bucket

__all__ = [
    "GNS_NAMES",
    "GPU_NAMES",
    "NO_DATA",
    "NO_DATA_NAME",
    "PERF_NAMES",
    "bucket_figure",
    "global_throughput",
    "gns_figure",
    "gpu_figure",
    "latest_by_rank",
    "metric_names",
    "metrics_figure",
    "row_kind",
    "rows_from_records",
    "scaling_figure",
    "step_time_figure",
    "throughput_figure",
    "tradeoff_figure",
]

Row = dict[str, Any]

NO_DATA = "no data yet"
NO_DATA_NAME = "dtwork-no-data"  # the name of the "no data yet" annotation
AGGREGATED_KINDS = ("log", "gns")  # record kinds stored with rank None
GNS_NAMES = ("b_simple", "g2", "trace_sigma")
PERF_NAMES = ("samples_per_s", "step_time", "compute_time", "comm_time", "data_time")
GPU_NAMES = ("utilization", "memory_used_mb", "memory_total_mb")
STEP_PARTS = (("compute_time", "compute"), ("comm_time", "communication wait"), ("data_time", "data loading"))
HEIGHT = 320


# -- rows ----------------------------------------------------------------------------------------


def _number(value: Any) -> float | None:
    """Return ``value`` as a finite float, or None (missing, NaN, infinite, not a number)."""
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def _row(step: Any, rank: Any, name: Any, value: Any, time: Any) -> Row | None:
    number = _number(value)
    if step is None or name is None or number is None:
        return None
    return {
        "step": int(step),
        "rank": None if rank is None else int(rank),
        "name": str(name),
        "value": number,
        "time": _number(time),
    }


def _rows_of(item: Mapping[str, Any]) -> list[Row | None]:
    if "values" in item:
        rank = None if item.get("kind") in AGGREGATED_KINDS else item.get("rank")
        values = item.get("values") or {}
        return [_row(item.get("step"), rank, k, v, item.get("time")) for k, v in values.items()]
    if "name" in item:
        return [_row(item.get("step"), item.get("rank"), item["name"], item.get("value"), item.get("time"))]
    return []


def rows_from_records(records: Iterable[Mapping[str, Any]]) -> list[Row]:
    """Flatten rank records (or pass store rows through) to rows ``{step, rank, name, value, time}``.

    A record ``{"kind", "step", "rank", "time", "values": {name: value}}`` gives one row per
    value; "log" and "gns" records get rank None (aggregated over ranks), as in the store.
    Items that already are rows (they have a ``name``) are normalised. Records without values
    (events) and non-finite or missing values are left out, so traces hold plain numbers.
    """
    out: list[Row] = []
    for item in records:
        out.extend(r for r in _rows_of(item) if r is not None)
    return out


def row_kind(row: Mapping[str, Any]) -> str:
    """Return the record kind a row came from: "log", "gns", "perf" or "gpu" (by rank and name)."""
    if row.get("rank") is None:
        return "gns" if row.get("name") in GNS_NAMES else "log"
    return "gpu" if row.get("name") in GPU_NAMES else "perf"


def metric_names(rows: Iterable[Mapping[str, Any]]) -> list[str]:
    """Return the aggregated metric names in first-seen order, noise-scale names excluded."""
    seen: dict[str, None] = {}
    for r in rows:
        if r["rank"] is None and r["name"] not in GNS_NAMES:
            seen.setdefault(r["name"], None)
    return list(seen)


def _series(rows: Iterable[Mapping[str, Any]], name: str) -> tuple[list[int], list[float]]:
    """Return the (steps, values) of the aggregated metric ``name`` in row order."""
    pairs = [(r["step"], r["value"]) for r in rows if r["rank"] is None and r["name"] == name]
    return [s for s, _ in pairs], [v for _, v in pairs]


def _by_rank(rows: Iterable[Mapping[str, Any]], name: str) -> dict[int, dict[int, float]]:
    """Return {rank: {step: value}} for the per-rank metric ``name`` (the last value of a step wins)."""
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r["rank"] is not None and r["name"] == name:
            out[r["rank"]][r["step"]] = r["value"]
    return dict(sorted(out.items()))


def _mean_over_ranks(rows: Iterable[Mapping[str, Any]], name: str) -> dict[int, float]:
    """Return {step: mean over the ranks that reported ``name`` at that step}."""
    by_step: dict[int, list[float]] = defaultdict(list)
    for values in _by_rank(rows, name).values():
        for step, v in values.items():
            by_step[step].append(v)
    return {s: sum(vs) / len(vs) for s, vs in sorted(by_step.items())}


def global_throughput(rows: Iterable[Mapping[str, Any]]) -> tuple[list[int], list[float]]:
    """Return (steps, global samples/s): the sum over ranks of ``samples_per_s`` at each step.

    Ranks report throughput over short windows, each at its own steps, so every rank's latest
    value at or before a step is carried forward. Only steps every reporting rank has reached
    are summed, so a step still in flight on some ranks does not show as a dip.
    """
    per_rank = _by_rank(rows, "samples_per_s")
    if not per_rank:
        return [], []
    first = max(min(values) for values in per_rank.values())
    last = min(max(values) for values in per_rank.values())
    steps = sorted({s for values in per_rank.values() for s in values if first <= s <= last})
    keyed = [(sorted(values), values) for values in per_rank.values()]
    out = [sum(values[keys[bisect.bisect_right(keys, step) - 1]] for keys, values in keyed) for step in steps]
    return steps, out


def latest_by_rank(rows: Iterable[Mapping[str, Any]], name: str) -> dict[int, float]:
    """Return {rank: value at the rank's highest step} for the per-rank metric ``name``."""
    return {rank: values[max(values)] for rank, values in _by_rank(rows, name).items() if values}


# -- shared layout -------------------------------------------------------------------------------


def _colour(i: int) -> str:
    palette = qualitative.Plotly
    return palette[i % len(palette)]


def _titled(fig: go.Figure, title: str, x: str, y: str, *, log_x: bool = False) -> go.Figure:
    """Set the title, axis titles and the shared look; ``uirevision`` keeps zoom across redraws."""
    fig.update_layout(
        title={"text": title},
        height=HEIGHT,
        margin={"l": 60, "r": 20, "t": 60, "b": 50},
        uirevision="dtwork",
        legend={"orientation": "h", "y": -0.25},
    )
    fig.update_xaxes(title_text=x, type="log" if log_x else None)
    fig.update_yaxes(title_text=y)
    return fig


def _no_data(fig: go.Figure, text: str = NO_DATA) -> go.Figure:
    """Add the centred "no data yet" annotation (named NO_DATA_NAME)."""
    fig.add_annotation(
        name=NO_DATA_NAME,
        text=text,
        x=0.5,
        y=0.5,
        xref="paper",
        yref="paper",
        showarrow=False,
        font={"size": 16, "color": "#888"},
    )
    return fig


def _line(x: Sequence[float], y: Sequence[float], name: str, **kw: Any) -> go.Scatter:
    return go.Scatter(x=list(x), y=list(y), name=name, mode=kw.pop("mode", "lines"), **kw)


# -- training figures ----------------------------------------------------------------------------


def metrics_figure(rows: Sequence[Mapping[str, Any]], names: Sequence[str] | None = None) -> go.Figure:
    """Plot each aggregated metric against step, one trace per metric named after it.

    ``names`` picks and orders the metrics; by default every aggregated metric except the
    noise-scale ones (see :func:`gns_figure`), in the order they first appear.
    """
    fig = _titled(go.Figure(), "Metrics", "step", "value")
    for name in metric_names(rows) if names is None else names:
        steps, values = _series(rows, name)
        if steps:
            fig.add_trace(_line(steps, values, name))
    return fig if fig.data else _no_data(fig)


def throughput_figure(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Plot global samples/s (the sum over ranks at each step) and one trace per rank "rank r"."""
    fig = _titled(go.Figure(), "Throughput", "step", "samples/s")
    steps, total = global_throughput(rows)
    if steps:
        fig.add_trace(_line(steps, total, "global", line={"width": 3, "color": "#222"}))
    for i, (rank, values) in enumerate(_by_rank(rows, "samples_per_s").items()):
        fig.add_trace(_line(list(values), list(values.values()), f"rank {rank}", line={"color": _colour(i)}))
    return fig if fig.data else _no_data(fig)


def step_time_figure(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Stack compute, communication wait and data-loading time per step (means over ranks).

    A part no rank measured (e.g. communication wait on a backend without timing) is left out;
    a step where only some parts were measured counts the missing ones as 0. The measured
    step time is drawn as a dashed line: the gap above the stack is time not accounted for.
    """
    fig = _titled(go.Figure(), "Step time split (mean over ranks)", "step", "seconds per step")
    parts = {label: _mean_over_ranks(rows, name) for name, label in STEP_PARTS}
    parts = {label: means for label, means in parts.items() if means}
    steps = sorted({s for means in parts.values() for s in means})
    for label, means in parts.items():
        fig.add_trace(_line(steps, [means.get(s, 0.0) for s in steps], label, stackgroup="split"))
    measured = _mean_over_ranks(rows, "step_time")
    if measured:
        fig.add_trace(_line(list(measured), list(measured.values()), "step time", line={"dash": "dash"}))
    return fig if fig.data else _no_data(fig)


def gpu_figure(rows: Sequence[Mapping[str, Any]]) -> go.Figure:
    """Plot GPU utilization (%) and memory used (MB) against step, per rank, side by side."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("utilization", "memory"))
    _titled(fig, "GPUs", "step", "")
    fig.update_yaxes(title_text="utilization (%)", row=1, col=1)
    fig.update_yaxes(title_text="memory used (MB)", row=1, col=2)
    memory = _by_rank(rows, "memory_used_mb")
    for i, (rank, values) in enumerate(_by_rank(rows, "utilization").items()):
        line = {"color": _colour(i)}
        fig.add_trace(_line(list(values), list(values.values()), f"rank {rank} utilization", line=line), 1, 1)
    for i, (rank, values) in enumerate(memory.items()):
        line = {"color": _colour(i), "dash": "dot"}
        fig.add_trace(_line(list(values), list(values.values()), f"rank {rank} memory", line=line), 1, 2)
    totals = [v for values in _by_rank(rows, "memory_total_mb").values() for v in values.values()]
    steps = [s for values in memory.values() for s in values]
    if totals and steps:
        x, y = [min(steps), max(steps)], [max(totals)] * 2
        fig.add_trace(_line(x, y, "memory total", line={"color": "#888", "dash": "dash"}), 1, 2)
    return fig if fig.data else _no_data(fig)


def gns_figure(rows: Sequence[Mapping[str, Any]], global_batch: int | None = None) -> go.Figure:
    """Plot the gradient noise scale B_simple = tr(Sigma)/|G|^2 against step.

    With ``global_batch`` a dashed line marks the current global batch: well below B_simple
    wastes steps, well above wastes examples (McCandlish et al. 2018, arXiv:1812.06162).
    """
    fig = _titled(go.Figure(), "Gradient noise scale", "step", "B_simple (samples)")
    steps, values = _series(rows, "b_simple")
    if not steps:
        return _no_data(fig)
    fig.add_trace(_line(steps, values, "B_simple"))
    if global_batch:
        x, y = [min(steps), max(steps)], [float(global_batch)] * 2
        fig.add_trace(_line(x, y, "global batch", line={"dash": "dash", "color": "#888"}))
    return fig


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
