"""A run store that refuses writes mid-cell (locked, full, read-only, damaged) loses no record."""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from dtwork.store.runs import RunStore

STEPS = 40
CELL = """
import os, time
for step, _ in ctx.steps(range(10**6), max_steps={steps}):
    ctx.log(kept=float(step), **{{f"wide{{i}}": float(i) for i in range(40)}})  # more than a page
    if step == 9:  # say so, then wait (bounded) until the test has made the store refuse writes
        open({at9!r} + str(ctx.rank), "w").close()
        t0 = time.time()
        while not os.path.exists({go!r}) and time.time() - t0 < 120:
            time.sleep(0.01)
"""


def _wait(cond: Callable[[], Any], seconds: float = 120.0) -> None:
    deadline = time.monotonic() + seconds
    while not cond():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


class _Lock:
    """Another program holding the store's write lock (BEGIN EXCLUSIVE): stops root too."""

    def __init__(self, path: Path) -> None:
        self.conn = sqlite3.connect(path, timeout=30, isolation_level=None)

    def refuse(self) -> None:
        self.conn.execute("BEGIN EXCLUSIVE")

    def allow(self) -> None:
        self.conn.execute("COMMIT")
        self.conn.close()


class _Full:
    """The disk is full for the store: SQLite may not grow the file past its present size."""

    def __init__(self, store: RunStore) -> None:
        self.conn = store.db.connection()  # the kernel's own connection: the limit is per connection

    def refuse(self) -> None:
        pages = self.conn.execute("PRAGMA page_count").fetchone()[0]
        self.conn.execute(f"PRAGMA max_page_count = {pages}")

    def allow(self) -> None:
        self.conn.execute("PRAGMA max_page_count = 1073741823")


@pytest.mark.parametrize("trouble", ["locked", "full"])
def test_a_store_refusing_writes_mid_cell_loses_no_record(cluster, tmp_path, capsys, trouble) -> None:
    cluster.configure(None)
    session = cluster.session
    go = tmp_path / "go"
    at9 = tmp_path / "at9-"
    cluster.run(CELL.format(steps=STEPS, go=str(go), at9=str(at9)), bg=True, quiet=True)
    run_id = session.run_id
    _wait(lambda: all(Path(f"{at9}{r}").exists() for r in (0, 1)))
    blocker = _Lock(session.store.path) if trouble == "locked" else _Full(session.store)
    blocker.refuse()
    try:
        go.touch()
        _wait(lambda: session.writer.problem is not None)
        _wait(session.background.done.is_set)  # the cell ended while the store refused writes
        assert session.writer.unsaved > 0
    finally:
        blocker.allow()
    result = session.wait_background()
    assert result is not None and result.status == "ok"
    rows = session.store.metrics(run_id, "kept")
    assert [r["step"] for r in rows] == list(range(STEPS))  # every step once: none lost, none twice
    assert [r["value"] for r in rows] == [float(s) for s in range(STEPS)]
    assert session.store.cells(run_id)[-1]["status"] == "ok"
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if "records are kept" in line]
    assert len(said) == 1, err
    assert ("locked by another program" if trouble == "locked" else "is full") in said[0]
    assert "takes writes again" in err


def test_a_store_deleted_mid_cell_is_made_again_with_every_row(cluster, tmp_path, capsys) -> None:
    cluster.configure(None)
    session = cluster.session
    go = tmp_path / "go"
    at9 = tmp_path / "at9-"
    cluster.run(CELL.format(steps=STEPS, go=str(go), at9=str(at9)), bg=True, quiet=True)
    run_id = session.run_id
    _wait(lambda: all(Path(f"{at9}{r}").exists() for r in (0, 1)))
    path = session.store.path
    for part in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):  # as `rm -rf` of its folder does
        part.unlink(missing_ok=True)
    go.touch()
    result = session.wait_background()
    assert result is not None and result.status == "ok"
    assert path.is_file() and path.stat().st_mode & 0o777 == 0o600
    with RunStore(path, readonly=True) as fresh:  # what another program finds at the path
        rows = fresh.metrics(run_id, "kept")
        assert [r["step"] for r in rows] == list(range(STEPS))  # the steps before and after, once
        assert fresh.cells(run_id)[-1]["status"] == "ok"
        assert fresh.get_run(run_id)["status"] == "running"
        assert [e["kind"] for e in fresh.events(run_id)][:1] == ["start"]
    said = [line for line in capsys.readouterr().err.splitlines() if "deleted or moved" in line]
    assert len(said) == 1 and f"run {run_id} is in it again" in said[0], said


def test_a_store_deleted_between_cells_is_back_before_dtrain_runs_reads_it(cluster, capsys) -> None:
    from IPython.core.interactiveshell import InteractiveShell

    cluster.configure(None)
    cluster.run("ctx.log(step=0, kept=1.0)", quiet=True)
    run_id = cluster.session.run_id
    path = cluster.session.store.path
    for part in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        part.unlink(missing_ok=True)
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "dtwork")
    capsys.readouterr()
    ip.run_line_magic("dtrain", "runs")
    out, err = capsys.readouterr()
    assert any(line.split()[:1] == [str(run_id)] for line in out.splitlines()), out
    assert "deleted or moved" in err
    with RunStore(path, readonly=True) as fresh:
        assert [r["value"] for r in fresh.metrics(run_id, "kept")] == [1.0]
