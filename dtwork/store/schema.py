"""The run store's SQLite schema, its upgrades from older versions, and how values are encoded."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any, SupportsFloat, SupportsInt, cast

from dtwork.errors import DtworkError

__all__ = [
    "AGGREGATED_RANK",
    "NO_CELL",
    "ROLLUPS_SINCE",
    "SCHEMA_VERSION",
    "check_version",
    "create_or_upgrade",
    "dumps",
    "float_or_none",
    "int_or_none",
    "loads",
    "ranges",
    "stored_float",
]

SCHEMA_VERSION = 7
AGGREGATED_RANK = -1  # rank NULL (aggregated over ranks) as the keys of metrics, series and rollups hold it
NO_CELL = 0  # cell_seq NULL as those keys hold it (cells are numbered from 1)

# runs.summary_json is read and written by nothing; it stays so that an older dtwork opens a store
# of this version (dropping it would need a version of its own).
_SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT,
    status TEXT NOT NULL,
    created_at REAL NOT NULL,
    ended_at REAL,
    world_size INT,
    backend TEXT,
    cluster_id TEXT,
    notebook TEXT,
    config_yaml TEXT,
    global_batch_size INT,
    per_slot_batch_size INT,
    summary_json TEXT NOT NULL DEFAULT '{}'
);
CREATE TABLE IF NOT EXISTS cells (
    run_id INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    source TEXT,
    started_at REAL,
    ended_at REAL,
    status TEXT,
    error TEXT,
    ranks_json TEXT,
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS metric_keys (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER NOT NULL,
    name TEXT NOT NULL,
    rank INT NOT NULL,
    kind TEXT NOT NULL,
    cell_seq INT NOT NULL,
    UNIQUE (run_id, name, rank, kind, cell_seq)
);
CREATE TABLE IF NOT EXISTS points (
    key INTEGER NOT NULL,
    step INT NOT NULL,
    seq INT NOT NULL,
    value REAL,
    time REAL,
    PRIMARY KEY (key, step, seq)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS counters (
    name TEXT PRIMARY KEY,
    value INT NOT NULL
) WITHOUT ROWID;
INSERT OR IGNORE INTO counters (name, value) VALUES ('points', 0);
CREATE TABLE IF NOT EXISTS series (
    run_id INTEGER NOT NULL,
    name TEXT NOT NULL,
    rank INT NOT NULL,
    kind TEXT NOT NULL,
    n INT NOT NULL,
    first_step INT,
    last_step INT,
    last_value REAL,
    last_time REAL,
    lo REAL,
    hi REAL,
    raw_from INT NOT NULL DEFAULT 0,
    PRIMARY KEY (run_id, name, rank)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS rollups (
    run_id INTEGER NOT NULL,
    name TEXT NOT NULL,
    level INT NOT NULL,
    cell_seq INT NOT NULL,
    rank INT NOT NULL,
    bucket INT NOT NULL,
    kind TEXT NOT NULL,
    n INT NOT NULL,
    total REAL NOT NULL,
    lo REAL NOT NULL,
    hi REAL NOT NULL,
    lo_step INT NOT NULL,
    hi_step INT NOT NULL,
    first_time REAL NOT NULL,
    last_time REAL NOT NULL,
    last_step INT NOT NULL,
    last REAL NOT NULL,
    PRIMARY KEY (run_id, name, level, cell_seq, rank, bucket)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS events (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER,
    time REAL NOT NULL,
    kind TEXT NOT NULL,
    message TEXT,
    data_json TEXT
);
CREATE INDEX IF NOT EXISTS events_run ON events (run_id, kind);
CREATE TABLE IF NOT EXISTS environment (
    run_id INTEGER PRIMARY KEY,
    data_json TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS results (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    run_id INTEGER,
    kind TEXT NOT NULL,
    created_at REAL NOT NULL,
    data_json TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS results_run_kind ON results (run_id, kind);
CREATE TABLE IF NOT EXISTS segments (
    run_id INTEGER NOT NULL,
    seq INTEGER NOT NULL,
    cell_seq INTEGER,
    first_step INT NOT NULL,
    time REAL NOT NULL,
    changed TEXT NOT NULL DEFAULT '',
    data_json TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (run_id, seq)
);
CREATE TABLE IF NOT EXISTS deliveries (
    rank INT NOT NULL,
    stream TEXT NOT NULL,
    run_id INTEGER NOT NULL,
    cell_seq INT,
    seq INT NOT NULL,
    PRIMARY KEY (rank, stream)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS searches (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    label TEXT NOT NULL,
    searcher TEXT NOT NULL,
    metric TEXT,
    smaller_is_better INT NOT NULL DEFAULT 1,
    config_yaml TEXT,
    code TEXT,
    cluster_id TEXT,
    world_size INT,
    backend TEXT,
    started_at REAL NOT NULL,
    ended_at REAL,
    status TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS trials (
    search_id INTEGER NOT NULL,
    number INT NOT NULL,
    run_id INTEGER,
    hparams_json TEXT NOT NULL DEFAULT '{}',
    status TEXT NOT NULL,
    metric REAL,
    error TEXT,
    PRIMARY KEY (search_id, number)
);
CREATE INDEX IF NOT EXISTS trials_run ON trials (run_id);
"""

