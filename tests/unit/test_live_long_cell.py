"""The live view of a long cell: bounded memory, every bucket's min and max, the store reader's figure.

A million steps of 8 ranks go through the real live-view intake and, the same records, through the
real store writer into a real SQLite store; the live figure must equal what the reopened cell's view
draws from the store. Bounds of :mod:`dtwork.store.rollups` are made small, so that a few thousand
rows per series cross what a day of training would.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

from dtwork import plots
from dtwork.plots.cell_view import MAX_POINTS
from dtwork.plots.training import drawn_series
from dtwork.store import rollups, views
from dtwork.store.runs import RunStore
from dtwork.store.writer import StoreWriter
from dtwork.widgets.intake import BUILD_SHARE, ETA_WINDOW, Intake

RANKS = 8
CHUNKS = 5  # the cell's records come in this many parts, a redraw after each
STEPS = 1_000_000
STRIDE = 2_500  # steps between two records of a rank (the ranks report at a rate, not every step)


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rollups, "KEEP_BUCKETS", 30)
    monkeypatch.setattr(views, "FULL_READ_ROWS", 600)


def _records(lo: int, hi: int, rng: random.Random) -> list[dict]:
    out: list[dict] = []
    for step in range(lo, hi, STRIDE):
        stamp = 1000.0 + step / 4
        for rank in range(RANKS):
            spike = 80.0 if rng.random() < 0.01 else 0.0
            values = {"samples_per_s": rng.uniform(90, 110) + spike, "step_time": rng.uniform(0.2, 0.3)}
            out.append({"kind": "perf", "step": step, "rank": rank, "time": stamp, "values": values})
        loss = 1.0 / (1 + step / 1000) + (9.0 if (step // STRIDE) % 97 == 13 else 0.0)
        out.append({"kind": "log", "step": step, "rank": 0, "time": stamp, "values": {"loss": loss}})
    return out


def _points(intake: Intake) -> tuple[int, int]:
    """The points the live view's series hold, and their traces."""
    traces = [t for s in intake.series.values() for t in s.traces(None)]
    return sum(len(t.x) for t in traces), len(traces)


def _drawn(series: dict[str, plots.Series]) -> dict[str, list[tuple]]:
    return {
        key: [(t.name, list(t.x.tolist()), list(t.y.tolist()), t.style) for t in s.traces(MAX_POINTS)]
        for key, s in series.items()
    }


