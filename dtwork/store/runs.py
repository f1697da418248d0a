"""The run store: one SQLite file holding every run, cell, metric, event and analysis result.

The notebook kernel's collector thread writes records as they arrive; the notebook's main
thread, the Jupyter server extension (read-only) and the report exporter read them.

* Location: ``$DTWORK_STORE`` if set, else ``./.dtwork/runs.sqlite`` (see
  :func:`default_store_path`), or an explicit path.
* Durability: WAL journal (a rollback journal on a network filesystem: see
  :mod:`dtwork.store.mounts`), ``synchronous=NORMAL``; every writing method commits before it
  returns, so a killed process loses nothing already written (only a power loss can drop
  the last few transactions).
* Threads: one connection opened with ``check_same_thread=False``; every statement runs
  under an internal lock, so a collector thread and the main thread can share one store.
  Other processes open their own ``RunStore`` (the busy timeout is 5 s).
* Non-finite metric values round-trip: SQLite would store a REAL NaN as NULL, so a NaN is
  kept as the text ``NaN`` and read back as ``nan``; ``+inf``/``-inf`` are REAL infinities;
  a missing value (``None``) is NULL and read back as ``None``. :meth:`RunStore.last_metrics`
  reports a NULL last value as ``nan``. JSON columns keep NaN/Infinity as Python's
  ``json`` writes them.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, cast

from dtwork.errors import DtworkError
from dtwork.shared.records import FOLLOWS
from dtwork.store import events as event_rows
from dtwork.store import lineage, views
from dtwork.store import metrics as metric_rows
from dtwork.store.db import (
    STORE_ERRORS,
    Database,
    SqlValue,
    default_store_path,
    next_seq,
    parse_run_id,
    store_path,
    store_problem,
)
from dtwork.store.metrics import RankSelector
from dtwork.store.rows import CellRow, DeliveryRow, EventRow, MetricRow, ResultRow, RunRow, SegmentRow
from dtwork.store.schema import SCHEMA_VERSION, dumps, int_or_none, loads

if TYPE_CHECKING:
    import pandas

__all__ = [
    "RUN_STATUSES",
    "SCHEMA_VERSION",
    "STORE_ERRORS",
    "RankSelector",
    "RunStore",
    "default_store_path",
    "store_path",
    "store_problem",
]

_NEXT_ID = "SELECT seq FROM sqlite_sequence WHERE name = 'runs'"  # AUTOINCREMENT keeps the last id there
RUN_STATUSES = ("running", "completed", "failed", "interrupted", "stopped")

_RUN_COLUMNS = (
    "id, name, status, created_at, ended_at, world_size, backend, cluster_id, notebook, "
    "config_yaml, global_batch_size, per_slot_batch_size"
)
_RUN_SELECT = (
    f"SELECT {_RUN_COLUMNS}, "
    "(SELECT COUNT(*) FROM cells c WHERE c.run_id = runs.id) AS n_cells, "
    "(SELECT MAX(last_step) FROM series s WHERE s.run_id = runs.id) AS last_step FROM runs"
)
_KEYED_TABLES = ("series", "rollups", "deliveries")  # WITHOUT ROWID: their primary key orders them
# A run's rows, table by table, as copy_run carries them (events and results get new ids).
_RUN_TABLES = (
    "runs",
    "cells",
    "metrics",
    "series",
    "rollups",
    "events",
    "environment",
    "results",
    "segments",
    "deliveries",
)


class RunStore:
    """The SQLite run store; see the module docstring for location, durability and threads.

    Runs and cells are read and written here; metrics (:mod:`dtwork.store.metrics`) and events,
    results, environments and segments (:mod:`dtwork.store.events`) by functions over ``db``.
    """

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, readonly: bool = False, busy_seconds: float = 5.0
    ) -> None:
        at = Path(path).expanduser().absolute() if path is not None else default_store_path()
        self._db = Database(at, readonly=readonly, busy_seconds=busy_seconds)

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def db(self) -> Database:
        """The connection every read and write runs over."""
        return self._db

    @property
    def path(self) -> Path:
        """The absolute path of the SQLite file."""
        return self._db.path

    @property
    def readonly(self) -> bool:
        return self._db.readonly

    def vanished(self) -> bool:
        """Whether the file this store has open is no longer at its path (deleted, its folder
        moved or replaced): writes would go to a file nobody can find."""
        return self._db.vanished()

    def close(self) -> None:
        """Close the connection; later calls raise DtworkError. Closing twice is harmless."""
        self._db.close()

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "readonly" if self.readonly else "writable"
        return f"RunStore({str(self.path)!r}, {mode})"

    def copy_run(self, run_id: int | str, into: RunStore) -> dict[str, int]:
        """Write the run's rows from this store into ``into``, keeping its id, in one transaction
        (this store may be a deleted file still open); returns the rows copied per table (the derived
        series and rollups go too, uncounted)."""
        rid = parse_run_id(run_id)
        tables: dict[str, list[dict[str, object]]] = {}
        for table in _RUN_TABLES:
            key = "id" if table == "runs" else "run_id"
            order = (
                "" if table in _KEYED_TABLES else " ORDER BY seq" if table == "metrics" else " ORDER BY rowid"
            )
            rows = self._db.query(f"SELECT * FROM {table} WHERE {key} = ?{order}", (rid,))
            tables[table] = [
                {k: v for k, v in r.items() if not (k == "id" and table != "runs")} for r in rows
            ]
        if not tables["runs"]:
            raise self._db.unknown_run(rid)
        with into.db.write() as cur:
            if cur.execute("SELECT 1 FROM runs WHERE id = ?", (rid,)).fetchone() is not None:
                raise DtworkError(f"{into.path} already holds a run {rid}: not copying run {rid} into it")
            # the view's rows, in its columns: the tuples metric_rows.add inserts
            copied = [tuple(r[c] for c in metric_rows.COLUMNS) for r in tables["metrics"]]
            metric_rows.insert(into.db, cur, copied)  # type: ignore[arg-type]
            for table, rows in tables.items():
                for row in rows if table != "metrics" else ():
                    cols = ", ".join(row)
                    marks = ", ".join("?" * len(row))
                    cur.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", tuple(row.values()))
        return {table: len(rows) for table, rows in tables.items() if table not in _KEYED_TABLES}

    def _update_run(self, run_id: int | str, sql: str, params: tuple[SqlValue, ...]) -> None:
        rid = parse_run_id(run_id)
        with self._db.write() as cur:
            cur.execute(sql, (*params, rid))
            changed = cur.rowcount
        if changed == 0:
            raise self._db.unknown_run(rid)

    # -- runs and cells ---------------------------------------------------------------------

    def create_run(
        self,
        *,
        name: str | None = None,
        world_size: int,
        backend: str,
        cluster_id: str | None = None,
        notebook: str | None = None,
        config_yaml: str | None = None,
        global_batch_size: int | None = None,
        per_slot_batch_size: int | None = None,
        wanted_id: int | None = None,
    ) -> int:
        """Insert a run with status ``running``; returns its id: ``wanted_id`` when that is still the
        next one (the ranks were told it ahead), else the next."""
        with self._db.write() as cur:
            free = wanted_id is not None and wanted_id == self._next_id(cur)
            cur.execute(
                "INSERT INTO runs (id, name, status, created_at, world_size, backend, cluster_id, notebook, "
                "config_yaml, global_batch_size, per_slot_batch_size) "
                "VALUES (?, ?, 'running', ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    wanted_id if free else None,
                    name,
                    time.time(),
                    int(world_size),
                    backend,
                    cluster_id,
                    notebook,
                    config_yaml,
                    int_or_none(global_batch_size),
                    int_or_none(per_slot_batch_size),
                ),
            )
            return int(cur.lastrowid or 0)

    def set_run_name(self, run_id: int | str, name: str | None) -> None:
        """Name the run (``%%dtrain --name``, ``Cluster.name_run``); None takes the name away."""
        self._update_run(run_id, "UPDATE runs SET name = ? WHERE id = ?", (name,))

    def set_run_status(self, run_id: int | str, status: str, *, ended: bool = False) -> None:
        """Set the run's status (one of RUN_STATUSES); ``ended=True`` also stamps ended_at."""
        if status not in RUN_STATUSES:
            raise DtworkError(f"run status must be one of {', '.join(RUN_STATUSES)}, got {status!r}")
        if ended:
            self._update_run(
                run_id, "UPDATE runs SET status = ?, ended_at = ? WHERE id = ?", (status, time.time())
            )
        else:
            self._update_run(run_id, "UPDATE runs SET status = ? WHERE id = ?", (status,))

    def add_cell(self, run_id: int | str, source: str, *, ranks: Iterable[int] | None = None) -> int:
        """Record a cell started now with status ``running``; returns its seq (1, 2, ... per run)."""
        rid = parse_run_id(run_id)
        ranks_json = None if ranks is None else dumps([int(r) for r in ranks])
        seq: int | None = None
        with self._db.write() as cur:
            if cur.execute("SELECT 1 FROM runs WHERE id = ?", (rid,)).fetchone() is not None:
                seq = next_seq(cur, "cells", rid)
                cur.execute(
                    "INSERT INTO cells (run_id, seq, source, started_at, status, ranks_json) "
                    "VALUES (?, ?, ?, ?, 'running', ?)",
                    (rid, seq, source, time.time(), ranks_json),
                )
        if seq is None:
            raise self._db.unknown_run(rid)
        return seq

    def finish_cell(self, run_id: int | str, seq: int, status: str, error: str | None = None) -> None:
        """Stamp a cell's end time, final status (e.g. completed/failed/interrupted) and error."""
        rid = parse_run_id(run_id)
        with self._db.write() as cur:
            cur.execute(
                "UPDATE cells SET status = ?, error = ?, ended_at = ? WHERE run_id = ? AND seq = ?",
                (status, error, time.time(), rid, int(seq)),
            )
            changed = cur.rowcount
        if changed == 0:
            raise DtworkError(f"run {rid} has no cell {seq} in {self.path}")

    def move_cell(self, run_id: int | str, seq: int, into: int | str) -> int:
        """Give the cell ``seq`` of ``run_id`` to run ``into`` as its newest cell (a cell whose
        training began a new run); it stays in ``run_id`` too when rows were already stored under
        it there. Returns its seq in ``into``."""
        rid, new = parse_run_id(run_id), parse_run_id(into)
        with self._db.write() as cur:
            row = cur.execute(
                "SELECT source, started_at, ranks_json FROM cells WHERE run_id = ? AND seq = ?", (rid, seq)
            ).fetchone()
            if row is None:
                raise DtworkError(f"run {rid} has no cell {seq}")
            to = next_seq(cur, "cells", new)
            cur.execute(
                "INSERT INTO cells (run_id, seq, source, started_at, status, ranks_json) "
                "VALUES (?, ?, ?, ?, 'running', ?)",
                (new, to, row["source"], row["started_at"], row["ranks_json"]),
            )
            used = cur.execute(
                "SELECT 1 FROM metrics WHERE run_id = ? AND cell_seq = ? LIMIT 1", (rid, seq)
            ).fetchone()
            if used is None:
                cur.execute("DELETE FROM cells WHERE run_id = ? AND seq = ?", (rid, seq))
            else:
                cur.execute(
                    "UPDATE cells SET status = 'ok', ended_at = ? WHERE run_id = ? AND seq = ?",
                    (time.time(), rid, seq),
                )
            return to

    def list_runs(self) -> list[RunRow]:
        """All runs, newest first, as :meth:`get_run` gives each."""
        return cast("list[RunRow]", self._db.query(_RUN_SELECT + " ORDER BY id DESC"))

    def get_run(self, run_id: int | str) -> RunRow:
        """One run: its columns, ``n_cells`` and ``last_step``."""
        rid = parse_run_id(run_id)
        rows = self._db.query(_RUN_SELECT + " WHERE id = ?", (rid,))
        if not rows:
            raise self._db.unknown_run(rid)
        return cast(RunRow, rows[0])

    def find_run(self, run_id: int) -> RunRow | None:
        """One run, or None when this store has no such run."""
        rows = self._db.query(_RUN_SELECT + " WHERE id = ?", (run_id,))
        return cast(RunRow, rows[0]) if rows else None

    def next_run_id(self) -> int:
        """The id the next ``create_run`` gives (ids are never reused, even after a delete)."""
        rows = self._db.query(_NEXT_ID)
        return int(cast(int, rows[0]["seq"])) + 1 if rows else 1

    @staticmethod
    def _next_id(cur: sqlite3.Cursor) -> int:
        row = cur.execute(_NEXT_ID).fetchone()
        return int(row[0]) + 1 if row else 1

    def latest_run_id(self) -> int | None:
        rows = self._db.query("SELECT MAX(id) AS id FROM runs")
        return cast("int | None", rows[0]["id"])

    def cells(self, run_id: int | str) -> list[CellRow]:
        """The run's cells in seq order; ``ranks`` decoded from JSON."""
        rows = self._db.query(
            "SELECT run_id, seq, source, started_at, ended_at, status, error, ranks_json "
            "FROM cells WHERE run_id = ? ORDER BY seq",
            (parse_run_id(run_id),),
        )
        for row in rows:
            row["ranks"] = loads(cast("str | None", row.pop("ranks_json")))
        return cast("list[CellRow]", rows)

    def history(self, run_id: int | str) -> list[CellRow]:
        """The earlier cells a re-run of the run needs before its own, in the order they ran: of the
        cells its cluster ran before the run (those of the runs its model follows from, when the
        cluster is not recorded), the ones that ended well and bind or set up a name the run's
        cells read (``lineage.needed``): the cell that defined the model and the data, not
        another run's training unless the run reads what it bound."""
        rid = parse_run_id(run_id)
        runs: set[int] = set()
        at = rid
        while True:  # the runs its model follows from (a new ctx.wrap mid-notebook)
            first = self.segments(at)[:1]
            link = first[0]["data"].get(FOLLOWS) if first else None
            if not isinstance(link, dict) or not isinstance(link.get("run"), int) or link["run"] >= at:
                break  # earlier runs only: a damaged link cannot loop
            at = link["run"]
            runs.add(at)
        cluster = self.get_run(rid)["cluster_id"]
        query = "SELECT id FROM runs WHERE cluster_id = ? AND id < ?"
        runs |= {int(cast(int, r["id"])) for r in self._db.query(query, (cluster, rid))}
        earlier: list[tuple[CellRow, bool]] = []
        for run in runs:
            trained = {int(s["cell_seq"]) for s in self.segments(run) if s["cell_seq"] is not None}
            earlier += [
                (c, c["seq"] in trained or (c["source"] or "").lstrip().startswith("%run "))
                for c in self.cells(run)
                if c["status"] in ("ok", None)  # a failed cell set nothing up (and would fail again)
            ]
        earlier.sort(key=lambda e: (e[0]["started_at"] or 0.0, e[0]["run_id"], e[0]["seq"]))
        own = [c["source"] or "" for c in self.cells(rid)]
        keep = lineage.needed(own, [(c["source"] or "", trained) for c, trained in earlier])
        return [earlier[i][0] for i in keep]

    # -- metrics (dtwork.store.metrics) ------------------------------------------------------

    def add_metrics(self, run_id: int | str, records: Iterable[Mapping[str, Any]]) -> int:
        """Insert metric rows (keys step, name, value; optional kind, rank, time, cell_seq).

        ``rank`` None (or absent) means aggregated over ranks; ``kind`` defaults to "log" (a
        user metric). NaN and infinite values are kept (see the module docstring).
        All records go in one transaction; returns how many were written.
        """
        return metric_rows.add(self._db, parse_run_id(run_id), records)

    def metrics(
        self,
        run_id: int | str,
        name: str | None = None,
        *,
        rank: RankSelector = "aggregated",
        cell: int | None = None,
    ) -> list[MetricRow]:
        """Metric records ordered by step (then rank, aggregated first, then insertion).

        ``rank="aggregated"`` gives the records without a rank, ``"all"`` every record, an
        int that rank's records; ``cell`` keeps those of the run's cell with that seq. ``value`` is
        None for a missing value, NaN and infinities as stored.
        """
        return metric_rows.select(self._db, parse_run_id(run_id), name, rank=rank, cell=cell)

    def metrics_frame(
        self, run_id: int | str, name: str | None = None, *, rank: RankSelector = "aggregated"
    ) -> pandas.DataFrame:
        """:meth:`metrics` as a pandas DataFrame (pandas is optional)."""
        return metric_rows.frame(self.metrics(run_id, name, rank=rank))

    def metric_names(self, run_id: int | str) -> list[str]:
        return metric_rows.names(self._db, parse_run_id(run_id))

    def last_metrics(self, run_id: int | str) -> dict[str, float]:
        """The latest (highest step, last written) aggregated value of each metric; NULL -> nan."""
        return metric_rows.last_values(self._db, parse_run_id(run_id))

    # -- reads that cost what they show (dtwork.store.views) ---------------------------------

    def series(self, run_id: int | str) -> list[views.SeriesSummary]:
        """Each series (name and rank) of the run: count, first and last step, last value, least
        and greatest value; a few rows however long the run."""
        return views.summaries(self._db, parse_run_id(run_id))

    def rank_last_values(self, run_id: int | str, name: str) -> list[float | None]:
        """Each rank's last value of ``name`` (the ranks' series only): a read of as many rows as ranks."""
        return views.rank_last_values(self._db, parse_run_id(run_id), name)

    def metric_points(
        self, run_id: int | str, name: str, *, rank: int | None = None, most: int = views.FIGURE_BUCKETS
    ) -> tuple[int, list[tuple[int, float | None, float | None]]]:
        """``(rows, [(step, value, time), ...])`` of one series: every row while they are few,
        else about ``most`` bucket means (``rank`` None: the aggregated series)."""
        return views.points(self._db, parse_run_id(run_id), name, rank, most)

    def last_step(self, run_id: int | str, *, cell: int | None = None) -> int | None:
        """The highest step the run (or its cell ``cell``) logged, None before any."""
        return views.last_step(self._db, parse_run_id(run_id), cell)

    def figure_rows(
        self, run_id: int | str, *, cell: int | None = None, rank: Literal["aggregated", "all"] = "all"
    ) -> list[MetricRow]:
        """The rows a figure of the run (or its cell ``cell``) draws: :meth:`metrics` while the
        run is short, else each rollup bucket's min and max (at most a screen's width per series)."""
        return views.figure_rows(self._db, parse_run_id(run_id), cell=cell, rank=rank)

    # -- events, results, environment, segments (dtwork.store.events) -----------------------

    def add_event(
        self, run_id: int | str | None, kind: str, message: str, data: Mapping[str, object] | None = None
    ) -> int:
        """Record an event (``run_id`` may be None for store-wide events); returns its id."""
        rid = None if run_id is None else parse_run_id(run_id)
        return event_rows.add_event(self._db, rid, kind, message, data)

    def events(self, run_id: int | str | None, kind: str | None = None) -> list[EventRow]:
        """The run's events (``run_id=None``: store-wide events) in order; ``data`` decoded."""
        return event_rows.events(self._db, None if run_id is None else parse_run_id(run_id), kind)

    def set_environment(self, run_id: int | str, data: Mapping[str, object]) -> None:
        """Store (replace) the run's environment snapshot."""
        event_rows.set_environment(self._db, parse_run_id(run_id), data)

    def environment(self, run_id: int | str) -> dict[str, Any]:
        """The run's environment snapshot, or ``{}`` if none was stored."""
        return event_rows.environment(self._db, parse_run_id(run_id))

    def add_result(self, run_id: int | str | None, kind: str, data: object) -> int:
        """Store an analysis result (e.g. scaling sweep, throughput check); returns its id."""
        rid = None if run_id is None else parse_run_id(run_id)
        return event_rows.add_result(self._db, rid, kind, data)

    def results(self, run_id: int | str | None = None, kind: str | None = None) -> list[ResultRow]:
        """Analysis results (all runs when ``run_id`` is None) in insertion order; ``data`` decoded."""
        return event_rows.results(self._db, None if run_id is None else parse_run_id(run_id), kind)

    def add_segment(
        self,
        run_id: int | str,
        *,
        cell_seq: int | None,
        first_step: int,
        changed: Iterable[str] = (),
        data: Mapping[str, object] | None = None,
    ) -> int:
        """Record that a training loop began a segment of the run's one step axis at ``first_step``
        (``changed``: what differs from the run's previous segment); returns its number."""
        return event_rows.add_segment(
            self._db,
            parse_run_id(run_id),
            cell_seq=cell_seq,
            first_step=first_step,
            changed=changed,
            data=data,
        )

    def segments(self, run_id: int | str) -> list[SegmentRow]:
        """The run's segments in order: ``seq``, ``cell_seq``, ``first_step``, ``time``, ``changed``
        (a list of what differs from the previous segment: "lr", "batch", "code", ...), ``data``."""
        return event_rows.segments(self._db, parse_run_id(run_id))

    def mark_delivered(
        self, run_id: int | str, cell_seq: int | None, marks: Iterable[tuple[int, str, int]]
    ) -> None:
        """Note batches (rank, stream, seq) as stored; inside ``db.write()``, with their rows."""
        event_rows.mark_delivered(self._db, parse_run_id(run_id), cell_seq, marks)

    def delivered(self, rank: int, stream: str) -> DeliveryRow | None:
        """The last batch stored of ``rank``'s stream (``records.Mark``), None before any."""
        return event_rows.delivered(self._db, rank, stream)
