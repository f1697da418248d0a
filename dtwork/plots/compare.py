"""``runs compare``'s figure: any number of runs, a panel per metric, a colour per run.

Within one panel the runs are told apart by colour (a metric's own colour would draw every run
alike); a loss panel is drawn on a log scale, so that one diverged run does not flatten the others.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dtwork.plots.figures import mark_segments
from dtwork.shared.records import finite

__all__ = ["COMPARE_PANELS", "RUN_COLOURS", "compare_figure", "log_scaled", "run_colour"]

COMPARE_PANELS = 12  # metrics drawn by compare_figure, the first by name
# plotly's default qualitative colours (D3's category10): the runs in the order they were named
RUN_COLOURS = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip


def run_colour(i: int) -> str:
    """The colour of the ``i``-th run compared (from 0); the palette repeats past ten runs."""
    return RUN_COLOURS[i % len(RUN_COLOURS)]


def log_scaled(name: str, values: Iterable[float]) -> bool:
    """Whether a panel is drawn on a log scale: a loss (its name says so) with only positive values."""
    shown = list(values)
    return "loss" in name.lower() and bool(shown) and min(shown) > 0


def compare_figure(
    runs: Sequence[tuple[int, Iterable[Mapping[str, Any]]]],
    names: Sequence[str],
    segments: Sequence[Iterable[int]] = (),
) -> go.Figure:
    """One panel per metric in ``names`` with a curve per run: ``runs`` is ``(run id, its aggregated
    rows)`` per run (``RunStore.metrics(run_id)``); rows without a finite value are skipped.
    ``segments``: each run's segment first steps (``RunStore.segments``), marked in its colour."""
    shown = list(names[:COMPARE_PANELS]) or ["(no metrics)"]
    fig = make_subplots(rows=len(shown), cols=1, subplot_titles=shown, shared_xaxes=True)
    values: dict[str, list[float]] = {name: [] for name in shown}
    for i, (run_id, rows) in enumerate(runs):
        by_name: dict[str, list[tuple[float, float]]] = {}
        for r in rows:
            value = finite(r.get("value"))
            if value is not None:
                by_name.setdefault(str(r.get("name")), []).append((r["step"], value))
        for row, name in enumerate(shown, start=1):
            points = by_name.get(name, [])
            values[name] += [p[1] for p in points]
            trace = go.Scatter(
                x=[p[0] for p in points],
                y=[p[1] for p in points],
                name=f"run {run_id}",
                legendgroup=str(run_id),
                showlegend=row == 1,
                line={"color": run_colour(i)},
            )
            fig.add_trace(trace, row=row, col=1)
    for i, starts in enumerate(segments):
        mark_segments(fig, starts, run_colour(i))
    for row, name in enumerate(shown, start=1):
        if log_scaled(name, values[name]):
            fig.update_yaxes(type="log", title_text=f"{name} (log)", row=row, col=1)
    title = " vs ".join(f"run {run_id}" for run_id, _ in runs)
    fig.update_layout(height=220 * len(shown) + 80, title=title)
    fig.update_xaxes(title_text="step", row=len(shown), col=1)
    return fig
