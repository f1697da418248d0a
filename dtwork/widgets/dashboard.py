"""The live training dashboard of one cell: header with per-rank progress bars, then the figures.

The collector hands it the records it has just persisted (``feed``, possibly from its polling
thread) and the ranks' progress (``progress``). Each figure is drawn from a
:class:`dtwork.plots.Series` (the same code the reports draw with) that takes the records as
they come. The view is redrawn twice a second while records flow (``min_interval``), and once
more shortly after a burst ends, so nothing stays undrawn. A redraw sends only the figures
that changed, as numpy arrays of at most ``MAX_POINTS`` points per trace: its cost is bounded by
the points on screen, not by the length of the run. Drawing is budgeted: when a redraw costs
more than ``draw_share`` of a core over the interval (many ranks, many metrics), the next one
waits longer, so that the kernel's CPU stays with the ranks (which share its cores on a CPU
machine, and wait for each other at every step); a redraw that builds widgets (the first, a new
figure) is not budgeted.

The metrics, throughput and step-time figures are the rows of one plotly ``FigureWidget``
(:class:`RowsPanel`): a redraw updates all three in one restyle, sent as one widget message
(:class:`LiveFigureWidget`; plotly's own ``FigureWidget`` sends four, and three figures took
twelve: in a kernel every message costs CPU, whatever its size). The GPU and noise-scale figures, shown once they have data, are widgets of their own.
The header line and the per-rank progress bars are one HTML widget: one message a redraw, however
many ranks (a progress widget per rank took one each).
Plotly >= 6 needs the ``anywidget`` package for ``FigureWidget``; without it each figure is a
plain ``go.Figure`` re-rendered into an ``Output`` widget, with the same data and the same API for
tests (``dashboard.figures[key].data``).
"""

from __future__ import annotations

import html
import json
import math
import os
import threading
import time
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
import plotly.io as pio

from dtwork import plots
from dtwork.records import Row, to_rows

__all__ = ["Dashboard", "FigurePanel", "format_duration"]

MIN_INTERVAL = 0.5  # seconds between redraws while records flow
DRAW_SHARE = 0.01  # of a core, at most, spent redrawing (the interval grows with a redraw's cost)
MAX_POINTS = 1000  # per trace on screen (a plot is ~800 px wide): redraws stay cheap however long the run
ETA_WINDOW = 20  # recent steps averaged for a rank's seconds per step
DRAWER_IDLE_CHECK = 0.1  # seconds: how soon a drawer that found nothing new looks again
DRAWER_JOIN_SECONDS = 5.0  # the most a finishing cell waits for its drawer's last redraw
BASE_FIGURES = ("metrics", "throughput", "step_time")
KIND_FIGURES = ("gpu", "gns")  # figures shown once they have something to draw
KIND_SERIES = {"log": ("metrics",), "perf": ("throughput", "step_time"), "gpu": ("gpu",), "gns": ("gns",)}
STATUS_WORDS = {"ok": "finished", "error": "failed", "interrupted": "interrupted", "running": "running"}
STATUS_COLOURS = {"running": "#1565c0", "finished": "#2e7d32", "failed": "#c62828", "interrupted": "#ef6c00"}
BAR_STYLES = {"finished": "success", "failed": "danger", "interrupted": "warning"}
BAR_COLOURS = {
    "": STATUS_COLOURS["running"],
    "success": STATUS_COLOURS["finished"],
    "danger": STATUS_COLOURS["failed"],
    "warning": STATUS_COLOURS["interrupted"],
}


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


