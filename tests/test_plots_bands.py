"""Percentile bands over many ranks (dtwork.plots.bands) equal a plain rank-by-rank computation."""

from __future__ import annotations

import bisect

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dtwork.plots.bands import BAND_RANKS, GRID_POINTS, QUANTILES, rank_bands
from dtwork.plots.series import Trace


def reference(traces: list[Trace]) -> tuple[np.ndarray, np.ndarray]:
    """(grid, percentiles) rank by rank: the last value at or before each grid step, by step order."""
    ranks = [(np.asarray(t.x, float), np.asarray(t.y, float)) for t in traces if len(t.x)]
    lo, hi = max(x[0] for x, _ in ranks), max(x[-1] for x, _ in ranks)
    grid = np.unique(np.linspace(lo, hi, GRID_POINTS).round())
    rows = []
    for x, y in ranks:
        pairs = sorted(enumerate(x), key=lambda p: (p[1], p[0]))  # equal steps: the later one wins
        steps = [s for _, s in pairs]
        rows.append([y[pairs[bisect.bisect_right(steps, g) - 1][0]] for g in grid])
    return grid, np.percentile(np.array(rows), [q for q, _ in QUANTILES], axis=0)


rank_trace = st.lists(
    st.tuples(st.integers(0, 400), st.floats(-1e6, 1e6, allow_nan=False)), min_size=1, max_size=40
)


@settings(max_examples=60, deadline=None)
@given(st.lists(rank_trace, min_size=BAND_RANKS + 1, max_size=40), st.booleans())
def test_bands_equal_the_rank_by_rank_computation(
    ranks: list[list[tuple[int, float]]], ordered: bool
) -> None:
    traces = []
    for r, points in enumerate(ranks):
        points = sorted(points, key=lambda p: p[0]) if ordered else points
        traces.append(Trace(f"rank {r}", [s for s, _ in points], [v for _, v in points], {}))
    bands = rank_bands(traces, len(traces))
    grid, expected = reference(traces)
    assert [t.name for t in bands] == [f"ranks {label}" for _, label in QUANTILES]
    for band, values in zip(bands, expected, strict=True):
        assert np.array_equal(band.x, grid.astype(np.int32))
        assert np.allclose(band.y, values, rtol=0, atol=1e-9 * max(1.0, float(np.abs(values).max())))


def test_ranks_without_points_are_left_out() -> None:
    traces = [Trace(f"rank {r}", [0, 10], [float(r), float(r)], {}) for r in range(BAND_RANKS + 1)]
    traces.append(Trace(f"rank {BAND_RANKS + 1}", [], [], {}))
    median = rank_bands(traces, len(traces))[2]
    assert median.y.tolist() == [BAND_RANKS / 2] * len(median.x)
