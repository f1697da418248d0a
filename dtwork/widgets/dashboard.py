"""The live training dashboard of one cell: header, figures and per-rank progress bars.

The collector hands it the records it has just persisted (``feed``, possibly from its polling
thread) and the ranks' progress (``progress``). Records are appended under a lock; the view
is redrawn at most every ``min_interval`` seconds (0.5 s: twice a second while
records flow) and once more shortly after a burst ends, so nothing stays undrawn. A redraw
rebuilds each figure with :mod:`dtwork.plots` (the same figures the reports draw) and copies
the traces' x/y into the figures on screen inside ``batch_update()``.

The figures are plotly ``FigureWidget``s. Plotly >= 6 needs the ``anywidget`` package for
those; without it each figure is a plain ``go.Figure`` re-rendered into an ``Output`` widget,
with the same data and the same API for tests (``dashboard.figures[key].data``).
"""

from __future__ import annotations

import html
import json
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio

from dtwork import plots

__all__ = ["Dashboard", "FigurePanel", "format_duration"]

Row = dict[str, Any]
MIN_INTERVAL = 0.5  # seconds between redraws while records flow
ETA_WINDOW = 20  # recent steps averaged for a rank's seconds per step
BASE_FIGURES = ("metrics", "throughput", "step_time")
KIND_FIGURES = {"gpu": "gpu", "gns": "gns"}  # figures shown once a record of that kind arrives
STATUS_WORDS = {"ok": "finished", "error": "failed", "interrupted": "interrupted", "running": "running"}
STATUS_COLOURS = {"running": "#1565c0", "finished": "#2e7d32", "failed": "#c62828", "interrupted": "#ef6c00"}
BAR_STYLES = {"finished": "success", "failed": "danger", "interrupted": "warning"}