class RankBar:
    """One rank's progress bar: its state (``value``, ``max``, ``description``, ``bar_style``, as an
    ipywidgets progress bar has them) drawn as HTML in the dashboard's header widget."""

    __slots__ = ("bar_style", "description", "max", "value")

    def __init__(self, rank: int) -> None:
        self.value = 0
        self.max = 1
        self.description = f"rank {rank}: waiting"
        self.bar_style = ""

    def html(self) -> str:
        share = 100.0 * min(max(self.value / self.max, 0.0), 1.0) if self.max > 0 else 0.0
        colour = BAR_COLOURS.get(self.bar_style, BAR_COLOURS[""])
        # two cells of the bars' grid (see Dashboard._bars_html): the label, then the bar
        return (
            f"<span class='dtwork-rank-bar' style='white-space:nowrap'>{html.escape(self.description)}</span>"
            "<div style='min-width:80px;height:10px;background:#e0e0e0;border-radius:5px;overflow:hidden'>"
            f"<div style='width:{share:.1f}%;height:100%;background:{colour}'></div></div>"
        )


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


class LiveFigureWidget(go.FigureWidget):  # type: ignore[misc]
    """plotly's ``FigureWidget``, whose restyles (every redraw of a live figure) go out as ONE widget
    message where plotly sends four: its two edit ids, the restyle, then None to clear it.

    Here the edit ids and the restyle travel together (``hold_sync``), and the restyle stays in place
    until the next one replaces it: each carries a new ``trace_edit_id``, so the frontend sees every
    one as a change and applies it, as it applies plotly's. In a kernel each widget message costs
    ~0.3 ms of CPU (``python -m benchmarks.widget_messages``), taken from ranks that share its cores
    on a CPU machine. :meth:`settle` clears the last restyle once the figure stops changing, so that
    a notebook's saved widget state holds the data once.
    """

    def _send_restyle_msg(
        self, restyle_data: dict[str, Any], trace_indexes: Any = None, source_view_id: str | None = None
    ) -> None:
        trace_indexes = self._normalize_trace_indexes(trace_indexes)
        with self.hold_sync():
            self._last_layout_edit_id += 1
            self._last_trace_edit_id += 1
            self._layout_edit_in_process = True
            self._trace_edit_in_process = True
            self._py2js_restyle = {
                "restyle_data": restyle_data,
                "restyle_traces": trace_indexes,
                "trace_edit_id": self._last_trace_edit_id,
                "layout_edit_id": self._last_layout_edit_id,
                "source_view_id": source_view_id,
            }

    def restyle_xy(self, xs: Sequence[Any], ys: Sequence[Any], index: Sequence[int]) -> None:
        """Set ``x`` and ``y`` of the traces at ``index`` and send them in one restyle.

        What ``plotly_restyle`` does for these arrays, without its checks: it validates each key
        path against each trace, compares every new array with the old one element by element
        and calls the traces' change callbacks (none are registered here): 0.2-0.7 ms of a redraw's
        1.5-3 ms of CPU (``python -m benchmarks.widget_messages``). The arrays are fresh 1-d numpy
        arrays of numbers (a series' ``traces``), the traces scatters.
        """
        index = list(index)
        for i, x, y in zip(index, xs, ys, strict=True):
            props = self._data[i]
            props["x"] = x
            props["y"] = y
        self._send_restyle_msg({"x": list(xs), "y": list(ys)}, index)

    def settle(self) -> None:
        """Clear the last restyle (the figure's data hold it already)."""
        if self._py2js_restyle is not None:
            self._py2js_restyle = None  # type: ignore[assignment]  # traitlets types Dict(allow_none) as dict


