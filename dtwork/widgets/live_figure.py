"""The plotly transport of the live view: figure widgets that a redraw updates in one message.

A :class:`FigurePanel` shows one series' figure, a :class:`RowsPanel` several series as the rows of
one figure; both draw a series' traces in place (one restyle for the traces on screen, the new ones
added at the end) through :class:`LiveFigureWidget`, plotly's ``FigureWidget`` whose restyle is one
widget message: in a kernel every message costs CPU that ranks sharing its cores would use.
"""

from __future__ import annotations

import types
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go

from dtwork import plots

__all__ = ["RELEASED_ESM", "FigurePanel", "LiveFigureWidget", "RowView", "RowsPanel"]

FIT_FIRST = 10  # restyles that each ask the browser to fit the figure to the cell's width
FIT_EVERY = 4  # after those, every this many restyles ask again
RELEASED_ESM = "export default {};"  # the JavaScript module of a released figure widget


class LiveFigureWidget(go.FigureWidget):  # type: ignore[misc]
    """plotly's ``FigureWidget`` whose restyles (every redraw of a live figure) go out as one widget
    message: the edit ids and the restyle travel together (``hold_sync``).

    The restyle stays in place until the next one replaces it: each carries a new
    ``trace_edit_id``, so the frontend sees every one as a change and applies it, as it applies
    plotly's. :meth:`settle` clears the last one once the figure stops changing, so that a
    notebook's saved widget state holds the data once.
    """

    def _send_restyle_msg(
        self,
        restyle_data: dict[str, object],
        trace_indexes: int | Sequence[int] | None = None,
        source_view_id: str | None = None,
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

    def __init__(self, fig: go.Figure | Mapping[str, object]) -> None:
        super().__init__(fig)
        self._config = {"responsive": True}  # follows the browser window's width
        self._restyles = 0

    @property
    def trace_edits(self) -> int:
        """plotly's trace edit id: one more with every restyle sent."""
        return int(self._last_trace_edit_id)

    @property
    def layout_edits(self) -> int:
        """plotly's layout edit id: one more with every restyle and relayout sent."""
        return int(self._last_layout_edit_id)

    @property
    def pending_restyle(self) -> dict[str, object] | None:
        """The last restyle message, while it stays in place (:meth:`settle` clears it)."""
        return self._py2js_restyle  # type: ignore[no-any-return]  # a traitlets Dict

    @property
    def pending_relayout(self) -> dict[str, object] | None:
        """The last relayout message, while it stays in place (:meth:`settle` clears it)."""
        return self._py2js_relayout  # type: ignore[no-any-return]  # a traitlets Dict

    @property
    def released(self) -> bool:
        """Whether :meth:`release` replaced plotly's JavaScript module with the stub."""
        return bool(self.has_trait("_esm") and self._esm == RELEASED_ESM)

    def restyle_xy(self, xs: Sequence[np.ndarray], ys: Sequence[np.ndarray], index: Sequence[int]) -> None:
        """Set ``x`` and ``y`` of the traces at ``index`` and send them in one restyle.

        What ``plotly_restyle`` does for these arrays, without its checks (key paths validated per
        trace, every new array compared with the old one element by element, change callbacks:
        none are registered here), which would cost a redraw more than the restyle itself. The
        arrays are fresh 1-d numpy arrays of numbers (a series' ``traces``), the traces scatters.
        """
        index = list(index)
        for i, x, y in zip(index, xs, ys, strict=True):
            props = self._data[i]
            props["x"] = x
            props["y"] = y
        self._restyles += 1
        with self.hold_sync():  # the restyle and, now and then, the fit: one message
            self._send_restyle_msg({"x": list(xs), "y": list(ys)}, index)
            if self._restyles <= FIT_FIRST or self._restyles % FIT_EVERY == 0:
                self.fit_width()

    def fit_width(self) -> None:
        """Ask the browser to size the figure to its cell again (``autosize``).

        plotly's widget draws a new view before JupyterLab attaches it to the page, so it may not
        measure the cell and take plotly's default width; a relayout with ``autosize`` measures
        again. The kernel cannot tell when a view is attached: the restyles ask now and then. Like
        the restyle, the message stays in place until the next one (plotly's own messages are set,
        then cleared at once, which a held sync would merge into nothing).
        """
        with self.hold_sync():
            self._last_layout_edit_id += 1
            self._layout_edit_in_process = True
            self._py2js_relayout = {
                "relayout_data": {"autosize": True},
                "layout_edit_id": self._last_layout_edit_id,
                "source_view_id": None,
            }

    def release(self) -> None:
        """Replace the JavaScript module in the model's state with a stub before the widget closes:
        a notebook executed headlessly saves every widget's last state, and plotly's module is
        megabytes per figure. Call it only once no view shows the figure."""
        if self.has_trait("_esm"):
            self._esm = RELEASED_ESM

    def settle(self) -> None:
        """Clear the last restyle and relayout (the figure's data hold them already)."""
        if self._py2js_restyle is not None:
            self._py2js_restyle = None  # type: ignore[assignment]  # traitlets types Dict(allow_none) as dict
        if self._py2js_relayout is not None:
            self._py2js_relayout = None  # type: ignore[assignment]


class FigurePanel:
    """One figure on screen, drawn from a series' traces."""

    def __init__(self, fig: go.Figure | Mapping[str, object]) -> None:
        """Show ``fig`` (a figure from :mod:`dtwork.plots`, or its dict)."""
        self.figure = LiveFigureWidget(fig)
        self.view = self.figure
        self.names = [trace.name for trace in self.figure.data]
        self.axes: dict[str, plots.AxisLayout] = {}  # the y axes' layout set so far, by axis name

    def _set_axis(self, name: str, axis: plots.AxisLayout) -> None:
        """Set the y axis ``name`` ("yaxis", "yaxis2", ...) when its layout changed."""
        if axis and self.axes.get(name) != axis:
            self.figure.layout[name].update(axis)
            self.axes[name] = axis.copy()

    def show(self, traces: Sequence[plots.Trace], axis: plots.AxisLayout | None = None) -> None:
        """Draw ``traces`` (a series' ``traces(...)``) on a y axis laid out as ``axis``: in place when
        the figure has those traces already, the new ones added at the end, all of them again when
        their order changed.
        """
        self._show(traces, axis or {})

    def _show(self, traces: Sequence[plots.Trace], axis: plots.AxisLayout) -> None:
        names = [t.name for t in traces]
        have = len(self.names)
        if names[:have] != self.names:  # order changed: draw them all again
            self.figure.data = ()
            have = 0
        with self.figure.batch_update():
            if have:
                mine = traces[:have]  # one restyle for the traces already there
                self.figure.restyle_xy([t.x for t in mine], [t.y for t in mine], list(range(have)))
            if len(names) > have:
                self.figure.add_traces([plots.scatter(t) for t in traces[have:]])
            self._no_data(not names)
            self._set_axis("yaxis", axis)
        self.names = names

    def settle(self) -> None:
        """The figure stops changing: drop what only a live update needed."""
        self.figure.settle()

    def _no_data(self, show: bool) -> None:
        """Show or drop the "no data yet" note."""
        notes = self.figure.layout.annotations
        has = any(a.name == plots.NO_DATA_NAME for a in notes)
        if has and not show:
            self.figure.layout.annotations = [a for a in notes if a.name != plots.NO_DATA_NAME]
        elif show and not has:
            self.figure.layout.annotations = [*notes, plots.no_data_note()]


class RowView:
    """One row of a :class:`RowsPanel` read as a figure: its traces (``data``) and its annotations
    (``layout.annotations``: the row's "no data yet" note)."""

    def __init__(self, panel: RowsPanel, key: str) -> None:
        self.panel = panel
        self.key = key

    @property
    def data(self) -> tuple[go.Scatter, ...]:
        return tuple(t for t in self.panel.figure.data if t.legendgroup == self.key)

    @property
    def layout(self) -> types.SimpleNamespace:
        ref = f"{plots.row_axes(self.panel.keys.index(self.key) + 1)[0]} domain"
        notes = tuple(a for a in self.panel.figure.layout.annotations if a.xref == ref)
        return types.SimpleNamespace(annotations=notes)


class RowsPanel(FigurePanel):
    """Several series' figures as the rows of one figure on screen (:func:`plots.stacked_figure`),
    so that a redraw updates every changed row with one restyle, one widget message.
    Each row has its own axes and its own legend beside it.
    """

    def __init__(self, series: Mapping[str, plots.Series]) -> None:
        self.keys = list(series)
        super().__init__(plots.stacked_figure(list(series.values())))
        # (row key, trace name) of each trace on screen, in order; the rows' empty traces have no key
        self.order: list[tuple[str, str]] = [(t.legendgroup or "", t.name or "") for t in self.figure.data]
        self._noted = set(self.keys)  # rows showing "no data yet" (every row, at first)

    def row(self, key: str) -> RowView:
        return RowView(self, key)

    def show_rows(
        self, rows: Mapping[str, Sequence[plots.Trace]], axes: Mapping[str, plots.AxisLayout] | None = None
    ) -> None:
        """Draw each row's traces (a series' ``traces(...)``) on its y axis laid out as ``axes[row]``:
        the ones on screen already in one restyle, the new ones added at the end; a row whose traces
        came in a new order is drawn again."""
        self._show_rows(rows, axes or {})

    def _show_rows(
        self, rows: Mapping[str, Sequence[plots.Trace]], axes: Mapping[str, plots.AxisLayout]
    ) -> None:
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
                fig.restyle_xy(xs, ys, index)
            if new:
                fig.add_traces([self._scatter(key, t) for key, t in new])
                self.order += [(key, t.name) for key, t in new]
            self._row_notes({key: not traces for key, traces in rows.items()})
            for key, axis in axes.items():
                row_y = plots.row_axes(self.keys.index(key) + 1)[1]
                self._set_axis(row_y.replace("y", "yaxis", 1), axis)

    def _scatter(self, key: str, trace: plots.Trace) -> go.Scatter:
        """The trace on its row's axes and legend, grouped under the row's key (:class:`RowView`)."""
        return plots.on_row(
            trace._replace(style={**trace.style, "legendgroup": key}), self.keys.index(key) + 1
        )

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
