"""Reads that cost what they show: series summaries, a metric's points, a figure's rows.

Each reads the raw rows while they are few and complete (a short run reads exactly as it always
did), else the rollups of :mod:`dtwork.store.rollups` at the finest level that fits the points asked
for: a bucket gives its mean as a point, and to a figure its min and max, so spikes stay visible.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, TypedDict, cast

from dtwork.shared.records import finite
from dtwork.store import metrics as metric_rows
from dtwork.store import rollups
from dtwork.store.db import Database, SqlValue
from dtwork.store.rollups import AGGREGATED_RANK, LEVELS, NO_CELL, Bucket, active_levels, width
from dtwork.store.rows import MetricRow
from dtwork.store.schema import stored_float

__all__ = [
    "FULL_READ_ROWS",
    "SeriesSummary",
    "bucket_rows",
    "figure_rows",
    "last_step",
    "points",
    "rank_last_values",
    "reads_raw",
    "summaries",
]

FULL_READ_ROWS = 20_000  # up to this many rows a reader takes the raw rows
FIGURE_BUCKETS = 500  # buckets per series in a figure: each gives two points, its min and its max
FIGURE_ROWS = 12_000  # rows of a figure in all, ranks' series included
MIN_BUCKETS = 50
JOIN = 4  # a figure reads up to this many buckets per one it draws, while READ_ROWS allows
READ_ROWS = 4 * FIGURE_ROWS  # bucket rows a figure reads when JOIN applies: many series read one per drawn
POINT_JOIN = 4  # a series' points are its raw rows while at most this many per point asked for


class SeriesSummary(TypedDict):
    """One series (a name and a rank, None: aggregated) of a run, as the ``series`` table keeps it."""

    name: str
    rank: int | None
    kind: str
    n: int
    first_step: int
    last_step: int
    last_value: float | None  # the last written value at the highest step (NaN and None as stored)
    last_time: float | None
    lo: float | None  # the least and greatest non-NaN value
    hi: float | None
    raw_from: int  # perf and gpu rows before this step live in the rollups only (0: none trimmed)


def summaries(db: Database, run_id: int) -> list[SeriesSummary]:
    """Every series of the run, by name then rank (aggregated first)."""
    rows = db.query(
        "SELECT name, rank, kind, n, first_step, last_step, last_value, last_time, lo, hi, raw_from "
        "FROM series WHERE run_id = ? ORDER BY name, rank",
        (run_id,),
    )
    for row in rows:
        row["rank"] = None if row["rank"] == AGGREGATED_RANK else row["rank"]
        row["last_value"] = stored_float(row["last_value"])
    return cast("list[SeriesSummary]", rows)


def rank_last_values(db: Database, run_id: int, name: str) -> list[float | None]:
    """The last value of each rank's series ``name`` (NaN and None as stored): one indexed read of
    the ranks' summaries, however many other series the run has."""
    rows = db.tuples(
        "SELECT last_value FROM series WHERE run_id = ? AND name = ? AND rank >= 0", [run_id, name]
    )
    return [stored_float(r[0]) for r in rows]


def _buckets(
    db: Database, run_id: int, names: Sequence[str], level: int, where: str, params: list[SqlValue]
) -> list[Bucket]:
    marks = ", ".join("?" * len(names))
    rows = db.tuples(
        "SELECT name, kind, rank, cell_seq, bucket, n, total, lo, hi, lo_step, hi_step, first_time, last_time, "
        f"last_step, last FROM rollups WHERE run_id = ? AND name IN ({marks}) AND level = ?{where} "
        "ORDER BY bucket",
        [run_id, *names, level, *params],
    )
    # the rollups' columns in Bucket's order, with rank and cell as a figure reads them
    return [
        Bucket._make(
            (r[0], r[1], None if r[2] == AGGREGATED_RANK else r[2], None if r[3] == NO_CELL else r[3], *r[4:])
        )
        for r in rows
    ]