class FigurePanel:
    """One figure on screen: a ``FigureWidget``, or a re-rendered ``Output`` without anywidget."""

    def __init__(self, fig: go.Figure | dict[str, Any]) -> None:
        """Show ``fig`` (a figure from :mod:`dtwork.plots`, or its dict)."""
        try:
            self.figure: go.Figure = LiveFigureWidget(fig)
            self.view: widgets.Widget = self.figure
            self.live = True
        except ImportError:  # plotly >= 6 without anywidget
            self.figure = go.Figure(fig)
            self.view = widgets.Output()
            self.live = False
            self._render()
        self.names = [trace.name for trace in self.figure.data]

    def show(self, traces: Sequence[plots.Trace]) -> None:
        """Draw ``traces`` (a series' ``traces(...)``): in place when the figure has those traces
        already, the new ones added at the end, all of them again when their order changed.
        """
        if not self.live:  # the Output fallback renders plotly's JSON: plain lists there
            traces = [_plain_trace(t) for t in traces]
        names = [t.name for t in traces]
        have = len(self.names)
        if names[:have] != self.names:  # order changed: draw them all again
            self.figure.data = ()
            have = 0
        with self.figure.batch_update():
            if have:
                mine = traces[:have]  # one restyle for the traces already there
                _restyle_xy(self.figure, [t.x for t in mine], [t.y for t in mine], list(range(have)))
            if len(names) > have:
                self.figure.add_traces([t.scatter() for t in traces[have:]])
            self._no_data(not names)
        self.names = names
        if not self.live:
            self._render()

    def settle(self) -> None:
        """The figure stops changing: drop what only a live update needed."""
        if self.live:
            self.figure.settle()

    def _no_data(self, show: bool) -> None:
        """Show or drop the "no data yet" note."""
        notes = self.figure.layout.annotations
        has = any(a.name == plots.NO_DATA_NAME for a in notes)
        if has and not show:
            self.figure.layout.annotations = [a for a in notes if a.name != plots.NO_DATA_NAME]
        elif show and not has:
            self.figure.layout.annotations = [*notes, plots.no_data_note()]

    def _render(self) -> None:
        bundle = _mime_bundle(self.figure)
        self.view.outputs = ({"output_type": "display_data", "data": bundle, "metadata": {}},)  # type: ignore[attr-defined]


class RowView:
    """One row of a :class:`RowsPanel` read as a figure: its traces (``data``) and its annotations
    (``layout.annotations``: the row's "no data yet" note)."""

    def __init__(self, panel: RowsPanel, key: str) -> None:
        self.panel = panel
        self.key = key

    @property
    def data(self) -> tuple[Any, ...]:
        return tuple(t for t in self.panel.figure.data if t.legendgroup == self.key)

    @property
    def layout(self) -> Any:
        ref = f"{plots.row_axes(self.panel.keys.index(self.key) + 1)[0]} domain"
        notes = tuple(a for a in self.panel.figure.layout.annotations if a.xref == ref)
        return types.SimpleNamespace(annotations=notes)


