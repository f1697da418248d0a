"""The ``metrics`` table: writing metric records and reading them back by run, name, rank and cell.

Functions over a :class:`~dtwork.store.db.Database`; :class:`~dtwork.store.runs.RunStore`'s
metric methods call them. Non-finite values round-trip as the run store's docstring says.
"""

from __future__ import annotations

import math
import sqlite3
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, cast

from dtwork.errors import DtworkError
from dtwork.store import rollups
from dtwork.store.db import Database, SqlValue
from dtwork.store.rows import MetricRow
from dtwork.store.schema import AGGREGATED_RANK, NO_CELL, float_or_none, int_or_none, stored_float

if TYPE_CHECKING:
    import pandas

RankSelector = Literal["aggregated", "all"] | int
COLUMNS = ("run_id", "cell_seq", "kind", "step", "rank", "name", "value", "time")


def add(db: Database, run_id: int, records: Iterable[Mapping[str, Any]]) -> int:
    """Insert metric rows in one transaction (see ``RunStore.add_metrics``); returns how many.

    ``records`` are JSON from the ranks' messages: their fields are checked here."""
    now = time.time()
    rows: list[tuple[SqlValue, ...]] = []
    for rec in records:
        try:
            step, name, value = rec["step"], rec["name"], rec["value"]
            stamp = rec.get("time")
            rows.append(
                (
                    run_id,
                    int_or_none(rec.get("cell_seq")),
                    str(rec.get("kind") or "log"),
                    int(step),
                    int_or_none(rec.get("rank")),
                    str(name),
                    float_or_none(value),
                    now if stamp is None else float(stamp),
                )
            )
        except KeyError as exc:
            raise DtworkError(f"metric record needs keys step, name and value; got {sorted(rec)}") from exc
        except (TypeError, ValueError) as exc:
            raise DtworkError(f"metric record {dict(rec)!r} has a non-numeric field: {exc}") from exc
    if rows:
        with db.write() as cur:
            insert(db, cur, rows)  # type: ignore[arg-type]  # the tuples built above
            rollups.fold(cur, run_id, rows)  # type: ignore[arg-type]
    return len(rows)


KEYS_HELD = 65_536  # the interned keys a connection remembers (a day of 256 ranks' cells is far less)


def insert(db: Database, cur: sqlite3.Cursor, rows: Sequence[rollups.InsertedRow]) -> None:
    """Insert metric rows as ``points`` of their series' interned keys, numbered in the order written,
    inside the caller's write transaction (their series and rollups are the caller's to fold)."""
    keys = db.metric_keys
    if len(keys) > KEYS_HELD:
        keys.clear()
    (end,) = cur.execute(
        "UPDATE counters SET value = value + ? WHERE name = 'points' RETURNING value", (len(rows),)
    ).fetchall()[0]
    seq = int(end) - len(rows)
    points: list[tuple[SqlValue, ...]] = []
    for run_id, cell_seq, kind, step, rank, name, value, stamp in rows:
        key = (
            run_id,
            name,
            AGGREGATED_RANK if rank is None else rank,
            kind,
            NO_CELL if cell_seq is None else cell_seq,
        )
        kid = keys.get(key)
        if kid is None:
            cur.execute(
                "INSERT OR IGNORE INTO metric_keys (run_id, name, rank, kind, cell_seq) VALUES (?, ?, ?, ?, ?)",
                key,
            )
            kid = keys[key] = int(
                cur.execute(
                    "SELECT id FROM metric_keys WHERE run_id = ? AND name = ? AND rank = ? AND kind = ? "
                    "AND cell_seq = ?",
                    key,
                ).fetchone()[0]
            )
        seq += 1
        points.append((kid, step, seq, value, stamp))
    cur.executemany("INSERT INTO points (key, step, seq, value, time) VALUES (?, ?, ?, ?, ?)", points)


def select(
    db: Database,
    run_id: int,
    name: str | None = None,
    *,
    rank: RankSelector = "aggregated",
    cell: int | None = None,
) -> list[MetricRow]:
    """Metric records ordered by step (see ``RunStore.metrics``)."""
    # On the key table's columns (its sentinels, not the view's NULLs), so that its index is used.
    where = ["k.run_id = ?"]
    params: list[SqlValue] = [run_id]
    if cell is not None:
        where.append("k.cell_seq = ?")
        params.append(int(cell))
    if name is not None:
        where.append("k.name = ?")
        params.append(name)
    if rank == "aggregated":
        where.append("k.rank = ?")
        params.append(AGGREGATED_RANK)
    elif rank == "all":
        pass
    elif isinstance(rank, int) and not isinstance(rank, bool):
        where.append("k.rank = ?")
        params.append(rank)
    else:
        raise DtworkError(f"rank must be 'aggregated', 'all' or a rank number, got {rank!r}")
    rows = db.query(
        f"SELECT k.run_id AS run_id, NULLIF(k.cell_seq, {NO_CELL}) AS cell_seq, k.kind AS kind, "
        f"p.step AS step, NULLIF(k.rank, {AGGREGATED_RANK}) AS rank, k.name AS name, p.value AS value, "
        f"p.time AS time FROM metric_keys k JOIN points p ON p.key = k.id WHERE {' AND '.join(where)} "
        f"ORDER BY p.step, k.rank != {AGGREGATED_RANK}, k.rank, p.seq",
        params,
    )
    for row in rows:
        row["value"] = stored_float(row["value"])
    return cast("list[MetricRow]", rows)


def frame(rows: list[MetricRow]) -> pandas.DataFrame:
    """Metric rows as a pandas DataFrame (pandas is optional)."""
    try:
        import pandas as pd
    except ImportError:
        raise DtworkError(
            "pandas is not installed: pip install pandas, or use store.metrics(...) for records"
        ) from None
    return pd.DataFrame(rows, columns=list(COLUMNS))


def names(db: Database, run_id: int) -> list[str]:
    """The names the run logged, sorted."""
    rows = db.query("SELECT DISTINCT name FROM series WHERE run_id = ? ORDER BY name", (run_id,))
    return [str(row["name"]) for row in rows]


def last_values(db: Database, run_id: int) -> dict[str, float]:
    """The latest (highest step, last written) aggregated value of each metric; NULL -> nan."""
    rows = db.query(
        "SELECT name, last_value FROM series WHERE run_id = ? AND rank = ? ORDER BY name",
        (run_id, AGGREGATED_RANK),
    )
    values = {str(row["name"]): stored_float(row["last_value"]) for row in rows}
    return {name: math.nan if value is None else value for name, value in values.items()}
