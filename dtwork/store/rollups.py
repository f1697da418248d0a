"""What keeps a long run's store and its readers bounded: series summaries, rollups, the raw window.

Three things are maintained incrementally, in the transaction that inserts a batch of metric rows:

* ``series``: one row per (run, name, rank) with its row count, first and last step, last value
  (highest step, last written) and least and greatest non-NaN value, so that the run list, the run
  card and ``dtwork runs show`` read a few rows however long the run was.
* ``rollups``: per bucket of ``10 ** level`` steps, per cell, name and rank, the count, sum, min and
  max of the finite values (and the steps where min and max fell, the bucket's time span and last
  value). A level is kept while the run spans at most ``keep_buckets(world_size)`` of its buckets
  (``KEEP_BUCKETS``; fewer past ``RAW_RANKS`` ranks, as the raw window), the coarsest always, so a
  figure of any range reads at most a screen's width of buckets with every spike.
* The raw window: ``perf`` and ``gpu`` rows (the ranks' timings and GPU telemetry) are kept at full
  resolution for each series' last ``raw_rows(world_size)`` rows only; older ones live on in the
  rollups. Up to ``RAW_RANKS`` ranks that is ``RAW_ROWS``; past it the run's window in all stays that
  of ``RAW_RANKS`` ranks (``RAW_ROWS * RAW_RANKS / world_size`` a series, at least ``MIN_RAW_ROWS``),
  so a 256-rank hour keeps about 375 rows a series, not 3,000 (the store's size was mostly these
  rows). User metrics (``ctx.log``, GNS, adaptive decisions, scaling estimates) are kept at every
  step, always.

A run with fewer rows than these bounds reads exactly the raw rows it always did.
"""

from __future__ import annotations

import math
import sqlite3
from collections.abc import Sequence
from typing import NamedTuple, cast

from dtwork.store.schema import AGGREGATED_RANK, NAN_TEXT, NO_CELL

__all__ = [
    "AGGREGATED_RANK",
    "KEEP_BUCKETS",
    "LEVELS",
    "PRUNED_KINDS",
    "RAW_RANKS",
    "RAW_ROWS",
    "Bucket",
    "MemoryRollups",
    "fold",
    "raw_rows",
    "width",
]

LEVELS = (1, 2, 3, 4)  # bucket widths 10, 100, 1000 and 10000 steps
KEEP_BUCKETS = 2000  # a level is kept while the run spans at most this many of its buckets
MIN_KEEP_BUCKETS = 200  # however many ranks: a run card's sparkline of 200 points reads one level
RAW_ROWS = 3000  # perf and gpu rows kept at full resolution, per series, up to RAW_RANKS ranks
RAW_RANKS = 32  # past this many ranks a run's raw window in all is that of RAW_RANKS ranks
MIN_RAW_ROWS = 300  # the least raw window of a series, however many ranks
PRUNE_EVERY = 500  # a series' raw window is trimmed each time it grows by this many rows (or a quarter)
PRUNED_KINDS = ("perf", "gpu")

# (run_id, cell_seq, kind, step, rank, name, value, time): a metric row as metrics.add inserts it
InsertedRow = tuple[int, "int | None", str, int, "int | None", str, "float | str | None", float]


def width(level: int) -> int:
    """Steps per bucket at ``level``."""
    return int(10**level)


