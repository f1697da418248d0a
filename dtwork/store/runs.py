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

import errno
import math
import os
import sqlite3
import threading
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Literal

from dtwork.errors import DtworkError
from dtwork.shared.records import FOLLOWS
from dtwork.store.schema import (
    SCHEMA_VERSION,
    check_version,
    create_or_upgrade,
)
from dtwork.store.schema import (
    dumps as _dumps,
)
from dtwork.store.schema import (
    float_or_none as _float_or_none,
)
from dtwork.store.schema import (
    int_or_none as _int_or_none,
)
from dtwork.store.schema import (
    loads as _loads,
)
from dtwork.store.schema import (
    ranges as _ranges,
)
from dtwork.store.schema import (
    stored_float as _stored_float,
)

__all__ = [
    "RUN_STATUSES",
    "SCHEMA_VERSION",
    "STORE_ERRORS",
    "RunStore",
    "default_store_path",
    "store_path",
    "store_problem",
]

RUN_STATUSES = ("running", "completed", "failed", "interrupted", "stopped")
RankSelector = Literal["aggregated", "all"] | int

_RUN_COLUMNS = (
    "id, name, status, created_at, ended_at, world_size, backend, cluster_id, notebook, "
    "config_yaml, global_batch_size, per_slot_batch_size"
)
_METRIC_COLUMNS = ("run_id", "cell_seq", "kind", "step", "rank", "name", "value", "time")
# A run's rows, table by table, as copy_run carries them (events and results get new ids).
_RUN_TABLES = ("runs", "cells", "metrics", "events", "environment", "results", "segments")

# What a store that cannot be read or written raises: SQLite's errors (locked, full, read-only,
# corrupt), the operating system's (a vanished folder, no space for a journal) and the store's own.
STORE_ERRORS = (sqlite3.Error, OSError, DtworkError)


def store_problem(exc: BaseException, path: Path | str) -> str:
    """One line for the user: what is wrong with the store at ``path`` and what to do."""
    text = str(exc).lower()
    code = getattr(exc, "errno", None)
    if "locked" in text or "busy" in text:
        return f"the run store {path} is locked by another program: close it (or end its transaction)"
    if "full" in text or code == errno.ENOSPC:
        return f"the disk holding the run store {path} is full: free some space"
    if "readonly" in text or "read-only" in text or code in (errno.EACCES, errno.EROFS, errno.EPERM):
        return f"the run store {path} cannot be written (read-only): make the file and its folder writable"
    detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if "malformed" in text or "not a database" in text or "corrupt" in text or "not a dtwork" in text:
        return (
            f"the run store {path} is damaged ({detail}): move the file aside and start again "
            "(or name another store: --store NEW_PATH)"
        )
    if isinstance(exc, DtworkError):
        return detail
    return f"the run store {path} cannot be used ({type(exc).__name__}: {detail})"


def _owner_only_file(path: Path) -> None:
    """Create the store's folder (0700, when dtwork makes it) and its file (0600) before SQLite
    opens it: the store holds cell sources and environment values (SQLite gives its journal
    files the database file's mode)."""
    if not path.parent.is_dir():
        path.parent.mkdir(parents=True, mode=0o700)
        os.chmod(path.parent, 0o700)
    if not path.exists():
        os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))


def default_store_path(root: str | os.PathLike[str] | None = None) -> Path:
    """``$DTWORK_STORE`` when set (and not empty), else ``<root>/.dtwork/runs.sqlite`` (root: the
    working folder); absolute, a relative ``$DTWORK_STORE`` taken from ``root``."""
    base = Path(root) if root is not None else Path.cwd()
    env = os.environ.get("DTWORK_STORE", "").strip()
    path = Path(env).expanduser() if env else Path(".dtwork") / "runs.sqlite"
    return (base / path).absolute() if not path.is_absolute() else path


