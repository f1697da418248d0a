"""The dashboard's header: the cell's status line and one progress bar per rank, drawn as HTML so
that a redraw updates them all in one widget message. Past ``BAND_RANKS`` ranks (where the figures
draw bands) it shows one bar for all of them and the bars of the ``SLOWEST`` slowest: the
stragglers are what a long list of bars would hide, and the bars' cost stays that of a few."""

from __future__ import annotations

import html
from collections.abc import Iterable, Mapping, Sequence
from typing import TypedDict

import ipywidgets as widgets

from dtwork.plots.bands import BAND_RANKS

__all__ = [
    "BAR_COLOURS",
    "BAR_STYLES",
    "STATUS_COLOURS",
    "Bars",
    "Header",
    "RankBar",
    "RankProgress",
    "bars_html",
    "format_duration",
    "ranks_text",
    "slowest",
    "step_text",
    "summary_bar",
]

SLOWEST = 4  # bars of single ranks shown past BAND_RANKS ranks: the furthest behind

STATUS_COLOURS = {"running": "#1565c0", "finished": "#2e7d32", "failed": "#c62828", "interrupted": "#ef6c00"}
BAR_STYLES = {"finished": "success", "failed": "danger", "interrupted": "warning"}
BAR_COLOURS = {
    "": STATUS_COLOURS["running"],
    "success": STATUS_COLOURS["finished"],
    "danger": STATUS_COLOURS["failed"],
    "warning": STATUS_COLOURS["interrupted"],
}


class RankProgress(TypedDict, total=False):
    """A rank's latest progress as it publishes it (``runtime.core.publish``)."""

    rank: int
    time: float
    step: int | None
    total: int | None
    phase: str
    epoch: int


class RankBar:
    """One rank's progress bar: its state (``value``, ``max``, ``description``, ``bar_style``, as an
    ipywidgets progress bar has them) drawn as HTML in the dashboard's header widget."""

    __slots__ = ("bar_style", "description", "max", "value")

    def __init__(self, rank: int) -> None:
        self.value = 0
        self.max = 1
        self.description = f"rank {rank}: waiting"
        self.bar_style = ""

    def fill(self, step: int, total: int | None) -> None:
        """Fill the bar to ``step`` of ``total`` (no total: full at its step)."""
        self.max = max(int(total), 1) if total else max(step, 1)
        self.value = min(step, self.max)

    def html(self) -> str:
        share = 100.0 * min(max(self.value / self.max, 0.0), 1.0) if self.max > 0 else 0.0
        colour = BAR_COLOURS.get(self.bar_style, BAR_COLOURS[""])
        # two cells of the bars' grid (see bars_html): the label, then the bar
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


def bars_html(bars: Iterable[RankBar]) -> str:
    """The bars in order, labels in one column so that the bars line up."""
    return (
        "<div style='display:grid;grid-template-columns:max-content 1fr;gap:3px 8px;align-items:center;"
        "margin-top:4px'>" + "".join(bar.html() for bar in bars) + "</div>"
    )


def slowest(progress: Mapping[int, RankProgress]) -> list[int]:
    """The SLOWEST ranks furthest behind (fewest steps; a rank not yet stepping first), slowest first."""
    return sorted(progress, key=lambda r: (int(progress[r].get("step") or 0), r))[:SLOWEST]


def summary_bar(progress: Mapping[int, RankProgress], ranks: int) -> RankBar:
    """One bar for every rank: filled to the slowest rank's step, labelled with the steps' spread."""
    bar = RankBar(0)
    steps = sorted(int(p.get("step") or 0) for p in progress.values())
    totals = [int(t) for p in progress.values() if (t := p.get("total"))]
    if not steps:
        bar.description = f"{ranks} ranks: waiting"
        return bar
    total = max(totals) if totals else None
    bar.fill(steps[0], total or max(steps[-1], 1))  # the slowest rank's step
    spread = f"step {steps[0]}" if steps[0] == steps[-1] else f"steps {steps[0]}-{steps[-1]}"
    bar.description = (
        f"{ranks} ranks: {spread}" + (f"/{total}" if total else "") + f" (median {steps[len(steps) // 2]})"
    )
    return bar


def ranks_text(ranks: Sequence[int]) -> str:
    """The ranks as "0-3" when they run in a row, else "0, 2, 5"."""
    if len(ranks) > 1 and list(ranks) == list(range(ranks[0], ranks[0] + len(ranks))):
        return f"{ranks[0]}-{ranks[-1]}"
    return ", ".join(str(r) for r in ranks)


