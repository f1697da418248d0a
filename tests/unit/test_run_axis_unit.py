"""One step axis per run (issue 33, item 3): a later cell that trains the same wrapped model goes
on with the run's steps, as a new segment of it; a new ``ctx.wrap`` starts a new run.

Its tests that need no engines; the others are in tests/cluster/test_run_axis.py.
"""

from __future__ import annotations


def test_a_version_2_store_gets_an_empty_segments_table(tmp_path) -> None:
    import sqlite3

    from dtwork.store.runs import SCHEMA_VERSION, RunStore

    path = tmp_path / "old.sqlite"
    with RunStore(path) as store:
        run = store.create_run(world_size=2, backend="gloo")
        store.add_metrics(run, [{"step": 0, "name": "loss", "value": 1.0}])
    conn = sqlite3.connect(path)
    conn.executescript("DROP TABLE segments; PRAGMA user_version = 2;")
    conn.close()
    with RunStore(path) as store:  # upgraded on open, its rows kept
        assert store.segments(run) == [] and len(store.metrics(run)) == 1
        store.add_segment(run, cell_seq=1, first_step=0, changed=["lr"], data={"lr": [[0.1]]})
        assert [(s["first_step"], s["changed"]) for s in store.segments(run)] == [(0, ["lr"])]
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION


def test_the_runs_list_route_says_where_a_run_diverged(tmp_path, monkeypatch) -> None:
    from dtwork.server import queries as server_data
    from dtwork.shared.records import DIVERGED
    from dtwork.store.runs import RunStore

    path = tmp_path / "runs.sqlite"
    with RunStore(path) as store:
        calm = store.create_run(world_size=2, backend="gloo")
        wild = store.create_run(world_size=2, backend="gloo")
        store.add_event(wild, DIVERGED, "loss is nan at step 3", {"step": 3, "name": "loss", "value": "nan"})
    monkeypatch.setenv("DTWORK_STORE", str(path))
    runs = {r["id"]: r for r in server_data.list_runs(str(tmp_path))["runs"]}
    assert runs[wild]["diverged"] == "diverged at step 3 (loss nan)" and runs[calm]["diverged"] is None