def store_path(named: str | os.PathLike[str] | None = None) -> Path:
    """The store file a user named: a file as is; a folder or a notebook: ``.dtwork/runs.sqlite``
    there; nothing: the default (``default_store_path``)."""
    if named is None or not str(named).strip():
        return default_store_path()
    path = Path(named).expanduser().absolute()
    if path.is_dir():
        return path / ".dtwork" / "runs.sqlite"
    if path.suffix == ".ipynb":
        return path.parent / ".dtwork" / "runs.sqlite"
    return path


class RunStore:
    """The SQLite run store; see the module docstring for location, durability and threads."""

    def __init__(
        self, path: str | os.PathLike[str] | None = None, *, readonly: bool = False, busy_seconds: float = 5.0
    ) -> None:
        self._busy_ms = round(busy_seconds * 1000)  # how long a statement waits for another's lock
        self._path = Path(path).expanduser().absolute() if path is not None else default_store_path()
        self._readonly = readonly
        self._lock = threading.Lock()
        if readonly:
            if not self._path.is_file():
                raise DtworkError(
                    f"no run store at {self._path}: run a %%dtrain cell first, or set DTWORK_STORE"
                )
            uri = self._path.as_uri() + "?mode=ro"
            conn = sqlite3.connect(
                uri, uri=True, timeout=busy_seconds, check_same_thread=False, isolation_level=None
            )
        else:
            _owner_only_file(self._path)
            conn = sqlite3.connect(
                self._path, timeout=busy_seconds, check_same_thread=False, isolation_level=None
            )
        conn.row_factory = sqlite3.Row
        self._conn: sqlite3.Connection | None = conn
        self._identity = self._file_identity()
        try:
            self._setup(conn)
        except BaseException:
            conn.close()
            self._conn = None
            raise

    def _setup(self, conn: sqlite3.Connection) -> None:
        try:
            conn.execute(f"PRAGMA busy_timeout = {self._busy_ms}")
            if not self._readonly:
                from dtwork.store.mounts import journal_mode  # WAL only on a local filesystem

                conn.execute(f"PRAGMA journal_mode = {journal_mode(self._path)}")
                conn.execute("PRAGMA synchronous = NORMAL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise  # a store in use by another program, not a foreign file: store_problem says so
            raise DtworkError(f"{self._path} is not a dtwork run store ({exc})") from exc
        check_version(self._path, version, self._readonly)
        if version < SCHEMA_VERSION:
            with self._write() as cur:
                create_or_upgrade(cur)

    # -- plumbing ---------------------------------------------------------------------------

    @property
    def path(self) -> Path:
        """The absolute path of the SQLite file."""
        return self._path

    @property
    def readonly(self) -> bool:
        return self._readonly

    def _file_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self._path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def vanished(self) -> bool:
        """Whether the file this store has open is no longer at its path (deleted, its folder
        moved or replaced): writes would go to a file nobody can find."""
        return self._identity is None or self._file_identity() != self._identity

    def copy_run(self, run_id: int | str, into: RunStore) -> dict[str, int]:
        """Write the run's rows from this store into ``into``, keeping its id, in one transaction
        (this store may be a deleted file still open); returns the rows copied per table."""
        rid = self._run_id(run_id)
        tables: dict[str, list[dict[str, Any]]] = {}
        for table in _RUN_TABLES:
            key = "id" if table == "runs" else "run_id"
            rows = self._query(f"SELECT * FROM {table} WHERE {key} = ? ORDER BY rowid", (rid,))
            tables[table] = [
                {k: v for k, v in r.items() if not (k == "id" and table != "runs")} for r in rows
            ]
        if not tables["runs"]:
            raise self._unknown_run(rid)
        with into._write() as cur:
            if cur.execute("SELECT 1 FROM runs WHERE id = ?", (rid,)).fetchone() is not None:
                raise DtworkError(f"{into.path} already holds a run {rid}: not copying run {rid} into it")
            for table, rows in tables.items():
                for row in rows:
                    cols = ", ".join(row)
                    marks = ", ".join("?" * len(row))
                    cur.execute(f"INSERT INTO {table} ({cols}) VALUES ({marks})", tuple(row.values()))
        return {table: len(rows) for table, rows in tables.items()}

    def close(self) -> None:
        """Close the connection; later calls raise DtworkError. Closing twice is harmless."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def __enter__(self) -> RunStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        mode = "readonly" if self._readonly else "writable"
        return f"RunStore({str(self._path)!r}, {mode})"

    def _connection(self) -> sqlite3.Connection:
        if self._conn is None:
            raise DtworkError(f"run store {self._path} is closed")
        return self._conn

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Cursor]:
        """One committed transaction under the lock (BEGIN IMMEDIATE ... COMMIT)."""
        if self._readonly:
            raise DtworkError(f"run store {self._path} is open read-only")
        with self._lock:
            cur = self._connection().cursor()
            cur.execute("BEGIN IMMEDIATE")
            try:
                yield cur
            except BaseException:
                if self._connection().in_transaction:  # SQLite rolls back by itself on a full disk
                    cur.execute("ROLLBACK")
                raise
            else:
                cur.execute("COMMIT")
            finally:
                cur.close()

    def _query(self, sql: str, params: Iterable[Any] = ()) -> list[dict[str, Any]]:
        with self._lock:
            rows = self._connection().execute(sql, tuple(params)).fetchall()
        return [dict(row) for row in rows]

    @staticmethod
    def _run_id(run_id: Any) -> int:
        if isinstance(run_id, int) and not isinstance(run_id, bool) and 0 <= run_id < 2**63:
            return run_id
        text = run_id.strip() if isinstance(run_id, str) else ""
        if text.isascii() and text.isdigit() and len(text) <= 18:
            return int(text)
        raise DtworkError(f"run id must be a whole number, got {run_id!r}")

    def _unknown_run(self, run_id: int) -> DtworkError:
        ids = [row["id"] for row in self._query("SELECT id FROM runs ORDER BY id")]
        known = f"known runs: {_ranges(ids)}" if ids else "the store is empty"
        return DtworkError(f"no run {run_id} in {self._path}; {known}")

    def _update_run(self, run_id: Any, sql: str, params: tuple[Any, ...]) -> None:
        rid = self._run_id(run_id)
        with self._write() as cur:
            cur.execute(sql, (*params, rid))
            changed = cur.rowcount
        if changed == 0:
            raise self._unknown_run(rid)

    # -- writes -----------------------------------------------------------------------------

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
    ) -> int:
        """Insert a run with status ``running``; returns its id."""
        with self._write() as cur:
            cur.execute(
                "INSERT INTO runs (name, status, created_at, world_size, backend, cluster_id, notebook, "
                "config_yaml, global_batch_size, per_slot_batch_size) "
                "VALUES (?, 'running', ?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    name,
                    time.time(),
                    int(world_size),
                    backend,
                    cluster_id,
                    notebook,
                    config_yaml,
                    _int_or_none(global_batch_size),
                    _int_or_none(per_slot_batch_size),
                ),
            )
            return int(cur.lastrowid or 0)

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
        rid = self._run_id(run_id)
        ranks_json = None if ranks is None else _dumps([int(r) for r in ranks])
        seq: int | None = None
        with self._write() as cur:
            if cur.execute("SELECT 1 FROM runs WHERE id = ?", (rid,)).fetchone() is not None:
                seq = int(
                    cur.execute(
                        "SELECT COALESCE(MAX(seq), 0) + 1 FROM cells WHERE run_id = ?", (rid,)
                    ).fetchone()[0]
                )
                cur.execute(
                    "INSERT INTO cells (run_id, seq, source, started_at, status, ranks_json) "
                    "VALUES (?, ?, ?, ?, 'running', ?)",
                    (rid, seq, source, time.time(), ranks_json),
                )
        if seq is None:
            raise self._unknown_run(rid)
        return seq

    def finish_cell(self, run_id: int | str, seq: int, status: str, error: str | None = None) -> None:
        """Stamp a cell's end time, final status (e.g. completed/failed/interrupted) and error."""
        rid = self._run_id(run_id)
        with self._write() as cur:
            cur.execute(
                "UPDATE cells SET status = ?, error = ?, ended_at = ? WHERE run_id = ? AND seq = ?",
                (status, error, time.time(), rid, int(seq)),
            )
            changed = cur.rowcount
        if changed == 0:
            raise DtworkError(f"run {rid} has no cell {seq} in {self._path}")

    def add_metrics(self, run_id: int | str, records: Iterable[Mapping[str, Any]]) -> int:
        """Insert metric rows (keys step, name, value; optional kind, rank, time, cell_seq).

        ``rank`` None (or absent) means aggregated over ranks; ``kind`` defaults to "log" (a
        user metric). NaN and infinite values are kept (see the module docstring).
        All records go in one transaction; returns how many were written.
        """
        rid = self._run_id(run_id)
        now = time.time()
        rows: list[tuple[Any, ...]] = []
        for rec in records:
            try:
                step, name, value = rec["step"], rec["name"], rec["value"]
                rows.append(
                    (
                        rid,
                        _int_or_none(rec.get("cell_seq")),
                        str(rec.get("kind") or "log"),
                        int(step),
                        _int_or_none(rec.get("rank")),
                        str(name),
                        _float_or_none(value),
                        now if rec.get("time") is None else float(rec["time"]),
                    )
                )
            except KeyError as exc:
                raise DtworkError(
                    f"metric record needs keys step, name and value; got {sorted(rec)}"
                ) from exc
            except (TypeError, ValueError) as exc:
                raise DtworkError(f"metric record {dict(rec)!r} has a non-numeric field: {exc}") from exc
        if rows:
            with self._write() as cur:
                cur.executemany(
                    "INSERT INTO metrics (run_id, cell_seq, kind, step, rank, name, value, time) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                    rows,
                )
        return len(rows)

    def add_event(
        self, run_id: int | str | None, kind: str, message: str, data: Mapping[str, Any] | None = None
    ) -> int:
        """Record an event (``run_id`` may be None for store-wide events); returns its id."""
        rid = None if run_id is None else self._run_id(run_id)
        data_json = None if data is None else _dumps(dict(data))
        with self._write() as cur:
            cur.execute(
                "INSERT INTO events (run_id, time, kind, message, data_json) VALUES (?, ?, ?, ?, ?)",
                (rid, time.time(), kind, message, data_json),
            )
            return int(cur.lastrowid or 0)

    def set_environment(self, run_id: int | str, data: Mapping[str, Any]) -> None:
        """Store (replace) the run's environment snapshot."""
        rid = self._run_id(run_id)
        with self._write() as cur:
            cur.execute(
                "INSERT OR REPLACE INTO environment (run_id, data_json) VALUES (?, ?)",
                (rid, _dumps(dict(data))),
            )

    def add_result(self, run_id: int | str | None, kind: str, data: Any) -> int:
        """Store an analysis result (e.g. scaling sweep, throughput check); returns its id."""
        rid = None if run_id is None else self._run_id(run_id)
        with self._write() as cur:
            cur.execute(
                "INSERT INTO results (run_id, kind, created_at, data_json) VALUES (?, ?, ?, ?)",
                (rid, kind, time.time(), _dumps(data)),
            )
            return int(cur.lastrowid or 0)

    def add_segment(
        self,
        run_id: int | str,
        *,
        cell_seq: int | None,
        first_step: int,
        changed: Iterable[str] = (),
        data: Mapping[str, Any] | None = None,
    ) -> int:
        """Record that a training loop began a segment of the run's one step axis at ``first_step``
        (``changed``: what differs from the run's previous segment); returns its number."""
        rid = self._run_id(run_id)
        with self._write() as cur:
            seq = cur.execute(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM segments WHERE run_id = ?", (rid,)
            ).fetchone()[0]
            cur.execute(
                "INSERT INTO segments (run_id, seq, cell_seq, first_step, time, changed, data_json) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    rid,
                    seq,
                    _int_or_none(cell_seq),
                    int(first_step),
                    time.time(),
                    ",".join(changed),
                    _dumps(dict(data or {})),
                ),
            )
            return int(seq)

    def move_cell(self, run_id: int | str, seq: int, into: int | str) -> int:
        """Give the cell ``seq`` of ``run_id`` to run ``into`` as its newest cell (a cell whose
        training began a new run); it stays in ``run_id`` too when rows were already stored under
        it there. Returns its seq in ``into``."""
        rid, new = self._run_id(run_id), self._run_id(into)
        with self._write() as cur:
            row = cur.execute(
                "SELECT source, started_at, ranks_json FROM cells WHERE run_id = ? AND seq = ?", (rid, seq)
            ).fetchone()
            if row is None:
                raise DtworkError(f"run {rid} has no cell {seq}")
            to = cur.execute(
                "SELECT COALESCE(MAX(seq), 0) + 1 FROM cells WHERE run_id = ?", (new,)
            ).fetchone()[0]
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
            return int(to)

    # -- reads ------------------------------------------------------------------------------

    _RUN_SELECT = (
        f"SELECT {_RUN_COLUMNS}, "
        "(SELECT COUNT(*) FROM cells c WHERE c.run_id = runs.id) AS n_cells, "
        "(SELECT MAX(step) FROM metrics m WHERE m.run_id = runs.id) AS last_step FROM runs"
    )

    def list_runs(self) -> list[dict[str, Any]]:
        """All runs, newest first, as :meth:`get_run` gives each."""
        return self._query(self._RUN_SELECT + " ORDER BY id DESC")

    def get_run(self, run_id: int | str) -> dict[str, Any]:
        """One run: its columns, ``n_cells`` and ``last_step``."""
        rid = self._run_id(run_id)
        rows = self._query(self._RUN_SELECT + " WHERE id = ?", (rid,))
        if not rows:
            raise self._unknown_run(rid)
        return rows[0]

    def latest_run_id(self) -> int | None:
        rows = self._query("SELECT MAX(id) AS id FROM runs")
        return rows[0]["id"]

    def cells(self, run_id: int | str) -> list[dict[str, Any]]:
        """The run's cells in seq order; ``ranks`` decoded from JSON."""
        rows = self._query(
            "SELECT run_id, seq, source, started_at, ended_at, status, error, ranks_json "
            "FROM cells WHERE run_id = ? ORDER BY seq",
            (self._run_id(run_id),),
        )
        for row in rows:
            row["ranks"] = _loads(row.pop("ranks_json"))
        return rows

    def segments(self, run_id: int | str) -> list[dict[str, Any]]:
        """The run's segments in order: ``seq``, ``cell_seq``, ``first_step``, ``time``, ``changed``
        (a list of what differs from the previous segment: "lr", "batch", "code", ...), ``data``."""
        rows = self._query(
            "SELECT seq, cell_seq, first_step, time, changed, data_json FROM segments "
            "WHERE run_id = ? ORDER BY seq",
            (self._run_id(run_id),),
        )
        for row in rows:
            row["changed"] = [c for c in (row["changed"] or "").split(",") if c]
            row["data"] = _loads(row.pop("data_json"), {})
        return rows

    def history(self, run_id: int | str) -> list[dict[str, Any]]:
        """The cells that came before a run that a new model began mid-notebook (its first segment
        follows on from an earlier run's cell): the earlier runs' cells before it, oldest first;
        [] for a run that began at a cell of its own. Re-running them rebuilds what the run used."""
        out: list[dict[str, Any]] = []
        rid = self._run_id(run_id)
        while True:
            first = self.segments(rid)[:1]
            link = first[0]["data"].get(FOLLOWS) if first else None
            if not isinstance(link, dict) or not isinstance(link.get("run"), int) or link["run"] >= rid:
                return out  # earlier runs only: a damaged link cannot loop
            rid = link["run"]
            out[:0] = [c for c in self.cells(rid) if c["seq"] < int(link.get("cell", 0))]

    def metrics(
        self,
        run_id: int | str,
        name: str | None = None,
        *,
        rank: RankSelector = "aggregated",
        cell: int | None = None,
    ) -> list[dict[str, Any]]:
        """Metric records ordered by step (then rank, aggregated first, then insertion).

        ``rank="aggregated"`` gives the records without a rank, ``"all"`` every record, an
        int that rank's records; ``cell`` keeps those of the run's cell with that seq. ``value`` is
        None for a missing value, NaN and infinities as stored.
        """
        where = ["run_id = ?"]
        params: list[Any] = [self._run_id(run_id)]
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
        rows = self._query(
            f"SELECT {', '.join(_METRIC_COLUMNS)} FROM metrics WHERE {' AND '.join(where)} "
            "ORDER BY step, rank IS NOT NULL, rank, rowid",
            params,
        )
        for row in rows:
            row["value"] = _stored_float(row["value"])
        return rows

    def metrics_frame(
        self, run_id: int | str, name: str | None = None, *, rank: RankSelector = "aggregated"
    ) -> Any:
        """:meth:`metrics` as a pandas DataFrame (pandas is optional)."""
        try:
            import pandas as pd
        except ImportError:
            raise DtworkError(
                "pandas is not installed: pip install pandas, or use store.metrics(...) for records"
            ) from None
        return pd.DataFrame(self.metrics(run_id, name, rank=rank), columns=list(_METRIC_COLUMNS))

    def metric_names(self, run_id: int | str) -> list[str]:
        rows = self._query(
            "SELECT DISTINCT name FROM metrics WHERE run_id = ? ORDER BY name", (self._run_id(run_id),)
        )
        return [row["name"] for row in rows]

    def last_metrics(self, run_id: int | str) -> dict[str, float]:
        """The latest (highest step, last written) aggregated value of each metric; NULL -> nan."""
        rows = self._query(
            "SELECT name, value FROM (SELECT name, value, ROW_NUMBER() OVER "
            "(PARTITION BY name ORDER BY step DESC, rowid DESC) AS rn "
            "FROM metrics WHERE run_id = ? AND rank IS NULL) WHERE rn = 1 ORDER BY name",
            (self._run_id(run_id),),
        )
        values = {row["name"]: _stored_float(row["value"]) for row in rows}
        return {name: math.nan if value is None else value for name, value in values.items()}

    def events(self, run_id: int | str | None, kind: str | None = None) -> list[dict[str, Any]]:
        """The run's events (``run_id=None``: store-wide events) in order; ``data`` decoded."""
        where = ["run_id IS ?"]
        params: list[Any] = [None if run_id is None else self._run_id(run_id)]
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        rows = self._query(
            "SELECT id, run_id, time, kind, message, data_json FROM events "
            f"WHERE {' AND '.join(where)} ORDER BY id",
            params,
        )
        for row in rows:
            row["data"] = _loads(row.pop("data_json"))
        return rows

    def environment(self, run_id: int | str) -> dict[str, Any]:
        """The run's environment snapshot, or ``{}`` if none was stored."""
        rows = self._query("SELECT data_json FROM environment WHERE run_id = ?", (self._run_id(run_id),))
        return _loads(rows[0]["data_json"], {}) if rows else {}

    def results(self, run_id: int | str | None = None, kind: str | None = None) -> list[dict[str, Any]]:
        """Analysis results (all runs when ``run_id`` is None) in insertion order; ``data`` decoded."""
        where: list[str] = []
        params: list[Any] = []
        if run_id is not None:
            where.append("run_id = ?")
            params.append(self._run_id(run_id))
        if kind is not None:
            where.append("kind = ?")
            params.append(kind)
        clause = f" WHERE {' AND '.join(where)}" if where else ""
        rows = self._query(
            f"SELECT id, run_id, kind, created_at, data_json FROM results{clause} ORDER BY id", params
        )
        for row in rows:
            row["data"] = _loads(row.pop("data_json"))
        return rows
