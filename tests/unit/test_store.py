"""Tests for dtwork.store.runs (the SQLite run store)."""

from __future__ import annotations

import importlib.util
import math
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from dtwork.cli import runs_table
from dtwork.errors import DtworkError
from dtwork.store.runs import SCHEMA_VERSION, RunStore, default_store_path
from dtwork.store.runs import store_path as named_store

REPO_ROOT = Path(__file__).resolve().parents[2]
HAS_PANDAS = importlib.util.find_spec("pandas") is not None


@pytest.fixture
def store_path(tmp_path: Path) -> Path:
    return tmp_path / "sub" / "runs.sqlite"


@pytest.fixture
def store(store_path: Path):
    with RunStore(store_path) as s:
        yield s


def _run(store: RunStore, **kw) -> int:
    args = {"world_size": 4, "backend": "nccl"}
    args.update(kw)
    return store.create_run(**args)


def test_the_next_run_id_is_told_ahead_and_given_while_it_is_free(store: RunStore) -> None:
    assert store.next_run_id() == 1
    assert _run(store, wanted_id=1) == 1 and store.next_run_id() == 2
    assert _run(store) == 2  # another kernel took 2 meanwhile: the run told 2 gets the next
    assert _run(store, wanted_id=2) == 3 and store.next_run_id() == 4


# -- opening ---------------------------------------------------------------------------------


def test_creates_parent_dirs_schema_and_pragmas(store: RunStore, store_path: Path) -> None:
    assert store.path == store_path.absolute()
    assert store_path.is_file()
    conn = sqlite3.connect(store_path)
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"runs", "cells", "metric_keys", "points", "events", "environment", "results"} <= tables
        views = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'view'")}
        assert views == {"metrics"}
    finally:
        conn.close()
    assert store.db.connection().execute("PRAGMA busy_timeout").fetchone()[0] == 5000
    assert store.db.connection().execute("PRAGMA synchronous").fetchone()[0] == 1  # NORMAL


