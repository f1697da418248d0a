"""The run store's connection: where the file is, how it is opened, and how statements run on it.

:class:`Database` holds the one SQLite connection and its lock; the store's modules
(:mod:`dtwork.store.runs`, :mod:`dtwork.store.metrics`, :mod:`dtwork.store.notes`) are functions
over it. See :mod:`dtwork.store.runs` for location, durability and threads.
"""

from __future__ import annotations

import errno
import os
import sqlite3
import sys
import threading
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Literal, cast

from dtwork.errors import DtworkError
from dtwork.store.rollups import backfill
from dtwork.store.schema import ROLLUPS_SINCE, SCHEMA_VERSION, check_version, create_or_upgrade, ranges

__all__ = [
    "STORE_ERRORS",
    "Database",
    "default_store_path",
    "next_seq",
    "parse_run_id",
    "store_path",
    "store_problem",
]

# What a store that cannot be read or written raises: SQLite's errors (locked, full, read-only,
# corrupt), the operating system's (a vanished folder, no space for a journal) and the store's own.
STORE_ERRORS = (sqlite3.Error, OSError, DtworkError)

# A value bound to a statement's ``?``, as sqlite3 takes it.
SqlValue = int | float | str | bytes | None
# One row read as a dict by column name; the store's modules decode some columns in place, then
# hand it on as one of the TypedDicts of dtwork.store.rows.
DbRow = dict[str, object]


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
    try:
        folder = path.is_dir()
    except OSError as exc:  # a name too long for the filesystem, a folder not readable
        raise DtworkError(f"the run store {named!r} cannot be used ({exc.strerror}): name another") from None
    if folder:
        return path / ".dtwork" / "runs.sqlite"
    if path.suffix == ".ipynb":
        return path.parent / ".dtwork" / "runs.sqlite"
    return path


def parse_run_id(run_id: object) -> int:
    """A run id given as an int or as decimal text; a DtworkError for anything else."""
    if isinstance(run_id, int) and not isinstance(run_id, bool) and 0 <= run_id < 2**63:
        return run_id
    text = run_id.strip() if isinstance(run_id, str) else ""
    if text.isascii() and text.isdigit() and len(text) <= 18:
        return int(text)
    raise DtworkError(f"run id must be a whole number, got {run_id!r}")


def next_seq(cur: sqlite3.Cursor, table: Literal["cells", "segments"], run_id: int) -> int:
    """The number the run's next row of ``table`` takes: 1, 2, ... per run."""
    sql = f"SELECT COALESCE(MAX(seq), 0) + 1 FROM {table} WHERE run_id = ?"
    return int(cur.execute(sql, (run_id,)).fetchone()[0])


class Database:
    """One SQLite connection to a store file, used under one lock by every thread."""

    def __init__(self, path: Path, *, readonly: bool, busy_seconds: float) -> None:
        self.path = path
        self.readonly = readonly
        self._busy_ms = round(busy_seconds * 1000)  # how long a statement waits for another's lock
        self._lock = threading.RLock()  # reentrant: a write inside a write is a savepoint of it
        self._depth = 0  # writes open on this connection (the lock's owner's)
        # The metric keys (run, name, rank, kind, cell) -> id this connection wrote or read: a key is
        # never changed or deleted once committed, and the map is emptied when a write rolls back.
        self.metric_keys: dict[tuple[int, str, int, str, int], int] = {}
        if readonly:
            if not path.is_file():
                raise DtworkError(f"no run store at {path}: run a %%dtrain cell first, or set DTWORK_STORE")
            uri = path.as_uri() + "?mode=ro"
            conn = sqlite3.connect(
                uri, uri=True, timeout=busy_seconds, check_same_thread=False, isolation_level=None
            )
        else:
            _owner_only_file(path)
            conn = sqlite3.connect(path, timeout=busy_seconds, check_same_thread=False, isolation_level=None)
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
            if not self.readonly:
                from dtwork.store.mounts import journal_mode  # WAL only on a local filesystem

                conn.execute(f"PRAGMA journal_mode = {journal_mode(self.path)}")
                conn.execute("PRAGMA synchronous = NORMAL")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
        except sqlite3.DatabaseError as exc:
            if "locked" in str(exc) or "busy" in str(exc):
                raise  # a store in use by another program, not a foreign file: store_problem says so
            raise DtworkError(f"{self.path} is not a dtwork run store ({exc})") from exc
        check_version(self.path, version, self.readonly)
        if version < SCHEMA_VERSION:
            if version:
                print(
                    f"dtwork: upgrading the run store {self.path} from version {version} to {SCHEMA_VERSION} "
                    "(once: its metric rows are moved, minutes for tens of millions)",
                    file=sys.stderr,
                    flush=True,
                )
            with self.write() as cur:
                if 0 < create_or_upgrade(cur) < ROLLUPS_SINCE:
                    backfill(cur)

    def _file_identity(self) -> tuple[int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def vanished(self) -> bool:
        """Whether the file this connection has open is no longer at its path."""
        return self._identity is None or self._file_identity() != self._identity

    def close(self) -> None:
        """Close the connection; later statements raise DtworkError. Closing twice is harmless."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None

    def connection(self) -> sqlite3.Connection:
        """The open SQLite connection (statements on it bypass the lock: for PRAGMAs and tests)."""
        if self._conn is None:
            raise DtworkError(f"run store {self.path} is closed")
        return self._conn

    @contextmanager
    def write(self) -> Iterator[sqlite3.Cursor]:
        """One committed transaction under the lock (BEGIN IMMEDIATE ... COMMIT); inside another
        write, a savepoint of it: what it wrote commits with the outer one, or not at all."""
        if self.readonly:
            raise DtworkError(f"run store {self.path} is open read-only")
        with self._lock:
            cur = self.connection().cursor()
            name = f"w{self._depth}"
            cur.execute(f"SAVEPOINT {name}" if self._depth else "BEGIN IMMEDIATE")
            self._depth += 1
            try:
                yield cur
            except BaseException:
                self.metric_keys.clear()  # it may hold keys of the rows rolled back
                if self.connection().in_transaction:  # SQLite rolls back by itself on a full disk
                    cur.execute(f"ROLLBACK TO {name}" if self._depth > 1 else "ROLLBACK")
                    if self._depth > 1:
                        cur.execute(f"RELEASE {name}")
                raise
            else:
                cur.execute(f"RELEASE {name}" if self._depth > 1 else "COMMIT")
            finally:
                self._depth -= 1
                cur.close()

    def query(self, sql: str, params: Iterable[SqlValue] = ()) -> list[DbRow]:
        """The rows of one read, each a dict by column name."""
        with self._lock:
            rows = self.connection().execute(sql, tuple(params)).fetchall()
        return [dict(row) for row in rows]

    def tuples(self, sql: str, params: Iterable[SqlValue] = ()) -> list[tuple[SqlValue, ...]]:
        """The rows of one read as tuples, in the columns' order (a long read without a dict a row)."""
        with self._lock:
            rows = self.connection().execute(sql, tuple(params)).fetchall()
        return [tuple(row) for row in rows]

    def unknown_run(self, run_id: int) -> DtworkError:
        """The error for a run id the store does not hold, naming the ones it does."""
        ids = [cast(int, row["id"]) for row in self.query("SELECT id FROM runs ORDER BY id")]
        known = f"known runs: {ranges(ids)}" if ids else "the store is empty"
        return DtworkError(f"no run {run_id} in {self.path}; {known}")
