"""A figure shown once in a cell's output and redrawn in place as results arrive.

JupyterLab's plotly renderer draws an output once and then ignores updates to it (its
``renderModel`` returns early once a graph is on the page), so an ``update_display`` of plotly
JSON changes the saved notebook but not the page. While results arrive the figure is therefore a
figure widget, whose updates the browser applies; :meth:`UpdatingFigure.done` puts the last
figure in its place as plotly JSON (a new renderer: the mime type changes), so a saved notebook
holds a figure rather than a widget model.
"""

from __future__ import annotations

import json
import re
from typing import Any

import plotly.graph_objects as go
import plotly.io as pio

from dtwork.widgets.live_figure import LiveFigureWidget

__all__ = ["UpdatingFigure", "plotly_bundle"]

PLOTLY_MIME = "application/vnd.plotly.v1+json"


def plotly_bundle(fig: go.Figure, fallback: str = "plotly figure") -> dict[str, object]:
    """The figure as a raw display bundle: plotly JSON and a plain-text title."""
    title = re.sub("<[^>]+>", "", fig.layout.title.text or fallback)
    return {PLOTLY_MIME: json.loads(pio.to_json(fig, validate=False)), "text/plain": title}


class UpdatingFigure:
    """Show a figure (:meth:`show`), redraw it in place on each later call, leave it as plotly JSON
    (:meth:`done`). Does nothing outside IPython."""

    def __init__(self) -> None:
        from IPython import get_ipython

        self.active = get_ipython() is not None
        self.widget: LiveFigureWidget | None = None
        self.handle: Any = None
        self.last: go.Figure | None = None

    def show(self, fig: go.Figure) -> None:
        """Show ``fig``, or redraw the figure on screen as ``fig``."""
        if not self.active:
            return
        from IPython.display import display

        self.last = fig
        if self.widget is None:
            self.widget = LiveFigureWidget(fig)
            self.handle = display(self.widget, display_id=True)
            return
        widget = self.widget
        with widget.batch_update():
            widget.data = ()
            widget.add_traces(list(fig.data))
            widget.layout = fig.layout
        widget.fit_width()

    def done(self) -> None:
        """Replace the widget by the last figure as plotly JSON and close it."""
        widget, self.widget = self.widget, None
        if widget is None or self.last is None:
            return
        if self.handle is not None:
            self.handle.update(plotly_bundle(self.last), raw=True)
        widget.release()
        widget.close()
