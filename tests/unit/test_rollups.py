"""A long run's store: rollups equal their raw rows, figures keep every spike, a v3 store upgrades.

Real SQLite stores written through the real writer; the bounds of :mod:`dtwork.store.rollups` are
made small so that a few thousand rows exercise what a day of training would.
"""

from __future__ import annotations

import math
import random
import sqlite3
from collections import defaultdict
from pathlib import Path

import pytest

from dtwork.store import rollups, views
from dtwork.store.runs import SCHEMA_VERSION, RunStore
from dtwork.store.writer import StoreWriter


@pytest.fixture
def small(monkeypatch: pytest.MonkeyPatch) -> None:
    """Bounds a few hundred steps cross."""
    monkeypatch.setattr(rollups, "RAW_ROWS", 40)
    monkeypatch.setattr(rollups, "PRUNE_EVERY", 10)
    monkeypatch.setattr(rollups, "KEEP_BUCKETS", 30)
    monkeypatch.setattr(views, "FULL_READ_ROWS", 50)


def _records(steps: range, ranks: int, seed: int = 0) -> list[dict]:
    """Records as ranks publish them: a perf and a gpu record per rank and step, the loss once."""
    rng = random.Random(seed)
    out: list[dict] = []
    for step in steps:
        for rank in range(ranks):
            spike = 50.0 if rng.random() < 0.02 else 0.0
            out.append(
                {
                    "kind": "perf",
                    "step": step,
                    "rank": rank,
                    "time": 1000.0 + step,
                    "values": {"samples_per_s": rng.uniform(90, 110) + spike, "step_s": rng.random()},
                }
            )
            out.append(
                {
                    "kind": "gpu",
                    "step": step,
                    "rank": rank,
                    "time": 1000.0 + step,
                    "values": {"utilization": rng.uniform(0, 100)},
                }
            )
        out.append(
            {
                "kind": "log",
                "step": step,
                "rank": 0,
                "time": 1000.0 + step,
                "values": {"loss": 1.0 / (step + 1) + (9.0 if step % 97 == 13 else 0.0)},
            }
        )
    return out