def test_default_store_path(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.delenv("DTWORK_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    assert default_store_path() == tmp_path / ".dtwork" / "runs.sqlite"
    monkeypatch.setenv("DTWORK_STORE", str(tmp_path / "elsewhere.sqlite"))
    assert default_store_path() == tmp_path / "elsewhere.sqlite"
    with RunStore() as s:
        assert s.path == tmp_path / "elsewhere.sqlite"
    assert (tmp_path / "elsewhere.sqlite").is_file()


def test_a_named_store_is_a_file_or_the_one_beside_a_folder_or_notebook(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("DTWORK_STORE", raising=False)
    monkeypatch.chdir(tmp_path)
    beside = tmp_path / ".dtwork" / "runs.sqlite"
    assert named_store(None) == named_store("  ") == default_store_path() == beside
    assert named_store(tmp_path) == beside and named_store(tmp_path / "train.ipynb") == beside
    assert named_store("other.sqlite") == tmp_path / "other.sqlite"
    assert default_store_path(tmp_path / "nb") == tmp_path / "nb" / ".dtwork" / "runs.sqlite"
    monkeypatch.setenv("DTWORK_STORE", "rel.sqlite")  # relative: from the root it is given
    assert default_store_path(tmp_path / "nb") == tmp_path / "nb" / "rel.sqlite"


def test_dtwork_runs_lists_the_runs_of_a_store(tmp_path: Path) -> None:
    import dtwork

    assert dtwork.runs(tmp_path) == []  # no store yet: no runs, and none made
    assert not (tmp_path / ".dtwork").exists()
    with RunStore(tmp_path / ".dtwork" / "runs.sqlite") as s:
        first, second = _run(s, name="a"), _run(s, name="b")
    assert [(r["id"], r["name"]) for r in dtwork.runs(tmp_path)] == [(second, "b"), (first, "a")]
    assert [r["id"] for r in dtwork.runs(tmp_path / ".dtwork" / "runs.sqlite")] == [second, first]


def test_reopen_keeps_data(store_path: Path) -> None:
    with RunStore(store_path) as s:
        rid = _run(s, name="a")
    with RunStore(store_path) as s:
        assert s.get_run(rid)["name"] == "a"


def test_readonly_missing_file_message(tmp_path: Path) -> None:
    path = tmp_path / "nope" / "runs.sqlite"
    with pytest.raises(DtworkError) as info:
        RunStore(path, readonly=True)
    assert str(info.value) == (f"no run store at {path}: run a %%dtrain cell first, or set DTWORK_STORE")
    assert not path.parent.exists()


def test_readonly_rejects_writes(store: RunStore) -> None:
    rid = _run(store)
    with RunStore(store.path, readonly=True) as ro:
        assert ro.readonly
        assert ro.get_run(rid)["id"] == rid
        with pytest.raises(DtworkError, match="read-only"):
            ro.add_event(rid, "x", "y")


def test_readonly_after_writer_closed(store_path: Path) -> None:
    with RunStore(store_path) as s:
        rid = _run(s)
        s.add_metrics(rid, [{"step": 1, "name": "loss", "value": 1.0}])
    with RunStore(store_path, readonly=True) as ro:
        assert [m["value"] for m in ro.metrics(rid)] == [1.0]


def test_newer_schema_version_is_refused(store_path: Path) -> None:
    RunStore(store_path).close()
    conn = sqlite3.connect(store_path)
    conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    conn.commit()
    conn.close()
    for readonly in (False, True):
        with pytest.raises(DtworkError, match=f"schema version {SCHEMA_VERSION + 1}, newer than"):
            RunStore(store_path, readonly=readonly)


def test_not_a_database(tmp_path: Path) -> None:
    path = tmp_path / "junk.sqlite"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(DtworkError, match="not a dtwork run store"):
        RunStore(path)


def test_closed_store(store_path: Path) -> None:
    s = RunStore(store_path)
    s.close()
    s.close()
    with pytest.raises(DtworkError, match="is closed"):
        s.list_runs()


# -- round trips ------------------------------------------------------------------------------


def test_run_round_trip(store: RunStore) -> None:
    before = time.time()
    rid = store.create_run(
        name="resnet",
        world_size=8,
        backend="gloo",
        cluster_id="c1",
        notebook="nb.ipynb",
        config_yaml="lr: 0.1\n",
        global_batch_size=256,
        per_slot_batch_size=32,
    )
    run = store.get_run(rid)
    assert run["id"] == rid
    assert run["name"] == "resnet"
    assert run["status"] == "running"
    assert before <= run["created_at"] <= time.time()
    assert run["ended_at"] is None
    assert (run["world_size"], run["backend"], run["cluster_id"], run["notebook"]) == (
        8,
        "gloo",
        "c1",
        "nb.ipynb",
    )
    assert run["config_yaml"] == "lr: 0.1\n"
    assert (run["global_batch_size"], run["per_slot_batch_size"]) == (256, 32)
    assert run["n_cells"] == 0 and run["last_step"] is None
    assert store.get_run(str(rid))["id"] == rid

    store.set_run_status(rid, "completed")
    assert store.get_run(rid)["ended_at"] is None
    store.set_run_status(rid, "failed", ended=True)
    run = store.get_run(rid)
    assert run["status"] == "failed" and run["ended_at"] >= run["created_at"]
    with pytest.raises(DtworkError, match="run status must be one of"):
        store.set_run_status(rid, "bogus")
    with pytest.raises(DtworkError, match="no run 99"):
        store.set_run_status(99, "stopped")


def test_list_runs_and_latest(store: RunStore) -> None:
    assert store.list_runs() == []
    assert store.latest_run_id() is None
    r1 = _run(store, name="first")
    r2 = _run(store, name="second", world_size=2)
    store.add_cell(r1, "a")
    store.add_cell(r1, "b")
    store.add_metrics(r1, [{"step": s, "name": "loss", "value": 1.0 / (s + 1)} for s in range(5)])
    store.add_metrics(r1, [{"step": 7, "name": "loss", "value": 0.1, "rank": 0}])
    runs = store.list_runs()
    assert [r["id"] for r in runs] == [r2, r1]
    assert store.latest_run_id() == r2
    first = runs[1]
    assert first["name"] == "first" and first["status"] == "running"
    assert first["n_cells"] == 2 and first["last_step"] == 7
    assert runs[0]["n_cells"] == 0 and runs[0]["last_step"] is None and runs[0]["world_size"] == 2
    for key in ("id", "name", "status", "created_at", "ended_at", "world_size", "backend"):
        assert key in first


def test_cells_round_trip(store: RunStore) -> None:
    r1, r2 = _run(store), _run(store)
    assert store.add_cell(r1, "x = 1", ranks=[0, 1, 2]) == 1
    assert store.add_cell(r1, "y = 2") == 2
    assert store.add_cell(r2, "z") == 1
    store.finish_cell(r1, 1, "completed")
    store.finish_cell(r1, 2, "failed", error="ZeroDivisionError: boom")
    cells = store.cells(r1)
    assert [c["seq"] for c in cells] == [1, 2]
    assert cells[0]["source"] == "x = 1" and cells[0]["ranks"] == [0, 1, 2]
    assert cells[0]["status"] == "completed" and cells[0]["error"] is None
    assert cells[0]["ended_at"] >= cells[0]["started_at"]
    assert cells[1]["ranks"] is None and cells[1]["status"] == "failed"
    assert cells[1]["error"] == "ZeroDivisionError: boom"
    assert [c["source"] for c in store.cells(r2)] == ["z"]
    with pytest.raises(DtworkError, match="no run 42"):
        store.add_cell(42, "q")
    with pytest.raises(DtworkError, match="has no cell 9"):
        store.finish_cell(r1, 9, "completed")


def test_metrics_round_trip(store: RunStore) -> None:
    rid = _run(store)
    other = _run(store)
    n = store.add_metrics(
        rid,
        [
            {"step": 2, "name": "loss", "value": 0.5, "cell_seq": 1, "time": 123.0},
            {"step": 1, "name": "loss", "value": 0.9},
            {"step": 1, "name": "loss", "value": 1.0, "rank": 1},
            {"step": 1, "name": "loss", "value": 0.8, "rank": 0},
            {"step": 1, "name": "lr", "value": 0.1},
            {"step": 2, "name": "loss", "value": 0.4, "rank": 0},
        ],
    )
    assert n == 6
    store.add_metrics(other, [{"step": 1, "name": "acc", "value": 0.3}])
    assert store.add_metrics(rid, []) == 0

    agg = store.metrics(rid, "loss")
    assert [(m["step"], m["value"], m["rank"]) for m in agg] == [(1, 0.9, None), (2, 0.5, None)]
    assert agg[1]["cell_seq"] == 1 and agg[1]["time"] == 123.0 and agg[1]["run_id"] == rid
    assert agg[0]["cell_seq"] is None and agg[0]["time"] > 1e9
    all_loss = store.metrics(rid, "loss", rank="all")
    assert [(m["step"], m["rank"]) for m in all_loss] == [(1, None), (1, 0), (1, 1), (2, None), (2, 0)]
    assert [m["value"] for m in store.metrics(rid, "loss", rank=0)] == [0.8, 0.4]
    assert [m["name"] for m in store.metrics(rid)] == ["loss", "lr", "loss"]
    assert store.metric_names(rid) == ["loss", "lr"]
    assert store.metric_names(other) == ["acc"]
    assert store.last_metrics(rid) == {"loss": 0.5, "lr": 0.1}
    with pytest.raises(DtworkError, match="rank must be"):
        store.metrics(rid, rank="some")  # type: ignore[arg-type]
    with pytest.raises(DtworkError, match="needs keys step, name and value"):
        store.add_metrics(rid, [{"step": 1, "name": "loss"}])
    with pytest.raises(DtworkError, match="non-numeric"):
        store.add_metrics(rid, [{"step": 1, "name": "loss", "value": "abc"}])


def test_add_metrics_is_one_transaction(store: RunStore) -> None:
    rid = _run(store)
    with pytest.raises(DtworkError):
        store.add_metrics(
            rid, [{"step": 1, "name": "a", "value": 1.0}, {"step": "x", "name": "a", "value": 1}]
        )
    assert store.metrics(rid, rank="all") == []


def test_non_finite_values(store: RunStore) -> None:
    """None is stored as NULL and read back as None; NaN and +-inf round-trip."""
    rid = _run(store)
    store.add_metrics(
        rid,
        [
            {"step": 1, "name": "loss", "value": None},
            {"step": 2, "name": "loss", "value": float("nan")},
            {"step": 3, "name": "loss", "value": float("inf")},
            {"step": 4, "name": "loss", "value": float("-inf")},
            {"step": 1, "name": "gnorm", "value": 2.0},
            {"step": 2, "name": "gnorm", "value": float("nan")},
        ],
    )
    values = [m["value"] for m in store.metrics(rid, "loss")]
    assert values[0] is None and math.isnan(values[1])
    assert values[2] == math.inf and values[3] == -math.inf
    last = store.last_metrics(rid)
    assert last["loss"] == -math.inf
    assert math.isnan(last["gnorm"])


def test_events_environment_results(store: RunStore) -> None:
    rid = _run(store)
    e1 = store.add_event(rid, "rank_failure", "rank 3 died", {"ranks": [3], "t": float("inf")})
    e2 = store.add_event(rid, "info", "started")
    e3 = store.add_event(None, "cluster", "cluster up")
    assert e1 < e2 < e3
    events = store.events(rid)
    assert [e["kind"] for e in events] == ["rank_failure", "info"]
    assert events[0]["data"] == {"ranks": [3], "t": math.inf} and events[0]["message"] == "rank 3 died"
    assert events[1]["data"] is None and events[1]["time"] > 0
    assert [e["id"] for e in store.events(rid, "info")] == [e2]
    assert [e["message"] for e in store.events(None)] == ["cluster up"]

    assert store.environment(rid) == {}
    store.set_environment(rid, {"torch": "2.3", "gpus": ["A", "B"], "path": Path("/x")})
    assert store.environment(rid) == {"torch": "2.3", "gpus": ["A", "B"], "path": "/x"}
    store.set_environment(rid, {"torch": "2.4"})
    assert store.environment(rid) == {"torch": "2.4"}

    other = _run(store)
    a = store.add_result(rid, "scaling_sweep", {"points": [[1, 100.0], [2, 190.0]]})
    b = store.add_result(other, "throughput", {"samples_per_s": 1234.5})
    c = store.add_result(rid, "gns", [1, 2, 3])
    d = store.add_result(None, "bucket_tuning", {"best_mb": 25})
    assert [r["id"] for r in store.results()] == [a, b, c, d]
    assert [r["id"] for r in store.results(rid)] == [a, c]
    assert [r["id"] for r in store.results(kind="throughput")] == [b]
    assert [r["id"] for r in store.results(rid, kind="gns")] == [c]
    res = store.results(rid)[0]
    assert res["data"] == {"points": [[1, 100.0], [2, 190.0]]}
    assert res["kind"] == "scaling_sweep" and res["run_id"] == rid and res["created_at"] > 0
    assert store.results(str(other))[0]["data"] == {"samples_per_s": 1234.5}


# -- run id errors ------------------------------------------------------------------------------


def test_unknown_run_messages(store: RunStore) -> None:
    with pytest.raises(DtworkError) as info:
        store.get_run(7)
    assert str(info.value) == f"no run 7 in {store.path}; the store is empty"
    for _ in range(5):
        _run(store)
    with pytest.raises(DtworkError) as info:
        store.get_run(7)
    assert str(info.value) == f"no run 7 in {store.path}; known runs: 1-5"
    with pytest.raises(DtworkError) as info:
        store.get_run("7")
    assert str(info.value) == f"no run 7 in {store.path}; known runs: 1-5"


def test_known_runs_are_shown_as_ranges(store: RunStore) -> None:
    for _ in range(8):
        _run(store)
    conn = sqlite3.connect(store.path)
    conn.execute("DELETE FROM runs WHERE id IN (4, 6)")
    conn.commit()
    conn.close()
    with pytest.raises(DtworkError) as info:
        store.get_run(4)
    assert str(info.value).endswith("; known runs: 1-3, 5, 7-8")


@pytest.mark.parametrize("bad", ["abc", "1.5", "-1", "", None, 2.0, True])
def test_malformed_run_ids(store: RunStore, bad: object) -> None:
    with pytest.raises(DtworkError) as info:
        store.get_run(bad)  # type: ignore[arg-type]
    assert str(info.value) == f"run id must be a whole number, got {bad!r}"


def test_malformed_run_id_exact_message(store: RunStore) -> None:
    with pytest.raises(DtworkError) as info:
        store.get_run("abc")
    assert str(info.value) == "run id must be a whole number, got 'abc'"
    with pytest.raises(DtworkError, match="got 'abc'"):
        store.metrics("abc")


# -- pandas ---------------------------------------------------------------------------------------


@pytest.mark.skipif(HAS_PANDAS, reason="pandas is installed")
def test_metrics_frame_without_pandas(store: RunStore) -> None:
    rid = _run(store)
    with pytest.raises(DtworkError) as info:
        store.metrics_frame(rid)
    assert str(info.value) == (
        "pandas is not installed: pip install pandas, or use store.metrics(...) for records"
    )


@pytest.mark.skipif(not HAS_PANDAS, reason="pandas is not installed")
def test_metrics_frame_with_pandas(store: RunStore) -> None:
    rid = _run(store)
    store.add_metrics(
        rid, [{"step": 1, "name": "loss", "value": 1.0}, {"step": 2, "name": "loss", "value": 0.5}]
    )
    frame = store.metrics_frame(rid, "loss")
    assert list(frame["value"]) == [1.0, 0.5]


# -- concurrency and durability --------------------------------------------------------------------


def test_two_threads_write_metrics_concurrently(store: RunStore) -> None:
    rid = _run(store)
    n_batches, batch = 50, 20
    errors: list[BaseException] = []
    start = threading.Barrier(3)

    def writer(rank: int) -> None:
        try:
            start.wait()
            for b in range(n_batches):
                store.add_metrics(
                    rid,
                    [
                        {"step": b * batch + i, "name": "loss", "value": float(i), "rank": rank}
                        for i in range(batch)
                    ],
                )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    start.wait()
    # The main thread reads while the writers write.
    for _ in range(20):
        store.list_runs()
        store.metrics(rid, "loss", rank="all")
    for t in threads:
        t.join()
    assert errors == []
    for rank in (0, 1):
        steps = [m["step"] for m in store.metrics(rid, "loss", rank=rank)]
        assert steps == list(range(n_batches * batch))


def test_second_connection_sees_committed_records(store: RunStore) -> None:
    rid = _run(store, name="live")
    store.add_metrics(rid, [{"step": 1, "name": "loss", "value": 2.0}])
    with RunStore(store.path, readonly=True) as ro:
        assert ro.get_run(rid)["name"] == "live"
        assert [m["value"] for m in ro.metrics(rid)] == [2.0]
        store.add_metrics(rid, [{"step": 2, "name": "loss", "value": 1.5}])
        store.add_cell(rid, "train()")
        store.add_event(rid, "info", "hi")
        assert [m["step"] for m in ro.metrics(rid)] == [1, 2]
        assert ro.list_runs()[0]["n_cells"] == 1
        assert ro.last_metrics(rid) == {"loss": 1.5}
        assert [e["message"] for e in ro.events(rid)] == ["hi"]


_CHILD = textwrap.dedent(
    """
    import sys
    from dtwork.store.runs import RunStore

    store = RunStore(sys.argv[1])
    rid = store.create_run(world_size=2, backend="gloo")
    print("run", rid, flush=True)
    step = 0
    while True:
        store.add_metrics(
            rid,
            [
                {"step": step, "name": "loss", "value": 1.0 / (step + 1)},
                {"step": step, "name": "loss", "value": 0.5, "rank": 0},
                {"step": step, "name": "loss", "value": 0.5, "rank": 1},
            ],
        )
        print(step, flush=True)
        step += 1
    """
)


@pytest.mark.skipif(not hasattr(signal, "SIGKILL"), reason="needs SIGKILL")
def test_sigkilled_writer_loses_nothing_committed(tmp_path: Path) -> None:
    path = tmp_path / "runs.sqlite"
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO_ROOT), env.get("PYTHONPATH", "")])
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline().split()
        assert first[:1] == ["run"], proc.stderr.read() if proc.stderr else first
        rid = int(first[1])
        last = -1
        deadline = time.monotonic() + 60
        while last < 200 and time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line:
                break
            last = int(line)
        assert last >= 0, "the child committed no step"
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        # The pipe may still hold lines printed after the ones we read: they count too.
        for line in proc.stdout.read().split():
            last = max(last, int(line))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert proc.returncode == -signal.SIGKILL

    with RunStore(path) as s:
        agg_steps = [m["step"] for m in s.metrics(rid, "loss")]
        assert agg_steps[: last + 1] == list(range(last + 1))
        for rank in (0, 1):
            assert [m["step"] for m in s.metrics(rid, "loss", rank=rank)][: last + 1] == list(range(last + 1))
        assert s.get_run(rid)["last_step"] >= last