# The metric rows as every reader sees them (``points`` of ``metric_keys``): a rank or cell NULL is
# stored in the key as AGGREGATED_RANK or NO_CELL; ``seq`` orders the rows as they were written.
_METRICS_VIEW = f"""
CREATE VIEW IF NOT EXISTS metrics AS SELECT k.run_id AS run_id, NULLIF(k.cell_seq, {NO_CELL}) AS cell_seq,
    p.step AS step, NULLIF(k.rank, {AGGREGATED_RANK}) AS rank, k.name AS name, p.value AS value,
    p.time AS time, k.kind AS kind, p.seq AS seq
FROM metric_keys k JOIN points p ON p.key = k.id
"""

# Version 7 keeps the metric rows as ``points`` (key, step, insertion number, value, time) clustered by
# their series' interned key (``metric_keys``: run, name, rank, kind, cell) in place of one table
# repeating the run, name and kind in every row and a separate index on them: 30-35 bytes a row, not
# 86-94, and a series' raw window trims whole pages. ``metrics`` is a view of the same columns; an
# older store's rows are moved into it, their rowid kept as the insertion number.
_MIGRATE_6_TO_7 = f"""
INSERT INTO metric_keys (run_id, name, rank, kind, cell_seq)
    SELECT run_id, name, IFNULL(rank, {AGGREGATED_RANK}) AS r, kind, IFNULL(cell_seq, {NO_CELL}) AS c
    FROM metrics
    GROUP BY run_id, name, r, kind, c ORDER BY MIN(rowid);
INSERT INTO points (key, step, seq, value, time)
    SELECT k.id, m.step, m.rowid, m.value, m.time FROM metrics m JOIN metric_keys k
    ON k.run_id = m.run_id AND k.name = m.name AND k.rank = IFNULL(m.rank, {AGGREGATED_RANK})
        AND k.kind = m.kind AND k.cell_seq = IFNULL(m.cell_seq, {NO_CELL})
    ORDER BY k.id, m.step, m.rowid;
UPDATE counters SET value = (SELECT IFNULL(MAX(rowid), 0) FROM metrics) WHERE name = 'points';
DROP TABLE metrics
"""

# Version 6 added the searches and trials tables (dtwork.store.searches): a search's file, searcher and
# metric, and each trial's run, hyperparameters, status and metric. An older store gets them empty.

# Version 5 added the deliveries table: the last batch stored of each rank's cell (its stream), written
# in the transaction of the batch's rows, so that a batch sent again (a kept cluster's ranks, read by a
# kernel that attached) is stored once. An older store gets it empty from ``_SCHEMA``.
ROLLUPS_SINCE = 4  # a store older than this gets the rollups of the rows it holds built

# Version 4 added the series and rollups tables (dtwork.store.rollups), built from the rows an
# older store holds when it is upgraded, and one index by (run, name, rank, step) in place of two.
_MIGRATE_3_TO_4 = """
DROP INDEX IF EXISTS metrics_run_name_step;
DROP INDEX IF EXISTS metrics_run_step
"""

# Version 3 added the segments table (each training loop of a run: its cell, first step, what
# changed); an older store gets it empty from ``_SCHEMA``'s CREATE IF NOT EXISTS.

