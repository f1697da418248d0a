"""The trial session of a cluster: its run in the store, the cells it runs, background cells, replay.

It calls the engine group below it and serves the cell watcher through ``CellHost``. One
direction: a cell's records reach the session through its ``CellWatcher``; the session writes
them to the store first, then hands them to the live dashboard. After a rank dies the session
restarts the engines and, with restarts left, replays the run from its last checkpoint.
"""

from __future__ import annotations

import math
import os
import signal
import sys
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from dtwork.analysis.scaling import LiveEfficiency, sweep_baseline
from dtwork.config import ExperimentConfig
from dtwork.errors import DtworkError
from dtwork.kernel import cell_settings, journals, kept, segments
from dtwork.kernel.background import BackgroundCell
from dtwork.kernel.engines import EngineGroup
from dtwork.kernel.progress import Progress
from dtwork.kernel.replay import Replay
from dtwork.kernel.segments import is_segment
from dtwork.kernel.stacks import RankStacks
from dtwork.kernel.store_handle import StoreHandle
from dtwork.kernel.tracebacks import error_line, stopped_by_interrupt
from dtwork.kernel.watcher import CellResult, CellWatcher, in_notebook
from dtwork.runtime import entry
from dtwork.shared import batch
from dtwork.shared.records import (
    DIVERGED,
    FOLLOWS,
    Kind,
    Mark,
    Record,
    divergence_text,
    first_non_finite,
)
from dtwork.store.perf_thinner import PerfThinner
from dtwork.store.runs import STORE_ERRORS, RunStore, store_problem
from dtwork.store.writer import StoreWriter

if TYPE_CHECKING:
    from dtwork.widgets.dashboard import Dashboard

REPAIR_SECONDS = 60.0  # for every rank to join a new process group after a failed cell
STALL_SECONDS = 60.0  # default hang watchdog


