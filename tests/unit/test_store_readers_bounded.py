"""A long or wide run's readers cost what they show, and a wide run's store keeps a narrow raw window.

Real SQLite stores; a reader's cost is counted in SQLite's virtual-machine steps (a progress handler),
not in seconds, so a bound holds however busy the machine is.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from dtwork.server import queries
from dtwork.store import rollups, views
from dtwork.store.rollups import Bucket
from dtwork.store.runs import RunStore

TICK = 10  # VM steps per progress callback


@contextmanager
def _counted(store: RunStore) -> Iterator[list[int]]:
    """Count the SQLite VM steps (in TICKs) of what runs inside."""
    ticks = [0]

    def tick() -> int:
        ticks[0] += 1
        return 0

    conn = store.db.connection()
    conn.set_progress_handler(tick, TICK)
    try:
        yield ticks
    finally:
        conn.set_progress_handler(None, TICK)


def _cost(store: RunStore, fn: Callable[[], object]) -> int:
    with _counted(store) as ticks:
        fn()
    return ticks[0]


def _loss_run(store: RunStore, steps: int) -> int:
    run = store.create_run(world_size=1, backend="gloo")
    store.add_metrics(run, [{"step": s, "name": "loss", "value": 1.0 / (s + 1)} for s in range(steps)])
    return run


def test_the_sparkline_of_a_long_run_reads_its_rollups_not_every_row(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.sqlite") as store:
        short, long = _loss_run(store, 1_000), _loss_run(store, 15_000)  # both under FULL_READ_ROWS
        costs = [
            _cost(store, lambda r=r: queries.loss_points(store, r, queries.SPARKLINE_POINTS))
            for r in (short, long)
        ]
        points = queries.loss_points(store, long, queries.SPARKLINE_POINTS)
    # 15x the rows: the raw read of every row (the old rule, up to 20,000 rows) cost about 15x
    assert costs[1] < 2 * costs[0], costs
    assert 10 <= len(points) <= queries.SPARKLINE_POINTS and points[-1][0] >= 14_000


def test_world_throughput_reads_the_ranks_summaries_of_its_name_only(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.sqlite") as store:
        runs = []
        for others in (1, 40):  # every rank's other series: 40x as many summaries
            run = store.create_run(world_size=32, backend="gloo")
            names = {"samples_per_s": 10.0} | {f"gpu_{i}": 1.0 for i in range(others)}
            store.add_metrics(
                run,
                [
                    {"kind": "perf", "step": 1, "rank": r, "name": n, "value": v}
                    for r in range(32)
                    for n, v in names.items()
                ],
            )
            runs.append(run)
        costs = [_cost(store, lambda r=r: queries.world_throughput(store, r)) for r in runs]
        assert queries.world_throughput(store, runs[1]) == pytest.approx(320.0)
    assert costs[1] < 2 * costs[0], costs  # every summary read: about 20x


def test_a_figure_of_many_ranks_reads_at_most_its_drawn_buckets_a_series() -> None:
    """2,563 series (256 ranks' perf and gpu, the user metrics) over an hour of 4 steps/s: the level
    read has at most ``most`` buckets a series (the old rule read up to 4x, joined)."""
    asked: list[int] = []

    def read(level: int) -> list[Bucket]:
        asked.append(level)
        return []

    coarse = [Bucket("loss", "log", None, 1, 0, 1, 1.0, 1.0, 1.0, 0, 0, 0.0, 1.0, 14_400, 1.0)]
    views.bucket_rows(1, coarse, read, 2563, rollups.active_levels(14_400))
    most = views.MIN_BUCKETS  # 12,000 rows / (2 x 2,563 series) is fewer: the floor
    assert asked and all(14_400 // rollups.width(lv) + 1 <= most for lv in asked), asked
    asked.clear()
    views.bucket_rows(
        1, coarse, read, 2, rollups.active_levels(14_400)
    )  # two series: buckets read 4 for 1 as before
    assert asked == [1]  # 1,441 buckets of 10 steps read for 500 drawn


def _perf(run: int, steps: range, ranks: int) -> list[dict[str, object]]:
    return [
        {"kind": "perf", "step": s, "rank": r, "name": "samples_per_s", "value": 100.0 + r}
        for s in steps
        for r in range(ranks)
    ] + [{"step": s, "name": "loss", "value": 1.0 / (s + 1)} for s in steps]


def test_a_wide_runs_raw_window_is_that_of_raw_ranks_ranks_in_all(tmp_path: Path) -> None:
    assert rollups.raw_rows(8) == rollups.raw_rows(rollups.RAW_RANKS) == rollups.RAW_ROWS
    assert rollups.raw_rows(256) == rollups.RAW_ROWS * rollups.RAW_RANKS // 256  # 375
    assert rollups.raw_rows(100_000) == rollups.MIN_RAW_ROWS
    with RunStore(tmp_path / "runs.sqlite") as store:
        kept = {}
        for world in (2, 256):
            run = store.create_run(world_size=world, backend="nccl")
            for start in range(0, 4_000, 500):  # batches as the writer joins them
                store.add_metrics(run, _perf(run, range(start, start + 500), 2))
            kept[world] = len(store.metrics(run, "samples_per_s", rank=0))
            assert len(store.metrics(run, "loss")) == 4_000  # user metrics: every step, always
            buckets = store.db.tuples(
                "SELECT SUM(n) FROM rollups WHERE run_id = ? AND name = 'samples_per_s' AND rank = 0 AND level = 4",
                [run],
            )
            assert buckets[0][0] == 4_000  # the trimmed rows live on in the rollups
    window = rollups.raw_rows(256)
    assert rollups.RAW_ROWS <= kept[2] <= rollups.RAW_ROWS + rollups.PRUNE_EVERY
    assert window <= kept[256] <= window + window // 4 + 500  # a batch of 500 lands before a trim


def test_a_report_converts_its_embedded_rows_once() -> None:
    """A 256-rank run embeds a few hundred thousand rows; the summary, the advice and the figures
    each asked for them, and each conversion took a second."""
    from dtwork.report import helpers

    data = {"columns": ["step", "name", "rank", "value"], "rows": [[1, "loss", None, 0.5]]}
    first = helpers.rows(data)  # type: ignore[arg-type]
    assert helpers.rows(data) is first  # type: ignore[arg-type]
    other = {**data, "rows": [[2, "loss", None, 0.25]]}
    assert helpers.rows(other)[0]["step"] == 2  # type: ignore[arg-type]


def test_a_write_of_one_series_reads_its_summary_not_every_series_of_a_wide_run(tmp_path: Path) -> None:
    """Each write folds its rows into the summaries of the series it touches: in a run of 256 ranks'
    2,560 series, a write of the loss reads the loss's summary and the run's span (one aggregate in
    SQLite, about a tick per summary), not every summary into Python (the kernel's writes of a wide
    run each did: about two ticks per summary in SQLite, and most of a write's Python time)."""
    with RunStore(tmp_path / "runs.sqlite") as store:
        costs = []
        for ranks in (1, 256):
            run = store.create_run(world_size=ranks, backend="gloo")
            values = {f"v{i}": 1.0 for i in range(10)}
            rows = [{"kind": "perf", "step": 1, "rank": r, "name": n, "value": v}
                    for r in range(ranks) for n, v in values.items()]  # fmt: skip
            store.add_metrics(run, rows)
            loss = [{"kind": "log", "step": 2, "rank": 0, "name": "loss", "value": 0.5}]
            costs.append(_cost(store, lambda run=run, loss=loss: store.add_metrics(run, loss)))
        assert store.metrics(run, "loss", rank=0)[0]["value"] == 0.5
    assert costs[1] < costs[0] + 1.2 * 2560, costs
