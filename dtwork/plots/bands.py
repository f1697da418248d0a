"""Per-rank traces folded into percentile bands, so that a figure of many ranks costs a few traces.

Past ``BAND_RANKS`` ranks, one line per rank is unreadable and each redraw would send every rank's
arrays: the traces named "rank r..." of each subplot become the 10th, 50th and 90th percentile
over ranks on a common grid of at most ``GRID_POINTS`` steps (each rank's value carried forward
from its last step at or before a grid step, as the global throughput is).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from dtwork.plots.series import Trace

__all__ = ["BAND_RANKS", "GRID_POINTS", "rank_bands"]

BAND_RANKS = 16  # more ranks than this are drawn as bands
GRID_POINTS = 200  # steps of a band's grid
QUANTILES = ((10, "p10"), (90, "p90"), (50, "median"))  # edges first: the upper one fills to the lower
_EDGE = {"line": {"width": 0, "color": "rgba(99,110,250,0.3)"}, "showlegend": False, "hoverinfo": "skip"}
_FILL = {"fill": "tonexty", "fillcolor": "rgba(99,110,250,0.2)"}
_MEDIAN = {"line": {"color": "rgb(99,110,250)"}}


def _band(group: Sequence[Trace], what: str, axes: dict[str, Any]) -> list[Trace]:
    """The p10, p90 and median traces over ``group``'s ranks (numpy arrays, as the widgets take them)."""
    ranks = [(np.asarray(t.x, dtype=float), np.asarray(t.y, dtype=float)) for t in group if len(t.x)]
    if not ranks:
        return []
    lo, hi = max(x[0] for x, _ in ranks), max(x[-1] for x, _ in ranks)  # every rank has begun at lo
    grid = np.unique(np.linspace(lo, hi, GRID_POINTS).round())
    values = np.empty((len(ranks), grid.size))
    for i, (x, y) in enumerate(ranks):
        order = np.argsort(x, kind="stable")
        values[i] = y[order][np.searchsorted(x[order], grid, side="right") - 1]  # >= 0: grid >= lo
    out = []
    bands = np.percentile(values, [q for q, _ in QUANTILES], axis=0)
    for (q, label), y in zip(QUANTILES, bands, strict=True):
        style = {**axes, **(_MEDIAN if q == 50 else _EDGE), **(_FILL if q == 90 else {})}
        out.append(Trace(f"ranks {what}{label}", grid.astype(np.int32), y, style))
    return out


def rank_bands(traces: Sequence[Trace], ranks: int) -> list[Trace]:
    """``traces`` with the per-rank ones ("rank r ...") of each subplot replaced by percentile bands
    when there are more than ``BAND_RANKS`` ``ranks``; the other traces keep their place."""
    if ranks <= BAND_RANKS:
        return list(traces)
    groups: dict[tuple[Any, ...], list[Trace]] = {}
    out: list[Trace | tuple[Any, ...]] = []
    for t in traces:
        if not t.name.startswith("rank "):
            out.append(t)
            continue
        key = (t.style.get("xaxis"), t.style.get("yaxis"), " ".join(t.name.split()[2:]))
        if key not in groups:
            out.append(key)  # the band goes where the group's first rank was
        groups.setdefault(key, []).append(t)
    result: list[Trace] = []
    for item in out:
        if isinstance(item, Trace):
            result.append(item)
        else:
            axes = {k: v for k, v in zip(("xaxis", "yaxis"), item[:2], strict=True) if v}
            result += _band(groups[item], f"{item[2]} " if item[2] else "", axes)
    return result
