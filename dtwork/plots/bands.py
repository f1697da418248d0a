"""Per-rank lines folded into percentile bands, so that a figure of many ranks costs a few traces.

Past ``BAND_RANKS`` ranks one line per rank is unreadable, and each redraw would send every rank's
arrays: a series' per-rank lines become the 10th, 50th and 90th percentile over ranks at the steps
of a grid, each rank's value carried forward from its last step at or before a grid step (as the
global throughput is). The grid is lo, lo + s, lo + 2s, ... up to the latest step, which ends it
(lo: the first step every rank has reached; s: the least power of two that keeps it within
``GRID_POINTS`` steps). A grid step keeps its place as the run grows, and when s doubles every other
one stays: so the percentiles of a step every rank has passed are kept, and a redraw computes only
the steps past the slowest rank, whatever the run's length.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping

import numpy as np

from dtwork.plots.columns import RankSeries, Trace, take

__all__ = ["BAND_RANKS", "GRID_POINTS", "QUANTILES", "RankBands", "band_grid"]

BAND_RANKS = 16  # more ranks than this are drawn as bands
GRID_POINTS = 200  # intervals of a band's grid, at most
QUANTILES = ((10, "p10"), (90, "p90"), (50, "median"))  # edges first: the upper one fills to the lower
FEW_STEPS = 8  # grid steps a redraw computes by bisection; past it, with numpy per rank
_EDGE = {"line": {"width": 0, "color": "rgba(99,110,250,0.3)"}, "showlegend": False, "hoverinfo": "skip"}
_FILL = {"fill": "tonexty", "fillcolor": "rgba(99,110,250,0.2)"}
_MEDIAN = {"line": {"color": "rgb(99,110,250)"}}


def grid_stride(lo: int, hi: int) -> int:
    """The least power of two that spaces lo..hi in at most GRID_POINTS intervals."""
    stride = 1
    while hi - lo > stride * GRID_POINTS:
        stride *= 2
    return stride


def band_grid(lo: int, hi: int) -> np.ndarray:
    """The steps a band is drawn at: lo, lo + s, ... (s = grid_stride), and hi."""
    grid = np.arange(lo, hi + 1, grid_stride(lo, hi), dtype=np.int64)
    return grid if grid[-1] == hi else np.append(grid, hi)


def _carried(series: list[RankSeries], steps: np.ndarray) -> np.ndarray:
    """Each rank's value at its last step at or before each of ``steps`` (each >= its first step):
    a row per rank. A few steps of ranks in order by bisection, else with numpy rank by rank."""
    if len(steps) <= FEW_STEPS and all(s.in_order for s in series):
        at = steps.tolist()
        return np.array([[s.values[bisect.bisect_right(s.steps, g) - 1] for g in at] for s in series])
    out = np.empty((len(series), len(steps)))
    for i, s in enumerate(series):
        x, y = s.trace(None, True)
        order = np.argsort(x, kind="stable")  # distinct steps: a step reported again replaced its value
        out[i] = np.asarray(y, dtype=float)[order][np.searchsorted(x[order], steps, side="right") - 1]
    return out


class RankBands:
    """The percentile bands of ``ranks`` (a series' live per-rank table, read at each call).

    The owner calls :meth:`reset` when a value already taken changes (a step reported again or out
    of order): the kept percentiles then no longer hold."""

    def __init__(self, ranks: Mapping[int, RankSeries]) -> None:
        self.ranks = ranks
        self._kept: dict[int, np.ndarray] = {}  # grid step -> its percentiles, in QUANTILES order
        self._lo: int | None = None
        self._stride = 1

    def reset(self) -> None:
        self._kept.clear()

    def traces(self, what: str, style: Mapping[str, object], array: bool) -> list[Trace]:
        """The p10, p90 and median traces (named "ranks {what}p10" ...), axes from ``style``."""
        series = [s for s in self.ranks.values() if len(s.steps)]
        if not series:
            return []
        ordered = all(s.in_order for s in series)
        lo = max(s.steps[0] if s.in_order else min(s.steps) for s in series)  # every rank has begun
        tops = [s.top for s in series if s.top is not None]  # every one: each rank has a step
        grid = band_grid(lo, max(tops))
        stride = grid_stride(lo, int(grid[-1]))
        if lo != self._lo or not ordered:
            self._kept, self._lo = {}, lo
        elif stride != self._stride:
            self._kept = {g: q for g, q in self._kept.items() if (g - lo) % stride == 0}
        self._stride = stride
        kept = self._kept
        new = np.array([g for g in grid.tolist() if g not in kept], dtype=np.int64)
        bands = np.empty((len(QUANTILES), grid.size))
        computed, at = np.empty((len(QUANTILES), 0)), {}
        if new.size:
            values = _carried(series, new)
            computed = np.percentile(values, [q for q, _ in QUANTILES], axis=0)
            final = min(tops)  # a step every rank has passed keeps its values
            if ordered:
                for j, g in enumerate(new.tolist()):
                    if g < final:
                        kept[g] = computed[:, j]
            at = {g: j for j, g in enumerate(new.tolist())}
        for i, g in enumerate(grid.tolist()):
            bands[:, i] = kept[g] if g in kept else computed[:, at[g]]
        axes = {k: v for k, v in style.items() if k in ("xaxis", "yaxis")}
        x = take(grid.tolist(), None, True) if array else grid.tolist()
        out = []
        for (q, label), y in zip(QUANTILES, bands, strict=True):
            look = {**axes, **(_MEDIAN if q == 50 else _EDGE), **(_FILL if q == 90 else {})}
            out.append(Trace(f"ranks {what}{label}", x, y if array else y.tolist(), look))
        return out


def banded(ranks: Mapping[int, object]) -> bool:
    """Whether a series with per-rank lines of ``ranks`` draws them as bands."""
    return len(ranks) > BAND_RANKS
