"""After a rank died: fresh engines and, with restarts left, the run's cells again from its last checkpoint.

A run that a new model began mid-notebook replays the earlier runs' cells first (they set up what
it used), in their own run folders, from scratch; their records are not stored again, and no
replayed cell stores its segments again. The replayed cells' watcher talks to ``_ReplayedCell``,
the session seen through that rule.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

from dtwork.config import ExperimentConfig
from dtwork.kernel.engines import EngineGroup
from dtwork.kernel.progress import Progress
from dtwork.kernel.segments import RunBook
from dtwork.kernel.stacks import RankStacks
from dtwork.kernel.watcher import CellHost, CellResult, CellWatcher
from dtwork.runtime import entry
from dtwork.shared.records import Mark, Record
from dtwork.store.runs import RunStore
from dtwork.store.writer import StoreWriter


class ReplayHost(CellHost, Protocol):
    """What a replay needs of the session (``session.Session`` implements it)."""

    @property
    def run_id(self) -> int | None: ...

    @property
    def engines(self) -> EngineGroup: ...

    @property
    def config(self) -> ExperimentConfig: ...

    @property
    def store(self) -> RunStore: ...

    @property
    def writer(self) -> StoreWriter: ...

    def persist(
        self,
        records: list[Record],
        seq: int | None,
        marks: list[Mark] | None = None,
        *,
        stored: bool = True,
        segments: bool = True,
    ) -> None: ...

    def tell_ranks(self, run_id: int, *, replaying: bool = False) -> None: ...

    @property
    def book(self) -> RunBook: ...

    def conclude(self, watcher: CellWatcher, result: CellResult) -> CellResult: ...


class _ReplayedCell:
    """The session as a replayed cell's host: no segment stored again, an earlier run's records not at all."""

    def __init__(self, session: ReplayHost, stored: bool) -> None:
        self.session = session
        self.stored = stored

    @property
    def live(self) -> bool:
        return self.session.live

    @property
    def stall_seconds(self) -> float:
        return self.session.stall_seconds

    @property
    def engine_log(self) -> Path | None:
        return self.session.engine_log

    def in_background(self, watcher: CellWatcher) -> bool:
        return self.session.in_background(watcher)

    def persist(self, records: list[Record], seq: int | None, marks: list[Mark]) -> None:
        self.session.persist(records, seq, marks, stored=self.stored, segments=False)

    def flush(self, final: bool = False) -> None:
        self.session.flush(final)

    def event(self, kind: str, message: str, data: Mapping[str, object] | None = None) -> None:
        self.session.event(kind, message, data)

    def dead_ranks(self, ranks: list[int]) -> dict[int, str]:
        return self.session.dead_ranks(ranks)

    def interrupt_ranks(self, ranks: list[int]) -> None:
        self.session.interrupt_ranks(ranks)

    def restart_after_failure(self, why: str) -> None:
        self.session.restart_after_failure(why)

    def show_progress(self, progress: dict[int, Progress]) -> None:
        self.session.show_progress(progress)

    def stacks(self, ranks: list[int]) -> RankStacks:
        return self.session.stacks(ranks)

    def debug_stop(self, rank: int, stop: Mapping[str, object]) -> None:
        self.session.debug_stop(rank, stop)


class Replay:
    """A session's recovery from dead ranks, and how many restarts its run has used."""

    def __init__(self, session: ReplayHost) -> None:
        self.session = session
        self.restarts_used = 0

    def replays(self) -> bool:
        """Whether a recovery now would replay the run (restarts left, a run to replay)."""
        return self.restarts_used < self.session.config.max_restarts and self.session.run_id is not None

    def recover(self, watcher: CellWatcher) -> CellResult | None:
        """After a rank died: fresh engines; with restarts left, replay the run from its checkpoint."""
        session = self.session
        dead = ", ".join(f"rank {r}" for r in sorted(watcher.dead))
        print(
            f"dtwork: {dead} died: restarting the engines (fresh process group)", file=sys.stderr, flush=True
        )
        session.restart_after_failure(f"{dead} died")
        watcher.restarted = True
        limit = session.config.max_restarts
        run_id = session.run_id
        if self.restarts_used >= limit or run_id is None:
            return None
        self.restarts_used += 1
        session.event(
            "resume",
            f"restart {self.restarts_used} of {limit}: replaying the run's cells from the last checkpoint",
        )
        print(
            f"dtwork: restart {self.restarts_used} of {limit}: replaying the run from its last checkpoint",
            file=sys.stderr,
        )
        return self._replay(run_id)

    def _replay(self, run_id: int) -> CellResult | None:
        session, engines = self.session, self.session.engines
        session.book.moved = {}
        resuming = False
        try:
            result = None
            for cell in session.store.history(run_id) + session.store.cells(run_id):
                ours = cell["run_id"] == run_id
                if ours and not resuming:
                    engines.call(entry.set_auto_resume, (True,), {})
                    resuming = True
                session.tell_ranks(cell["run_id"], replaying=True)
                ar = engines.view().execute(cell["source"], silent=False, block=False)
                replay = CellWatcher(
                    _ReplayedCell(session, stored=ours),
                    ar,
                    list(range(engines.world_size)),
                    seq=cell["seq"] if ours else None,
                    rank0=False,
                    quiet=True,
                )
                result = replay.wait()
                if result.errors:
                    return session.conclude(replay, result)
                if ours:
                    session.writer.finish_cell(run_id, cell["seq"], "ok")
            return result
        finally:
            session.book.ranks_run = None  # told again at the next cell, with a token
            if engines.state == "running" and resuming:
                engines.call(entry.set_auto_resume, (False,), {})