class Session:
    """The trial session of a cluster: the current run, its store, its dashboard."""

    def __init__(self, engines: EngineGroup, store_file: Path, notebook: str | None = None) -> None:
        self.engines = engines
        self.notebook = notebook  # recorded with each run
        self.run_id: int | None = None
        self.stall_seconds: float = STALL_SECONDS
        # Feed the live dashboard of cells that show output (on in a notebook; a script or a
        # terminal gets lines of text). Read at every poll: switched off while a cell trains, the
        # view pauses (records still go to the store); back on, it resumes from then on.
        self.live: bool = in_notebook()
        self.stores = StoreHandle(store_file)
        # Every write during a cell goes through the writer: what the store refuses waits.
        self.writer = StoreWriter(lambda: self.store, store_file)
        self.bg: BackgroundCell | None = None
        self.dashboard: Dashboard | None = None  # the current cell's live view, if any
        self.last: CellResult | None = None
        self.efficiency: LiveEfficiency | None = None  # the current cell's, on more than one rank
        self.perf_rate = PerfThinner(max(1, engines.world_size))  # the current cell's perf records to store
        self.autoreload = True  # reload the notebook folder's edited modules on the ranks before a cell
        self.book = segments.RunBook()  # one step axis per run (kernel/segments.py)
        self.replay = Replay(self)  # after a rank died: the run again from its last checkpoint

    @property
    def config(self) -> ExperimentConfig:
        """The experiment config the ranks hold (the engine group keeps it with their batch)."""
        return self.engines.config

    # -- store -----------------------------------------------------------------------------

    @property
    def store_file(self) -> Path:
        return self.stores.file

    @property
    def store(self) -> RunStore:
        return self.stores.get(self.run_id)

    def check_store(self) -> None:
        """Make the store again now if its file went away, before something else reads it."""
        self.stores.check(self.run_id)

    @property
    def restarts_used(self) -> int:
        return self.replay.restarts_used

    @property
    def background(self) -> CellWatcher | None:
        """The watcher of the cell training in the background, if any."""
        return self.bg.watcher if self.bg is not None and not self.bg.concluded else None

    def ensure_run(self, wanted: int | None = None) -> int:
        """The current run, made now if there is none (with id ``wanted`` when that is still free)."""
        if self.run_id is None:
            e = self.engines
            name, self.book.config_named = (None if self.book.config_named else e.config.name), True
            self.run_id = self.store.create_run(
                name=name,
                world_size=e.world_size,
                backend=e.backend,
                cluster_id=e.cluster_id,
                notebook=self.notebook,
                config_yaml=e.config.to_yaml(),
                global_batch_size=batch.effective(e.global_batch_size, e.world_size),
                per_slot_batch_size=batch.per_slot(e.global_batch_size, e.world_size),
                wanted_id=wanted,
            )
            self.store.set_environment(self.run_id, e.environment())
            self.store.add_event(self.run_id, "start", f"run started on {e.world_size} rank(s), {e.backend}")
        return self.run_id

    def resume(self, run_id: object) -> None:
        """Go on with the ranks' run (a kept cluster just attached) if it is this cluster's and running;
        a cell its last kernel left running is stored and closed as the ranks ran it."""
        run = kept.resumable(self.store, run_id, self.engines.cluster_id)
        if run is not None:
            self.run_id = self.book.ranks_run = run
            self.event("attach", f"a notebook attached (kernel pid {os.getpid()})")
            journals.recover(self, run, self.engines.joined.stacks, list(range(self.engines.world_size)))

    def new_run(self) -> None:
        """End the current run; the next cell starts a new one (after a config change)."""
        if self.run_id is not None:
            self.writer.run_status(self.run_id, self.book.final_status(self.run_id))
            self.writer.flush(force=True)
        self.run_id = None
        self.replay.restarts_used = 0
        self.book.config_named = False  # a config was just loaded: its name goes to the next run

    def persist(
        self,
        records: list[Record],
        seq: int | None,
        marks: list[Mark] | None = None,
        *,
        stored: bool = True,
        segments: bool = True,
    ) -> None:
        """Write records to the store (first), as rows and events, with the ``marks`` of the ranks'
        batches they came in; the store refusing keeps them. A training loop's segment event may start
        a new run: what follows it goes there. A replay stores no segment again (``segments``), nor an
        earlier run's records (``stored``)."""
        with self.writer.holding:  # the batches' marks go in the transaction of their records
            chunk: list[Record] = []
            for rec in records if self.run_id is not None and stored else []:
                if is_segment(rec):
                    self._write_records(chunk, seq)
                    chunk = []
                    if segments:
                        self._segment(rec, seq)
                else:
                    chunk.append(rec)
            self._write_records(chunk, seq)
            if self.run_id is not None and marks:
                self.writer.mark(self.run_id, self.cell_seq(seq), marks)
        self.writer.flush()
        if self.run_id is not None and self.config.tensorboard:  # live scalars, after the store
            from dtwork.export.tensorboard import live_tensorboard

            live_tensorboard(self.config.tensorboard, self.run_id, self.config.name, records)

    def _write_records(self, records: list[Record], seq: int | None) -> None:
        if records and self.run_id is not None:
            seq = self.cell_seq(seq)
            if any(rec.get("kind") == Kind.PERF for rec in records):  # a measured training step
                self._trains(self.run_id)
            self.writer.records(self.run_id, seq, self.perf_rate(records))
            self._estimate(records, seq, time.monotonic())
            self._watch_divergence(records)

    def cell_seq(self, seq: int | None) -> int | None:
        """The running cell's seq in the current run (it changed if its training began a new run)."""
        return self.book.cell_seq(seq)

    def _segment(self, rec: Mapping[str, object], seq: int | None) -> None:
        """A training loop began: a new run when it asks for one and this run already trained
        (a new ctx.wrap); then the segment, with what changed since the run's previous one."""
        if self.run_id is None:
            return
        follows, pending, step = None, rec.get("pending"), rec.get("step")
        first = int(step) if isinstance(step, (int, float, str)) and step else 0
        # The rank's loop decides (runtime/core/run_axis.py): it names the pending folder it checkpoints in.
        if isinstance(pending, str) and seq is not None:
            follows = self._begin_run_of_loop(seq, first, rec.get("run"))
            if follows is not None:
                self.book.adopt.append((self.run_id, pending))
            else:
                print(f"dtwork: its checkpoints are in the folder {pending}: resume={pending!r} loads them")
        self._trains(self.run_id)
        what, data = self.book.segment(self.run_id, rec)
        if follows is not None:
            data[FOLLOWS] = follows
        if isinstance(pending, str):
            data[segments.PENDING] = pending
        self.writer.segment(self.run_id, self.cell_seq(seq), first, what, data)

    def _begin_run_of_loop(self, seq: int, first: int, told: object = None) -> dict[str, int] | None:
        """End the current run and go on in a new one from this cell on (its loop trains a new
        model); return where it follows on: the old run, and this cell's seq there."""
        old = self.run_id
        assert old is not None  # the caller checked
        before = self.cell_seq(seq) or seq
        if old in self.book.trained:  # this cell's loop in the old run ended before the new one began
            self.book.outcome[old] = "ok"
            self.book.trained.discard(old)
        try:
            self.writer.run_status(old, self.book.final_status(old))
            self.writer.flush(force=True)
            self.run_id = None
            new = self.ensure_run(told if isinstance(told, int) else None)
            if isinstance(told, int) and told != new:
                print(
                    f"dtwork: ctx.run_id says {told} in this cell: another kernel took that id, the run is {new}"
                )
            self.book.moved[seq] = self.store.move_cell(old, before, new)
        except STORE_ERRORS as exc:
            self.run_id = self.run_id or old
            print(
                f"dtwork: the new model trains in run {self.run_id}: {store_problem(exc, self.writer.path)}"
            )
            return None
        self.book.loop_runs.add(new)
        self.replay.restarts_used = 0
        print(
            f"dtwork: a newly wrapped model: run {new} begins at step {first} "
            f"(run {old} ended; ctx.steps(..., new_run=False) would have gone on with it)"
        )
        return {"run": old, "cell": before}

    def _trains(self, run_id: int) -> None:
        """The running cell trains in ``run_id``: its status is this cell's to set (running again
        after a failed cell of its own)."""
        if run_id not in self.book.trained:
            self.book.trained.add(run_id)
            if self.efficiency is not None:  # looked up once it trains: a cell that does not pays nothing
                self.efficiency.baseline = self._sweep_baseline(run_id)
            if self.book.outcome.get(run_id, "ok") != "ok":
                self.writer.run_status(run_id, "running", ended=False)

    def _watch_divergence(self, records: list[Record]) -> None:
        """The run's first NaN or infinite logged value: an event, and one line in the cell."""
        hit = first_non_finite(records) if self.run_id not in self.book.diverged else None
        if hit is None or self.run_id is None:
            return
        step, name, value = hit
        message = f"{name} is {value} at step {step}: training diverged"
        data = {"step": step, "name": name, "value": value}
        self.writer.event(self.run_id, DIVERGED, message, data)
        self.book.diverged[self.run_id] = divergence_text(data)  # the dashboard's header says it (see feed)
        print(f"dtwork: warning: {message} (lower the learning rate, or clip the gradients)", file=sys.stderr)

    def _estimate(self, records: list[Record], seq: int | None, now: float) -> None:
        """Write the cell's scaling-efficiency estimate when due: an aggregated row of its own, for
        the sidebar and the report, and the dashboard's header."""
        eff = self.efficiency.add(records, now) if self.efficiency and self.run_id is not None else None
        if eff is not None and self.run_id is not None:
            self.writer.records(self.run_id, seq, [eff])
            if self.dashboard is not None and self.live:  # a paused view is fed nothing
                self.dashboard.feed([eff])

    def flush(self, final: bool = False) -> None:
        """Write what waits for the store when due (see ``CellHost.flush``)."""
        self.writer.flush(rows_now=final)

    def event(self, kind: str, message: str, data: Mapping[str, object] | None = None) -> None:
        if self.run_id is not None:
            self.writer.event(self.run_id, kind, message, data)
            self.writer.flush()

    # -- what the cell watcher asks of its host (watcher.CellHost) --------------------------

    def debug_stop(self, rank: int, stop: Mapping[str, object]) -> None:
        from dtwork.kernel import postmortem

        postmortem.drive_stop(self.engines, rank, stop)

    @property
    def engine_log(self) -> Path | None:
        return self.engines.log_file

    def in_background(self, watcher: CellWatcher) -> bool:
        return self.bg is not None and self.bg.watcher is watcher

    def dead_ranks(self, ranks: list[int]) -> dict[int, str]:
        """Ranks whose engine is gone, with why (by PID on this host, by heartbeat elsewhere)."""
        return self.engines.dead_ranks(ranks)

    def interrupt_ranks(self, ranks: list[int]) -> None:
        self.engines.signal(signal.SIGUSR1, ranks)

    def show_progress(self, progress: dict[int, Progress]) -> None:
        if self.dashboard is not None:
            self.dashboard.progress(progress)

    def restart_after_failure(self, why: str) -> None:
        self.restart(why, force=True)

    def stacks(self, ranks: list[int]) -> RankStacks:
        return self.engines.stacks(ranks)

    # -- the engines -----------------------------------------------------------------------

    def restart(self, why: str | None = None, force: bool = False) -> None:
        """Fresh engines and process group; the run goes on (its event says why, when given)."""
        if threading.current_thread() is threading.main_thread():
            self.settle_background()  # not over a background cell's own restart
        if why:
            self.event("restart", f"engines restarted: {why}")
        self.book.ranks_run = None
        self.engines.restart(force=force)

    def tell_ranks(self, run_id: int, *, replaying: bool = False) -> None:
        """Set ``ctx.run_id`` on the ranks (it names the run's checkpoint folder) when it changed;
        a run the kernel began (not a rank's loop) starts their step axis at 0."""
        book = self.book
        if book.ranks_run != run_id:
            new_axis = run_id not in book.loop_runs
            # A token names the folder of a run a loop begins mid-cell; none while replaying.
            token = None if replaying else uuid.uuid4().hex[:12]
            told = (run_id, str(self.store_file), new_axis, run_id in book.last_segment, token)
            ahead = {"next_run": self.store.next_run_id()}  # ctx.run_id of a run a loop begins mid-cell
            self.engines.call(entry.set_run_id, (*told, tuple(book.adopt)), ahead)
            book.ranks_run, book.adopt = run_id, []

    # -- running cells ---------------------------------------------------------------------

    def run_cell(
        self, source: str, *, ranks: list[int] | None, rank0: bool, bg: bool, quiet: bool
    ) -> CellResult:
        if self.bg is not None and self.bg.running:
            raise DtworkError("a background cell is still training: %dtrain wait (or attach) first")
        self.settle_background()
        self.writer.flush(force=True)
        n = self.engines.world_size if ranks is None else len(ranks)
        self.efficiency = LiveEfficiency(n) if n > 1 else None  # before the cell trains or is polled
        try:
            run_id = self.ensure_run()
            seq = self.store.add_cell(run_id, source, ranks=ranks)
            self.book.begin_cell(source)
            if source.lstrip().startswith("%run "):  # a script trains in the run (run_script's cell)
                self._trains(run_id)
        except STORE_ERRORS as exc:
            raise DtworkError(f"the cell did not start: {store_problem(exc, self.writer.path)}") from None
        self.tell_ranks(run_id)
        rank_list = list(range(self.engines.world_size)) if ranks is None else list(ranks)
        if not quiet:
            from dtwork.widgets import dashboard_ready

            # The live view's modules, if they are still loading (Cluster.start began it), load
            # before the ranks start: ~1.5 s of kernel CPU would otherwise compete with the cell.
            dashboard_ready()
        if len(rank_list) < self.engines.world_size:  # so that ctx refuses collectives at once
            self.engines.view(rank_list).apply_async(entry.set_cell_ranks, rank_list)
        # the notebook folder's edited modules, reloaded by the ranks as the cell starts (told on a change)
        self.engines.tell_reload(os.getcwd() if self.autoreload else None)
        # Each engine's queue is in order: what was sent above runs before the cell, so no round trip
        # waits before it; the settings it leaves come back with its own messages.
        ar = self.engines.view(rank_list).execute(source, silent=False, block=False)
        on_records = self._dashboard_feed(run_id, rank_list, quiet, seq)
        self.perf_rate = PerfThinner(len(rank_list))
        watcher = CellWatcher(self, ar, rank_list, seq=seq, rank0=rank0, quiet=quiet, on_records=on_records)
        if bg:
            self.bg = BackgroundCell(watcher, self.replay.replays)
            self.bg.start()
            return watcher.result
        return self.conclude(watcher, watcher.wait())

    def wait_background(self) -> CellResult | None:
        """Bring a background cell back to the foreground and wait for it."""
        bg = self.bg
        if bg is None or bg.concluded:
            return None
        bg.join()  # the cell's end: its failure is told at once, a restart after it goes on (kept)
        bg.concluded = True
        return self.conclude(bg.watcher, bg.watcher.result)

    def settle_background(self) -> None:
        """Let the restart after a background cell's dead rank end before the engines are used."""
        bg = self.bg
        if bg is not None and not bg.running:
            bg.settle()
            if bg.concluded:
                self.bg = None

    def conclude(self, watcher: CellWatcher, result: CellResult) -> CellResult:
        status = {"ok": "ok", "interrupted": "interrupted"}.get(result.status, "error")
        err = (
            None if not result.errors or status != "error" else error_line(result.errors[min(result.errors)])
        )
        seq = self.cell_seq(result.seq)
        if seq is not None and self.run_id is not None:
            self.writer.records(self.run_id, seq, self.perf_rate.flush())
            self._estimate([], seq, math.inf)  # the cell's last estimate, however short it was
            self.writer.finish_cell(self.run_id, seq, status, err)
            cell_settings.record(self.store, self.run_id, seq, watcher.rank0, result)
            for run in self.book.trained:
                self.book.outcome[run] = status
            if status == "error" and self.run_id in self.book.trained:  # not a run this cell did not train in
                self.writer.run_status(self.run_id, "failed", ended=False)
            if status == "error":
                self.event("error", f"cell {seq}: {err}")
            self.writer.flush(force=True)
        self.last = result
        if self.dashboard is not None:
            self.dashboard.finish(result)
        if watcher.dead and not watcher.restarted:
            recovered = self.replay.recover(watcher)
            if recovered is not None:
                return recovered
        if result.errors:
            if not watcher.restarted:  # fresh engines (or a background cell's restarting) have none to settle
                self.engines.settle([r for r in result.errors if r not in watcher.dead])
            if not watcher.restarted and not watcher.dead:
                self._repair_group()
            if status == "error" or not all(map(stopped_by_interrupt, result.errors.values())):
                raise watcher.failure()  # a hand loop's stop is stored and shown as interrupted, not raised
        return result

    def _repair_group(self) -> None:
        """The failing rank aborted the process group (so no rank waits for it): every rank joins
        a new one, keeping engines and namespaces; a restart only if that fails."""
        try:  # bounded: a rank that cannot rejoin must not hold the notebook
            self.engines.view().apply_async(entry.repair_group).get(timeout=REPAIR_SECONDS)
        except Exception as exc:
            print(
                f"dtwork: the process group could not be rebuilt ({exc}): restarting the engines",
                file=sys.stderr,
            )
            self.restart_after_failure("process group not rebuilt after a failed cell")

    def _sweep_baseline(self, run_id: int) -> float | None:
        """The run's 1-rank throughput at this per-slot batch from its latest scaling sweep, if any."""
        per_slot = batch.per_slot(self.engines.global_batch_size, self.engines.world_size)
        try:
            sweeps = [r["data"] for r in self.store.results(run_id, "scaling")]
        except STORE_ERRORS:
            sweeps = []
        return sweep_baseline(sweeps, per_slot)

    def _dashboard_feed(
        self, run_id: int, ranks: list[int], quiet: bool, seq: int | None = None
    ) -> Callable[[list[Record]], None] | None:
        self.dashboard = None  # the last cell's, finished already
        if quiet:
            return None
        try:
            from dtwork.widgets.dashboard import Dashboard
        except ImportError:
            return None

        def feed(records: list[Record]) -> None:
            # Made at the first records: a cell that logs nothing shows no empty dashboard.
            if self.dashboard is None:
                self.dashboard = Dashboard.for_cell(
                    self.run_id or run_id,
                    ranks,
                    seq=self.cell_seq(seq),  # the cell's seq in the run it trains (it may have moved)
                    title=self.config.name,
                    global_batch=self.engines.global_batch_size,
                )
                if self.efficiency is not None and self.efficiency.last is not None:
                    self.dashboard.feed([self.efficiency.last])
            self.dashboard.feed(records)
            if self.run_id in self.book.diverged:
                self.dashboard.diverged = self.book.diverged[self.run_id]

        return feed

    def close(self) -> None:
        """End the session's run (completed, failed or interrupted) and close the store."""
        self.settle_background()
        if self.run_id is not None:
            self.writer.event(self.run_id, "stop", "cluster stopped")
            self.writer.run_status(self.run_id, self.book.final_status(self.run_id))
        if not self.writer.flush(force=True):
            self.writer.lost(f"{self.writer.problem}; the cluster stopped")
        self.stores.close()
        self.run_id = None