def format_duration(seconds: float) -> str:
    """Return a short duration such as "42 s", "3 min 05 s" or "1 h 02 min"."""
    s = max(0, round(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60} min {s % 60:02d} s"
    return f"{s // 3600} h {s % 3600 // 60:02d} min"


def _mime_bundle(fig: go.Figure) -> dict[str, Any]:
    """Return the display data that renders ``fig`` in JupyterLab (plotly's own mimetype)."""
    spec = json.loads(pio.to_json(fig, validate=False))
    title = fig.layout.title.text or "figure"
    return {"application/vnd.plotly.v1+json": spec, "text/plain": f"<plotly figure: {title}>"}


class FigurePanel:
    """One figure on screen: a ``FigureWidget``, or a re-rendered ``Output`` without anywidget."""

    def __init__(self, fig: go.Figure) -> None:
        """Show ``fig`` (a figure from :mod:`dtwork.plots`)."""
        try:
            self.figure: go.Figure = go.FigureWidget(fig)
            self.view: widgets.Widget = self.figure
            self.live = True
        except ImportError:  # plotly >= 6 without anywidget
            self.figure = go.Figure(fig)
            self.view = widgets.Output()
            self.live = False
            self._render()

    def update(self, new: go.Figure) -> None:
        """Copy the traces' x/y (and annotations, title) of ``new`` into the figure on screen.

        Traces are matched by name: new names are added first (one addTraces message), then
        every existing trace is updated in place inside one ``batch_update()``.
        """
        names = {trace.name for trace in self.figure.data}
        added = [trace for trace in new.data if trace.name not in names]
        if added:
            self.figure.add_traces(added)
        with self.figure.batch_update():
            self._sync_traces(new, skip={trace.name for trace in added})
            self._sync_layout(new)
        if not self.live:
            self._render()

    def _sync_traces(self, new: go.Figure, skip: set[str]) -> None:
        """Set x/y of traces matched by name; empty the ones ``new`` no longer has."""
        fresh = {trace.name: trace for trace in new.data}
        for old in self.figure.data:
            if old.name in skip:
                continue
            src = fresh.get(old.name)
            old.x, old.y = _thin(list(src.x), list(src.y)) if src is not None else ([], [])

    def _sync_layout(self, new: go.Figure) -> None:
        notes = [a.to_plotly_json() for a in new.layout.annotations]
        if notes != [a.to_plotly_json() for a in self.figure.layout.annotations]:
            self.figure.layout.annotations = notes
        if new.layout.title.text != self.figure.layout.title.text:
            self.figure.layout.title.text = new.layout.title.text

    def _render(self) -> None:
        bundle = _mime_bundle(self.figure)
        self.view.outputs = ({"output_type": "display_data", "data": bundle, "metadata": {}},)  # type: ignore[attr-defined]


def _session_info(session: Any) -> tuple[str, int | None]:
    """Return (title, global batch) from a collector session; the only things taken from it."""
    cluster = getattr(session, "cluster", None)
    name = getattr(getattr(cluster, "config", None), "name", None)
    batch = getattr(cluster, "global_batch_size", None)
    return (str(name) if name else "dtwork"), (batch if isinstance(batch, int) else None)


def _ranks_text(ranks: Sequence[int]) -> str:
    if len(ranks) > 1 and list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(str(r) for r in ranks)


class Dashboard(widgets.VBox):
    """Live view of one training cell: header line, figures and one progress bar per rank."""

    def __init__(
        self,
        run_id: int | None,
        ranks: Sequence[int],
        *,
        title: str = "dtwork",
        global_batch: int | None = None,
        min_interval: float = MIN_INTERVAL,
        trailing: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Build an empty dashboard for ``ranks`` of run ``run_id``.

        ``min_interval`` is the least time between two throttled redraws; with ``trailing``
        records fed inside that interval are drawn when it ends. ``clock`` is for tests.
        """
        super().__init__()
        self.run_id = run_id
        self.ranks = list(ranks)
        self.title = title
        self.global_batch = global_batch
        self.min_interval = min_interval
        self.trailing = trailing
        self.redraws = 0
        self.status = "running"
        self._clock = clock
        self._lock = threading.Lock()  # guards the data below
        self._draw_lock = threading.Lock()  # one redraw at a time
        self._rows: list[Row] = []
        self._by_kind: dict[str, list[Row]] = {"log": [], "perf": [], "gns": [], "gpu": []}
        self._progress: dict[int, dict[str, Any]] = {}
        self._first_progress: dict[int, tuple[float, int]] = {}
        self._seconds: float | None = None
        self._dirty = False
        self._last_draw = -math.inf
        self._timer: threading.Timer | None = None
        self._header = widgets.HTML(self._header_html({}, self._by_kind))
        self._bars = {r: self._new_bar(r) for r in self.ranks}
        self.panels = {key: FigurePanel(self._build(key, self._by_kind)) for key in BASE_FIGURES}
        self._arrange()

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def for_cell(cls, session: Any, run_id: int, ranks: list[int], display: bool = True) -> Dashboard:
        """Create the dashboard of a new cell (title from the session) and display it."""
        title, global_batch = _session_info(session)
        dash = cls(run_id, ranks, title=title, global_batch=global_batch)
        if display:
            from IPython.display import display as show

            show(dash)
        return dash

    @staticmethod
    def _new_bar(rank: int) -> widgets.IntProgress:
        return widgets.IntProgress(
            value=0,
            min=0,
            max=1,
            description=f"rank {rank}: waiting",
            style={"description_width": "initial"},
            layout=widgets.Layout(width="100%"),
        )

    def _arrange(self) -> None:
        views = [panel.view for panel in self.panels.values()]
        bars = widgets.VBox([self._bars[r] for r in sorted(self._bars)])
        self.children = (self._header, *views, bars)

    def _build(self, key: str, by_kind: Mapping[str, list[Row]]) -> go.Figure:
        """Build figure ``key`` from the rows of the kinds it draws."""
        if key == "metrics":
            return plots.metrics_figure(by_kind["log"])
        if key == "throughput":
            return plots.throughput_figure(by_kind["perf"])
        if key == "step_time":
            return plots.step_time_figure(by_kind["perf"])
        if key == "gpu":
            return plots.gpu_figure(by_kind["gpu"])
        return plots.gns_figure(by_kind["gns"], self.global_batch)

    # -- public API --------------------------------------------------------------------------

    @property
    def figures(self) -> dict[str, go.Figure]:
        """The figures on screen by key ("metrics", "throughput", "step_time", "gpu", "gns")."""
        return {key: panel.figure for key, panel in self.panels.items()}

    @property
    def rows(self) -> list[Row]:
        """All rows fed so far (``{step, rank, name, value, time}``), in arrival order."""
        with self._lock:
            return list(self._rows)

    def feed(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Add rank records (or store rows); redraw if ``min_interval`` has passed. Thread-safe."""
        rows = plots.rows_from_records(records)
        if not rows:
            return
        with self._lock:
            self._rows.extend(rows)
            for row in rows:
                self._by_kind[plots.row_kind(row)].append(row)
            self._dirty = True
        self._maybe_redraw()

    def progress(self, progress_by_rank: Mapping[int, Mapping[str, Any]]) -> None:
        """Take the ranks' latest progress ({rank: {step, total, time, phase, ...}}). Thread-safe."""
        with self._lock:
            for rank, info in progress_by_rank.items():
                self._progress[int(rank)] = dict(info)
                step, t = info.get("step"), info.get("time")
                if step is not None and t is not None:
                    self._first_progress.setdefault(int(rank), (float(t), int(step)))
            self._dirty = True
        self._maybe_redraw()

    def flush(self) -> None:
        """Redraw now, whatever the throttle says."""
        with self._draw_lock:
            self._draw()

    def finish(self, result: Any) -> None:
        """Draw everything once more and say in the header how the cell ended (``result.status``)."""
        status = str(getattr(result, "status", "ok"))
        with self._lock:
            self.status = STATUS_WORDS.get(status, status)
            self._seconds = getattr(result, "seconds", None)
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        self.flush()

    def close(self) -> None:
        """Stop the pending redraw and close the widgets."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        for panel in self.panels.values():
            panel.view.close()
        super().close()

    # -- throttling --------------------------------------------------------------------------

    def _due(self) -> bool:
        return self._clock() - self._last_draw >= self.min_interval

    def _maybe_redraw(self) -> None:
        """Redraw when due and no other thread is drawing; otherwise leave it to the timer."""
        if self._due() and self._draw_lock.acquire(blocking=False):
            try:
                if self._due():
                    self._draw()
                    return
            finally:
                self._draw_lock.release()
        self._schedule()

    def _schedule(self) -> None:
        """Start the trailing redraw unless one is pending (or trailing is off)."""
        if not self.trailing:
            return
        with self._lock:
            if self._timer is not None or self.status != "running":
                return
            wait = self.min_interval - (self._clock() - self._last_draw)
            self._timer = threading.Timer(min(max(wait, 0.01), self.min_interval), self._on_timer)
            self._timer.daemon = True
            self._timer.start()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            dirty = self._dirty
        if dirty:
            self.flush()

    # -- drawing -----------------------------------------------------------------------------

    def _snapshot(self) -> tuple[dict[str, list[Row]], dict[int, dict[str, Any]]]:
        with self._lock:
            self._dirty = False
            by_kind = {kind: list(rows) for kind, rows in self._by_kind.items()}
            return by_kind, {r: dict(p) for r, p in self._progress.items()}

    def _draw(self) -> None:
        """Redraw figures, bars and header from a snapshot (caller holds the draw lock)."""
        by_kind, progress = self._snapshot()
        self._add_kind_panels(by_kind)
        for key, panel in self.panels.items():
            panel.update(self._build(key, by_kind))
        self._draw_bars(progress, by_kind["perf"])
        self._header.value = self._header_html(progress, by_kind)
        self.redraws += 1
        self._last_draw = self._clock()

    def _add_kind_panels(self, by_kind: Mapping[str, list[Row]]) -> None:
        added = False
        for kind, key in KIND_FIGURES.items():
            if by_kind[kind] and key not in self.panels:
                self.panels[key] = FigurePanel(self._build(key, by_kind))
                added = True
        if added:
            self._arrange()

    def _seconds_per_step(self, rank: int, info: Mapping[str, Any], perf: list[Row]) -> float | None:
        """Return the rank's seconds per step: from its progress so far, else its recent step times."""
        first = self._first_progress.get(rank)
        step, t = info.get("step"), info.get("time")
        if first is not None and step is not None and t is not None and step > first[1] and t > first[0]:
            return (float(t) - first[0]) / (int(step) - first[1])
        times = [r["value"] for r in perf if r["rank"] == rank and r["name"] == "step_time"][-ETA_WINDOW:]
        return sum(times) / len(times) if times else None

    def _eta(self, rank: int, info: Mapping[str, Any], perf: list[Row]) -> float | None:
        step, total = info.get("step"), info.get("total")
        per_step = self._seconds_per_step(rank, info, perf)
        if step is None or total is None or per_step is None:
            return None
        return max(0, int(total) - int(step)) * per_step

    def _draw_bars(self, progress: Mapping[int, Mapping[str, Any]], perf: list[Row]) -> None:
        rates = plots.latest_by_rank(perf, "samples_per_s")
        for rank, info in sorted(progress.items()):
            if rank not in self._bars:
                self._bars[rank] = self._new_bar(rank)
                self._arrange()
            self._draw_bar(self._bars[rank], rank, info, rates.get(rank), self._eta(rank, info, perf))

    def _draw_bar(
        self,
        bar: widgets.IntProgress,
        rank: int,
        info: Mapping[str, Any],
        rate: float | None,
        eta: float | None,
    ) -> None:
        step = int(info.get("step") or 0)
        total = info.get("total")
        bar.max = max(int(total), 1) if total else max(step, 1)
        bar.value = min(step, bar.max)
        parts = [f"rank {rank}: step {step}" + (f"/{total}" if total else "")]
        if rate is not None:
            parts.append(f"{rate:,.0f} samples/s")
        if eta is not None and self.status == "running":
            parts.append(f"ETA {format_duration(eta)}")
        bar.description = " · ".join(parts)
        bar.bar_style = BAR_STYLES.get(self.status, "")

    def _header_html(
        self, progress: Mapping[int, Mapping[str, Any]], by_kind: Mapping[str, list[Row]]
    ) -> str:
        parts = [
            f"<b>{html.escape(self.title)}</b>",
            f"run {self.run_id}",
            f"ranks {_ranks_text(self.ranks)}",
        ]
        parts.append(self._step_text(progress, by_kind))
        _, total = plots.global_throughput(by_kind["perf"])
        if total:
            parts.append(f"{total[-1]:,.0f} samples/s")
        etas = [e for r, p in progress.items() if (e := self._eta(r, p, by_kind["perf"])) is not None]
        if etas and self.status == "running":
            parts.append(f"ETA {format_duration(max(etas))}")
        seconds = self._seconds
        state = self.status + (
            f" in {format_duration(seconds)}" if seconds and self.status != "running" else ""
        )
        colour = STATUS_COLOURS.get(self.status, "#555")
        parts.append(f"<span style='color:{colour}'>● {html.escape(state)}</span>")
        return f"<div class='dtwork-dashboard-header'>{' · '.join(parts)}</div>"

    @staticmethod
    def _step_text(progress: Mapping[int, Mapping[str, Any]], by_kind: Mapping[str, list[Row]]) -> str:
        steps = [int(p["step"]) for p in progress.values() if p.get("step") is not None]
        totals = [int(p["total"]) for p in progress.values() if p.get("total")]
        if not steps:
            steps = [r["step"] for rows in by_kind.values() for r in rows[-1:]]
        if not steps:
            return "step —"
        return f"step {max(steps)}" + (f"/{max(totals)}" if totals else "")


MAX_POINTS = 2000  # per trace on screen: a long run's redraws stay cheap for the kernel and the browser


def _thin(x: list[Any], y: list[Any]) -> tuple[list[Any], list[Any]]:
    """Keep at most about MAX_POINTS evenly spaced points of a trace, always the latest one."""
    if len(x) <= MAX_POINTS:
        return x, y
    stride = -(-len(x) // MAX_POINTS)
    keep = list(range(0, len(x), stride))
    if keep[-1] != len(x) - 1:
        keep.append(len(x) - 1)
    return [x[i] for i in keep], [y[i] for i in keep]
