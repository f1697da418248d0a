"""The ``metrics`` table: writing metric records and reading them back by run, name, rank and cell.

Functions over a :class:`~dtwork.store.db.Database`; :class:`~dtwork.store.runs.RunStore`'s
metric methods call them. Non-finite values round-trip as the run store's docstring says.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING, Any, Literal, cast

from dtwork.errors import DtworkError
from dtwork.store import rollups
from dtwork.store.db import Database, SqlValue
from dtwork.store.rows import MetricRow
from dtwork.store.schema import float_or_none, int_or_none, stored_float

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
            cur.executemany(
                "INSERT INTO metrics (run_id, cell_seq, kind, step, rank, name, value, time) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                rows,
            )
            rollups.fold(cur, run_id, rows)  # type: ignore[arg-type]  # the tuples built above
    return len(rows)


def select(
    db: Database,
    run_id: int,
    name: str | None = None,
    *,
    rank: RankSelector = "aggregated",
    cell: int | None = None,
) -> list[MetricRow]:
    """Metric records ordered by step (see ``RunStore.metrics``)."""
    where = ["run_id = ?"]
    params: list[SqlValue] = [run_id]
    if cell is not None:
        where.append("cell_seq = ?")
        params.append(int(cell))
    if name is not None:
        where.append("name = ?")
        params.append(name)
    if rank == "aggregated":
        where.append("rank IS NULL")
    elif rank == "all":
        pass
    elif isinstance(rank, int) and not isinstance(rank, bool):
        where.append("rank = ?")
        params.append(rank)
    else:
        raise DtworkError(f"rank must be 'aggregated', 'all' or a rank number, got {rank!r}")
    rows = db.query(
        f"SELECT {', '.join(COLUMNS)} FROM metrics WHERE {' AND '.join(where)} "
        "ORDER BY step, rank IS NOT NULL, rank, rowid",
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
        (run_id, rollups.AGGREGATED_RANK),
    )
    values = {str(row["name"]): stored_float(row["last_value"]) for row in rows}
    return {name: math.nan if value is None else value for name, value in values.items()}
