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

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Protocol

import ipywidgets as widgets
import plotly.graph_objects as go

from dtwork import plots
from dtwork.plots.cell_view import CELL_MIME, cell_bundle
from dtwork.widgets.drawer import Drawer, Pacer, idle_priority
from dtwork.widgets.header import BAR_COLOURS, Header, format_duration
from dtwork.widgets.intake import Intake
from dtwork.widgets.live_figure import FigurePanel, LiveFigureWidget, RowView
from dtwork.widgets.panels import Panels
from dtwork.widgets.updating import plotly_bundle

__all__ = ["BAR_COLOURS", "Dashboard", "format_duration", "idle_priority"]

MIN_INTERVAL = 0.5  # seconds between redraws while records flow
DRAW_SHARE = 0.01  # of a core, at most, spent redrawing (the interval grows with a redraw's cost)
SHARE_RANKS = 64  # past this many ranks the share grows in proportion (4% at 256 ranks)
MAX_POINTS = 1000  # per trace on screen (about a plot's width in pixels): redraws cost what is drawn
BASE_FIGURES, KIND_FIGURES = plots.BASE_FIGURES, plots.KIND_FIGURES
STATUS_WORDS = {"ok": "finished", "error": "failed", "interrupted": "interrupted", "running": "running"}


class Finished(Protocol):
    """How a cell ended, as the dashboard reads it (``kernel.watcher.CellResult`` is one)."""

    status: str


class DisplayHandle(Protocol):
    """The handle of the output showing the dashboard (IPython's ``DisplayHandle``)."""

    def update(self, obj: object, **kwargs: object) -> None: ...


