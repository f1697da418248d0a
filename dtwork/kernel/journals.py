"""The cell a kept cluster's ranks trained on after its kernel died, closed by the kernel that attached.

Each rank kept the cell's batches and how it ended (``runtime/core/journal.py``); this reads them on
the rank's side channel past the last batch the store holds of that rank's cell (its mark), stores
them through the session as if they had just arrived (their marks in the same transaction: nothing
twice), and records the cell's real end. A cell the ranks cannot tell about is closed as interrupted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol, cast

from dtwork.kernel import stacks as rank_stacks
from dtwork.shared.records import Mark, Record
from dtwork.store.perf_thinner import PerfThinner
from dtwork.store.rows import CellRow
from dtwork.store.runs import STORE_ERRORS, RunStore
from dtwork.store.writer import StoreWriter

ORPHANED = (
    "its kernel died while it ran, and the ranks could not say how it ended: its later records are lost"
)
PAGE = 20_000  # records one request brings back
SKEW = 2.0  # seconds a rank's clock may be behind the kernel's: its cell began after the store's did


class JournalHost(Protocol):
    """What closing an orphaned cell needs of the session."""

    @property
    def store(self) -> RunStore: ...

    @property
    def writer(self) -> StoreWriter: ...

    @property
    def perf_rate(self) -> PerfThinner: ...

    def persist(self, records: list[Record], seq: int | None, marks: list[Mark] | None = None) -> None: ...


def recover(host: JournalHost, run_id: int, channels: rank_stacks.StackChannels, ranks: list[int]) -> None:
    """Close the cells of ``run_id`` that a dead kernel left running: the last one with the records
    and the end its ranks kept, any other (or one the ranks cannot tell about) as interrupted."""
    cells = [c for c in host.store.cells(run_id) if c["status"] == "running"]
    for cell in cells:
        end = _collect(host, run_id, cell, channels, ranks) if cell is cells[-1] else None
        status, error = end or ("interrupted", ORPHANED)
        host.writer.records(run_id, cell["seq"], host.perf_rate.flush())
        host.writer.finish_cell(run_id, cell["seq"], status, error)
        if status == "error":
            host.writer.run_status(run_id, "failed", ended=False)
    host.writer.flush(force=True)


def _collect(
    host: JournalHost, run_id: int, cell: CellRow, channels: rank_stacks.StackChannels, ranks: list[int]
) -> tuple[str, str | None] | None:
    """Store what the ranks kept of ``cell`` that the store lacks; its end as they saw it (None: a
    rank did not answer, did not run this cell, or runs it still)."""
    ends: dict[int, Mapping[str, object]] = {}
    stored = 0
    for rank in ranks:
        try:
            head = rank_stacks.journal(channels, rank, -1, 0)
            ended, started = head.get("ended"), head.get("started")
            if not isinstance(ended, dict) or not isinstance(started, (int, float)):
                return None
            if started < (cell["started_at"] or 0.0) - SKEW:
                return None  # its last cell began before this one: the ranks never ran it
            ends[rank] = ended
            stored += _store_batches(host, cell, channels, rank, str(head["stream"]))
        except (OSError, ValueError, *STORE_ERRORS):  # what was stored stays, marked: nothing twice
            return None
    if stored:
        host.writer.event(
            run_id, "attach", f"cell {cell['seq']}: {stored} batches the ranks kept while no kernel listened"
        )
    failed = [r for r, e in ends.items() if e.get("status") == "error"]
    if failed:
        return "error", f"rank {failed[0]}: {ends[failed[0]].get('error')}"
    return ("interrupted" if any(e.get("status") == "interrupted" for e in ends.values()) else "ok"), None


def _store_batches(
    host: JournalHost, cell: CellRow, channels: rank_stacks.StackChannels, rank: int, stream: str
) -> int:
    """Store the rank's batches of ``stream`` past the last one stored, a page at a time; how many."""
    last = host.store.delivered(rank, stream)
    after, count = (last["seq"] if last is not None else -1), 0
    while True:
        page = rank_stacks.journal(channels, rank, after, PAGE)
        for seq, records in cast("list[tuple[int, list[Record]]]", page["batches"]):
            mark = (rank, stream, int(seq))
            if host.writer.fresh(mark):
                host.persist(records, cell["seq"], [mark])
                count += 1
            after = int(seq)
        if not page.get("more"):
            return count
