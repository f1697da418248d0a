"""An analysis figure that updates in place: a widget while results arrive, plotly JSON after.

JupyterLab's plotly renderer ignores updates to an output it has drawn, so the updates must
reach the page as widget changes, and the last figure must replace the widget (a new mime type,
so a new renderer). The browser half is in extension/ui-tests (the scaling figure spec).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import plotly.graph_objects as go
import pytest
from IPython.core.displaypub import DisplayPublisher
from IPython.core.interactiveshell import InteractiveShell

from dtwork.widgets.updating import PLOTLY_MIME, UpdatingFigure

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


class Recorder(DisplayPublisher):
    """Keeps every display message: (data, transient, update)."""

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[tuple[dict[str, Any], dict[str, Any], bool]] = []

    def publish(self, data, metadata=None, source=None, *, transient=None, update=False, **kw):  # type: ignore[no-untyped-def]
        self.messages.append((dict(data), dict(transient or {}), update))


@pytest.fixture()
def shown() -> Iterator[Recorder]:
    shell = InteractiveShell.instance()
    recorder, saved = Recorder(), shell.display_pub
    shell.display_pub = recorder
    try:
        yield recorder
    finally:
        shell.display_pub = saved


def _fig(ys: list[float], title: str) -> go.Figure:
    return go.Figure(go.Scatter(x=list(range(len(ys))), y=ys, name="measured"), layout={"title": title})


def test_updates_reach_the_widget_and_the_last_figure_stays_as_plotly_json(shown: Recorder) -> None:
    figure = UpdatingFigure()
    figure.show(_fig([1.0], "one point"))
    widget = figure.widget
    assert widget is not None
    figure.show(_fig([1.0, 1.8], "two points"))
    assert figure.widget is widget  # the same view, redrawn: not a second output
    assert list(widget.data[0].y) == [1.0, 1.8]
    assert widget.layout.title.text == "two points"
    (first, transient, update), *rest = shown.messages
    assert WIDGET_MIME in first and not update
    figure.done()
    assert widget.comm is None  # closed
    (last, last_transient, last_update) = shown.messages[-1]
    assert last_update and last_transient["display_id"] == transient["display_id"]
    assert WIDGET_MIME not in last
    assert last[PLOTLY_MIME]["data"][0]["y"] == [1.0, 1.8]
    assert last["text/plain"] == "two points"
    assert len([m for m in shown.messages if not m[2]]) == 1  # one output, updated


def test_done_without_a_figure_shows_nothing(shown: Recorder) -> None:
    figure = UpdatingFigure()
    figure.done()
    assert shown.messages == []