def _expected(rows: list[tuple], level: int) -> dict[tuple, tuple]:
    """The aggregate of raw rows (name, rank, cell, step, value, time) per bucket at ``level``."""
    groups: dict[tuple, list[tuple]] = defaultdict(list)
    for name, rank, cell, step, value, stamp in rows:
        if isinstance(value, float) and math.isfinite(value):
            groups[(name, -1 if rank is None else rank, cell or 0, step // 10**level)].append(
                (step, value, stamp)
            )
    return {
        key: (
            len(g),
            sum(v for _, v, _ in g),
            min(v for _, v, _ in g),
            max(v for _, v, _ in g),
            min(t for *_, t in g),
            max(t for *_, t in g),
            max(s for s, _, _ in g),
        )
        for key, g in groups.items()
    }


def _stored(store: RunStore, run: int, level: int) -> dict[tuple, tuple]:
    rows = store.db.query(
        "SELECT name, rank, cell_seq, bucket, n, total, lo, hi, first_time, last_time, last_step "
        "FROM rollups WHERE run_id = ? AND level = ?",
        (run, level),
    )
    return {
        (r["name"], r["rank"], r["cell_seq"], r["bucket"]): (
            r["n"],
            r["total"],
            r["lo"],
            r["hi"],
            r["first_time"],
            r["last_time"],
            r["last_step"],
        )
        for r in rows
    }


def _same(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, w in want.items():
        assert got[key][0] == w[0] and got[key][1] == pytest.approx(w[1]) and got[key][2:] == w[2:], key


def test_each_rollup_equals_the_aggregate_of_its_raw_rows(tmp_path: Path, small: None) -> None:
    with RunStore(tmp_path / "runs.sqlite") as store:
        run = store.create_run(world_size=2, backend="gloo")
        writer = StoreWriter(lambda: store, store.path, say=lambda _: None)
        written: list[tuple] = []
        for cell, steps in ((1, range(0, 250)), (2, range(250, 520))):
            recs = _records(steps, ranks=2, seed=cell)
            for i in range(0, len(recs), 37):  # batches as the collector hands them over
                writer.records(run, cell, recs[i : i + 37])
                assert writer.flush(force=True)
            for rec in recs:
                rank = None if rec["kind"] == "log" else rec["rank"]
                written += [(n, rank, cell, rec["step"], v, rec["time"]) for n, v in rec["values"].items()]
            if cell == 1:  # 250 steps: every level kept, the finest too
                assert rollups.active_levels(249) == list(rollups.LEVELS)
                for level in rollups.LEVELS:
                    _same(_stored(store, run, level), _expected(written, level))
        span = 519
        kept = rollups.active_levels(span)
        assert kept == [2, 3, 4]  # 520 steps: 10-step buckets past KEEP_BUCKETS, dropped
        for level in rollups.LEVELS:
            want = _expected(written, level) if level in kept else {}
            _same(_stored(store, run, level), want)
        # user metrics at every step; perf and gpu rows trimmed to their recent window
        assert len(store.metrics(run, "loss")) == 520
        perf = store.metrics(run, "samples_per_s", rank=0)
        assert rollups.RAW_ROWS <= len(perf) < rollups.RAW_ROWS + rollups.PRUNE_EVERY + 1
        assert perf[-1]["step"] == 519
        summary = {(s["name"], s["rank"]): s for s in store.series(run)}
        assert summary[("samples_per_s", 1)]["n"] == 520 and summary[("loss", None)]["last_step"] == 519
        assert store.last_metrics(run)["loss"] == pytest.approx(1.0 / 520)


def test_figures_from_rollups_keep_every_buckets_min_and_max(tmp_path: Path, small: None) -> None:
    from dtwork import plots

    with RunStore(tmp_path / "runs.sqlite") as store:
        run = store.create_run(world_size=2, backend="gloo")
        store.add_cell(run, "train()")
        writer = StoreWriter(lambda: store, store.path, say=lambda _: None)
        writer.records(run, 1, _records(range(0, 600), ranks=2))
        assert writer.flush(force=True)
        rows = store.figure_rows(run, cell=1)
        level = 2  # 600 steps over 100-step buckets: 6 of them fit the screen
        buckets = store.db.query(
            "SELECT name, rank, lo, hi FROM rollups WHERE run_id = ? AND level = ? AND cell_seq = 1",
            (run, level),
        )
        assert len(rows) == 2 * len(buckets) and len(rows) < 600
        series = plots.cell_series()
        for s in series.values():
            s.add(rows)
        drawn = {
            (t.name, float(y))
            for key in ("metrics", "throughput", "gpu")
            for t in series[key].traces(1000)
            for y in t.y
        }
        loss = [b for b in buckets if b["name"] == "loss"]
        assert any(b["hi"] > 9 for b in loss)  # the spikes are there to lose
        for b in loss:
            assert ("loss", b["lo"]) in drawn and ("loss", b["hi"]) in drawn
        per_rank = defaultdict(set)
        for r in rows:
            per_rank[(r["name"], r["rank"])].add(r["value"])
        for b in buckets:
            assert {b["lo"], b["hi"]} <= per_rank[(b["name"], None if b["rank"] == -1 else b["rank"])]
        from dtwork.plots.cell_view import cell_view

        view = cell_view(store, run, 1)
        assert view["step"] == 599
        ys = [y for trace in view["figure"]["data"] for y in (trace.get("y") or [])]
        assert max(b["hi"] for b in loss) in ys


def test_a_short_run_reads_its_raw_rows(tmp_path: Path) -> None:
    with RunStore(tmp_path / "runs.sqlite") as store:
        run = store.create_run(world_size=2, backend="gloo")
        store.add_cell(run, "train()")
        writer = StoreWriter(lambda: store, store.path)
        writer.records(run, 1, _records(range(0, 60), ranks=2))
        assert writer.flush(force=True)
        assert store.figure_rows(run, cell=1) == store.metrics(run, rank="all", cell=1)
        assert store.figure_rows(run, rank="aggregated") == store.metrics(run)
        total, pts = store.metric_points(run, "loss")
        assert total == 60 and pts == [(r["step"], r["value"], r["time"]) for r in store.metrics(run, "loss")]


# The run store's schema as dtwork wrote it at version 3 (an old store file, made with it).
V3_SCHEMA = """
CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, status TEXT NOT NULL,
    created_at REAL NOT NULL, ended_at REAL, world_size INT, backend TEXT, cluster_id TEXT, notebook TEXT,
    config_yaml TEXT, global_batch_size INT, per_slot_batch_size INT, summary_json TEXT NOT NULL DEFAULT '{}');
CREATE TABLE cells (run_id INTEGER NOT NULL, seq INTEGER NOT NULL, source TEXT, started_at REAL,
    ended_at REAL, status TEXT, error TEXT, ranks_json TEXT, PRIMARY KEY (run_id, seq));
CREATE TABLE metrics (run_id INTEGER NOT NULL, cell_seq INTEGER, step INT NOT NULL, rank INT,
    name TEXT NOT NULL, value REAL, time REAL, kind TEXT NOT NULL DEFAULT 'log');
CREATE INDEX metrics_run_name_step ON metrics (run_id, name, step);
CREATE INDEX metrics_run_step ON metrics (run_id, step);
CREATE TABLE events (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER, time REAL NOT NULL,
    kind TEXT NOT NULL, message TEXT, data_json TEXT);
CREATE INDEX events_run ON events (run_id, kind);
CREATE TABLE environment (run_id INTEGER PRIMARY KEY, data_json TEXT NOT NULL);
CREATE TABLE results (id INTEGER PRIMARY KEY AUTOINCREMENT, run_id INTEGER, kind TEXT NOT NULL,
    created_at REAL NOT NULL, data_json TEXT NOT NULL);
CREATE INDEX results_run_kind ON results (run_id, kind);
CREATE TABLE segments (run_id INTEGER NOT NULL, seq INTEGER NOT NULL, cell_seq INTEGER,
    first_step INT NOT NULL, time REAL NOT NULL, changed TEXT NOT NULL DEFAULT '',
    data_json TEXT NOT NULL DEFAULT '{}', PRIMARY KEY (run_id, seq));
PRAGMA user_version = 3;
"""


def test_a_v3_store_upgrades_in_place_keeping_every_user_metric(tmp_path: Path, small: None) -> None:
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(V3_SCHEMA)
    conn.execute("INSERT INTO runs (name, status, created_at, world_size) VALUES ('old', 'completed', 1, 2)")
    rows: list[tuple] = []
    for step in range(400):
        rows.append((1, 1, step, None, "loss", "NaN" if step == 7 else 2.0 - step / 400, 10.0 + step, "log"))
        rows.append((1, 1, step, None, "b_simple", None if step == 9 else float(step), 10.0 + step, "gns"))
        rows += [(1, 1, step, r, "samples_per_s", 100.0 + r + step % 5, 10.0 + step, "perf") for r in (0, 1)]
    rows.append((1, 1, 399, None, "global_batch", 64.0, 500.0, "adaptive"))
    conn.executemany(
        "INSERT INTO metrics (run_id, cell_seq, step, rank, name, value, time, kind) "
        "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
        rows,
    )
    conn.commit()
    user_before = conn.execute(
        "SELECT run_id, cell_seq, step, rank, name, value, time, kind FROM metrics "
        "WHERE kind != 'perf' ORDER BY rowid"
    ).fetchall()
    conn.close()
    with RunStore(path) as store:
        assert store.db.connection().execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7
        user_after = (
            store.db.connection()
            .execute(
                "SELECT run_id, cell_seq, step, rank, name, value, time, kind FROM metrics "
                "WHERE kind != 'perf' ORDER BY seq"
            )
            .fetchall()
        )
        assert [tuple(r) for r in user_after] == user_before and len(user_before) == 801
        assert len(store.metrics(1, "samples_per_s", rank=1)) < 400  # older perf rows: rollups only
        raw = [
            (r[4], r[3], r[1], r[2], r[5] if r[5] == "NaN" or r[5] is None else float(r[5]), r[6])
            for r in rows
        ]
        for level in rollups.active_levels(399):
            _same(_stored(store, 1, level), _expected(raw, level))
        last = store.last_metrics(1)
        assert last["loss"] == pytest.approx(2.0 - 399 / 400) and last["global_batch"] == 64.0
        assert store.get_run(1)["last_step"] == 399
        assert store.metric_names(1) == ["b_simple", "global_batch", "loss", "samples_per_s"]


def test_a_wide_run_keeps_its_levels_for_fewer_buckets_in_the_store_and_the_live_view(
    tmp_path: Path, small: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Past RAW_RANKS ranks a level is kept for KEEP_BUCKETS x RAW_RANKS / ranks buckets (the store's
    size at 256 ranks was mostly its ranks' 10-step buckets); the store, its readers and the kernel's
    live view keep the same levels, so a figure drawn from either is the same."""
    from dtwork.plots import drawn_series
    from dtwork.plots.long_cell import LongCell

    monkeypatch.setattr(rollups, "MIN_KEEP_BUCKETS", 5)
    world = 4 * rollups.RAW_RANKS  # the records come from 3 of its ranks
    assert rollups.keep_buckets(world) == 7 and rollups.keep_buckets(8) == 30
    with RunStore(tmp_path / "runs.sqlite") as store:
        run = store.create_run(world_size=world, backend="nccl")
        store.add_cell(run, "train()")
        writer = StoreWriter(lambda: store, store.path, say=lambda _: None)
        live = LongCell(cell_seq=1, world_size=world)
        written: list[tuple] = []
        recs = _records(range(0, 150), ranks=3, seed=5)
        for i in range(0, len(recs), 41):
            writer.records(run, 1, recs[i : i + 41])
            assert writer.flush(force=True)
        for rec in recs:
            rank = None if rec["kind"] == "log" else rec["rank"]
            written += [(n, rank, 1, rec["step"], v, rec["time"]) for n, v in rec["values"].items()]
            live.add([{**rec, "name": n, "value": v, "rank": rank} for n, v in rec["values"].items()])
        # 150 steps: 15 buckets of 10 steps, past 7; a run of 8 ranks would keep them (below 30)
        kept = rollups.active_levels(149, world)
        assert kept == [2, 3, 4] and rollups.active_levels(149, 8) == list(rollups.LEVELS)
        for level in rollups.LEVELS:
            _same(_stored(store, run, level), _expected(written, level) if level in kept else {})
        assert live.rollups.levels == kept and live.long
        mine = drawn_series(store.figure_rows(run, cell=1))
        theirs = live.series()
        assert {k: [list(t.y) for t in s.traces(None)] for k, s in mine.items()} == {
            k: [list(t.y) for t in s.traces(None)] for k, s in theirs.items()
        }
