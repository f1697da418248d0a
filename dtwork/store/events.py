"""What a run records besides metrics: events, analysis results, its environment and its segments.

Functions over a :class:`~dtwork.store.db.Database`; :class:`~dtwork.store.runs.RunStore`'s
methods of the same names call them. JSON columns come back decoded as ``data``.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from typing import Any, cast

from dtwork.store.db import Database, SqlValue, next_seq
from dtwork.store.rows import DeliveryRow, EventRow, ResultRow, SegmentRow
from dtwork.store.schema import dumps, int_or_none, loads


def _decode_data(rows: list[dict[str, object]], empty: object = None) -> None:
    """Replace each row's ``data_json`` column by its decoded ``data``."""
    for row in rows:
        row["data"] = loads(cast("str | None", row.pop("data_json")), empty)


def add_event(
    db: Database, run_id: int | None, kind: str, message: str, data: Mapping[str, object] | None
) -> int:
    """Record an event; returns its id."""
    data_json = None if data is None else dumps(dict(data))
    with db.write() as cur:
        cur.execute(
            "INSERT INTO events (run_id, time, kind, message, data_json) VALUES (?, ?, ?, ?, ?)",
            (run_id, time.time(), kind, message, data_json),
        )
        return int(cur.lastrowid or 0)


def events(db: Database, run_id: int | None, kind: str | None = None) -> list[EventRow]:
    """The run's events (``run_id=None``: store-wide events) in order."""
    where = ["run_id IS ?"]
    params: list[SqlValue] = [run_id]
    if kind is not None:
        where.append("kind = ?")
        params.append(kind)
    rows = db.query(
        "SELECT id, run_id, time, kind, message, data_json FROM events "
        f"WHERE {' AND '.join(where)} ORDER BY id",
        params,
    )
    _decode_data(rows)
    return cast("list[EventRow]", rows)


def set_environment(db: Database, run_id: int, data: Mapping[str, object]) -> None:
    """Store (replace) the run's environment snapshot."""
    with db.write() as cur:
        cur.execute(
            "INSERT OR REPLACE INTO environment (run_id, data_json) VALUES (?, ?)",
            (run_id, dumps(dict(data))),
        )


def environment(db: Database, run_id: int) -> dict[str, Any]:
    """The run's environment snapshot, or ``{}`` if none was stored."""
    rows = db.query("SELECT data_json FROM environment WHERE run_id = ?", (run_id,))
    return cast("dict[str, Any]", loads(cast(str, rows[0]["data_json"]), {})) if rows else {}


def add_result(db: Database, run_id: int | None, kind: str, data: object) -> int:
    """Store an analysis result; returns its id."""
    with db.write() as cur:
        cur.execute(
            "INSERT INTO results (run_id, kind, created_at, data_json) VALUES (?, ?, ?, ?)",
            (run_id, kind, time.time(), dumps(data)),
        )
        return int(cur.lastrowid or 0)


def results(db: Database, run_id: int | None = None, kind: str | None = None) -> list[ResultRow]:
    """Analysis results (all runs when ``run_id`` is None) in insertion order."""
    where: list[str] = []
    params: list[SqlValue] = []
    if run_id is not None:
        where.append("run_id = ?")
        params.append(run_id)
    if kind is not None:
        where.append("kind = ?")
        params.append(kind)
    clause = f" WHERE {' AND '.join(where)}" if where else ""
    rows = db.query(
        f"SELECT id, run_id, kind, created_at, data_json FROM results{clause} ORDER BY id", params
    )
    _decode_data(rows)
    return cast("list[ResultRow]", rows)


def add_segment(
    db: Database,
    run_id: int,
    *,
    cell_seq: int | None,
    first_step: int,
    changed: Iterable[str] = (),
    data: Mapping[str, object] | None = None,
) -> int:
    """Record a segment of the run's step axis beginning at ``first_step``; returns its number."""
    with db.write() as cur:
        seq = next_seq(cur, "segments", run_id)
        cur.execute(
            "INSERT INTO segments (run_id, seq, cell_seq, first_step, time, changed, data_json) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)",
            (
                run_id,
                seq,
                int_or_none(cell_seq),
                int(first_step),
                time.time(),
                ",".join(changed),
                dumps(dict(data or {})),
            ),
        )
        return seq


def segments(db: Database, run_id: int) -> list[SegmentRow]:
    """The run's segments in order, ``changed`` split into a list."""
    rows = db.query(
        "SELECT seq, cell_seq, first_step, time, changed, data_json FROM segments "
        "WHERE run_id = ? ORDER BY seq",
        (run_id,),
    )
    for row in rows:
        changed = cast("str | None", row["changed"]) or ""
        row["changed"] = [c for c in changed.split(",") if c]
    _decode_data(rows, {})
    return cast("list[SegmentRow]", rows)


def mark_delivered(
    db: Database, run_id: int, cell_seq: int | None, marks: Iterable[tuple[int, str, int]]
) -> None:
    """Note each (rank, stream, seq) as the last batch of that rank's stream stored (a higher one stays)."""
    with db.write() as cur:
        cur.executemany(
            "INSERT INTO deliveries (rank, stream, run_id, cell_seq, seq) VALUES (?, ?, ?, ?, ?) "
            "ON CONFLICT (rank, stream) DO UPDATE SET seq = MAX(seq, excluded.seq)",
            [(rank, stream, run_id, cell_seq, seq) for rank, stream, seq in marks],
        )


def delivered(db: Database, rank: int, stream: str) -> DeliveryRow | None:
    """The last batch stored of ``rank``'s stream ``stream``: its run, cell and seq; None before any."""
    rows = db.query(
        "SELECT rank, stream, run_id, cell_seq, seq FROM deliveries WHERE rank = ? AND stream = ?",
        (rank, stream),
    )
    return cast(DeliveryRow, rows[0]) if rows else None