def test_a_long_cells_live_view_is_bounded_and_draws_the_stores_figure(tmp_path: Path, small: None) -> None:
    rng = random.Random(3)
    intake = Intake(RANKS, None, MAX_POINTS)
    intake.clock = lambda: math.inf  # every redraw draws the figures again (their pacing: below)
    sizes, fed = [], []
    with RunStore(tmp_path / "runs.sqlite") as store:
        run = store.create_run(world_size=RANKS, backend="gloo")
        store.add_cell(run, "train()")
        writer = StoreWriter(lambda: store, store.path, say=lambda _: None)
        loss: list[float] = []
        for lo in range(0, STEPS, STEPS // CHUNKS):
            recs = _records(lo, lo + STEPS // CHUNKS, rng)
            loss += [r["values"]["loss"] for r in recs if r["kind"] == "log"]
            intake.add(recs, thin=False)
            writer.records(run, 1, recs)
            assert writer.flush(force=True)
            intake.snapshot()  # a redraw
            sizes.append((intake.long.size(), _points(intake)))
            fed.append(intake.rows_fed)
        # the rows grow fivefold; what the view holds does not follow them
        series = len(intake.long.rollups.series)
        assert intake.long.long and fed[-1] == (2 * RANKS + 1) * STEPS // STRIDE
        assert intake.long.rollups.levels == [rollups.LEVELS[-1]]  # the finer ones dropped past 30 buckets
        spans = range(2 * STEPS // CHUNKS, STEPS + 1, STEPS // CHUNKS)
        for (held, (points, traces)), span in zip(sizes[1:], spans, strict=True):
            coarse = span // rollups.width(rollups.LEVELS[-1]) + 1  # buckets of the coarsest level
            assert held <= series * coarse + RANKS * (1 + ETA_WINDOW)  # the rates and step times too
            assert points <= 2 * traces * coarse  # a bucket's min and max per trace, not every row
        # the store reader's figure, point for point
        mine = _drawn(intake.series)
        assert mine == _drawn(drawn_series(store.figure_rows(run, cell=1)))
    # every spike of the loss is drawn (each is its bucket's max), and each rank's extremes
    ys = {y for name, _, y_list, _ in mine["metrics"] for y in y_list if name == "loss"}
    assert {v for v in loss if v > 9} <= ys
    assert max(loss) in ys and min(loss) in ys
    assert len(mine["throughput"]) == 1 + RANKS


def test_a_short_cell_keeps_every_step(small: None) -> None:
    intake = Intake(2, None, MAX_POINTS)
    recs = [
        {"kind": "perf", "step": s, "rank": r, "time": float(s), "values": {"samples_per_s": float(s + r)}}
        for s in range(1, 151)
        for r in range(2)
    ]
    intake.add(recs, thin=False)
    assert not intake.long.long
    rank0 = next(t for t in intake.series["throughput"].traces(None) if t.name == "rank 0")
    assert list(rank0.x) == list(range(1, 151))


def test_a_cell_reads_its_raw_rows_while_they_are_few_and_all_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The rule is the cell's own: a short cell after a long one is drawn point for point, as live;
    a short cell whose perf rows a later cell pushed out of the raw window, from its buckets."""
    monkeypatch.setattr(rollups, "RAW_ROWS", 40)
    monkeypatch.setattr(rollups, "PRUNE_EVERY", 10)
    monkeypatch.setattr(views, "FULL_READ_ROWS", 100)
    with RunStore(tmp_path / "runs.sqlite") as store:
        run = store.create_run(world_size=2, backend="gloo")
        writer = StoreWriter(lambda: store, store.path, say=lambda _: None)
        for cell, steps in ((1, range(0, 30)), (2, range(30, 90)), (3, range(90, 110))):
            store.add_cell(run, "train()")
            recs = [
                {
                    "kind": "perf",
                    "step": s,
                    "rank": r,
                    "time": float(s),
                    "values": {"samples_per_s": s + r + 0.5},
                }
                for s in steps
                for r in range(2)
            ]
            for i in range(0, len(recs), 20):
                writer.records(run, cell, recs[i : i + 20])
                assert writer.flush(force=True)
        assert store.figure_rows(run, cell=3) == store.metrics(run, rank="all", cell=3)
        trimmed = store.metrics(run, rank="all", cell=1)
        assert len(trimmed) < 60  # the raw window let the first cell's rows go
        first = store.figure_rows(run, cell=1)
        assert first != trimmed and max(r["value"] for r in first) == 29 + 1 + 0.5


def test_a_long_cells_figures_are_drawn_again_within_their_share_of_a_core(small: None) -> None:
    """Drawing a long cell's figures from its rollups costs per series (a tenth of a second at
    hundreds of ranks): a redraw draws them again only once the last drawing's CPU time over
    BUILD_SHARE has passed, while the header moves at every redraw; the cell's end draws them."""
    now = [0.0]
    intake = Intake(RANKS, None, MAX_POINTS)
    intake.clock = lambda: now[0]
    rng = random.Random(5)
    intake.add(_records(0, 200_000, rng), thin=False)
    assert intake.long.long and intake.builds == 1  # drawn once as the cell turned long
    loss = intake.series["metrics"]
    intake.add(_records(200_000, 400_000, rng), thin=False)
    snap = intake.snapshot()
    assert intake.builds == 1 and snap.build_cpu == 0.0 and intake.series["metrics"] is loss
    intake.progress({0: {"step": 400_000, "total": 10**6, "time": 2.0}})
    assert intake.snapshot().progress[0]["step"] == 400_000  # the header still moves
    now[0] = 1e6  # far past the last drawing's cost over BUILD_SHARE
    snap = intake.snapshot()
    assert intake.builds == 2 and snap.build_cpu > 0.0 and intake.series["metrics"] is not loss
    assert max(intake.series["metrics"].traces(None)[0].x) > 200_000
    intake.add(_records(400_000, 600_000, rng), thin=False)
    assert intake.snapshot().build_cpu == 0.0  # not due again yet
    ((series, traces),) = intake.static_parts(["metrics"])[0]
    assert intake.builds == 3 and max(traces[0].x) > 400_000  # the cell's end draws the latest
    assert BUILD_SHARE <= 0.05
