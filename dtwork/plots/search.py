"""A search's figures: every trial's curve of the searcher's metric, and a parallel-coordinates figure of
the trials' hyperparameters against it (one line per trial that has a finite metric)."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from dtwork.plots.compare import log_scaled, run_colour

__all__ = ["flat_hparams", "parallel_figure", "trial_curves_figure"]

TrialCurve = tuple[int, Sequence[tuple[int, float]]]  # (trial number, [(step, value), ...])


def trial_curves_figure(curves: Sequence[TrialCurve], metric: str, best: int | None = None) -> go.Figure:
    """One curve per trial of ``metric`` by step, the best trial drawn wider; a loss on a log scale."""
    fig = go.Figure()
    values: list[float] = []
    for i, (number, points) in enumerate(curves):
        shown = [(s, v) for s, v in points if v is not None and math.isfinite(v)]
        values += [v for _, v in shown]
        fig.add_trace(
            go.Scatter(
                x=[s for s, _ in shown],
                y=[v for _, v in shown],
                mode="lines+markers" if len(shown) < 2 else "lines",
                name=f"trial {number}" + (" (best)" if number == best else ""),
                line={"color": run_colour(i), "width": 4 if number == best else 1.5},
            )
        )
    if log_scaled(metric, values):
        fig.update_yaxes(type="log")
    fig.update_layout(title=f"{metric} of every trial", height=360, xaxis_title="step", yaxis_title=metric)
    return fig


def flat_hparams(hp: Mapping[str, object], prefix: str = "") -> dict[str, object]:
    """Nested hyperparameters by dotted name: ``{"optimizer": {"lr": 0.1}}`` -> ``{"optimizer.lr": 0.1}``."""
    out: dict[str, object] = {}
    for key, value in hp.items():
        if isinstance(value, Mapping):
            out.update(flat_hparams(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _dimension(label: str, values: list[object]) -> dict[str, object]:
    """A parallel axis: numbers as they are, anything else (categories) by its place in sorted order."""
    if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values):
        return {"label": label, "values": [float(v) for v in values]}  # type: ignore[arg-type]
    kinds = sorted({repr(v) for v in values})
    return {
        "label": label,
        "values": [kinds.index(repr(v)) for v in values],
        "tickvals": list(range(len(kinds))),
        "ticktext": kinds,
    }


def parallel_figure(
    trials: Sequence[tuple[Mapping[str, object], float]], metric: str, smaller_is_better: bool
) -> go.Figure:
    """Parallel coordinates of each trial's hyperparameters (``trials``: (hparams, metric) pairs) and its
    metric, coloured by the metric, the better end darker."""
    kept = [(flat_hparams(hp), m) for hp, m in trials if math.isfinite(m)]
    names = sorted({k for hp, _ in kept for k in hp})
    dims = [_dimension(n, [hp.get(n) for hp, _ in kept]) for n in names]
    dims.append({"label": metric, "values": [m for _, m in kept]})
    line = {
        "color": [m for _, m in kept],
        "colorscale": "Viridis",
        "reversescale": not smaller_is_better,  # darker: better
        "showscale": True,
        "colorbar": {"title": {"text": metric}},
    }
    fig = go.Figure(go.Parcoords(dimensions=dims, line=line))
    better = "smaller" if smaller_is_better else "larger"
    fig.update_layout(title=f"hyperparameters against {metric} ({better} is better)", height=400)
    return fig