# -- formatting -----------------------------------------------------------------------------------


def test_runs_table_without_runs(tmp_path: Path) -> None:
    missing = tmp_path / "x.sqlite"
    assert runs_table(missing) == f"no runs yet in {missing}: run a %%dtrain cell to start one"
    assert not missing.exists()  # reading made no store
    with RunStore(missing):
        pass
    assert runs_table(missing) == f"no runs yet in {missing}: run a %%dtrain cell to start one"


def test_runs_table(store: RunStore) -> None:
    r1 = _run(store, name="baseline", world_size=8, global_batch_size=256)
    r2 = _run(store, backend="gloo", world_size=2)
    store.add_metrics(r1, [{"step": 1200, "name": "loss", "value": 0.1}])
    store.set_run_status(r1, "completed", ended=True)
    lines = runs_table(store.path).splitlines()
    assert len(lines) == 4 and lines[0] == str(store.path)
    assert lines[1].split() == [
        "id",
        "name",
        "status",
        "ranks",
        "batch",
        "steps",
        "result",
        "started",
        "changed",
    ]
    row2, row1 = lines[2].split(), lines[3].split()
    assert row2[:7] == [str(r2), "-", "running", "2", "-", "-", "-"]
    assert row1[:7] == [str(r1), "baseline", "completed", "8", "256", "1200", "-"]
    started = time.strftime("%Y-%m-%d", time.localtime(store.get_run(r1)["created_at"]))
    assert row1[7] == started
    assert row1[-1] == row2[-1] == "-"  # no config stored: nothing differs
    # columns line up: every 'status' cell starts where the header's does
    col = lines[1].index("status")
    assert lines[2][col:].startswith("running") and lines[3][col:].startswith("completed")
    assert all(line == line.rstrip() for line in lines)


