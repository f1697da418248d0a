"""Figures: series and analysis results -> titled plotly figures, in the house style.

Every figure function takes *rows* (:class:`dtwork.shared.records.Row`, as ``RunStore.metrics(...,
rank="all")`` returns them and :func:`dtwork.shared.records.to_rows` makes them from rank records); rows
without a finite value are skipped. Every figure is titled, has labelled axes, keeps its traces'
x/y as plain lists of numbers (the dashboard's thinned traces are numpy arrays) and draws an empty
input as an empty figure with a "no data yet" annotation instead of raising. No widgets, no torch.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
import plotly.io as pio
from plotly.subplots import make_subplots

from dtwork.analysis.gns import tradeoff, tradeoff_curve
from dtwork.analysis.scaling import ScalingResult, best_bucket
from dtwork.plots.columns import Points
from dtwork.plots.palette import metric_colour
from dtwork.plots.rank_series import GpuSeries, StepTimeSeries, ThroughputSeries
from dtwork.plots.series import AxisLayout, GnsSeries, MetricsSeries, Series, Trace
from dtwork.shared.records import finite

__all__ = [
    "HEIGHT",
    "LIVE_ROW_HEIGHT",
    "NO_DATA",
    "NO_DATA_NAME",
    "bucket_figure",
    "mark_segments",
    "dashboard_figure",
    "empty_figure",
    "gns_figure",
    "gpu_figure",
    "loading_figure",
    "metrics_figure",
    "no_data_note",
    "on_row",
    "row_axes",
    "row_legend",
    "scaling_figure",
    "scatter",
    "series_figure",
    "stacked_figure",
    "step_time_figure",
    "throughput_figure",
    "tradeoff_figure",
]

NO_DATA = "no data yet"
NO_DATA_NAME = "dtwork-no-data"  # the name of the "no data yet" annotation
HEIGHT = 320
LIVE_ROW_HEIGHT = 180  # px a row of the live dashboard takes: three rows and the header fit one screen
SUBTITLE_ROOM = 40  # px above the plots for a title's subtitle


# -- the house style -----------------------------------------------------------------------------

# The layout part of plotly's default template, which is all that line charts use: the full
# template (defaults for every trace type) makes every figure widget slow to validate.
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
        autosize=True,
        legend={"orientation": "h", "y": -0.25},
    )
    fig.update_xaxes(title_text=x, type="log" if log_x else None)
    fig.update_yaxes(title_text=y)
    return fig


def no_data_note(text: str = NO_DATA) -> dict[str, object]:
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


def _no_data(fig: go.Figure, text: str = NO_DATA) -> go.Figure:
    """Add the "no data yet" annotation."""
    fig.add_annotation(**no_data_note(text))
    return fig


def _line(x: Points | Sequence[float], y: Points | Sequence[float], name: str, **kw: object) -> go.Scatter:
    """A line trace; numpy arrays stay arrays (plotly validates lists item by item, slowly)."""
    x = x if isinstance(x, np.ndarray) else list(x)
    y = y if isinstance(y, np.ndarray) else list(y)
    return go.Scatter(x=x, y=y, name=name, mode=kw.pop("mode", "lines"), **kw)


def scatter(trace: Trace) -> go.Scatter:
    """The plotly trace of a series' trace, in its metric's colour unless its style sets one."""
    style = trace.style
    line = style.get("line") or {}
    if "color" not in line and "fillcolor" not in style and "marker" not in style:
        style = {**style, "line": {**line, "color": metric_colour(trace.name)}}
    return _line(trace.x, trace.y, trace.name, **style)


# -- series figures ------------------------------------------------------------------------------

_EMPTY: dict[type, dict[str, object]] = {}  # empty_figure() by class of series


def _blank(series: Series) -> go.Figure:
    """The titled figure of ``series`` without traces (side-by-side plots for a series that has them)."""
    if not series.subplots:
        return _titled(go.Figure(), series.title, series.x_title, series.y_title)
    fig = make_subplots(rows=1, cols=len(series.subplots), subplot_titles=[t for t, _ in series.subplots])
    _titled(fig, series.title, series.x_title, "")
    for col, (_, y_title) in enumerate(series.subplots, 1):
        fig.update_yaxes(title_text=y_title, row=1, col=col)
    return fig


def _assemble(series: Series, traces: Sequence[Trace]) -> go.Figure:
    """The figure of ``series`` with these traces on the axis that fits them; "no data yet" without any."""
    fig = _blank(series)
    fig.add_traces([scatter(t) for t in traces])
    if not traces:
        return _no_data(fig)
    if not series.subplots:
        fig.update_yaxes(**series.y_axis(traces))
    return fig


def series_figure(series: Series, max_points: int | None = None) -> go.Figure:
    """The whole figure of ``series``; "no data yet" when there is nothing to draw."""
    return _assemble(series, series.traces(max_points))


def empty_figure(series: Series) -> dict[str, object]:
    """The figure of ``series`` without data ("no data yet") as a plotly dict, built once per class
    of series: the live dashboard starts every cell's figures from it without validating plotly's
    layout again."""
    key = type(series)
    if key not in _EMPTY:
        _EMPTY[key] = _assemble(series, []).to_dict()
    return copy.deepcopy(_EMPTY[key])


_STACKED: dict[tuple[type, ...], dict[str, object]] = {}  # stacked_figure() by series classes


def row_axes(row: int) -> tuple[str, str]:
    """The x and y axis names of a stacked figure's row (1-based): ("x", "y"), ("x2", "y2"), ..."""
    suffix = "" if row == 1 else str(row)
    return f"x{suffix}", f"y{suffix}"


