"""Records become rows by one rule, the store keeps each row's kind, and the views read it back."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path

import pytest

from dtwork import plots
from dtwork.shared.records import Kind, finite, make_record, to_rows
from dtwork.store.runs import SCHEMA_VERSION, RunStore


def test_logged_and_gns_values_are_aggregated_the_others_stay_per_rank() -> None:
    records = [
        make_record(Kind.LOG, 3, 0, {"loss": 0.5}),
        make_record(Kind.PERF, 3, 1, {"samples_per_s": 10}),
        make_record(Kind.GNS, 3, 0, {"b_simple": 64.0}),
        make_record(Kind.GPU, 3, 1, {"utilization": 50.0}),
        make_record(Kind.EVENT, None, 0, {}, event="warning", message="hi"),
    ]
    rows = to_rows(records)
    assert [(r["kind"], r["step"], r["rank"], r["name"], r["value"]) for r in rows] == [
        ("log", 3, None, "loss", 0.5),
        ("perf", 3, 1, "samples_per_s", 10.0),
        ("gns", 3, None, "b_simple", 64.0),
        ("gpu", 3, 1, "utilization", 50.0),
    ]
    assert all(isinstance(r["time"], float) for r in rows)


def test_non_finite_values_stay_as_they_are_and_malformed_records_are_skipped() -> None:
    records: list[object] = [
        {"kind": "log", "step": 4, "rank": 0, "values": {"loss": math.inf, "acc": 0.5, "bad": "x"}},
        {"kind": "log", "step": "not a step", "rank": 0, "values": {"loss": 1.0}},
        {"kind": "log", "step": 5, "rank": 0, "values": ["not", "a", "mapping"]},
        "not a record",
        {"kind": "log", "step": 6, "rank": 0, "values": {"loss": 2.0}},
    ]
    rows = to_rows(records)  # type: ignore[arg-type]
    assert [(r["step"], r["name"], r["value"]) for r in rows] == [
        (4, "loss", math.inf),
        (4, "acc", 0.5),
        (6, "loss", 2.0),
    ]


def test_finite_is_the_one_rule_for_values() -> None:
    assert finite(1) == 1.0 and finite("2.5") == 2.5 and finite(True) == 1.0
    for bad in (None, math.nan, math.inf, -math.inf, "x", "nan", [1.0], object()):
        assert finite(bad) is None, bad
    from dtwork.plots import figures
    from dtwork.server import queries

    assert figures.finite is finite and queries.finite is finite  # the figures and the server use it
    assert queries.json_safe({"a": [math.nan, 1.5, (math.inf, 2)], 3: "x"}) == {
        "a": [None, 1.5, [None, 2]],
        "3": "x",
    }


def test_the_store_keeps_the_kind_and_the_figures_read_it(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs.sqlite")
    rid = store.create_run(name="r", world_size=2, backend="gloo")
    records = [make_record(Kind.LOG, s, 0, {"loss": 1.0 / (s + 1)}) for s in range(3)]
    records += [make_record(Kind.GNS, 2, 0, {"b_simple": 40.0})]
    records += [make_record(Kind.PERF, s, r, {"samples_per_s": 10.0 + r}) for s in range(3) for r in (0, 1)]
    store.add_metrics(rid, to_rows(records))
    stored = store.metrics(rid, rank="all")
    assert {r["kind"] for r in stored} == {"log", "gns", "perf"}
    assert [t.name for t in plots.metrics_figure(stored).data] == ["loss"]  # b_simple is not a metric
    assert [t.name for t in plots.throughput_figure(stored).data] == ["global", "rank 0", "rank 1"]
    assert list(plots.gns_figure(stored).data[0].y) == [40.0]


def test_a_store_written_before_kinds_were_stored_is_upgraded_once(tmp_path: Path) -> None:
    path = tmp_path / "old.sqlite"
    conn = sqlite3.connect(path)
    conn.executescript(
        """
        CREATE TABLE runs (id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT, status TEXT NOT NULL,
            created_at REAL NOT NULL, ended_at REAL, world_size INT, backend TEXT, cluster_id TEXT,
            notebook TEXT, config_yaml TEXT, global_batch_size INT, per_slot_batch_size INT,
            summary_json TEXT NOT NULL DEFAULT '{}');
        CREATE TABLE metrics (run_id INTEGER NOT NULL, cell_seq INTEGER, step INT NOT NULL, rank INT,
            name TEXT NOT NULL, value REAL, time REAL);
        INSERT INTO runs (name, status, created_at, summary_json)
            VALUES ('old', 'completed', 1.0, '{"throughput": 5.0}');
        INSERT INTO metrics VALUES (1, 1, 0, NULL, 'loss', 0.5, 1.0), (1, 1, 0, NULL, 'b_simple', 9.0, 1.0),
            (1, 1, 0, 0, 'samples_per_s', 10.0, 1.0), (1, 1, 0, 0, 'utilization', 50.0, 1.0);
        PRAGMA user_version = 1;
        """
    )
    conn.close()
    with pytest.raises(Exception, match="older dtwork"):
        RunStore(path, readonly=True).metrics(1)
    store = RunStore(path)
    assert [(r["name"], r["kind"]) for r in store.metrics(1, rank="all")] == [
        ("loss", "log"),
        ("b_simple", "gns"),
        ("samples_per_s", "perf"),
        ("utilization", "gpu"),
    ]
    store.close()
    assert sqlite3.connect(path).execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert RunStore(path, readonly=True).get_run(1)["name"] == "old"
    # what an older dtwork wrote in runs.summary_json stays there, unread
    assert "throughput" not in RunStore(path, readonly=True).list_runs()[0]