class Dashboard(widgets.VBox):
    """Live view of one training cell: header line, figures and one progress bar per rank.

    Its parts, one job each: the :class:`Header` (status line and bars), the :class:`Intake` (records
    and progress handed over, the series), the :class:`Panels` (figure widgets on screen), the
    :class:`Pacer` (when a redraw is due) and the :class:`Drawer` (the thread that redraws).
    """

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
        self.global_batch = global_batch
        self._header = Header(run_id, ranks, title)
        n = len(self._header.ranks)
        # the bars and bands cost more with more ranks: a larger view may take a little more
        self._pacer = Pacer(min_interval, draw_share and draw_share * max(1.0, n / SHARE_RANKS), clock)
        self._intake = Intake(n, global_batch, MAX_POINTS)
        self._draw_lock = threading.RLock()  # one redraw at a time
        self._drawer = Drawer(self.wake, self._pacer)
        self._panels = Panels(self._intake.series)
        self._display: DisplayHandle | None = None  # the output showing the dashboard (for_cell)
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

    def _arrange(self) -> None:
        self.children = (self._header.widget, *self._panels.sections())

    # -- what it shows -------------------------------------------------------------------------

    @property
    def header(self) -> Header:
        """The status line and the bars (``header.html``: what it shows)."""
        return self._header

    @property
    def panels(self) -> Mapping[str, FigurePanel]:
        """The panel of each figure on screen by key (the base figures share one)."""
        return self._panels.by_key

    @property
    def views(self) -> list[widgets.Widget]:
        """The figure views on screen, in order (each inside its folding section)."""
        return [view for section in self.children[1:] for view in section.children]

    @property
    def figures(self) -> dict[str, LiveFigureWidget | RowView]:
        """The figures on screen by key ("metrics", "throughput", "step_time", "gpu", "gns"): the first
        three are rows of one figure widget, read through a :class:`RowView` (``data``, ``layout``)."""
        return self._panels.figures

    @property
    def series(self) -> Mapping[str, plots.Series]:
        """The cell's series by figure key, what the figures are drawn from."""
        return self._intake.series

    # -- what it was told ----------------------------------------------------------------------

    @property
    def run_id(self) -> int | None:
        return self._header.run_id

    @property
    def ranks(self) -> list[int]:
        return self._header.ranks

    @property
    def title(self) -> str:
        return self._header.title

    @property
    def status(self) -> str:
        """ "running", then how the cell ended ("finished", "failed", "interrupted")."""
        return self._header.status

    @property
    def diverged(self) -> str | None:
        """ "diverged at step k (loss nan)", once the run has (the session sets it)."""
        return self._header.diverged

    @diverged.setter
    def diverged(self, text: str | None) -> None:
        self._header.diverged = text

    @property
    def rows_fed(self) -> int:
        """The rows read from what was fed so far."""
        return self._intake.rows_fed

    @property
    def efficiency(self) -> float | None:
        """The session's live scaling-efficiency estimate, once fed."""
        return self._intake.efficiency

    # -- its pace ------------------------------------------------------------------------------

    @property
    def min_interval(self) -> float:
        return self._pacer.min_interval

    @property
    def draw_share(self) -> float | None:
        return self._pacer.draw_share

    @property
    def interval(self) -> float:
        """The current interval between redraws: ``min_interval``, or longer when redraws cost more."""
        return self._pacer.interval

    @property
    def redraws(self) -> int:
        return self._pacer.redraws

    @property
    def rebuilds(self) -> int:
        """How often a long cell's figures were drawn again from its rollups."""
        return self._intake.builds

    @property
    def next_draw(self) -> float:
        """When the next redraw is due, on the dashboard's clock."""
        return self._pacer.next_draw

    @property
    def drawer_busy(self) -> bool:
        """Whether its drawer found every core busy (a wake came late) and left idle priority."""
        return self._drawer.busy

    @property
    def drawing(self) -> bool:
        """Whether its drawer thread runs."""
        return self._drawer.running

    # -- public API --------------------------------------------------------------------------

    def feed(self, records: Iterable[Mapping[str, object]]) -> None:
        """Hand over rank records (or store rows) for the drawer to read. Thread-safe."""
        self._intake.feed(records)

    def progress(self, progress_by_rank: Mapping[int, Mapping[str, object]]) -> None:
        """Take the ranks' latest progress ({rank: {step, total, time, phase, ...}}). Thread-safe."""
        self._intake.progress(progress_by_rank)

    def read_fed(self) -> int:
        """Read what was fed now, not at the drawer's pace; return the rows read so far."""
        with self._draw_lock:
            self._intake.read_queued()
        return self._intake.rows_fed

    def flush(self) -> None:
        """Read what was fed and redraw now, whatever the interval says."""
        with self._draw_lock:
            self._intake.read_queued()
            self.redraw()

    def finish(self, result: Finished) -> None:
        """Stop the drawer, draw everything once more and say in the header how the cell ended
        (``result.status``)."""
        status = str(result.status)
        self._drawer.stop()
        self._header.status = STATUS_WORDS.get(status, status)
        self._header.seconds = getattr(result, "seconds", None)
        with self._draw_lock:
            self._intake.read_all()
        self.flush()
        self._panels.settle()
        if self._display is not None:
            self._leave_figures()

    def static_figure(self) -> go.Figure:
        """Every figure on screen as the rows of one plotly figure, titled with the header line."""
        keys = (*BASE_FIGURES, *(k for k in KIND_FIGURES if k in self._panels.by_key))
        parts, progress = self._intake.static_parts(keys)
        line = self._header.summary(progress, self._intake.efficiency, self._intake.last_step)
        return plots.dashboard_figure(parts, line)

    def _leave_figures(self) -> None:
        """Put the static figures in the dashboard's output in place of the widgets and close them:
        a saved notebook then holds the figures as plotly JSON, which JupyterLab draws, instead of
        widget models that each carry plotly's JavaScript."""
        assert self._display is not None
        self._display.update(plotly_bundle(self.static_figure(), self.title), raw=True)
        self._panels.release()
        self.close()

    def close(self) -> None:
        """Stop the drawer and close the widgets."""
        self._drawer.stop()
        self._panels.close()
        self._header.widget.close()
        super().close()

    # -- the drawer --------------------------------------------------------------------------

    def start_drawer(self, idle: bool = True) -> None:
        """Draw from a thread of the dashboard's own from now on, at the OS's idle scheduling
        priority where it has one (Linux: ``SCHED_IDLE``).

        At idle priority it runs when a core has nothing else to run: on a CPU machine whose cores
        the ranks fill, in their waits for each other at every step, instead of taking a core from a
        rank that every other rank would then wait for. Where every core stays busy it still gets
        its share at the scheduler's ticks, seconds late: once a wake comes ``DRAWER_LATE`` late the
        drawer goes back to the normal policy, niced, for the rest of the cell. :meth:`finish` and
        :meth:`close` stop it."""
        self._drawer.start(idle)

    def wake(self) -> bool:
        """One wake of the drawer: read what was fed, redraw if something is new and the interval
        has passed. Return False once the drawer is told to stop."""
        with self._draw_lock:
            if self._drawer.stopping:
                return False
            self._intake.read_queued()
            if self._intake.dirty and self._pacer.due():
                self.redraw()
        return True

    def redraw(self) -> None:
        """Redraw the changed figures, the bars and the header from what was read."""
        with self._draw_lock:
            cpu, start = time.thread_time(), self._pacer.clock()
            snap = self._intake.snapshot()
            drawn, added = self._panels.show(snap.figures)
            for key, version in drawn.items():
                self._intake.drawn(key, version)
            if added:
                self._arrange()
            intake = self._intake
            self._header.draw(
                snap.progress, snap.rates, snap.etas, snap.total, intake.efficiency, intake.last_step
            )
            # a long cell's figures drawn again are paced by their own share (intake.BUILD_SHARE)
            self._pacer.drew(start, cpu + snap.build_cpu, added)
