"""A run store that refuses writes mid-cell (locked, full, read-only, damaged) loses no record.

Its tests that need no engines; the others are in tests/cluster/test_store_errors.py.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dtwork.errors import DtworkError
from dtwork.store.runs import RunStore, store_problem
from dtwork.store.writer import ROWS_MAX_SECONDS, ROWS_SHARE, StoreWriter, paced


def test_malformed_records_and_writes_are_dropped_with_one_warning_each(tmp_path) -> None:
    said: list[str] = []
    with RunStore(tmp_path / "s.sqlite") as store:
        run = store.create_run(name="x", world_size=2, backend="gloo")
        writer = StoreWriter(lambda: store, store.path, said.append)
        good = {"kind": "log", "step": 0, "rank": 0, "time": 1.0, "values": {"loss": 2.0}}
        writer.records(run, None, [good, "junk", {"kind": "log", "step": 1}, "more junk", good | {"step": 1}])
        writer.finish_cell(run, 99, "ok")  # no such cell: the store refuses it
        writer.event(run, "odd", "a lone surrogate \ud800 SQLite cannot encode")
        writer.event(run, "after", "still written")
        assert writer.flush(force=True)
        assert [r["step"] for r in store.metrics(run, "loss")] == [0, 1]
        assert [e["kind"] for e in store.events(run)] == ["after"]
    assert len(said) == 4, said
    assert all(line.startswith("dtwork: warning: dropped") for line in said)


def _locked(path: Path) -> BaseException:
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with RunStore(path) as s:
            s.db.connection().execute("PRAGMA busy_timeout = 0")
            s.add_event(None, "x", "y")
    except sqlite3.Error as exc:
        return exc
    finally:
        holder.close()
    raise AssertionError("the write went through")


def _full(path: Path) -> BaseException:
    with RunStore(path) as s:
        conn = s.db.connection()
        conn.execute(f"PRAGMA max_page_count = {conn.execute('PRAGMA page_count').fetchone()[0]}")
        try:
            s.add_event(None, "x", "y" * 100_000)
        except sqlite3.Error as exc:
            return exc
    raise AssertionError("the write went through")


def _readonly(path: Path) -> BaseException:
    conn = sqlite3.connect(path.as_uri() + "?mode=ro", uri=True)
    try:
        conn.execute("INSERT INTO events (time, kind, message) VALUES (0, 'x', 'y')")
    except sqlite3.Error as exc:
        return exc
    finally:
        conn.close()
    raise AssertionError("the write went through")


def _damaged(path: Path) -> BaseException:
    with open(path, "r+b") as f:
        f.seek(0)
        f.write(b"\xff" * 100)
    conn = sqlite3.connect(path)
    try:
        conn.execute("INSERT INTO events (time, kind, message) VALUES (0, 'x', 'y')")
    except sqlite3.Error as exc:
        return exc
    finally:
        conn.close()
    raise AssertionError("the write went through")


@pytest.mark.parametrize(
    ("make", "says"),
    [
        (_locked, "locked by another program"),
        (_full, "is full: free some space"),
        (_readonly, "read-only"),
        (_damaged, "is damaged"),
    ],
)
def test_each_real_store_error_gets_a_line_that_says_what_to_do(tmp_path, make, says) -> None:
    path = tmp_path / "s.sqlite"
    with RunStore(path) as s:
        s.add_event(None, "start", "made")
    line = store_problem(make(path), path)
    assert says in line and str(path) in line and "\n" not in line


def test_a_moved_store_folder_is_noticed_and_the_run_copied(tmp_path) -> None:
    path = tmp_path / "work" / ".dtwork" / "runs.sqlite"
    old = RunStore(path)
    rid = old.create_run(world_size=2, backend="gloo", name="moved")
    old.add_cell(rid, "x = 1")
    old.add_metrics(rid, [{"step": s, "name": "loss", "value": 1.0 / (s + 1)} for s in range(5)])
    old.add_event(rid, "start", "started", {"ranks": 2})
    old.set_environment(rid, {"torch": "2"})
    assert not old.vanished()
    (tmp_path / "work" / ".dtwork").rename(tmp_path / "elsewhere")
    assert old.vanished()
    old.add_metrics(rid, [{"step": 5, "name": "loss", "value": 0.1}])  # into the moved file
    with RunStore(path) as new:
        counts = old.copy_run(rid, new)
        assert counts == {
            "runs": 1,
            "cells": 1,
            "metrics": 6,
            "events": 1,
            "environment": 1,
            "results": 0,
            "segments": 0,
        }
        assert [r["step"] for r in new.metrics(rid, "loss")] == list(range(6))
        assert new.get_run(rid)["name"] == "moved" and new.environment(rid) == {"torch": "2"}
        assert new.events(rid)[0]["data"] == {"ranks": 2}
        with pytest.raises(DtworkError, match="already holds a run"):
            old.copy_run(rid, new)
    old.close()


def test_metric_rows_alone_wait_for_the_next_write_and_anything_else_writes_them(tmp_path) -> None:
    """At many ranks a write costs per series it touches: rows alone are written at most every
    ``rows_every`` seconds; an event, a cell's end (``rows_now``) or ``force`` writes everything queued,
    in order."""
    with RunStore(tmp_path / "s.sqlite") as store:
        run = store.create_run(name="x", world_size=2, backend="gloo")
        writer = StoreWriter(lambda: store, store.path, rows_every=3600.0)
        rec = {"kind": "log", "step": 0, "rank": 0, "time": 1.0, "values": {"loss": 2.0}}
        writer.records(run, None, [rec])
        assert writer.flush()  # the first write is due at once
        writer.records(run, None, [rec | {"step": 1}, rec | {"step": 2}])
        assert not writer.flush() and writer.unsaved == 2
        assert [r["step"] for r in store.metrics(run, "loss")] == [0]
        writer.event(run, "note", "an event writes the rows before it")
        assert writer.flush() and writer.unsaved == 0
        assert [r["step"] for r in store.metrics(run, "loss")] == [0, 1, 2]
        assert [e["kind"] for e in store.events(run)][-1] == "note"
        writer.records(run, None, [rec | {"step": 3}])
        assert not writer.flush() and writer.flush(force=True)
        writer.records(run, None, [rec | {"step": 4}])
        assert not writer.flush() and writer.flush(rows_now=True)  # a cell ended: its rows go now
        assert [r["step"] for r in store.metrics(run, "loss")] == [0, 1, 2, 3, 4]


def test_rows_wait_longer_after_a_write_that_cost_more_than_its_share_of_a_core(tmp_path) -> None:
    """The writer's CPU stays within ROWS_SHARE of a core: a write of a thousand ranks' series (each
    one's summary and rollups) makes the next rows alone wait past ``rows_every``; a small write
    brings the wait back; ``rows_every`` 0 (every flush writes) stays 0."""
    assert paced(1.0, 0.003) == 1.0 and paced(1.0, 0.15) == pytest.approx(0.15 / ROWS_SHARE)
    assert paced(1.0, 60.0) == ROWS_MAX_SECONDS and paced(0.0, 60.0) == 0.0
    with RunStore(tmp_path / "s.sqlite") as store:
        run = store.create_run(name="wide", world_size=1024, backend="nccl")
        writer = StoreWriter(lambda: store, store.path, rows_every=1.0)
        values = {f"v{i}": float(i) for i in range(5)}
        writer.records(
            run,
            None,
            [{"kind": "perf", "step": 1, "rank": r, "time": 1.0, "values": values} for r in range(1024)],
        )
        assert writer.flush() and writer.rows_interval > 1.0  # 5,120 series' rows cost far over 30 ms
        writer.records(
            run, None, [{"kind": "log", "step": 1, "rank": 0, "time": 1.0, "values": {"loss": 1.0}}]
        )
        assert not writer.flush() and writer.flush(force=True)
        assert writer.rows_interval == 1.0  # one row: a write far under the share