def _level(span: int, kept: Sequence[int], most: int) -> int:
    """The finest level of ``kept`` whose buckets over ``span`` steps number at most ``most``."""
    return next((lv for lv in kept if span // width(lv) + 1 <= most), kept[-1])


def _merged(buckets: list[Bucket], k: int = 1) -> list[Bucket]:
    """One bucket per (name, rank, bucket // k): the cells' buckets of the same steps joined, and
    ``k`` neighbours into one (numbered ``bucket // k``)."""
    groups: dict[tuple[str, int | None, int], list[Bucket]] = {}
    for b in buckets:
        key = (b.name, b.rank, b.bucket // k)
        group = groups.get(key)
        if group is None:
            groups[key] = [b]
        else:
            group.append(b)
    out = []
    for (_, _, bucket), group in groups.items():
        a = group[0]
        if len(group) == 1:
            out.append(a if a.bucket == bucket else a._replace(bucket=bucket))
            continue
        # a tie goes to the earlier step, as in the rollups: the order buckets come in does not matter
        lo, lo_step = min((b.lo, b.lo_step) for b in group)
        hi, hi_step = max((b.hi, -b.hi_step) for b in group)
        last_step, last = max(((b.last_step, b.last) for b in group), key=lambda e: e[0])
        out.append(
            a._replace(
                bucket=bucket,
                n=sum(b.n for b in group),
                total=sum(b.total for b in group),
                lo=lo,
                hi=hi,
                lo_step=lo_step,
                hi_step=-hi_step,
                first_time=min(b.first_time for b in group),
                last_time=max(b.last_time for b in group),
                last_step=last_step,
                last=last,
            )
        )
    return out


def points(
    db: Database, run_id: int, name: str, rank: int | None, most: int
) -> tuple[int, list[tuple[int, float | None, float | None]]]:
    """``(total, [(step, value, time), ...])`` of one series, at most about ``most`` points when it
    is long (bucket means at their last step and time; a caller may thin further): total counts its
    rows."""
    key = AGGREGATED_RANK if rank is None else rank
    found = db.query(
        "SELECT n, first_step, last_step, raw_from FROM series WHERE run_id = ? AND name = ? AND rank = ?",
        (run_id, name, key),
    )
    if not found:
        return 0, []
    s = found[0]
    total = int(cast(int, s["n"]))
    # the raw rows while few for what is asked (a sparkline of a long run reads its rollups)
    if total <= min(FULL_READ_ROWS, most * POINT_JOIN) and not s["raw_from"]:
        rows = metric_rows.select(db, run_id, name, rank="aggregated" if rank is None else rank)
        return total, [(r["step"], r["value"], r["time"]) for r in rows]
    span = int(cast(int, s["last_step"])) - int(cast(int, s["first_step"]))
    level = _level(span, _kept(db, run_id), most)
    buckets = _merged(_buckets(db, run_id, [name], level, " AND rank = ?", [key]))
    buckets.sort(key=lambda b: b.bucket)
    return total, [(b.last_step, b.total / b.n, b.last_time) for b in buckets]


def last_step(db: Database, run_id: int, cell: int | None) -> int | None:
    """The highest step the run (or its cell ``cell``) logged."""
    if cell is None:
        row = db.query("SELECT MAX(last_step) AS s FROM series WHERE run_id = ?", (run_id,))[0]
    else:
        found = db.query("SELECT name, n FROM series WHERE run_id = ?", (run_id,))
        names, total = [str(r["name"]) for r in found], sum(int(cast(int, r["n"])) for r in found)
        marks = ", ".join("?" * len(names))
        row = db.query(
            f"SELECT MAX(last_step) AS s FROM rollups WHERE run_id = ? AND name IN ({marks}) AND level = ? "
            "AND cell_seq = ?",
            [run_id, *names, LEVELS[-1], int(cell)],
        )[0]
        if total <= FULL_READ_ROWS or row["s"] is None:  # a short run's: non-finite values count too
            sql = "SELECT MAX(step) AS s FROM metrics WHERE run_id = ? AND cell_seq = ?"
            row = db.query(sql, (run_id, cell))[0]
    return None if row["s"] is None else int(cast(int, row["s"]))


def _kept(db: Database, run_id: int) -> list[int]:
    """The rollup levels the store keeps for the run now (``rollups.active_levels``)."""
    row = db.query(
        "SELECT MIN(first_step) AS a, MAX(last_step) AS b, (SELECT world_size FROM runs WHERE id = ?) AS w "
        "FROM series WHERE run_id = ?",
        (run_id, run_id),
    )[0]
    span = 0 if row["a"] is None else int(cast(int, row["b"])) - int(cast(int, row["a"]))
    return active_levels(span, cast("int | None", row["w"]))


def reads_raw(rows: int, longest: int) -> bool:
    """Whether a figure draws the raw rows (the one rule, for the store's readers and the kernel's
    live view): ``rows`` finite values in all, at most FULL_READ_ROWS, and none of its perf or gpu
    series longer than the raw window (``longest`` values), whose older rows may be trimmed."""
    return rows <= FULL_READ_ROWS and longest <= rollups.RAW_ROWS


def figure_rows(
    db: Database,
    run_id: int,
    *,
    cell: int | None = None,
    rank: Literal["aggregated", "all"] = "all",
    most: int = FIGURE_BUCKETS,
) -> list[MetricRow]:
    """The rows a figure of the run (or of one of its cells) draws, ordered as ``metrics.select``:
    the raw rows while :func:`reads_raw` says so and they are all there, else :func:`bucket_rows`."""
    series = [s for s in summaries(db, run_id) if rank == "all" or s["rank"] is None]
    names = sorted({s["name"] for s in series})
    if not names:
        return []
    where, params = (" AND rank = ?", [AGGREGATED_RANK]) if rank == "aggregated" else ("", [])
    if cell is not None:
        where, params = where + " AND cell_seq = ?", [*params, int(cell)]
    coarse = _buckets(db, run_id, names, LEVELS[-1], where, list(params))
    if cell is None:
        total = sum(s["n"] for s in series)
        longest = max((s["n"] for s in series if s["kind"] in rollups.PRUNED_KINDS), default=0)
    else:  # the cell's own values, as the live view counts them
        counts: dict[tuple[str, int | None], int] = {}
        for b in coarse:
            if b.kind in rollups.PRUNED_KINDS:
                counts[(b.name, b.rank)] = counts.get((b.name, b.rank), 0) + b.n
        total, longest = sum(b.n for b in coarse), max(counts.values(), default=0)
    if not coarse:
        return metric_rows.select(db, run_id, rank=rank, cell=cell)
    if reads_raw(total, longest):
        raw = metric_rows.select(db, run_id, rank=rank, cell=cell)
        # an older cell's perf and gpu rows may be trimmed by the later cells' (its buckets remain)
        # a wide run's raw window is shorter than RAW_ROWS (rollups.raw_rows): a trimmed series says so
        whole = cell is None and not any(s["raw_from"] for s in series)
        if whole or sum(1 for r in raw if finite(r["value"]) is not None) == total:
            return raw

    def read(level: int) -> list[Bucket]:
        return _buckets(db, run_id, names, level, where, list(params))

    drawn = len(series) if cell is None else len({(b.name, b.rank) for b in coarse})  # the cell's own
    return bucket_rows(run_id, coarse, read, drawn, _kept(db, run_id), most, last=cell is None)


def bucket_rows(
    run_id: int,
    coarse: Sequence[Bucket],
    read: Callable[[int], list[Bucket]],
    series: int,
    kept: Sequence[int],
    most: int = FIGURE_BUCKETS,
    *,
    last: bool = False,
) -> list[MetricRow]:
    """A figure's rows from rollups: each bucket's min and max at two fixed steps of the bucket (the
    same for every rank, so means over ranks stay aligned), at most about ``most`` buckets per series.

    ``coarse``: the coarsest level's buckets of what is drawn; ``read(level)``: that level's;
    ``series``: how many series are drawn; ``kept``: the levels its source keeps; ``last``: each series' last value closes it, as the raw rows of a whole run would."""
    # the steps drawn: from the earliest extreme of the first buckets to the last step (near enough)
    span = max(b.last_step for b in coarse) - min(min(b.lo_step, b.hi_step) for b in coarse)
    most = max(MIN_BUCKETS, min(most, FIGURE_ROWS // (2 * max(1, series))))  # many ranks: fewer each
    # Up to JOIN buckets read per one drawn while their rows fit READ_ROWS; many ranks' series read a
    # level at most ``most`` buckets wide, so what is read stays bounded by series x most.
    join = max(1, min(JOIN, READ_ROWS // (max(1, series) * most)))
    level = _level(span, kept, most * join)
    k = -(-(span // width(level) + 1) // most)  # neighbours joined: the levels are 10x apart
    w = width(level) * k
    buckets = _merged(read(level), k)
    out: list[MetricRow] = []
    for b in buckets:
        ends = [(b.lo_step, b.lo), (b.hi_step, b.hi)]
        ends.sort(key=lambda e: e[0])
        late = min(b.bucket * w + (3 * w) // 4, b.last_step)  # a bucket still filling ends at its last step
        at = (min(b.bucket * w + w // 4, late), late)
        for (_, value), step, stamp in zip(ends, at, (b.first_time, b.last_time), strict=True):
            out.append(
                {
                    "run_id": run_id,
                    "cell_seq": b.cell_seq,
                    "kind": b.kind,
                    "step": step,
                    "rank": b.rank,
                    "name": b.name,
                    "value": value,
                    "time": stamp,
                }
            )
    if last:
        for b in _last_buckets(buckets):
            row = {**out[0], "cell_seq": b.cell_seq, "kind": b.kind, "rank": b.rank, "name": b.name}
            out.append({**row, "step": b.last_step, "value": b.last, "time": b.last_time})  # type: ignore[typeddict-item]
    # names ordered too: which name a figure meets first must not hang on the order buckets are read in
    out.sort(key=lambda r: (r["step"], r["rank"] is not None, r["rank"] or 0, r["name"]))
    return out


def _last_buckets(buckets: list[Bucket]) -> list[Bucket]:
    """Each series' last bucket."""
    last: dict[tuple[str, int | None], Bucket] = {}
    for b in buckets:
        if (key := (b.name, b.rank)) not in last or b.bucket > last[key].bucket:
            last[key] = b
    return list(last.values())