def raw_rows(world_size: int | None) -> int:
    """The perf and gpu rows kept at full resolution per series of a run of ``world_size`` ranks (the
    one rule: a wide run's window in all is that of ``RAW_RANKS`` ranks)."""
    if world_size is None or world_size <= RAW_RANKS:
        return RAW_ROWS
    return max(MIN_RAW_ROWS, RAW_ROWS * RAW_RANKS // world_size)


def keep_buckets(world_size: int | None) -> int:
    """The buckets a level may span before it is dropped (the rule of ``raw_rows``: a wide run's
    levels in all span those of ``RAW_RANKS`` ranks; its figures draw at most ``MIN_BUCKETS`` of
    dtwork.store.views a series, so its ranks' 10-step buckets were most of its store)."""
    if world_size is None or world_size <= RAW_RANKS:
        return KEEP_BUCKETS
    return max(MIN_KEEP_BUCKETS, KEEP_BUCKETS * RAW_RANKS // world_size)


def active_levels(span: int, world_size: int | None = None) -> list[int]:
    """The levels kept for a run of ``world_size`` ranks spanning ``span`` steps (the coarsest always)."""
    keep = keep_buckets(world_size)
    return [lv for lv in LEVELS if lv == LEVELS[-1] or span < width(lv) * keep]


class Bucket(NamedTuple):
    """One rollup row as read back: a bucket of one series at one level."""

    name: str
    kind: str
    rank: int | None
    cell_seq: int | None
    bucket: int
    n: int
    total: float
    lo: float
    hi: float
    lo_step: int
    hi_step: int
    first_time: float
    last_time: float
    last_step: int
    last: float


_FINEST = width(LEVELS[0])


class _Agg:
    """One bucket's aggregate of finite values, as a batch builds it."""

    __slots__ = ("hi", "hi_step", "kind", "last", "last_step", "lo", "lo_step", "n", "t0", "t1", "total")

    def __init__(self, kind: str, step: int, value: float, stamp: float) -> None:
        self.kind, self.n, self.total = kind, 1, value
        self.lo = self.hi = self.last = value
        self.lo_step = self.hi_step = self.last_step = step
        self.t0 = self.t1 = stamp

    def add(self, step: int, value: float, stamp: float) -> None:
        self.n += 1
        self.total += value
        # a tie goes to the earlier step, so that the order rows arrive in does not matter
        if value < self.lo or (value == self.lo and step < self.lo_step):
            self.lo, self.lo_step = value, step
        if value > self.hi or (value == self.hi and step < self.hi_step):
            self.hi, self.hi_step = value, step
        if stamp < self.t0:
            self.t0 = stamp
        if stamp > self.t1:
            self.t1 = stamp
        if step >= self.last_step:
            self.last_step, self.last = step, value

    def merge(self, o: _Agg) -> None:
        """Take in another bucket's aggregate, of later rows (a tie of steps goes to ``o``)."""
        self.n += o.n
        self.total += o.total
        if o.lo < self.lo or (o.lo == self.lo and o.lo_step < self.lo_step):
            self.lo, self.lo_step = o.lo, o.lo_step
        if o.hi > self.hi or (o.hi == self.hi and o.hi_step < self.hi_step):
            self.hi, self.hi_step = o.hi, o.hi_step
        self.t0, self.t1 = min(self.t0, o.t0), max(self.t1, o.t1)
        if o.last_step >= self.last_step:
            self.last_step, self.last = o.last_step, o.last

    def copy(self) -> _Agg:
        new = _Agg.__new__(_Agg)  # field by field: a loop over __slots__ was most of a write's fold
        new.kind, new.n, new.total = self.kind, self.n, self.total
        new.lo, new.hi, new.last = self.lo, self.hi, self.last
        new.lo_step, new.hi_step, new.last_step = self.lo_step, self.hi_step, self.last_step
        new.t0, new.t1 = self.t0, self.t1
        return new

    def row(self) -> tuple[object, ...]:
        """The values of a rollup row, in the upsert's order."""
        return (
            self.kind,
            self.n,
            self.total,
            self.lo,
            self.hi,
            self.lo_step,
            self.hi_step,
            self.t0,
            self.t1,
            self.last_step,
            self.last,
        )


class _Series:
    """A series' summary as the ``series`` table holds it, updated row by row."""

    __slots__ = ("first", "hi", "kind", "last_step", "last_time", "last_value", "lo", "n", "n0", "raw_from")

    def __init__(self, kind: str, row: sqlite3.Row | None = None) -> None:
        self.kind = kind
        self.n = self.n0 = 0
        self.first: int | None = None
        self.last_step: int | None = None
        self.last_value: float | str | None = None
        self.last_time: float | None = None
        self.lo: float | None = None
        self.hi: float | None = None
        self.raw_from = 0
        if row is not None:
            self.n = self.n0 = int(row["n"])
            self.first, self.last_step = row["first_step"], row["last_step"]
            self.last_value, self.last_time = row["last_value"], row["last_time"]
            self.lo, self.hi, self.raw_from = row["lo"], row["hi"], int(row["raw_from"])

    def add(self, step: int, value: float | str | None, stamp: float) -> None:
        self.n += 1
        self.first = step if self.first is None else min(self.first, step)
        if self.last_step is None or step >= self.last_step:  # the last written of the highest step
            self.last_step, self.last_value, self.last_time = step, value, stamp
        if isinstance(value, float) and not math.isnan(value):
            self.lo = value if self.lo is None else min(self.lo, value)
            self.hi = value if self.hi is None else max(self.hi, value)


_SERIES_UPSERT = """
INSERT INTO series (run_id, name, rank, kind, n, first_step, last_step, last_value, last_time, lo, hi,
    raw_from) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id, name, rank) DO UPDATE SET n = excluded.n, first_step = excluded.first_step,
    last_step = excluded.last_step, last_value = excluded.last_value, last_time = excluded.last_time,
    lo = excluded.lo, hi = excluded.hi, raw_from = excluded.raw_from
"""

# Every right-hand side reads the row as it was: min and max steps follow their values (a tie: the
# earlier step, as _Agg keeps it).
_ROLLUP_UPSERT = """
INSERT INTO rollups (run_id, name, level, cell_seq, rank, bucket, kind, n, total, lo, hi, lo_step,
    hi_step, first_time, last_time, last_step, last) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
ON CONFLICT (run_id, name, level, cell_seq, rank, bucket) DO UPDATE SET
    n = n + excluded.n, total = total + excluded.total,
    lo_step = CASE WHEN excluded.lo < lo OR (excluded.lo = lo AND excluded.lo_step < lo_step)
        THEN excluded.lo_step ELSE lo_step END,
    lo = MIN(lo, excluded.lo),
    hi_step = CASE WHEN excluded.hi > hi OR (excluded.hi = hi AND excluded.hi_step < hi_step)
        THEN excluded.hi_step ELSE hi_step END,
    hi = MAX(hi, excluded.hi),
    first_time = MIN(first_time, excluded.first_time), last_time = MAX(last_time, excluded.last_time),
    last = CASE WHEN excluded.last_step >= last_step THEN excluded.last ELSE last END,
    last_step = MAX(last_step, excluded.last_step)
"""


def fold(cur: sqlite3.Cursor, run_id: int, rows: Sequence[InsertedRow], *, trim: bool = True) -> None:
    """Bring the run's series, rollups and (with ``trim``) raw window up to date with ``rows`` (just
    inserted), inside the caller's write transaction."""
    if not rows:
        return
    # Only the summaries of the names in the batch are read, and the run's span by aggregate: a
    # write of one name's rows in a run of thousands of series reads a few.
    names = sorted({row[5] for row in rows})
    known: dict[tuple[str, int], _Series] = {}
    for row in cur.execute(
        "SELECT name, rank, kind, n, first_step, last_step, last_value, last_time, lo, hi, raw_from "
        f"FROM series WHERE run_id = ? AND name IN ({', '.join('?' * len(names))})",
        (run_id, *names),
    ).fetchall():
        known[(row["name"], row["rank"])] = _Series(row["kind"], row)
    first, last = cur.execute(
        "SELECT MIN(first_step), MAX(last_step) FROM series WHERE run_id = ?", (run_id,)
    ).fetchone()
    span_before = 0 if first is None else int(last) - int(first)
    found = cur.execute("SELECT world_size FROM runs WHERE id = ?", (run_id,)).fetchone()
    world = None if found is None else found[0]
    fine: dict[tuple[str, int, int, int], _Agg] = {}  # by the finest buckets first: one update a row
    touched: dict[tuple[str, int], _Series] = {}
    levels = active_levels(span_before, world)
    for _, cell_seq, kind, step, rank, name, value, stamp in rows:
        key = (name, AGGREGATED_RANK if rank is None else rank)
        s = known.get(key)
        if s is None:
            s = known[key] = _Series(kind)
        s.add(step, value, stamp)
        touched[key] = s
        if not isinstance(value, float) or not math.isfinite(value):
            continue  # rollups aggregate finite values; the raw row keeps a NaN or an infinity
        at = (name, NO_CELL if cell_seq is None else cell_seq, key[1], step // _FINEST)
        b = fine.get(at)
        if b is None:
            fine[at] = _Agg(kind, step, value, stamp)
        else:
            b.add(step, value, stamp)
    buckets: dict[tuple[str, int, int, int, int], _Agg] = {}
    # The finest level's buckets are the batch's own (one each): the others copy or merge into theirs.
    coarser = [(lv, width(lv) // _FINEST) for lv in levels if lv != LEVELS[0]]
    for (name, cell, rank, b10), agg in fine.items():
        for lv, per in coarser:
            k = (name, lv, cell, rank, b10 // per)
            if (into := buckets.get(k)) is None:
                buckets[k] = agg.copy()
            else:
                into.merge(agg)
        if LEVELS[0] in levels:
            buckets[(name, LEVELS[0], cell, rank, b10)] = agg
    cur.executemany(_ROLLUP_UPSERT, [(run_id, *k, *v.row()) for k, v in buckets.items()])
    keep = raw_rows(world)
    every = min(PRUNE_EVERY, max(1, keep // 4))
    for (name, rank), s in touched.items():
        if trim and s.kind in PRUNED_KINDS and s.n > keep and s.n // every > s.n0 // every:
            s.raw_from = _trim(cur, run_id, name, rank, s.raw_from, keep)
    cur.executemany(
        _SERIES_UPSERT,
        [
            (
                run_id,
                name,
                rank,
                s.kind,
                s.n,
                s.first,
                s.last_step,
                s.last_value,
                s.last_time,
                s.lo,
                s.hi,
                s.raw_from,
            )
            for (name, rank), s in touched.items()
        ],
    )
    lo = min([s.first for s in touched.values() if s.first is not None] + ([] if first is None else [first]))
    hi = max(
        [s.last_step for s in touched.values() if s.last_step is not None] + ([] if last is None else [last])
    )
    for lv in set(levels) - set(active_levels(hi - lo, world)):
        cur.execute("DELETE FROM rollups WHERE run_id = ? AND level = ?", (run_id, lv))


class MemoryRollups:
    """One cell's rollups kept in memory as its rows arrive, by the rule :func:`fold` keeps a run's in
    the store: the same buckets at the same levels (a level dropped once the cell spans more than
    ``KEEP_BUCKETS`` of its buckets), so that a figure drawn from either is the same. Its size grows
    with the levels kept, not with the rows taken (the kernel's live view of a long cell)."""

    def __init__(self, cell_seq: int | None = None, world_size: int | None = None) -> None:
        self.cell_seq = cell_seq
        self.world_size = world_size  # the run's ranks: a wide run keeps its levels shorter
        self.first: int | None = None  # the lowest and highest step taken
        self.last: int | None = None
        self.series: dict[tuple[str, int], str] = {}  # every (name, rank) taken, with its kind
        self.counts: dict[tuple[str, int], int] = {}  # finite values of each series
        self.rows = 0  # finite values in all
        self._kept: dict[int, dict[tuple[str, int, int], _Agg]] = {lv: {} for lv in LEVELS}

    @property
    def span(self) -> int:
        return 0 if self.first is None or self.last is None else self.last - self.first

    @property
    def levels(self) -> list[int]:
        return list(self._kept)

    def add(self, kind: str, step: int, rank: int | None, name: str, value: object, stamp: float) -> None:
        """Take one row (a non-finite value counts as a step of its series, as in the store)."""
        key = (name, AGGREGATED_RANK if rank is None else rank)
        if key not in self.series:
            self.series[key] = kind
        if self.first is None or step < self.first:
            self.first = step
            self._drop()
        if self.last is None or step > self.last:
            self.last = step
            self._drop()
        if not isinstance(value, float) or not math.isfinite(value):
            return
        self.counts[key] = self.counts.get(key, 0) + 1
        self.rows += 1
        for lv, kept in self._kept.items():
            at = (name, key[1], step // width(lv))
            b = kept.get(at)
            if b is None:
                kept[at] = _Agg(kind, step, value, stamp)
            else:
                b.add(step, value, stamp)

    def _drop(self) -> None:
        if len(self._kept) > 1:
            for lv in set(self._kept) - set(active_levels(self.span, self.world_size)):
                del self._kept[lv]

    def buckets(self, level: int) -> list[Bucket]:
        """The buckets of ``level`` (one kept), in no set order (as the store's, merged alike)."""
        cell = self.cell_seq
        return [
            Bucket(
                name,
                a.kind,
                None if rank == AGGREGATED_RANK else rank,
                cell,
                bucket,
                a.n,
                a.total,
                a.lo,
                a.hi,
                a.lo_step,
                a.hi_step,
                a.t0,
                a.t1,
                a.last_step,
                a.last,
            )
            for (name, rank, bucket), a in self._kept[level].items()
        ]

    def size(self) -> int:
        """The buckets held, at every level."""
        return sum(len(kept) for kept in self._kept.values())


def _trim(cur: sqlite3.Cursor, run_id: int, name: str, rank: int, raw_from: int, keep: int) -> int:
    """Delete the series' raw rows before its last ``keep``; return the first step kept."""
    keys = [
        int(r[0])
        for r in cur.execute(
            "SELECT id FROM metric_keys WHERE run_id = ? AND name = ? AND rank = ?", (run_id, name, rank)
        )
    ]
    marks = ", ".join("?" * len(keys))
    row = cur.execute(
        f"SELECT step FROM points WHERE key IN ({marks}) ORDER BY step DESC LIMIT 1 OFFSET ?",
        (*keys, keep - 1),
    ).fetchone()
    if row is None or int(row[0]) <= raw_from:
        return raw_from
    cut = int(row[0])
    cur.execute(f"DELETE FROM points WHERE key IN ({marks}) AND step < ?", (*keys, cut))
    return cut


def backfill(cur: sqlite3.Cursor, chunk: int = 50_000) -> None:
    """Build the series and rollups of every run from the rows a store of an older version holds
    (its upgrade), then trim perf and gpu rows to the raw window; user metrics are all kept."""
    keys = cur.execute(
        "SELECT id, run_id, cell_seq, kind, rank, name FROM metric_keys ORDER BY id"
    ).fetchall()
    for kid, run_id, cell, kind, rank, name in keys:
        cell_seq = None if cell == NO_CELL else cell
        at: tuple[int, int] = (-(2**63), -(2**63))
        while True:
            got = cur.execute(
                "SELECT step, seq, value, time FROM points WHERE key = ? AND (step, seq) > (?, ?) "
                "ORDER BY step, seq LIMIT ?",
                (kid, *at, chunk),
            ).fetchall()
            if not got:
                break
            at = (int(got[-1][0]), int(got[-1][1]))
            rows = [
                (
                    run_id,
                    cell_seq,
                    kind,
                    int(step),
                    None if rank == AGGREGATED_RANK else rank,
                    name,
                    *_stored(v, t),
                )
                for step, _, v, t in got
            ]
            fold(cur, run_id, rows, trim=False)
    # Trimmed once all is folded: a trim during the fold would cut rows not folded yet.
    for run_id, name, rank, raw_from, world in cur.execute(
        "SELECT s.run_id, s.name, s.rank, s.raw_from, r.world_size FROM series s LEFT JOIN runs r "
        f"ON r.id = s.run_id WHERE s.kind IN ({', '.join('?' * len(PRUNED_KINDS))}) ORDER BY s.run_id",
        PRUNED_KINDS,
    ).fetchall():
        cut = _trim(cur, run_id, name, rank, raw_from, raw_rows(world))
        cur.execute(
            "UPDATE series SET raw_from = ? WHERE run_id = ? AND name = ? AND rank = ?",
            (cut, run_id, name, rank),
        )


def _stored(value: object, stamp: object) -> tuple[float | str | None, float]:
    """A stored value and time as ``fold`` takes them."""
    value = value if value == NAN_TEXT or value is None else float(cast(float, value))
    return value, 0.0 if stamp is None else float(cast(float, stamp))
