"""One colour per metric, wherever it is drawn: the live dashboard, the finished cell, the report
and the sidebar's loss sparkline (its run summaries carry the colour). ``runs compare`` colours by
run instead (``plots/compare.py``): there the runs of one metric share a panel.

A figure's default colours follow trace order, which differs between the live view (traces added
as they appear) and a finished figure, so every metric trace is coloured by its name here. Known
names have fixed colours; any other name takes one from a 24-colour palette by a stable hash of
the name, the same in every process. Pure: no plotly, so the server can read it.
"""

from __future__ import annotations

import zlib

__all__ = ["METRIC_COLOURS", "OTHER_COLOURS", "metric_colour"]

# the metrics most runs log, and the dashboard's own traces (step-time parts, throughput)
METRIC_COLOURS: dict[str, str] = {
    "loss": "#1f77b4",
    "train_loss": "#1f77b4",
    "val_loss": "#ff7f0e",
    "eval_loss": "#ff7f0e",
    "accuracy": "#2ca02c",
    "val_accuracy": "#98df8a",
    "lr": "#9467bd",
    "grad_norm": "#8c564b",
    "compute": "#4c78a8",
    "communication wait": "#f58518",
    "data loading": "#54a24b",
    "step time": "#444444",
    "global": "#222222",
    "B_simple": "#1f77b4",
}

# plotly's Dark24 (qualitative), for names not listed above
OTHER_COLOURS = (
    "#2E91E5", "#E15F99", "#1CA71C", "#FB0D0D", "#DA16E3", "#222A2A", "#B68100", "#750D86",
    "#EB663B", "#511CFB", "#00A08B", "#FB00D1", "#FC0080", "#B2828D", "#6C7C32", "#778AAE",
    "#862A16", "#A777F1", "#620042", "#1616A7", "#DA60CA", "#6C4516", "#0D2A63", "#AF0038",
)  # fmt: skip


def metric_colour(name: str) -> str:
    """The colour of metric ``name`` in every figure (a CSS hex colour)."""
    known = METRIC_COLOURS.get(name)
    if known is not None:
        return known
    return OTHER_COLOURS[zlib.crc32(name.encode("utf-8")) % len(OTHER_COLOURS)]
