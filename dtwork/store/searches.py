"""Hyperparameter searches in the run store: a search's file, searcher and metric, and its trials.

Functions over a :class:`~dtwork.store.db.Database` (``RunStore.db``). A search is created with every
trial it plans ("not run"); each trial gets its run, status and metric as it ends, and the search its
end and status (running, completed, interrupted, failed). A trial's status is completed, failed,
interrupted, stopped (ended early by its searcher) or "not run". A trial is counted running while its
search runs and a run of the search's cluster, begun since, has not been claimed by a trial yet.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from dtwork.errors import DtworkError
from dtwork.store.db import Database, DbRow
from dtwork.store.rows import SearchRow, TrialRow
from dtwork.store.schema import dumps, float_or_none, loads, ranges, stored_float

__all__ = [
    "SEARCH_STATUSES",
    "TRIAL_STATUSES",
    "NewSearch",
    "best_trial",
    "create",
    "finish",
    "get",
    "interrupt",
    "list_searches",
    "parse_search_id",
    "pieces",
    "reopen",
    "run_ids",
    "set_trial",
    "trials",
]

SEARCH_STATUSES = ("running", "completed", "interrupted", "failed")
TRIAL_STATUSES = ("not run", "completed", "failed", "interrupted", "stopped")


@dataclass(frozen=True)
class NewSearch:
    """What a search is created with: its file and searcher, where it runs, and its planned trials."""

    label: str
    searcher: str
    metric: str | None
    smaller_is_better: bool
    config_yaml: str | None
    code: str
    cluster_id: str | None
    world_size: int | None
    backend: str | None
    hparams: Sequence[Mapping[str, Any]]  # each planned trial's, in trial-number order


# The runs of the search's cluster begun since it started that no trial holds yet: its trials running.
_RUNNING = """CASE WHEN s.status = 'running' THEN (
    SELECT COUNT(*) FROM runs r WHERE r.status = 'running' AND r.cluster_id IS s.cluster_id
    AND r.created_at >= s.started_at
    AND r.id NOT IN (SELECT t.run_id FROM trials t WHERE t.search_id = s.id AND t.run_id IS NOT NULL)
) ELSE 0 END"""
_SELECT = f"""SELECT s.id, s.label, s.searcher, s.metric, s.smaller_is_better, s.config_yaml, s.code,
    s.cluster_id, s.world_size, s.backend, s.started_at, s.ended_at, s.status,
    (SELECT COUNT(*) FROM trials t WHERE t.search_id = s.id) AS trials,
    {_RUNNING} AS running,
    (SELECT COUNT(*) FROM trials t WHERE t.search_id = s.id AND t.status = 'completed') AS done,
    (SELECT COUNT(*) FROM trials t WHERE t.search_id = s.id AND t.status = 'stopped') AS stopped,
    (SELECT COUNT(*) FROM trials t WHERE t.search_id = s.id AND t.status = 'failed') AS failed
    FROM searches s"""


def parse_search_id(search_id: object) -> int:
    """A search id given as an int or as decimal text; a DtworkError for anything else."""
    text = str(search_id).strip() if isinstance(search_id, (int, str)) else ""
    if isinstance(search_id, bool) or not (text.isascii() and text.isdigit() and len(text) <= 18):
        raise DtworkError(
            f"search id must be a whole number, got {search_id!r}: dtwork runs searches lists them"
        )
    return int(text)


def create(db: Database, new: NewSearch) -> int:
    """Insert a running search and its planned trials ("not run"); returns its id."""
    with db.write() as cur:
        cur.execute(
            "INSERT INTO searches (label, searcher, metric, smaller_is_better, config_yaml, code, cluster_id, "
            "world_size, backend, started_at, status) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, 'running')",
            (
                new.label,
                new.searcher,
                new.metric,
                int(new.smaller_is_better),
                new.config_yaml,
                new.code,
                new.cluster_id,
                new.world_size,
                new.backend,
                time.time(),
            ),
        )
        sid = int(cur.lastrowid or 0)
        cur.executemany(
            "INSERT INTO trials (search_id, number, hparams_json, status) VALUES (?, ?, ?, 'not run')",
            [(sid, i + 1, dumps(dict(hp))) for i, hp in enumerate(new.hparams)],
        )
    return sid


def set_trial(
    db: Database,
    search_id: int,
    number: int,
    *,
    run_id: int | None,
    status: str,
    metric: float | None = None,
    error: str | None = None,
) -> None:
    """Record how trial ``number`` of the search ended: its run, status, metric and error."""
    if status not in TRIAL_STATUSES:
        raise DtworkError(f"trial status must be one of {', '.join(TRIAL_STATUSES)}, got {status!r}")
    with db.write() as cur:
        cur.execute(
            "UPDATE trials SET run_id = ?, status = ?, metric = ?, error = ? WHERE search_id = ? AND number = ?",
            (run_id, status, float_or_none(metric), error, search_id, number),
        )
        if cur.rowcount == 0:
            raise DtworkError(f"search {search_id} has no trial {number}")


def finish(db: Database, search_id: int, status: str) -> None:
    """Stamp the search's end and its status (completed, interrupted or failed)."""
    if status not in SEARCH_STATUSES:
        raise DtworkError(f"search status must be one of {', '.join(SEARCH_STATUSES)}, got {status!r}")
    with db.write() as cur:
        cur.execute(
            "UPDATE searches SET status = ?, ended_at = ? WHERE id = ?", (status, time.time(), search_id)
        )