def row_legend(row: int) -> str:
    """The name of a stacked figure's row's legend (1-based): "legend", "legend2", ..."""
    return "legend" if row == 1 else f"legend{row}"


def _stack(panels: Sequence[tuple[str, str]], title: str = "", row_height: int = HEIGHT) -> go.Figure:
    """Rows of one figure, each (title, y title) with its own axes and its own legend beside it."""
    n = len(panels)
    fig = make_subplots(rows=n, cols=1, subplot_titles=[t for t, _ in panels], vertical_spacing=0.3 / n)
    fig.update_layout(
        template=_template(),
        height=row_height * n + (40 if title else 0),
        autosize=True,
        showlegend=True,  # every row's legend, also one with a single trace
        margin={"l": 60, "r": 20, "t": 80 if title else 40, "b": 50},
        uirevision="dtwork",
    )
    if title:
        fig.update_layout(title={"text": title, "x": 0, "xanchor": "left", "font": {"size": 14}})
    for row, (_, y_title) in enumerate(panels, 1):
        # every row's x is the step: said once, under the last row (above it, the next row's title)
        fig.update_xaxes(title_text="step" if row == n else None, row=row, col=1)
        fig.update_yaxes(title_text=y_title, row=row, col=1)
        top = fig.layout[row_axes(row)[1].replace("y", "yaxis", 1)].domain[1]
        fig.update_layout(
            {row_legend(row): {"x": 1.01, "xanchor": "left", "y": top, "yanchor": "top", "tracegroupgap": 4}}
        )
    return fig


def _on_row(trace: Trace, row: int) -> Trace:
    """The trace drawn on a stacked figure's row: its axes and its legend."""
    xa, ya = row_axes(row)
    return trace._replace(style={**trace.style, "xaxis": xa, "yaxis": ya, "legend": row_legend(row)})


