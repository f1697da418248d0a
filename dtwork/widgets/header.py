"""The dashboard's header: the cell's status line and one progress bar per rank, drawn as HTML so
that a redraw updates them all in one widget message, however many ranks."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence

__all__ = [
    "BAR_COLOURS",
    "BAR_STYLES",
    "STATUS_COLOURS",
    "RankBar",
    "bars_html",
    "format_duration",
    "ranks_text",
]

STATUS_COLOURS = {"running": "#1565c0", "finished": "#2e7d32", "failed": "#c62828", "interrupted": "#ef6c00"}
BAR_STYLES = {"finished": "success", "failed": "danger", "interrupted": "warning"}
BAR_COLOURS = {
    "": STATUS_COLOURS["running"],
    "success": STATUS_COLOURS["finished"],
    "danger": STATUS_COLOURS["failed"],
    "warning": STATUS_COLOURS["interrupted"],
}


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


def bars_html(bars: Mapping[int, RankBar]) -> str:
    """Every rank's bar, labels in one column so that the bars line up."""
    return (
        "<div style='display:grid;grid-template-columns:max-content 1fr;gap:3px 8px;align-items:center;"
        "margin-top:4px'>" + "".join(bars[r].html() for r in sorted(bars)) + "</div>"
    )


def ranks_text(ranks: Sequence[int]) -> str:
    """The ranks as "0-3" when they run in a row, else "0, 2, 5"."""
    if len(ranks) > 1 and list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(str(r) for r in ranks)
