"""The metric rows as schema 7 keeps them: points of interned series keys, read through the ``metrics``
view as before, a v6 store's rows moved into them in place, and the size a row takes on disk."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from benchmarks.store_upgrade import TO_V6
from dtwork.store import metrics as metric_rows
from dtwork.store.runs import RunStore
from dtwork.store.schema import SCHEMA_VERSION

COLS = "run_id, cell_seq, step, rank, name, value, time, kind"


def _v6_store(path: Path) -> list[tuple[object, ...]]:
    """A v6 store of two runs: user metrics (a NaN, a missing value, a row without a cell), perf rows of
    two ranks; returns its metric rows in the order they were written."""
    with RunStore(path) as store:
        store.create_run(world_size=2, backend="gloo")
        store.create_run(world_size=2, backend="gloo")
    conn = sqlite3.connect(path)
    conn.executescript(TO_V6)
    rows: list[tuple[object, ...]] = []
    for step in range(300):
        for run in (1, 2):
            cell = None if step < 5 else 1 + step // 100
            rows.append(
                (run, cell, step, None, "loss", "NaN" if step == 7 else 1.0 / (step + 1), 10.0 + step, "log")
            )
            rows.append(
                (run, cell, step, None, "b_simple", None if step == 9 else 3.0 * step, 10.0 + step, "gns")
            )
            rows += [
                (run, cell, step, r, "step_time", 0.1 + r + step % 3, 10.0 + step, "perf") for r in (0, 1)
            ]
    rows.append((1, 3, 299, None, "loss", 0.5, 400.0, "log"))  # a value logged twice at one step
    conn.executemany(f"INSERT INTO metrics ({COLS}) VALUES (?, ?, ?, ?, ?, ?, ?, ?)", rows)
    conn.commit()
    conn.close()
    return rows


def test_a_v6_store_moves_every_row_into_points_in_place_and_reads_them_as_before(tmp_path: Path) -> None:
    path = tmp_path / "v6.sqlite"
    rows = _v6_store(path)
    with RunStore(path) as store:
        conn = store.db.connection()
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 7
        assert conn.execute("SELECT type FROM sqlite_master WHERE name = 'metrics'").fetchone()[0] == "view"
        moved = conn.execute(f"SELECT {COLS} FROM metrics ORDER BY seq").fetchall()
        assert [tuple(r) for r in moved] == rows  # every row, in the order written, NULLs kept
        loss = store.metrics(1, "loss")
        assert [r["step"] for r in loss] == sorted(r[2] for r in rows if r[0] == 1 and r[4] == "loss")
        assert math.isnan(loss[7]["value"]) and loss[-1]["value"] == 0.5 and loss[-2]["step"] == 299
        assert [r["cell_seq"] for r in loss[:6]] == [None] * 5 + [1]
        assert [r["rank"] for r in store.metrics(2, "step_time", rank="all")[:4]] == [0, 1, 0, 1]
        # rows written after the upgrade come after the moved ones at the same step
        store.add_metrics(1, [{"step": 299, "name": "loss", "value": 0.25, "cell_seq": 3}])
        assert store.metrics(1, "loss")[-1]["value"] == 0.25 and store.last_metrics(1)["loss"] == 0.25


def test_a_run_of_many_rows_takes_under_40_bytes_a_row(tmp_path: Path) -> None:
    """The layout itself: 86-94 bytes a row in the table and index of version 6, about 35 now."""
    with RunStore(tmp_path / "s.sqlite") as store:
        run = store.create_run(world_size=8, backend="gloo")
        for start in range(0, 20_000, 1_000):
            store.add_metrics(
                run,
                [
                    {"step": s, "name": n, "value": s * 0.001 + i, "time": 1e9 + s * 0.25, "cell_seq": 1}
                    for s in range(start, start + 1_000)
                    for i, n in enumerate(("loss", "accuracy", "lr"))
                ],
            )
        conn = store.db.connection()
        used = conn.execute(
            "SELECT SUM(pgsize - unused) FROM dbstat WHERE name IN ('points', 'metric_keys')"
        ).fetchone()[0]
        assert used / 60_000 < 40


def test_a_write_that_rolls_back_leaves_no_key_behind_in_the_connections_memory(tmp_path: Path) -> None:
    with RunStore(tmp_path / "s.sqlite") as store:
        run = store.create_run(world_size=1, backend="gloo")
        row = (run, 1, "log", 0, None, "loss", 1.0, 5.0)
        with pytest.raises(RuntimeError), store.db.write() as cur:
            metric_rows.insert(store.db, cur, [row])
            raise RuntimeError("the batch failed after its key was made")
        # the rolled-back key's id is given again; a remembered one would file acc's rows as loss
        store.add_metrics(run, [{"step": 0, "name": "acc", "value": 0.5, "cell_seq": 1}])
        store.add_metrics(run, [{"step": 0, "name": "loss", "value": 1.0, "cell_seq": 1}])
        assert [r["value"] for r in store.metrics(run, "loss")] == [1.0]
        assert [r["value"] for r in store.metrics(run, "acc")] == [0.5]


def test_two_connections_writing_one_run_file_each_row_under_its_own_series(tmp_path: Path) -> None:
    """Two notebooks (two connections, each with its keys in memory) writing the same store."""
    path = tmp_path / "s.sqlite"
    with RunStore(path) as a, RunStore(path) as b:
        run = a.create_run(world_size=2, backend="gloo")
        for step in range(50):
            for store, rank in ((a, 0), (b, 1)):
                store.add_metrics(
                    run,
                    [
                        {"step": step, "name": n, "value": step + rank / 10, "rank": rank, "kind": "perf"}
                        for n in "xy"
                    ],
                )
        for store in (a, b):
            for rank in (0, 1):
                for n in "xy":
                    got = store.metrics(run, n, rank=rank)
                    assert [r["value"] for r in got] == [s + rank / 10 for s in range(50)]