def stacked_figure(series: Sequence[Series]) -> dict[str, object]:
    """Empty figures of ``series`` as the rows of one figure, as a plotly dict.

    Each row has its title, its axes and its legend, "no data yet" in its middle (an annotation
    named NO_DATA_NAME on the row's axes) and one empty trace (no name, no legend entry) so that
    plotly draws its axes. The live dashboard draws several series in one figure widget so that a
    redraw updates them all in one message. Built once per classes of series (plotly's layout
    validation is slow)."""
    key = tuple(type(s) for s in series)
    if key not in _STACKED:
        fig = _stack([(s.title, s.y_title) for s in series], row_height=LIVE_ROW_HEIGHT)
        for row in range(1, len(series) + 1):
            xa, ya = row_axes(row)
            fig.add_annotation(**{**no_data_note(), "xref": f"{xa} domain", "yref": f"{ya} domain"})
            # plotly draws no axes for a row without a trace: an empty one keeps every row on screen
            fig.add_trace(
                go.Scatter(x=[], y=[], name="", xaxis=xa, yaxis=ya, showlegend=False, hoverinfo="skip")
            )
        _STACKED[key] = fig.to_dict()
    return copy.deepcopy(_STACKED[key])


def on_row(trace: Trace, row: int) -> go.Scatter:
    """The plotly trace of a series' trace drawn on row ``row`` of a :func:`stacked_figure`."""
    return scatter(_on_row(trace, row))


def dashboard_figure(parts: Sequence[tuple[Series, Sequence[Trace]]], title: str = "") -> go.Figure:
    """Series with their traces as the rows of one static figure (what a finished cell's live view
    leaves in the notebook): each row with its own axes, the y axis that fits it, and its own legend.
    A series of side-by-side plots (the GPUs) takes a row for each."""
    rows: list[tuple[str, str, list[Trace], AxisLayout]] = []
    for series, traces in parts:
        if not series.subplots:
            rows.append((series.title, series.y_title, list(traces), series.y_axis(traces)))
            continue
        for col, (sub_title, y_title) in enumerate(series.subplots, 1):
            xa = "x" if col == 1 else f"x{col}"
            mine = [t for t in traces if t.style.get("xaxis", "x") == xa]
            rows.append((f"{series.title}: {sub_title}", y_title, mine, {}))
    fig = _stack([(t, y) for t, y, _, _ in rows], title, row_height=LIVE_ROW_HEIGHT)  # as compact as live
    for row, (_, _, traces, axis) in enumerate(rows, 1):
        fig.add_traces([on_row(t, row) for t in traces])
        if axis:
            fig.update_yaxes(axis, row=row, col=1)
        if not traces:
            xa, ya = row_axes(row)
            fig.add_annotation(**{**no_data_note(), "xref": f"{xa} domain", "yref": f"{ya} domain"})
    return fig


# -- training figures ----------------------------------------------------------------------------


def metrics_figure(rows: Iterable[Mapping[str, object]], names: Sequence[str] | None = None) -> go.Figure:
    """Plot each aggregated metric against step, one trace per metric named after it.

    ``names`` picks and orders the metrics; by default every logged metric (kind "log"), in the
    order they first appear.
    """
    return series_figure(MetricsSeries(names).add(rows))


def throughput_figure(rows: Iterable[Mapping[str, object]]) -> go.Figure:
    """Plot global samples/s (the sum over ranks at each step) and one trace per rank "rank r"."""
    return series_figure(ThroughputSeries().add(rows))


def step_time_figure(rows: Iterable[Mapping[str, object]]) -> go.Figure:
    """Stack compute, communication wait and data-loading time per step (means over ranks).

    A part no rank measured (e.g. communication wait on a backend without timing) is left out;
    a step where only some parts were measured counts the missing ones as 0. The measured
    step time is drawn as a dashed line: the gap above the stack is time not accounted for.
    """
    return series_figure(StepTimeSeries().add(rows))


def gpu_figure(rows: Iterable[Mapping[str, object]]) -> go.Figure:
    """Plot GPU utilization (%) and memory used (MB) against step, per rank, side by side."""
    return series_figure(GpuSeries().add(rows))