# Version 1 stored no kind; its rows get the kind their names and ranks imply, once.
_MIGRATE_1_TO_2 = """
ALTER TABLE metrics ADD COLUMN kind TEXT NOT NULL DEFAULT 'log';
UPDATE metrics SET kind = CASE
    WHEN rank IS NULL AND name IN ('b_simple', 'g2', 'trace_sigma') THEN 'gns'
    WHEN rank IS NULL THEN 'log'
    WHEN name IN ('utilization', 'memory_used_mb', 'memory_total_mb') THEN 'gpu'
    ELSE 'perf' END
"""


class NoRunsYet(DtworkError):
    """A store file with no schema yet (just made, or made by another tool): it holds no runs."""


def check_version(path: Path, version: int, readonly: bool) -> None:
    """Refuse a store this dtwork cannot use as it is; say what to do."""
    if version > SCHEMA_VERSION:
        raise DtworkError(
            f"run store {path} has schema version {version}, newer than this dtwork "
            f"supports ({SCHEMA_VERSION}): upgrade dtwork, or set DTWORK_STORE to another file"
        )
    if readonly and 0 < version < SCHEMA_VERSION:
        raise DtworkError(
            f"{path} was written by an older dtwork (schema version {version}): "
            "open it once with write access (e.g. RunStore(path)) to upgrade it"
        )
    if readonly and version == 0:
        raise NoRunsYet(
            f"{path} holds no dtwork runs yet (schema version {version}): "
            "run a %%dtrain cell first, or set DTWORK_STORE"
        )


def _run(cur: sqlite3.Cursor, script: str) -> None:
    for statement in script.split(";\n"):
        if statement.strip():
            cur.execute(statement)


def create_or_upgrade(cur: sqlite3.Cursor) -> int:
    """Create or upgrade the schema inside the caller's write transaction; return the version found
    (0: a new store; from 1 to ``ROLLUPS_SINCE`` - 1 the caller builds the rollups of the rows it holds)."""
    # Re-read the version under the write lock: another process may have done it meanwhile.
    found = cur.execute("PRAGMA user_version").fetchone()[0]
    if found == 1:
        _run(cur, _MIGRATE_1_TO_2)
    if found < SCHEMA_VERSION:
        _run(cur, _MIGRATE_3_TO_4)
        _run(cur, _SCHEMA)
        kept = cur.execute("SELECT type FROM sqlite_master WHERE name = 'metrics'").fetchone()
        if kept is not None and kept[0] == "table":  # rows of an older store
            _run(cur, _MIGRATE_6_TO_7)
        _run(cur, _METRICS_VIEW)
        cur.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
    return int(found)


def _json_default(obj: object) -> object:
    item = getattr(obj, "item", None)  # numpy / torch scalars
    if callable(item):
        try:
            return item()
        except (TypeError, ValueError):
            pass
    tolist = getattr(obj, "tolist", None)  # numpy arrays, tensors
    if callable(tolist):
        return tolist()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def dumps(data: object) -> str:
    return json.dumps(data, default=_json_default)


def loads(text: str | None, empty: object = None) -> Any:  # JSON: its shape is the writer's
    if text is None:
        return empty
    return json.loads(text)


NAN_TEXT = "NaN"  # SQLite stores a REAL NaN as NULL: a NaN is kept as this text instead


def float_or_none(value: SupportsFloat | str | None) -> float | str | None:
    """A metric value as SQLite keeps it: a float, ``NAN_TEXT`` for a NaN, None for a missing one."""
    if value is None:
        return None
    value = float(value)
    return NAN_TEXT if math.isnan(value) else value


def stored_float(value: object) -> float | None:
    """A metric value as read back: ``float_or_none`` undone."""
    return math.nan if value == NAN_TEXT else cast("float | None", value)


def int_or_none(value: SupportsInt | str | None) -> int | None:
    return None if value is None else int(value)


def ranges(ids: list[int]) -> str:
    """``[1, 2, 3, 5, 7, 8]`` -> ``"1-3, 5, 7-8"``."""
    parts: list[str] = []
    start = prev = ids[0]
    for i in [*ids[1:], None]:
        if i is not None and i == prev + 1:
            prev = i
            continue
        parts.append(str(start) if start == prev else f"{start}-{prev}")
        if i is not None:
            start = prev = i
    return ", ".join(parts)