def test_a_runs_history_is_the_earlier_cells_its_cells_need_not_other_training(store: RunStore) -> None:
    """The cells a report or a replay re-runs before a run's own: of its cluster's earlier cells,
    those that bind (or set up without training) a name its cells read; never another cluster's,
    nor a failed cell, nor another run's training it does not read from."""

    def cell(run: int, source: str, trains: bool = False, follows: dict[str, int] | None = None) -> None:
        seq = store.add_cell(run, source)
        store.finish_cell(run, seq, "ok", None)
        if trains:
            data = {"follows": follows} if follows else {}
            store.add_segment(run, cell_seq=seq, first_step=0, changed=[], data=data)

    other = _run(store, cluster_id="b")
    cell(other, "data = 'elsewhere'")
    one = _run(store, cluster_id="a")
    cell(
        one,
        "import torch\ndef make_model(width):\n    hidden = width * 2\n    return torch.nn.Linear(width, hidden)",
    )
    cell(one, "data = list(range(8))")
    store.finish_cell(one, store.add_cell(one, "make_model = None"), "error", "ValueError")
    cell(one, "model = make_model(4)\nfor x in data: loss = model(x)", trains=True)
    cell(one, "assert loss is not None")  # reads what run 1's training bound: not the others' setup
    two = _run(store, cluster_id="a")  # begun by the kernel (a new config): it follows nothing
    cell(two, "scale = 2.0\ndata.append(9)")
    cell(two, "model = make_model(4)\nfor x in data: loss = model(x) * scale", trains=True)
    three = _run(store, cluster_id="a")
    cell(three, "tuned = make_model(4)\ntuned.load_state_dict(model.state_dict())", trains=True)
    setup = [
        "import torch\ndef make_model(width):\n    hidden = width * 2\n    return torch.nn.Linear(width, hidden)",
        "data = list(range(8))",
    ]
    assert [c["source"] for c in store.history(two)] == setup
    # run 3 reads run 2's model: run 2's training comes along, with what it read
    assert [c["source"] for c in store.history(three)] == [*setup, *[c["source"] for c in store.cells(two)]]
    assert [c["source"] for c in store.history(other)] == []
