"""The live training dashboard of one cell: a header with per-rank progress bars, then the figures.

The session hands it the records it has just persisted (``feed``) and the ranks' progress
(``progress``), from whatever thread polls the ranks; both only hand the data over. A drawer thread
of the dashboard's own, at the OS's idle priority, reads what was fed and redraws at most every
``min_interval`` while records flow, so that the view takes the CPU that ranks leave idle instead of
a core that one rank (and through it every rank) waits for. A redraw sends only the figures that
changed, as arrays of at most ``MAX_POINTS`` points per trace, so its cost is bounded by what is on
screen; when it costs more than ``draw_share`` of a core over the interval, the interval grows.

The metrics, throughput and step-time figures are the rows of one figure widget
(:class:`~dtwork.widgets.live_figure.RowsPanel`), updated in one message a redraw; the GPU and
noise-scale figures, shown once they have data, are widgets of their own. Each figure is drawn from
a :class:`dtwork.plots.Series`, the code the reports draw with. The header line and the bars are
one HTML widget: one message a redraw, however many ranks. When the cell ends, its output is
replaced by the same figures as one static plotly figure and the widgets close, so that a saved
notebook holds plotly JSON rather than widget models.
"""

from __future__ import annotations

import html
import math
import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

import ipywidgets as widgets
import plotly.graph_objects as go

from dtwork import plots
from dtwork.plots.cell_view import CELL_MIME, cell_bundle
from dtwork.shared.records import Row, to_rows
from dtwork.store.perf_thinner import PerfThinner
from dtwork.widgets.header import (
    BAR_COLOURS,
    STATUS_COLOURS,
    Bars,
    format_duration,
    ranks_text,
)
from dtwork.widgets.live_figure import FigurePanel, RowsPanel
from dtwork.widgets.updating import plotly_bundle

__all__ = ["BAR_COLOURS", "Dashboard", "format_duration"]

MIN_INTERVAL = 0.5  # seconds between redraws while records flow
DRAW_SHARE = 0.01  # of a core, at most, spent redrawing (the interval grows with a redraw's cost)
SHARE_RANKS = 64  # past this many ranks the share grows in proportion (4% at 256 ranks)
MAX_POINTS = 1000  # per trace on screen (about a plot's width in pixels): redraws cost what is drawn
ETA_WINDOW = 20  # recent steps averaged for a rank's seconds per step
DRAWER_IDLE_CHECK = 0.1  # seconds: how soon a drawer that found nothing new looks again
DRAWER_JOIN_SECONDS = 5.0  # the most a finishing cell waits for its drawer's last redraw
BASE_FIGURES, KIND_FIGURES = plots.BASE_FIGURES, plots.KIND_FIGURES
KIND_SERIES = {
    "log": ("metrics",),
    "perf": ("throughput", "step_time"),
    "gpu": ("gpu",),
    "gns": ("gns",),
    "adaptive": ("adaptive",),
}
# the title of each folding section; the base figures open, the others folded so the view stays one screen tall
SECTION_TITLES = {
    "metrics": "Metrics · throughput · step time",
    "gpu": "GPUs",
    "gns": "Gradient noise scale",
    "adaptive": "Adaptive batch",
}
STATUS_WORDS = {"ok": "finished", "error": "failed", "interrupted": "interrupted", "running": "running"}


def idle_priority() -> bool:
    """Put the calling thread at the OS's idle scheduling priority (Linux: ``SCHED_IDLE``, which any
    user may set for their own threads); return whether it could. Other threads keep theirs."""
    policy = getattr(os, "SCHED_IDLE", None)
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return False
    try:
        os.sched_setscheduler(0, policy, os.sched_param(0))  # 0: this thread (a Linux thread is a task)
    except OSError:
        return False
    return True


def _as_lists(trace: plots.Trace) -> plots.Trace:
    """The trace with plain lists: plotly JSON that any reader of a notebook takes as it is."""
    return trace._replace(x=list(trace.x.tolist()), y=list(trace.y.tolist()))