def reopen(db: Database, search_id: int, cluster_id: str | None, world_size: int, backend: str) -> None:
    """A resumed search runs again, on ``cluster_id`` now (its start is kept: its trials' runs began
    since)."""
    with db.write() as cur:
        cur.execute(
            "UPDATE searches SET status = 'running', ended_at = NULL, cluster_id = ?, world_size = ?, "
            "backend = ? WHERE id = ?",
            (cluster_id, world_size, backend, search_id),
        )


def pieces(db: Database, search_id: int) -> list[dict[str, Any]]:
    """Every piece of the search's trials that began a run, in the order they ended: the run, its trial,
    when it began and ended (its "search" event, written as it ended) and the run's status."""
    rows = db.query(
        "SELECT e.run_id, e.time, e.data_json, r.created_at, r.status FROM events e "
        "JOIN runs r ON r.id = e.run_id WHERE e.kind = 'search' ORDER BY e.id"
    )
    out = []
    for row in rows:
        data = loads(cast("str | None", row["data_json"]), {})
        if data.get("search_id") == search_id and isinstance(data.get("trial"), int):
            out.append(
                {
                    "run_id": row["run_id"],
                    "trial": data["trial"],
                    "began": row["created_at"],
                    "ended": row["time"],
                    "run_status": row["status"],
                }
            )
    return out


def interrupt(db: Database, cluster_id: str) -> int:
    """Mark the searches a dead kernel left running on ``cluster_id`` as interrupted; how many."""
    with db.write() as cur:
        cur.execute(
            "UPDATE searches SET status = 'interrupted', ended_at = ? WHERE status = 'running' AND cluster_id = ?",
            (time.time(), cluster_id),
        )
        return int(cur.rowcount)


def _decoded(db: Database, rows: list[DbRow]) -> list[SearchRow]:
    for row in rows:
        row["smaller_is_better"] = bool(row["smaller_is_better"])
        best = best_trial(trials(db, cast(int, row["id"])), bool(row["smaller_is_better"]))
        row["best"] = None if best is None else best["metric"]
    return cast("list[SearchRow]", rows)


def list_searches(db: Database) -> list[SearchRow]:
    """Every search, newest first, with its trials' tally and best metric so far."""
    return _decoded(db, db.query(_SELECT + " ORDER BY s.id DESC"))


def get(db: Database, search_id: object) -> SearchRow:
    """One search with its tally; a DtworkError naming the searches the store holds when unknown."""
    sid = parse_search_id(search_id)
    rows = _decoded(db, db.query(_SELECT + " WHERE s.id = ?", (sid,)))
    if rows:
        return rows[0]
    ids = [cast(int, r["id"]) for r in db.query("SELECT id FROM searches ORDER BY id")]
    known = (
        f"known searches: {ranges(ids)}" if ids else "the store holds no searches (%%dtrain search runs one)"
    )
    raise DtworkError(f"no search {sid} in {db.path}; {known}")


def trials(db: Database, search_id: int) -> list[TrialRow]:
    """The search's trials in trial-number order; ``hparams`` decoded."""
    rows = db.query(
        "SELECT search_id, number, run_id, hparams_json, status, metric, error FROM trials "
        "WHERE search_id = ? ORDER BY number",
        (search_id,),
    )
    for row in rows:
        row["hparams"] = loads(cast(str, row.pop("hparams_json")), {})
        row["metric"] = stored_float(row["metric"])
    return cast("list[TrialRow]", rows)


def best_trial(rows: Sequence[TrialRow], smaller_is_better: bool) -> TrialRow | None:
    """The trial with the best finite metric (the first of equals), None before any has one."""
    scored = [t for t in rows if t["metric"] is not None and math.isfinite(t["metric"])]
    if not scored:
        return None
    sign = 1.0 if smaller_is_better else -1.0
    return min(scored, key=lambda t: (sign * cast(float, t["metric"]), t["number"]))


def run_ids(db: Database, search: SearchRow) -> list[int]:
    """The runs of the search's trials: those its trials hold, in trial order, then (while it runs) the
    runs of its cluster begun since it started that no trial holds yet, its trials running now."""
    held = [t["run_id"] for t in trials(db, search["id"]) if t["run_id"] is not None]
    if search["status"] != "running":
        return held
    rows = db.query(
        "SELECT id FROM runs WHERE status = 'running' AND cluster_id IS ? AND created_at >= ? ORDER BY id",
        (search["cluster_id"], search["started_at"]),
    )
    return held + [cast(int, r["id"]) for r in rows if r["id"] not in held]
