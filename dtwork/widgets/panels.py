"""The dashboard's figures on screen, each in a section that folds.

The metrics, throughput and step-time figures are the rows of one figure widget (a
:class:`~dtwork.widgets.live_figure.RowsPanel`), updated in one message a redraw; the GPU, noise-scale
and adaptive-batch figures, shown once they have data, are widgets of their own.
"""

from __future__ import annotations

from collections.abc import Mapping

import ipywidgets as widgets

from dtwork import plots
from dtwork.widgets.intake import Changed
from dtwork.widgets.live_figure import FigurePanel, LiveFigureWidget, RowsPanel, RowView

__all__ = ["SECTION_TITLES", "Panels"]

# the title of each folding section; the base figures open, the others folded so the view stays one screen tall
SECTION_TITLES = {
    "metrics": "Metrics · throughput · step time",
    "gpu": "GPUs",
    "gns": "Gradient noise scale",
    "adaptive": "Adaptive batch",
}


class Panels:
    """The panels of a cell's figures by key, the base figures' one shared, and their sections."""

    def __init__(self, series: Mapping[str, plots.Series]) -> None:
        self.series = series
        self.rows = RowsPanel({key: series[key] for key in plots.BASE_FIGURES})
        self.by_key: dict[str, FigurePanel] = {key: self.rows for key in plots.BASE_FIGURES}
        self._sections: dict[int, widgets.Accordion] = {}  # the folding section of each panel, by id

    @property
    def figures(self) -> dict[str, LiveFigureWidget | RowView]:
        """The figures on screen by key: the base figures are rows of one figure widget, read through
        a :class:`RowView` (``data``, ``layout``)."""
        return {
            key: panel.row(key) if isinstance(panel, RowsPanel) else panel.figure
            for key, panel in self.by_key.items()
        }

    def show(self, figures: Mapping[str, Changed]) -> tuple[dict[str, int], bool]:
        """Draw the changed figures, adding a panel for a figure's first traces. Return the version
        drawn of each figure, and whether a panel was added."""
        added = False
        drawn: dict[str, int] = {}
        rows: dict[str, list[plots.Trace]] = {}  # the changed rows of the base figures
        axes: dict[str, plots.AxisLayout] = {}
        for key, (version, traces, axis) in figures.items():
            panel = self.by_key.get(key)
            if panel is None:
                if not traces:
                    continue
                panel = self.by_key[key] = FigurePanel(plots.empty_figure(self.series[key]))
                added = True
            if panel is self.rows:
                rows[key], axes[key] = traces, axis
            else:
                panel.show(traces, axis)
            drawn[key] = version
        if rows:
            self.rows.show_rows(rows, axes)
        return drawn, added

    def distinct(self) -> list[FigurePanel]:
        """The panels on screen, each once (the base figures share one), in order."""
        return list({id(panel): panel for panel in self.by_key.values()}.values())

    def sections(self) -> list[widgets.Accordion]:
        """Each panel's view in a section of its own that folds (made once), in order."""
        seen: dict[int, tuple[str, FigurePanel]] = {}
        for key, panel in self.by_key.items():
            seen.setdefault(id(panel), (key, panel))
        return [self._section(key, panel) for key, panel in seen.values()]

    def _section(self, key: str, panel: FigurePanel) -> widgets.Accordion:
        section = self._sections.get(id(panel))
        if section is None:
            section = widgets.Accordion(children=[panel.view], titles=(SECTION_TITLES.get(key, key),))
            section.selected_index = 0 if key in plots.BASE_FIGURES else None
            section.layout.width = "100%"
            self._sections[id(panel)] = section
        return section

    def settle(self) -> None:
        """The figures stop changing: drop what only a live update needed."""
        for panel in self.distinct():
            panel.settle()

    def release(self) -> None:
        """Drop plotly's JavaScript from the figure widgets' state (no view shows them any more)."""
        for panel in self.distinct():
            panel.figure.release()

    def close(self) -> None:
        """Close the figure widgets and their sections."""
        for panel in self.distinct():
            panel.view.close()
        for section in self._sections.values():
            section.close()