class RowsPanel(FigurePanel):
    """Several series' figures as the rows of ONE figure on screen (:func:`plots.stacked_figure`).

    A redraw updates the traces of every changed row with one restyle: one widget message whatever
    its size (:class:`LiveFigureWidget`), and in a kernel each message costs ~0.3 ms of CPU
    (``python -m benchmarks.widget_messages``), so one figure for three costs a third of the messages.
    The traces of a row are grouped in the legend under the row's title.
    """

    def __init__(self, series: Mapping[str, plots.Series]) -> None:
        self.keys = list(series)
        self.titles = {key: s.title for key, s in series.items()}
        super().__init__(plots.stacked_figure(list(series.values())))
        # (row key, trace name) of each trace on screen, in order; the rows' empty traces have no key
        self.order: list[tuple[str, str]] = [(t.legendgroup or "", t.name or "") for t in self.figure.data]
        self._noted = set(self.keys)  # rows showing "no data yet" (every row, at first)

    def row(self, key: str) -> RowView:
        return RowView(self, key)

    def show_rows(self, rows: Mapping[str, Sequence[plots.Trace]]) -> None:
        """Draw each row's traces (a series' ``traces(...)``): the ones on screen already in one restyle,
        the new ones added at the end; a row whose traces came in a new order is drawn again."""
        if not self.live:
            rows = {key: [_plain_trace(t) for t in traces] for key, traces in rows.items()}
        fig = self.figure
        have = {key: [name for k, name in self.order if k == key] for key in rows}
        again = {
            key for key, traces in rows.items() if [t.name for t in traces][: len(have[key])] != have[key]
        }
        if again:  # drop those rows' traces (rare: a trace that belongs before others appeared)
            fig.data = tuple(t for t, (k, _) in zip(fig.data, self.order, strict=True) if k not in again)
            self.order = [o for o in self.order if o[0] not in again]
            have.update({key: [] for key in again})
        at = {o: i for i, o in enumerate(self.order)}
        with fig.batch_update():
            index, xs, ys, new = [], [], [], []
            for key, traces in rows.items():
                n = len(have[key])
                for t in traces[:n]:
                    index.append(at[(key, t.name)])
                    xs.append(t.x)
                    ys.append(t.y)
                new += [(key, t) for t in traces[n:]]
            if index:  # one restyle for every row
                _restyle_xy(fig, xs, ys, index)
            if new:
                fig.add_traces([self._scatter(key, t) for key, t in new])
                self.order += [(key, t.name) for key, t in new]
            self._row_notes({key: not traces for key, traces in rows.items()})
        if not self.live:
            self._render()

    def _scatter(self, key: str, trace: plots.Trace) -> go.Scatter:
        xa, ya = plots.row_axes(self.keys.index(key) + 1)
        style = {
            **trace.style,
            "xaxis": xa,
            "yaxis": ya,
            "legendgroup": key,
            "legendgrouptitle": {"text": self.titles[key]},
        }
        return trace._replace(style=style).scatter()

    def _row_notes(self, empty: Mapping[str, bool]) -> None:
        """Show or drop the "no data yet" note of each row in ``empty`` (row -> it has no trace); the
        layout is set once, and only when a row's note changes (reading plotly's annotations is slow)."""
        noted = {key for key in self.keys if (empty[key] if key in empty else key in self._noted)}
        if noted == self._noted:
            return
        refs = {f"{plots.row_axes(i + 1)[0]} domain": key for i, key in enumerate(self.keys)}
        notes = [
            a for a in self.figure.layout.annotations if not (a.name == plots.NO_DATA_NAME and a.xref in refs)
        ]
        for ref, key in refs.items():
            if key in noted:
                notes.append({**plots.no_data_note(), "xref": ref, "yref": ref.replace("x", "y", 1)})
        self.figure.layout.annotations = notes
        self._noted = noted


def _restyle_xy(fig: go.Figure, xs: list[Any], ys: list[Any], index: list[int]) -> None:
    """Set x and y of the traces at ``index`` in one restyle: unchecked on a live figure widget, through
    ``plotly_restyle`` on the plain figure of the Output fallback (no anywidget)."""
    if isinstance(fig, LiveFigureWidget):
        fig.restyle_xy(xs, ys, index)
    else:
        fig.plotly_restyle({"x": xs, "y": ys}, index)


def _plain_trace(t: plots.Trace) -> plots.Trace:
    """The trace with lists of Python numbers (the Output fallback renders plotly's JSON)."""
    return t._replace(x=list(map(_plain, t.x)), y=list(map(_plain, t.y)))


