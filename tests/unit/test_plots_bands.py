"""Percentile bands over many ranks (dtwork.plots.bands) equal a plain rank-by-rank computation,
drawn at once or built up redraw by redraw."""

from __future__ import annotations

import bisect
import random

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from dtwork.plots import GpuSeries, ThroughputSeries
from dtwork.plots.bands import BAND_RANKS, GRID_POINTS, QUANTILES, RankBands, band_grid
from dtwork.plots.columns import RankSeries
from dtwork.shared.records import make_record, to_rows

Points = list[tuple[int, float]]


def reference(ranks: list[Points]) -> tuple[np.ndarray, np.ndarray]:
    """(grid, percentiles) rank by rank: the grid from its definition (lo, lo + s, ... with s the
    least power of two giving at most GRID_POINTS intervals, then the latest step), each rank's
    value the last one at or before a grid step, a step reported again by its last report."""
    latest = [dict(points) for points in ranks if points]  # a step's last value wins
    lo, hi = max(min(p) for p in latest), max(max(p) for p in latest)
    stride = next(2**k for k in range(40) if hi - lo <= 2**k * GRID_POINTS)
    grid = list(range(lo, hi + 1, stride))
    grid += [hi] if grid[-1] != hi else []
    rows = []
    for p in latest:
        steps = sorted(p)
        rows.append([p[steps[bisect.bisect_right(steps, g) - 1]] for g in grid])
    return np.array(grid), np.percentile(np.array(rows), [q for q, _ in QUANTILES], axis=0)


def feed(ranks: list[Points], series: ThroughputSeries, chunks: int) -> None:
    """Feed the ranks' points in ``chunks`` rounds (each rank's points in its own order), drawing
    the traces after each round, as the live view does between records."""
    for c in range(chunks):
        recs = [
            make_record("perf", s, r, {"samples_per_s": v})
            for r, points in enumerate(ranks)
            for s, v in points[c * len(points) // chunks : (c + 1) * len(points) // chunks]
        ]
        series.add(to_rows(recs))
        series.traces(1000)


def check(ranks: list[Points], series: ThroughputSeries) -> None:
    bands = [t for t in series.traces(1000) if t.name.startswith("ranks ")]
    grid, expected = reference(ranks)
    assert [t.name for t in bands] == [f"ranks {label}" for _, label in QUANTILES]
    for band, values in zip(bands, expected, strict=True):
        assert np.array_equal(band.x, grid.astype(np.int32))
        assert np.allclose(band.y, values, rtol=0, atol=1e-9 * max(1.0, float(np.abs(values).max())))


rank_points = st.lists(
    st.tuples(st.integers(0, 3000), st.floats(-1e6, 1e6, allow_nan=False)), min_size=1, max_size=40
)


@settings(max_examples=60, deadline=None)
@given(st.lists(rank_points, min_size=BAND_RANKS + 1, max_size=40), st.booleans(), st.integers(1, 6))
def test_bands_equal_the_rank_by_rank_computation(ranks: list[Points], ordered: bool, chunks: int) -> None:
    """Any steps, repeated or out of order, fed at once or in rounds with a redraw between."""
    ranks = [sorted(p, key=lambda x: x[0]) if ordered else p for p in ranks]
    series = ThroughputSeries()
    feed(ranks, series, chunks)
    check(ranks, series)


def test_a_long_run_in_order_keeps_the_bands_of_passed_steps_and_still_equals_the_reference() -> None:
    """Ranks a little apart, 3000 steps in 100 rounds (the grid's stride doubles four times): every
    round's bands equal the reference's."""
    rng = random.Random(7)
    n = BAND_RANKS * 2
    ranks: list[Points] = [[] for _ in range(n)]
    series = ThroughputSeries()
    for c in range(100):
        for r in range(n):
            top = 30 * (c + 1) - rng.randrange(5)
            start = ranks[r][-1][0] + 1 if ranks[r] else r % 3
            new = [(s, rng.uniform(90, 110)) for s in range(start, top + 1, 2)]
            ranks[r] += new
            series.add(to_rows(make_record("perf", s, r, {"samples_per_s": v}) for s, v in new))
        check(ranks, series)
    assert len(band_grid(0, 3000)) <= GRID_POINTS + 2


def test_ranks_without_points_are_left_out() -> None:
    table = {r: RankSeries() for r in range(BAND_RANKS + 2)}
    for r in range(BAND_RANKS + 1):  # the last rank is known, with no point yet
        table[r].set(0, float(r))
        table[r].set(10, float(r))
    median = RankBands(table).traces("", {}, True)[2]
    assert median.name == "ranks median" and median.y.tolist() == [BAND_RANKS / 2] * len(median.x)


def test_the_report_draws_bands_as_lists() -> None:
    """Without max_points (the report's figures), band traces are plain lists, as its JSON takes."""
    series = ThroughputSeries()
    feed([[(s, 1.0 + r) for s in range(5)] for r in range(BAND_RANKS + 1)], series, 1)
    band = [t for t in series.traces() if t.name == "ranks p90"][0]
    assert isinstance(band.x, list) and isinstance(band.y, list) and band.x == [0, 1, 2, 3, 4]


def test_gpu_bands_follow_a_value_replaced_at_a_passed_step() -> None:
    """A GPU sample reported again at a step every rank has passed replaces the kept band's value."""
    gpu = GpuSeries()
    n = BAND_RANKS + 1
    gpu.add(to_rows(make_record("gpu", s, r, {"utilization": 50.0}) for r in range(n) for s in range(10)))
    assert [t for t in gpu.traces(1000) if t.name == "ranks utilization p90"][0].y[3] == 50.0
    gpu.add(to_rows(make_record("gpu", 3, r, {"utilization": 80.0}) for r in range(n)))
    assert [t for t in gpu.traces(1000) if t.name == "ranks utilization p90"][0].y[3] == 80.0


def test_throughput_bands_follow_a_value_replaced_at_a_passed_step() -> None:
    ranks: list[Points] = [[(s, 100.0) for s in range(10)] for _ in range(BAND_RANKS + 1)]
    series = ThroughputSeries()
    feed(ranks, series, 1)
    ranks = [points[:3] + [(3, 300.0)] + points[4:] for points in ranks]
    series.add(to_rows(make_record("perf", 3, r, {"samples_per_s": 300.0}) for r in range(len(ranks))))
    check(ranks, series)
