"""A training cell's figures read back from the run store, for a notebook that lost its live widgets.

A notebook reopened (or a page reloaded) while a ``%%dtrain`` cell trains cannot restore the cell's
widgets: ipywidgets asks the kernel for their state over the shell channel, which the training cell
keeps busy, so the view would read "Loading widget..." until the cell ends and then find the widgets
closed. The dashboard's output therefore carries, beside the widget view, a small ``CELL_MIME``
bundle naming the run and the cell; the labextension renders the widget when it can and otherwise
polls ``GET /dtwork/runs/<id>/cells/<seq>`` (:func:`cell_view`), which draws the same rows of the same
figure as the finished dashboard (``plots.dashboard_figure``) from what the store holds so far.
"""

from __future__ import annotations

import html
import json
from typing import TypedDict

import plotly.io as pio

from dtwork import plots
from dtwork.errors import DtworkError
from dtwork.plots.training import drawn_series
from dtwork.store.runs import RunStore

__all__ = ["CELL_MIME", "MAX_POINTS", "CellView", "cell_bundle", "cell_view"]

CELL_MIME = "application/vnd.dtwork.cell+json"
MAX_POINTS = 1000  # per trace, as the live dashboard draws them
ENDED = {"ok": "finished", "error": "failed"}  # a cell's stored status, as the title says it


class CellView(TypedDict):
    """A cell's view as ``GET /dtwork/runs/<id>/cells/<seq>`` answers it."""

    run_id: int
    seq: int
    status: str
    running: bool
    step: int | None
    figure: dict[str, object]  # plotly JSON


def cell_bundle(run_id: int, seq: int) -> dict[str, int]:
    """The data of a cell's ``CELL_MIME`` output: which run and which of its cells."""
    return {"run_id": int(run_id), "seq": int(seq)}


def cell_view(store: RunStore, run_id: int, seq: int) -> CellView:
    """The cell's status, last step and figure (plotly JSON) as the store has them now.

    Raises ``DtworkError`` when the run has no such cell.
    """
    run = store.get_run(run_id)
    cell = next((c for c in store.cells(run_id) if c["seq"] == int(seq)), None)
    if cell is None:
        raise DtworkError(f"run {run_id} has no cell {seq}")
    rows = store.figure_rows(run_id, cell=seq)
    series = drawn_series(rows, run.get("global_batch_size"))
    parts = []
    for key in (*plots.BASE_FIGURES, *plots.KIND_FIGURES):
        traces = series[key].traces(MAX_POINTS)
        if key in plots.BASE_FIGURES or traces:
            parts.append(
                (series[key], [t._replace(x=list(t.x.tolist()), y=list(t.y.tolist())) for t in traces])
            )
    step = store.last_step(run_id, cell=seq)
    status = str(cell["status"] or "running")
    if status == "running" and run.get("status") not in (None, "running"):
        status = str(run["status"])  # the cluster stopped before the cell could say how it ended
    ranks = cell.get("ranks") or []
    title = " · ".join(
        [
            f"<b>{html.escape(str(run.get('name') or 'dtwork'))}</b>",
            f"run {run_id}",
            f"cell {seq}",
            f"{len(ranks)} ranks" if ranks else "",
            f"step {step}" if step is not None else "step —",
            ENDED.get(status, status),
        ]
    ).replace(" ·  · ", " · ")
    fig = plots.dashboard_figure(parts, title)
    return {
        "run_id": int(run_id),
        "seq": int(seq),
        "status": status,
        "running": status == "running",
        "step": step,
        "figure": json.loads(pio.to_json(fig, validate=False)),
    }
