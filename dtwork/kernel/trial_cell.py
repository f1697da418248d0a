"""One trial of a search on one rank group: a run of its own in the store, its cell followed by a
``CellWatcher`` whose host (this) writes the group's records to that run.

The session's own run is not touched: several trials run at once, each writing its run through the
session's store writer (which takes a run per write). The ranks tag their records with their rank
in the group (0 to slots - 1), as a standalone run of that many ranks would.
"""

from __future__ import annotations

import signal
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from dtwork.config import ExperimentConfig
from dtwork.kernel import calls
from dtwork.kernel.progress import Progress
from dtwork.kernel.segments import RunBook, is_segment
from dtwork.kernel.stacks import RankStacks
from dtwork.kernel.tracebacks import error_line, left_after_peer
from dtwork.kernel.watcher import CellResult, CellWatcher
from dtwork.runtime import trials
from dtwork.shared import batch
from dtwork.shared.records import Mark, Record

if TYPE_CHECKING:
    from dtwork.kernel.session import Session

RUN_STATUS = {"ok": "completed", "interrupted": "interrupted"}  # any other: failed


class TrialCell:
    """The cell of one trial on ``ranks`` (the cluster's ranks of one group), in a run of its own."""

    live = False  # several cells at once: no live view, only the store

    def __init__(self, session: Session, ranks: list[int], config: ExperimentConfig, note: str) -> None:
        self.session, self.ranks, self.config = session, list(ranks), config
        self.book = RunBook()
        self.broken = False  # the group's sockets were shut (a failure): made again before its next trial
        e, n = session.engines, len(ranks)
        store = session.store
        self.run_id = store.create_run(
            name=config.name,
            world_size=n,
            backend=e.backend,
            cluster_id=e.cluster_id,
            notebook=session.notebook,
            config_yaml=config.to_yaml(),
            global_batch_size=batch.effective(config.global_batch_size, n),
            per_slot_batch_size=batch.per_slot(config.global_batch_size, n),
        )
        # the group's ranks only, as a standalone run of that many ranks records them
        store.set_environment(
            self.run_id, calls.environment(e.backend, [e.rank_info[r] for r in ranks], config.seed)
        )
        store.add_event(
            self.run_id, "start", f"{note}: run started on ranks {ranks} of the cluster ({n} rank(s))"
        )
        self.seq: int | None = None
        self.watcher: CellWatcher | None = None
        self.error: str | None = None  # the failed cell's error line

    def start(self, code: str, rebuild: bool, resume: int | None = None) -> None:
        """Make the group the ranks' world with this trial's config and run, then send the cell;
        ``resume``: the run whose newest checkpoint its loop goes on from (an ASHA promotion)."""
        e = self.session.engines
        self.seq = self.session.store.add_cell(self.run_id, code)
        self.book.begin_cell(code)
        token = uuid.uuid4().hex[:12]
        told = (self.config.to_dict(), self.run_id, str(self.session.store_file), token, rebuild, resume)
        e.call(trials.begin_trial, told, {}, self.ranks)
        ar = e.view(self.ranks).execute(code, silent=False, block=False)
        self.watcher = CellWatcher(self, ar, self.ranks, seq=self.seq, rank0=True, quiet=True)

    def ended(self) -> bool:
        """One polling round: whether the cell has ended on every rank of the group."""
        w = self.watcher
        return w is not None and (w.ar.ready() or w.poll())

    def conclude(self, result: CellResult, interrupted: bool) -> str:
        """Store how the cell and the run ended; return the run's status."""
        status = "interrupted" if interrupted and result.status in ("ok", "interrupted") else result.status
        run_status = RUN_STATUS.get(status, "failed")
        err = self.cause(result) if run_status == "failed" else None
        self.error = err
        w = self.session.writer
        if self.seq is not None:
            w.finish_cell(self.run_id, self.seq, status, err)
        if err is not None:
            w.event(self.run_id, "error", f"cell {self.seq}: {err}")
        w.run_status(self.run_id, run_status)
        w.flush(force=True)
        return run_status

    def cause(self, result: CellResult) -> str | None:
        """The failing cell's error: the rank that failed first's, not a peer's that left with it."""
        errs, dead = result.errors, self.watcher.dead if self.watcher is not None else {}
        if not errs:
            return None
        first = min(errs, key=lambda r: (r not in dead, left_after_peer(errs[r]), r))
        return error_line(errs[first])

    # -- what the cell watcher asks of its host (watcher.CellHost) --------------------------

    @property
    def stall_seconds(self) -> float:
        return self.session.stall_seconds

    @property
    def engine_log(self) -> Path | None:
        return self.session.engines.log_file

    def in_background(self, watcher: CellWatcher) -> bool:
        return False

    def persist(self, records: list[Record], seq: int | None, marks: list[Mark]) -> None:
        """The group's records to the trial's run (its loop's segments as segments)."""
        w = self.session.writer
        rows = []
        for rec in records:
            if is_segment(rec):
                step = rec.get("step")
                first = int(step) if isinstance(step, (int, float)) else 0
                what, data = self.book.segment(self.run_id, rec)
                w.segment(self.run_id, seq, first, what, data)
            else:
                rows.append(rec)
        w.records(self.run_id, seq, rows)
        w.flush()

    def flush(self, final: bool = False) -> None:
        self.session.writer.flush(rows_now=final)

    def event(self, kind: str, message: str, data: Mapping[str, object] | None = None) -> None:
        self.session.writer.event(self.run_id, kind, message, data)

    def dead_ranks(self, ranks: list[int]) -> dict[int, str]:
        return self.session.engines.dead_ranks(ranks)

    def interrupt_ranks(self, ranks: list[int]) -> None:
        self.session.engines.signal(signal.SIGUSR1, ranks)

    def restart_after_failure(self, why: str) -> None:
        """Ranks still wait after a peer failed: the group's sockets are shut on every rank of it that
        is free (the failed ones), which wakes the waiting ones; the other groups train on."""
        self.broken = True
        self.session.engines.view(self.ranks).apply_async(trials.abort_group)

    def stacks(self, ranks: list[int]) -> RankStacks:
        return self.session.engines.stacks(ranks)

    def debug_stop(self, rank: int, stop: Mapping[str, object]) -> None:
        self.session.debug_stop(rank, stop)

    def show_progress(self, progress: dict[int, Progress]) -> None:
        return None