class Bars:
    """The bars under the header line: one a rank, or past BAND_RANKS ranks one for all of them
    (:func:`summary_bar`) above the slowest ranks' (:func:`slowest`), slowest first."""

    def __init__(self, ranks: Sequence[int]) -> None:
        self.ranks = len(ranks)
        many = self.ranks > BAND_RANKS
        self.summary: RankBar | None = summary_bar({}, self.ranks) if many else None
        self.bars: dict[int, RankBar] = {} if many else {r: RankBar(r) for r in ranks}

    def draw(
        self,
        progress: Mapping[int, RankProgress],
        rates: Mapping[int, float],
        etas: Mapping[int, float | None],
        status: str,
    ) -> None:
        """Update the bars from the ranks' progress, samples/s and seconds left."""
        style = BAR_STYLES.get(status, "")
        if self.summary is not None or len(progress) > BAND_RANKS:
            self.summary = summary_bar(progress, max(self.ranks, len(progress)))
            self.summary.bar_style = style
            self.bars = {r: self.bars.get(r) or RankBar(r) for r in slowest(progress)}
        else:
            for rank in progress:
                self.bars.setdefault(rank, RankBar(rank))
        for rank, bar in self.bars.items():
            info = progress.get(rank)
            if info is None:
                continue
            step, total = int(info.get("step") or 0), info.get("total")
            parts = [f"rank {rank}: step {step}" + (f"/{total}" if total else "")]
            if (rate := rates.get(rank)) is not None:
                parts.append(f"{rate:,.0f} samples/s")
            if (eta := etas.get(rank)) is not None and status == "running":
                parts.append(f"ETA {format_duration(eta)}")
            bar.fill(step, total)
            bar.description = " · ".join(parts)
            bar.bar_style = style

    def html(self) -> str:
        if self.summary is not None:
            return bars_html([self.summary, *self.bars.values()])
        return bars_html(self.bars[r] for r in sorted(self.bars))


class Header:
    """The dashboard's first widget: the status line (title, run, ranks, step, throughput,
    efficiency, ETA, how the cell is going) and the bars, in one HTML widget."""

    def __init__(self, run_id: int | None, ranks: Sequence[int], title: str) -> None:
        self.run_id = run_id
        self.ranks = list(ranks)
        self.title = title
        self.status = "running"
        self.diverged: str | None = None  # "diverged at step k (loss nan)", once the run has
        self.seconds: float | None = None  # how long the cell took, once it ended
        self.bars = Bars(self.ranks)
        self.widget = widgets.HTML(self._line({}, {}, None, None, None) + self.bars.html())

    @property
    def html(self) -> str:
        """What the header shows now (the status line and the bars)."""
        return str(self.widget.value)

    @property
    def rank_bars(self) -> Mapping[int, RankBar]:
        """The bars of single ranks on screen, by rank."""
        return self.bars.bars

    def draw(
        self,
        progress: Mapping[int, RankProgress],
        rates: Mapping[int, float],
        etas: Mapping[int, float | None],
        total: float | None,
        efficiency: float | None,
        last_step: int | None,
    ) -> None:
        """Redraw the bars and the line: one widget message (sent only when it changed)."""
        self.bars.draw(progress, rates, etas, self.status)
        self.widget.value = self._line(progress, etas, total, efficiency, last_step) + self.bars.html()

    def _line(
        self,
        progress: Mapping[int, RankProgress],
        etas: Mapping[int, float | None],
        total: float | None,
        efficiency: float | None,
        last_step: int | None,
    ) -> str:
        parts = [
            f"<b>{html.escape(self.title)}</b>",
            f"run {self.run_id}",
            f"ranks {ranks_text(self.ranks)}",
        ]
        parts.append(step_text(progress, last_step))
        if total:
            parts.append(f"{total:,.0f} samples/s")
        if efficiency is not None:
            parts.append(f"{efficiency:.0%} scaling efficiency")
        known = [eta for eta in etas.values() if eta is not None]
        if known and self.status == "running":
            parts.append(f"ETA {format_duration(max(known))}")
        if self.diverged:
            parts.append(
                f"<span style='color:{STATUS_COLOURS.get('error', '#c00')}'>{html.escape(self.diverged)}</span>"
            )
        seconds = self.seconds
        state = self.status + (
            f" in {format_duration(seconds)}" if seconds and self.status != "running" else ""
        )
        colour = STATUS_COLOURS.get(self.status, "#555")
        parts.append(f"<span style='color:{colour}'>● {html.escape(state)}</span>")
        return f"<div class='dtwork-dashboard-header'>{' · '.join(parts)}</div>"

    def summary(
        self, progress: Mapping[int, RankProgress], efficiency: float | None, last_step: int | None
    ) -> str:
        """The line for a finished cell: what ran, how far, how it ended."""
        parts = [
            f"<b>{html.escape(self.title)}</b>",
            f"run {self.run_id}",
            f"ranks {ranks_text(self.ranks)}",
        ]
        parts.append(step_text(progress, last_step))
        if efficiency is not None:
            parts.append(f"{efficiency:.0%} scaling efficiency")
        if self.diverged:
            parts.append(html.escape(self.diverged))
        seconds = self.seconds
        parts.append(self.status + (f" in {format_duration(seconds)}" if seconds else ""))
        return " · ".join(parts)


def step_text(progress: Mapping[int, RankProgress], last_step: int | None) -> str:
    """The furthest rank's step (of the largest total), else the last step fed: "step 20/100"."""
    steps = [int(step) for p in progress.values() if (step := p.get("step")) is not None]
    totals = [int(total) for p in progress.values() if (total := p.get("total"))]
    if not steps and last_step is not None:
        steps = [last_step]
    if not steps:
        return "step —"
    return f"step {max(steps)}" + (f"/{max(totals)}" if totals else "")