def _plain(value: Any) -> Any:
    """A Python number for a numpy scalar (JSON for the Output fallback)."""
    return value.item() if hasattr(value, "item") else value


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
        draw_share: float | None = DRAW_SHARE,
        trailing: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        """Build an empty dashboard for ``ranks`` of run ``run_id``.

        ``min_interval`` is the least time between two throttled redraws; ``draw_share`` (None:
        no budget) stretches it to the last redraw's CPU time divided by that share of a core.
        With ``trailing`` records fed inside the interval are drawn when it ends. ``clock`` is
        for tests.
        """
        super().__init__()
        self.run_id = run_id
        self.ranks = list(ranks)
        self.title = title
        self.global_batch = global_batch
        self.min_interval = min_interval
        self.draw_share = draw_share
        self.interval = min_interval  # the current one: min_interval, or longer when redraws cost more
        self.trailing = trailing
        self.redraws = 0
        self.status = "running"
        self._clock = clock
        self.rows_fed = 0
        self._lock = threading.Lock()  # guards the data below
        self._draw_lock = threading.Lock()  # one redraw at a time
        self._series: dict[str, plots.Series] = {
            "metrics": plots.MetricsSeries(),
            "throughput": plots.ThroughputSeries(),
            "step_time": plots.StepTimeSeries(),
            "gpu": plots.GpuSeries(),
            "gns": plots.GnsSeries(global_batch),
        }
        self._last_step: int | None = None  # of the last row fed
        self._progress: dict[int, dict[str, Any]] = {}
        self._first_progress: dict[int, tuple[float, int]] = {}
        self._seconds: float | None = None
        self._dirty = False
        self._last_draw = -math.inf
        self._timer: threading.Timer | None = None
        # the drawer (``start_drawer``): its thread, the records fed since it last woke, its stop flag
        self._drawer: threading.Thread | None = None
        self._queued: list[Iterable[Mapping[str, Any]]] = []
        self._stop_drawer = threading.Event()
        self._bars = {r: RankBar(r) for r in self.ranks}
        self._header = widgets.HTML(self._header_html({}, {}, None) + self._bars_html())  # header + bars
        self._rows = RowsPanel({key: self._series[key] for key in BASE_FIGURES})
        self.panels: dict[str, FigurePanel] = {key: self._rows for key in BASE_FIGURES}  # gpu, gns: their own
        self._drawn: dict[str, int] = {}  # the version of each series last drawn
        self._arrange()

    # -- construction ------------------------------------------------------------------------

    @classmethod
    def for_cell(
        cls,
        session: Any,
        run_id: int,
        ranks: list[int],
        display: bool = True,
        trailing: bool = True,
        drawer: bool = False,
    ) -> Dashboard:
        """Create the dashboard of a new cell (title from the session) and display it.

        ``trailing=False`` when the caller calls :meth:`tick` as it polls: what a feed left undrawn
        is drawn by the next tick, in a wakeup the caller makes anyway, instead of by a timer thread
        of its own. ``drawer=True`` (the collector's choice): the dashboard draws from a thread of
        its own at idle priority (:meth:`start_drawer`)."""
        title, global_batch = _session_info(session)
        dash = cls(run_id, ranks, title=title, global_batch=global_batch, trailing=trailing and not drawer)
        if display:
            from IPython.display import display as show

            show(dash)
        if drawer:
            dash.start_drawer()
        return dash

    def _distinct_panels(self) -> list[FigurePanel]:
        """The panels on screen, each once (the base figures share one), in order."""
        return list({id(panel): panel for panel in self.panels.values()}.values())

    def _arrange(self) -> None:
        self.children = (self._header, *(panel.view for panel in self._distinct_panels()))

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
        """Add rank records (or store rows); redraw if ``min_interval`` has passed. Thread-safe.
        With a drawer (:meth:`start_drawer`) the records are only queued: the drawer reads them."""
        if self._drawer is not None:
            with self._lock:
                self._queued.append(records)
            return
        if self._add(records):
            self._maybe_redraw()

    def _add(self, records: Iterable[Mapping[str, Any]]) -> bool:
        """Put the records' rows in the series; return whether there were any."""
        rows = to_rows(records)
        if not rows:
            return False
        by_kind: dict[str, list[Row]] = {}
        for row in rows:
            by_kind.setdefault(row["kind"], []).append(row)
        with self._lock:
            for kind, kind_rows in by_kind.items():
                for key in KIND_SERIES[kind]:
                    self._series[key].add(kind_rows)
            self.rows_fed += len(rows)
            self._last_step = rows[-1]["step"]
            self._dirty = True
        return True

    def _add_queued(self) -> None:
        """Read what ``feed`` queued for the drawer."""
        with self._lock:
            queued, self._queued = self._queued, []
        for records in queued:
            self._add(records)

    def progress(self, progress_by_rank: Mapping[int, Mapping[str, Any]]) -> None:
        """Take the ranks' latest progress ({rank: {step, total, time, phase, ...}}). Thread-safe."""
        with self._lock:
            for rank, info in progress_by_rank.items():
                self._progress[int(rank)] = dict(info)
                step, t = info.get("step"), info.get("time")
                if step is not None and t is not None:
                    self._first_progress.setdefault(int(rank), (float(t), int(step)))
            self._dirty = True
        if self._drawer is None:
            self._maybe_redraw()

    def tick(self) -> None:
        """Redraw if something is undrawn and the interval has passed (for a caller that polls;
        nothing to do with a drawer, which keeps time itself)."""
        if self._drawer is None and self._dirty and self._due():
            self._maybe_redraw()

    def flush(self) -> None:
        """Redraw now, whatever the throttle says (with what was queued for the drawer)."""
        with self._draw_lock:
            self._add_queued()
            self._draw()

    def finish(self, result: Any) -> None:
        """Draw everything once more and say in the header how the cell ended (``result.status``)."""
        status = str(getattr(result, "status", "ok"))
        self._stop()
        with self._lock:
            self.status = STATUS_WORDS.get(status, status)
            self._seconds = getattr(result, "seconds", None)
        self.flush()
        for panel in self._distinct_panels():
            panel.settle()

    def close(self) -> None:
        """Stop the pending redraw (and the drawer) and close the widgets."""
        self._stop()
        for panel in self._distinct_panels():
            panel.view.close()
        super().close()

    def _stop(self) -> None:
        """Cancel the trailing redraw; stop the drawer (it finishes the redraw it is in)."""
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
        drawer, self._drawer = self._drawer, None
        if drawer is not None:
            self._stop_drawer.set()
            drawer.join(DRAWER_JOIN_SECONDS)

    # -- the drawer --------------------------------------------------------------------------

    def start_drawer(self, idle: bool = True) -> None:
        """Draw from a thread of the dashboard's own from now on, at the OS's idle scheduling
        priority where it has one (Linux: ``SCHED_IDLE``).

        Then ``feed`` and ``progress`` only hand their data over (a list append under a lock, in
        the caller's thread) and the drawer, once per interval, reads the records fed since and
        redraws. At idle priority it runs when a core has nothing else to run: on a CPU machine
        whose cores the ranks fill, their waits for each other at every step, instead of taking a
        core from a rank, which would make every rank wait for that one
        (``python -m benchmarks.live --kernel`` measures what the live view costs training).
        Where every core stays busy it still gets its share at the scheduler's ticks: the view is
        late, never stopped. :meth:`finish` and :meth:`close` stop it."""
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
            with self._draw_lock:
                if self._stop_drawer.is_set():
                    return
                self._add_queued()
                if self._dirty and self._due():
                    self._draw()
            next_check = max(self._last_draw + self.interval, self._clock() + DRAWER_IDLE_CHECK)

    # -- throttling --------------------------------------------------------------------------

    def _due(self) -> bool:
        return self._clock() - self._last_draw >= self.interval

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
            wait = self.interval - (self._clock() - self._last_draw)
            self._timer = threading.Timer(min(max(wait, 0.01), self.interval), self._on_timer)
            self._timer.daemon = True
            self._timer.start()

    def _on_timer(self) -> None:
        with self._lock:
            self._timer = None
            dirty = self._dirty
        if dirty:
            self.flush()

    # -- drawing -----------------------------------------------------------------------------

    def _snapshot(self) -> dict[str, Any]:
        """Copy what a redraw needs under the lock: the changed figures' traces (bounded in size
        by MAX_POINTS), the progress, the rates and the ETAs."""
        with self._lock:
            self._dirty = False
            figures = {}
            for key, series in self._series.items():
                if series.version != self._drawn.get(key, 0):
                    figures[key] = (series.version, series.traces(MAX_POINTS))
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

    def _draw(self) -> None:
        """Redraw the changed figures, the bars and the header (caller holds the draw lock)."""
        cpu = time.thread_time()
        snap = self._snapshot()
        added = False
        rows: dict[str, list[plots.Trace]] = {}  # the changed rows of the base figures
        for key, (version, traces) in snap["figures"].items():
            panel = self.panels.get(key)
            if panel is None:
                if not traces:
                    continue
                panel = self.panels[key] = FigurePanel(self._series[key].empty())
                added = True
            if panel is self._rows:
                rows[key] = traces
            else:
                panel.show(traces)
            self._drawn[key] = version
        if rows:
            self._rows.show_rows(rows)
        if added:
            self._arrange()
        self._draw_bars(snap["progress"], snap["rates"], snap["etas"])
        # one widget message for the header line and every rank's bar (sent only when it changed)
        self._header.value = (
            self._header_html(snap["progress"], snap["etas"], snap["total"]) + self._bars_html()
        )
        self.redraws += 1
        self._last_draw = self._clock()
        # A redraw that built widgets (the first, a new figure) pays once for what later ones reuse
        # (10-20 ms of CPU here): budgeting it would hold the next redraw back for a second or more.
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

    def _draw_bars(
        self,
        progress: Mapping[int, Mapping[str, Any]],
        rates: Mapping[int, float],
        etas: Mapping[int, float | None],
    ) -> None:
        for rank, info in sorted(progress.items()):
            if rank not in self._bars:
                self._bars[rank] = RankBar(rank)
            self._draw_bar(self._bars[rank], rank, info, rates.get(rank), etas.get(rank))

    def _draw_bar(
        self,
        bar: RankBar,
        rank: int,
        info: Mapping[str, Any],
        rate: float | None,
        eta: float | None,
    ) -> None:
        step = int(info.get("step") or 0)
        total = info.get("total")
        parts = [f"rank {rank}: step {step}" + (f"/{total}" if total else "")]
        if rate is not None:
            parts.append(f"{rate:,.0f} samples/s")
        if eta is not None and self.status == "running":
            parts.append(f"ETA {format_duration(eta)}")
        bar.max = max(int(total), 1) if total else max(step, 1)
        bar.value = min(step, bar.max)
        bar.description = " · ".join(parts)
        bar.bar_style = BAR_STYLES.get(self.status, "")

    def _bars_html(self) -> str:
        """Every rank's bar, labels in one column so that the bars line up."""
        return (
            "<div style='display:grid;grid-template-columns:max-content 1fr;gap:3px 8px;align-items:center;"
            "margin-top:4px'>" + "".join(self._bars[r].html() for r in sorted(self._bars)) + "</div>"
        )

    def _header_html(
        self,
        progress: Mapping[int, Mapping[str, Any]],
        etas: Mapping[int, float | None],
        total: float | None,
    ) -> str:
        parts = [
            f"<b>{html.escape(self.title)}</b>",
            f"run {self.run_id}",
            f"ranks {_ranks_text(self.ranks)}",
        ]
        parts.append(self._step_text(progress))
        if total:
            parts.append(f"{total:,.0f} samples/s")
        known = [eta for eta in etas.values() if eta is not None]
        if known and self.status == "running":
            parts.append(f"ETA {format_duration(max(known))}")
        seconds = self._seconds
        state = self.status + (
            f" in {format_duration(seconds)}" if seconds and self.status != "running" else ""
        )
        colour = STATUS_COLOURS.get(self.status, "#555")
        parts.append(f"<span style='color:{colour}'>● {html.escape(state)}</span>")
        return f"<div class='dtwork-dashboard-header'>{' · '.join(parts)}</div>"

    def _step_text(self, progress: Mapping[int, Mapping[str, Any]]) -> str:
        steps = [int(p["step"]) for p in progress.values() if p.get("step") is not None]
        totals = [int(p["total"]) for p in progress.values() if p.get("total")]
        if not steps and self._last_step is not None:
            steps = [self._last_step]
        if not steps:
            return "step —"
        return f"step {max(steps)}" + (f"/{max(totals)}" if totals else "")