def gns_figure(rows: Iterable[Mapping[str, object]], global_batch: int | None = None) -> go.Figure:
    """Plot the gradient noise scale B_simple = tr(Sigma)/|G|^2 against step.

    With ``global_batch`` a dashed line marks the current global batch: well below B_simple
    wastes steps, well above wastes examples (McCandlish et al. 2018, arXiv:1812.06162).
    """
    return series_figure(GnsSeries(global_batch).add(rows))


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
    # the headline as a subtitle at the top of the figure, with room below it for the subplots'
    # titles (a title's line break overlaps them)
    fig.update_layout(
        title={
            "text": f"{mode.capitalize()} scaling",
            "subtitle": {"text": result.headline()},
            "y": 0.97,
            "yanchor": "top",
            "yref": "container",
        },
        height=HEIGHT + SUBTITLE_ROOM,
        margin={"t": 60 + SUBTITLE_ROOM},
    )
    ideal, eff, comm = result.ideal(), result.efficiencies(), result.comm_share()
    tput = {p.world_size: p.throughput for p in result.points}
    spans = {p.world_size: (p.low, p.high) for p in result.points if p.low is not None and p.high is not None}
    measured = _line(
        sizes, list(tput.values()), "measured", mode="lines+markers", error_y=_bars(sizes, tput, spans)
    )
    fig.add_trace(measured, 1, 1)
    fig.add_trace(_line(sizes, [ideal[n] for n in sizes], "ideal", line={"dash": "dash"}), 1, 1)
    bars = _bars(sizes, eff, result.efficiency_intervals())  # 95% intervals, where measured
    fig.add_trace(
        _line(sizes, [eff[n] for n in sizes], "efficiency", mode="lines+markers", error_y=bars), 1, 2
    )
    fig.add_trace(_line(sizes, [comm[n] for n in sizes], "comm share", mode="lines+markers"), 1, 2)
    return fig


def _bars(
    sizes: Sequence[int], mid: Mapping[int, float], bounds: Mapping[int, tuple[float, float]]
) -> dict[str, object] | None:
    """Asymmetric error bars from (low, high) bounds; none where a size has no bounds."""
    if not bounds:
        return None
    up = [bounds[n][1] - mid[n] if n in bounds else 0.0 for n in sizes]
    down = [mid[n] - bounds[n][0] if n in bounds else 0.0 for n in sizes]
    return {"type": "data", "symmetric": False, "array": up, "arrayminus": down}


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
    b = finite(b_noise)
    if b is None or b <= 0:
        return _no_data(fig)
    fig.update_layout(title={"text": f"{title} (B_noise ~ {b:.0f})"})
    curve = tradeoff_curve(b, _geometric(b / 64, b * 64, 129))
    text = [f"B = {batch:.0f}" for batch, _, _ in curve]
    fig.add_trace(_line([e for _, _, e in curve], [s for _, s, _ in curve], "trade-off", text=text))
    s, e = tradeoff(b, b)
    fig.add_trace(_line([e], [s], "B = B_noise", mode="markers", marker={"size": 9, "color": "#888"}))
    batch = finite(current_batch)
    if batch is not None and batch > 0:
        s, e = tradeoff(b, batch)
        marker = {"size": 14, "symbol": "star"}
        fig.add_trace(_line([e], [s], f"current batch {batch:.0f}", mode="markers", marker=marker))
    return fig


def loading_figure(real: float, synthetic: float, title: str) -> go.Figure:
    """Bar the samples/s on the loader's batches against synthetic ones of the same shape."""
    fig = go.Figure(go.Bar(x=["real batches", "synthetic batches"], y=[real, synthetic]))
    fig.update_layout(title=title, yaxis_title="samples/s", template="plotly_white")
    return fig


def mark_segments(fig: go.Figure, starts: Iterable[int], color: str = "#888888") -> go.Figure:
    """Mark where each later segment of a run began (a training cell that went on with its steps):
    a dotted vertical line, named "segment", at each first step but the run's first."""
    try:  # a figure of subplots (compare's panels) gets the line in every panel
        fig.get_subplot(1, 1)
        where: dict[str, object] = {"row": "all", "col": 1}
    except Exception:
        where = {}
    for step in sorted({int(s) for s in starts if s}):
        fig.add_vline(x=step, line_dash="dot", line_color=color, line_width=1, name="segment", **where)
    return fig