class Finished(Protocol):
    """How a cell ended, as the dashboard reads it (``kernel.watcher.CellResult`` is one)."""

    status: str


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
        draw_share: float | None = DRAW_SHARE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Build an empty dashboard for ``ranks`` of run ``run_id``; :meth:`start_drawer` starts drawing.

        ``min_interval`` is the least time between two redraws; ``draw_share`` (None: no budget),
        times ``max(1, ranks / SHARE_RANKS)``, stretches it to the last redraw's CPU time divided by
        that share of a core. ``clock`` is for tests.
        """
        super().__init__()
        self.run_id = run_id
        self.ranks = list(ranks)
        self.title = title
        self.global_batch = global_batch
        self.min_interval = min_interval
        # the bars and bands cost more with more ranks: a larger view may take a little more
        self.draw_share = draw_share and draw_share * max(1.0, len(self.ranks) / SHARE_RANKS)
        self.interval = min_interval  # the current one: min_interval, or longer when redraws cost more
        self.redraws = 0
        self.status = "running"
        self.diverged: str | None = None  # "diverged at step k (loss nan)", once the run has
        self._clock = clock
        self.rows_fed = 0
        self._perf_rate = PerfThinner(len(self.ranks))  # the perf records drawn, as the store keeps them
        self._lock = threading.Lock()  # guards the data below
        self._draw_lock = threading.Lock()  # one redraw at a time
        self._series = plots.cell_series(global_batch)
        self._last_step: int | None = None  # of the last row fed
        self.efficiency: float | None = None  # the session's live scaling-efficiency estimate
        self._progress: dict[int, dict[str, Any]] = {}
        self._first_progress: dict[int, tuple[float, int]] = {}
        self._seconds: float | None = None
        self._dirty = False
        self._last_draw = -math.inf
        # the drawer: its thread, the records fed since it last woke, its stop flag
        self._drawer: threading.Thread | None = None
        self._queued: list[Iterable[Mapping[str, Any]]] = []
        self._stop_drawer = threading.Event()
        self._rank_bars = Bars(self.ranks)
        self._header = widgets.HTML(self._header_html({}, {}, None) + self._rank_bars.html())  # + bars
        self._rows = RowsPanel({key: self._series[key] for key in BASE_FIGURES})
        self.panels: dict[str, FigurePanel] = {key: self._rows for key in BASE_FIGURES}  # gpu, gns: their own
        self._drawn: dict[str, int] = {}  # the version of each series last drawn
        self._display: Any = None  # the handle of the output showing the dashboard (for_cell)
        self._sections: dict[int, widgets.Accordion] = {}  # the folding section of each panel, by id
        self.layout.width = "100%"  # the figures take the cell's width
        self._arrange()

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def for_cell(
        cls,
        run_id: int,
        ranks: list[int],
        *,
        seq: int | None = None,
        title: str | None = None,
        global_batch: int | None = None,
        display: bool = True,
    ) -> Dashboard:
        """Create the dashboard of a new cell (titled by the experiment's name), display it and
        start its drawer. With the cell's ``seq`` its output also names the run's cell, for the
        view of a notebook reopened before the cell ends (:mod:`dtwork.plots.cell_view`)."""
        dash = cls(run_id, ranks, title=title or "dtwork", global_batch=global_batch)
        if display:
            from IPython.display import display as show

            bundle = dash._repr_mimebundle_()
            if seq is not None:
                bundle[CELL_MIME] = cell_bundle(run_id, seq)
            dash._display = show(bundle, raw=True, display_id=True)  # None outside IPython
        dash.start_drawer()
        return dash

    def _distinct_panels(self) -> list[FigurePanel]:
        """The panels on screen, each once (the base figures share one), in order."""
        return list({id(panel): panel for panel in self.panels.values()}.values())

    def _arrange(self) -> None:
        self.children = (self._header, *(self._section(key, panel) for key, panel in self._keyed_panels()))

    def _keyed_panels(self) -> list[tuple[str, FigurePanel]]:
        """(first key, panel) of each panel on screen, in order."""
        seen: dict[int, tuple[str, FigurePanel]] = {}
        for key, panel in self.panels.items():
            seen.setdefault(id(panel), (key, panel))
        return list(seen.values())

    def _section(self, key: str, panel: FigurePanel) -> widgets.Accordion:
        """The panel's view in a section of its own that folds (made once)."""
        section = self._sections.get(id(panel))
        if section is None:
            section = widgets.Accordion(children=[panel.view], titles=(SECTION_TITLES.get(key, key),))
            section.selected_index = 0 if key in BASE_FIGURES else None
            section.layout.width = "100%"
            self._sections[id(panel)] = section
        return section

    @property
    def views(self) -> list[Any]:
        """The figure views on screen, in order (each inside its folding section)."""
        return [view for section in self.children[1:] for view in section.children]

    # -- public API --------------------------------------------------------------------------

    @property
    def figures(self) -> dict[str, Any]:
        """The figures on screen by key ("metrics", "throughput", "step_time", "gpu", "gns"): the first
        three are rows of one figure widget, read through a :class:`RowView` (``data``, ``layout``)."""
        return {
            key: panel.row(key) if isinstance(panel, RowsPanel) else panel.figure
            for key, panel in self.panels.items()
        }

    def feed(self, records: Iterable[Mapping[str, Any]]) -> None:
        """Hand over rank records (or store rows) for the drawer to read. Thread-safe."""
        with self._lock:
            self._queued.append(records)

    def progress(self, progress_by_rank: Mapping[int, Mapping[str, Any]]) -> None:
        """Take the ranks' latest progress ({rank: {step, total, time, phase, ...}}). Thread-safe."""
        with self._lock:
            for rank, info in progress_by_rank.items():
                self._progress[int(rank)] = dict(info)
                step, t = info.get("step"), info.get("time")
                if step is not None and t is not None:
                    self._first_progress.setdefault(int(rank), (float(t), int(step)))
            self._dirty = True

    def flush(self) -> None:
        """Read what was fed and redraw now, whatever the interval says."""
        with self._draw_lock:
            self._add_queued()
            self._draw()

    def finish(self, result: Finished) -> None:
        """Stop the drawer, draw everything once more and say in the header how the cell ended
        (``result.status``)."""
        status = str(result.status)
        self._stop()
        with self._lock:
            self.status = STATUS_WORDS.get(status, status)
            self._seconds = getattr(result, "seconds", None)
        with self._draw_lock:
            self._add_queued()
            self._add(self._perf_rate.flush(), thin=False)
        self.flush()
        for panel in self._distinct_panels():
            panel.settle()
        if self._display is not None:
            self._leave_figures()

    def static_figure(self) -> go.Figure:
        """Every figure on screen as the rows of one plotly figure, titled with the header line."""
        with self._lock:
            parts = [
                (self._series[key], [_as_lists(t) for t in self._traces(key)])
                for key in (*BASE_FIGURES, *(k for k in KIND_FIGURES if k in self.panels))
            ]
            progress = {r: dict(p) for r, p in self._progress.items()}
        return plots.dashboard_figure(parts, self._summary(progress))

    def _leave_figures(self) -> None:
        """Put the static figures in the dashboard's output in place of the widgets and close them:
        a saved notebook then holds the figures as plotly JSON, which JupyterLab draws, instead of
        widget models that each carry plotly's JavaScript."""
        self._display.update(plotly_bundle(self.static_figure(), self.title), raw=True)
        for panel in self._distinct_panels():
            panel.figure.release()
        self.close()

    def close(self) -> None:
        """Stop the drawer and close the widgets."""
        self._stop()
        for panel in self._distinct_panels():
            panel.view.close()
        for section in self._sections.values():
            section.close()
        self._header.close()
        super().close()

    # -- the drawer --------------------------------------------------------------------------

    def start_drawer(self, idle: bool = True) -> None:
        """Draw from a thread of the dashboard's own from now on, at the OS's idle scheduling
        priority where it has one (Linux: ``SCHED_IDLE``).

        At idle priority it runs when a core has nothing else to run: on a CPU machine whose cores
        the ranks fill, in their waits for each other at every step, instead of taking a core from a
        rank that every other rank would then wait for. Where every core stays busy it still gets
        its share at the scheduler's ticks: the view is late, never stopped. :meth:`finish` and
        :meth:`close` stop it."""
        if self._drawer is not None:
            return
        self._stop_drawer.clear()
        self._drawer = threading.Thread(
            target=self._drawer_loop, args=(idle,), name="dtwork-dashboard", daemon=True
        )
        self._drawer.start()

    def _drawer_loop(self, idle: bool) -> None:
        if idle:
            idle_priority()
        next_check = self._clock()
        while not self._stop_drawer.wait(max(0.01, next_check - self._clock())):
            drawn = self.redraws
            if not self._wake():
                return
            next_check = self._last_draw + self.interval
            if self.redraws == drawn:  # nothing new yet: look again soon, not at once
                next_check = max(next_check, self._clock() + DRAWER_IDLE_CHECK)

    def _wake(self) -> bool:
        """One wake of the drawer: read what was fed, redraw if something is new and the interval
        has passed. Return False once the drawer is told to stop."""
        with self._draw_lock:
            if self._stop_drawer.is_set():
                return False
            self._add_queued()
            if self._dirty and self._clock() - self._last_draw >= self.interval:
                self._draw()
        return True

    def _stop(self) -> None:
        """Stop the drawer (it finishes the redraw it is in)."""
        drawer, self._drawer = self._drawer, None
        if drawer is not None:
            self._stop_drawer.set()
            drawer.join(DRAWER_JOIN_SECONDS)

    def _add(self, records: Iterable[Mapping[str, Any]], thin: bool = True) -> None:
        """Put the records' rows in the series (perf records at the rate the store keeps them)."""
        rows = to_rows(self._perf_rate(records) if thin else records)
        if not rows:
            return
        by_kind: dict[str, list[Row]] = {}
        for row in rows:
            by_kind.setdefault(row["kind"], []).append(row)
        with self._lock:
            for kind, kind_rows in by_kind.items():
                for key in KIND_SERIES.get(kind, ()):
                    self._series[key].add(kind_rows)
            self.rows_fed += len(rows)
            for row in rows:
                if row["kind"] == "scaling" and row["name"] == plots.EFFICIENCY_NAME:
                    self.efficiency = row["value"]
            self._last_step = rows[-1]["step"]
            self._dirty = True

    def _add_queued(self) -> None:
        """Read what ``feed`` handed over."""
        with self._lock:
            queued, self._queued = self._queued, []
        for records in queued:
            self._add(records)

    # -- drawing -----------------------------------------------------------------------------

    def _snapshot(self) -> dict[str, Any]:
        """Copy what a redraw needs under the lock: the changed figures' traces (bounded in size
        by MAX_POINTS), the progress, the rates and the ETAs."""
        with self._lock:
            self._dirty = False
            figures = {}
            for key, series in self._series.items():
                if series.version != self._drawn.get(key, 0):
                    traces = self._traces(key)
                    figures[key] = (series.version, traces, series.y_axis(traces))
            progress = {r: dict(p) for r, p in self._progress.items()}
            throughput = self._series["throughput"]
            assert isinstance(throughput, plots.ThroughputSeries)
            return {
                "figures": figures,
                "progress": progress,
                "rates": throughput.latest(),
                "total": throughput.total(),
                "etas": {r: self._eta(r, p) for r, p in progress.items()},
            }

    def _traces(self, key: str) -> list[plots.Trace]:
        """A figure's traces, bounded by what is on screen: points per trace, and past BAND_RANKS
        ranks, percentile bands for the per-rank lines (caller holds the lock)."""
        return self._series[key].traces(MAX_POINTS)

    def _draw(self) -> None:
        """Redraw the changed figures, the bars and the header (caller holds the draw lock)."""
        cpu, start = time.thread_time(), self._clock()
        snap = self._snapshot()
        added = False
        rows: dict[str, list[plots.Trace]] = {}  # the changed rows of the base figures
        axes: dict[str, dict[str, Any]] = {}
        for key, (version, traces, axis) in snap["figures"].items():
            panel = self.panels.get(key)
            if panel is None:
                if not traces:
                    continue
                panel = self.panels[key] = FigurePanel(plots.empty_figure(self._series[key]))
                added = True
            if panel is self._rows:
                rows[key], axes[key] = traces, axis
            else:
                panel.show(traces, axis)
            self._drawn[key] = version
        if rows:
            self._rows.show_rows(rows, axes)
        if added:
            self._arrange()
        self._rank_bars.draw(snap["progress"], snap["rates"], snap["etas"], self.status)
        # one widget message for the header line and every rank's bar (sent only when it changed)
        self._header.value = (
            self._header_html(snap["progress"], snap["etas"], snap["total"]) + self._rank_bars.html()
        )
        self.redraws += 1
        # the next redraw is due an interval after this one was due, so that the drawer's late
        # wakes do not add up; after a pause, or a redraw longer than the interval, from now
        due = self._last_draw + self.interval
        self._last_draw = due if 0 <= start - due < self.interval else start
        # a redraw that built widgets (the first, a new figure) pays once for what later ones reuse
        if self.draw_share and self.redraws > 1 and not added:
            self.interval = max(self.min_interval, (time.thread_time() - cpu) / self.draw_share)

    def _seconds_per_step(self, rank: int, info: Mapping[str, Any]) -> float | None:
        """Return the rank's seconds per step: from its progress so far, else its recent step times."""
        first = self._first_progress.get(rank)
        step, t = info.get("step"), info.get("time")
        if first is not None and step is not None and t is not None and step > first[1] and t > first[0]:
            return (float(t) - first[0]) / (int(step) - first[1])
        step_time = self._series["step_time"]
        assert isinstance(step_time, plots.StepTimeSeries)
        times = step_time.recent_step_times(rank, ETA_WINDOW)
        return sum(times) / len(times) if times else None

    def _eta(self, rank: int, info: Mapping[str, Any]) -> float | None:
        """Seconds left for ``rank`` (caller holds the lock)."""
        step, total = info.get("step"), info.get("total")
        per_step = self._seconds_per_step(rank, info)
        if step is None or total is None or per_step is None:
            return None
        return max(0, int(total) - int(step)) * per_step

    def _header_html(
        self,
        progress: Mapping[int, Mapping[str, Any]],
        etas: Mapping[int, float | None],
        total: float | None,
    ) -> str:
        parts = [
            f"<b>{html.escape(self.title)}</b>",
            f"run {self.run_id}",
            f"ranks {ranks_text(self.ranks)}",
        ]
        parts.append(self._step_text(progress))
        if total:
            parts.append(f"{total:,.0f} samples/s")
        if self.efficiency is not None:
            parts.append(f"{self.efficiency:.0%} scaling efficiency")
        known = [eta for eta in etas.values() if eta is not None]
        if known and self.status == "running":
            parts.append(f"ETA {format_duration(max(known))}")
        if self.diverged:
            parts.append(
                f"<span style='color:{STATUS_COLOURS.get('error', '#c00')}'>{html.escape(self.diverged)}</span>"
            )
        seconds = self._seconds
        state = self.status + (
            f" in {format_duration(seconds)}" if seconds and self.status != "running" else ""
        )
        colour = STATUS_COLOURS.get(self.status, "#555")
        parts.append(f"<span style='color:{colour}'>● {html.escape(state)}</span>")
        return f"<div class='dtwork-dashboard-header'>{' · '.join(parts)}</div>"

    def _summary(self, progress: Mapping[int, Mapping[str, Any]]) -> str:
        """The header's line for a finished cell: what ran, how far, how it ended."""
        parts = [
            f"<b>{html.escape(self.title)}</b>",
            f"run {self.run_id}",
            f"ranks {ranks_text(self.ranks)}",
        ]
        parts.append(self._step_text(progress))
        if self.efficiency is not None:
            parts.append(f"{self.efficiency:.0%} scaling efficiency")
        if self.diverged:
            parts.append(html.escape(self.diverged))
        seconds = self._seconds
        parts.append(self.status + (f" in {format_duration(seconds)}" if seconds else ""))
        return " · ".join(parts)

    def _step_text(self, progress: Mapping[int, Mapping[str, Any]]) -> str:
        steps = [int(p["step"]) for p in progress.values() if p.get("step") is not None]
        totals = [int(p["total"]) for p in progress.values() if p.get("total")]
        if not steps and self._last_step is not None:
            steps = [self._last_step]
        if not steps:
            return "step —"
        return f"step {max(steps)}" + (f"/{max(totals)}" if totals else "")
