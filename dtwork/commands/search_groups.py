"""Trials side by side: a search whose ``resources.slots_per_trial`` is less than the cluster's ranks.

The ranks split into groups of ``slots_per_trial`` consecutive ranks (``layout``), each its own
process group made once from the cluster's (no restart). Each free group takes the searcher's next
piece of work as soon as it is free, up to ``searcher.max_concurrent_trials`` at once: its ranks
make the group their world with the trial's config (``ctx.rank``, ``ctx.world_size``, DDP, the
collectives, ``ctx.loader``'s shards and the records are the group's), the cell runs on them
without blocking, and the kernel polls every running trial's watcher in turn, each writing its
records to its trial's run. A trial that fails costs that trial: its group is made again by its
ranks before their next trial, the other groups train on. Ctrl-C asks every running trial for a
consistent stop and records them interrupted.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from dtwork.config import ExperimentConfig
from dtwork.config.search import Search
from dtwork.config.searchers import Searcher, Work
from dtwork.errors import DtworkError
from dtwork.kernel.trial_cell import TrialCell
from dtwork.kernel.watcher import POLL_SECONDS, interrupts_as_flags
from dtwork.runtime import trials

if TYPE_CHECKING:
    from dtwork.cluster import Cluster

__all__ = ["Job", "concurrency", "error_text", "layout", "run_in_groups", "said"]


class Trial(Protocol):
    """What this runner reads and sets of a search's trial (``search.Trial``)."""

    number: int
    hparams: dict[str, Any]
    status: str
    metric: float | None
    error: str | None


def said(hp: Mapping[str, Any]) -> str:
    """A trial's hyperparameters in one line."""
    return ", ".join(f"{k}={v!r}" for k, v in hp.items()) or "no hyperparameters"


def error_text(exc: BaseException) -> str:
    """The error a failed trial ends with: a rank's traceback ends with its exception's line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return lines[-1] if lines else type(exc).__name__


def layout(world_size: int, slots: int | None) -> list[list[int]] | None:
    """The trial groups, consecutive ranks ``slots`` at a time; None when a trial takes the whole
    cluster (no ``slots_per_trial``, or as many as there are ranks, or more: one after another)."""
    if slots is None or slots >= world_size:
        return None
    if world_size % slots:
        fits = [n for n in range(1, world_size) if world_size % n == 0]
        raise DtworkError(
            f"resources.slots_per_trial {slots} does not divide the cluster's {world_size} ranks into "
            f"trial groups: use {' or '.join(map(str, fits))}, or start {world_size - world_size % slots + slots} "
            "ranks (%dtrain start -n N)"
        )
    return [list(range(i, i + slots)) for i in range(0, world_size, slots)]


def concurrency(groups: int, max_concurrent_trials: int | None) -> int:
    """How many trials run at once: one per group, at most ``max_concurrent_trials``."""
    return groups if max_concurrent_trials is None else max(1, min(groups, max_concurrent_trials))


@dataclass
class _Running:
    """A trial running on a group: the group's index, the work, the trial, its cell."""

    group: int
    work: Work
    trial: Trial
    cell: TrialCell


Ended = Callable[[Work, "int | None"], None]  # a piece ended in its run (None: none began): search._ended


@dataclass(frozen=True)
class Job:
    """A search as its runner needs it: the plan, the cell, the trials by number (1-based), each
    piece of work's config (the searcher's length in it), how an ended piece is noted (and reported to
    the searcher), and the run a piece resumes from (an ASHA promotion; None: it starts afresh)."""

    plan: Search
    code: str
    trials: Sequence[Trial]
    config_for: Callable[[Work], ExperimentConfig]
    ended: Ended
    resume_from: Callable[[Work], int | None]
    quiet: bool = False


def run_in_groups(cluster: Cluster, job: Job, searcher: Searcher, groups: list[list[int]]) -> None:
    """Run the searcher's work on ``groups`` of ``cluster``'s ranks, several trials at once."""
    if cluster.checks_collectives:  # the checking wrapper groups are the world's, not a trial group's
        raise DtworkError(
            "a search on rank groups runs with collectives unchecked: %dtrain collectives off first"
        )
    cluster.engines.call(trials.make_groups, (groups,), {})  # every rank, every group, in the same order
    runner = _Runner(cluster, job, searcher, groups)
    try:
        with interrupts_as_flags() as pending:
            while runner.start_free():
                runner.poll()
                if pending:
                    pending.clear()
                    runner.stop()
    finally:
        if runner.lost:  # a rank died: fresh engines, the world's group (the search's are gone)
            cluster.session.restart("a rank died during a search", force=True)
        else:
            cluster.engines.call(trials.end_search, (), {})


class _Runner:
    """The groups, which are free, broken or lost, and the trials running on them."""

    def __init__(self, cluster: Cluster, job: Job, searcher: Searcher, groups: list[list[int]]) -> None:
        self.cluster, self.job, self.searcher, self.groups = cluster, job, searcher, groups
        self.free = list(range(concurrency(len(groups), job.plan.max_concurrent_trials)))
        self.broken: set[int] = set()  # a failure shut their sockets: made again before their next trial
        self.lost: set[int] = set()  # a rank of theirs died: no more trials there
        self.running: list[_Running] = []
        self.stopping = False

    def start_free(self) -> bool:
        """Give each free group the searcher's next work; whether any trial runs now."""
        while self.free and not self.stopping and (work := self.searcher.next()) is not None:
            g = self.free.pop(0)
            trial = self.job.trials[work.trial - 1]
            cell = _start(self.cluster, self.job, work, self.groups[g], g in self.broken)
            self.broken.discard(g)
            if isinstance(cell, TrialCell):
                self.running.append(_Running(g, work, trial, cell))
                continue
            self.broken.add(g)  # it failed before its cell ran: the group is made again for the next
            self.free.append(g)
            self.job.ended(work, cell)
        return bool(self.running)

    def poll(self) -> None:
        """One round over the running trials: conclude those whose cell ended, free their groups."""
        first = self.running[0].cell.watcher
        assert first is not None  # started
        first.ar.wait(POLL_SECONDS / len(self.running))
        for r in [r for r in self.running if r.cell.ended()]:
            self.running.remove(r)
            ended = _end(self.cluster, r, self.stopping, self.job.quiet)
            if ended == "lost":
                self.lost.add(r.group)
            else:
                self.broken.update([r.group] if ended == "broken" else [])
                self.free.append(r.group)
            self.job.ended(r.work, r.cell.run_id)

    def stop(self) -> None:
        """Ctrl-C: no new trial; the running ones stop at a step all their ranks agree on (again:
        their groups are aborted)."""
        if not self.stopping and not self.job.quiet:
            print(f"dtwork: search stopped: {len(self.running)} running trial(s) asked to stop")
        self.stopping = True
        for r in self.running:
            assert r.cell.watcher is not None  # started
            r.cell.watcher.interrupt()


def _start(cluster: Cluster, job: Job, work: Work, ranks: list[int], rebuild: bool) -> TrialCell | int | None:
    """Start a trial's cell on ``ranks``; the cell, or (it failed to start) its run id if it had one."""
    plan, trial = job.plan, job.trials[work.trial - 1]
    note = f"trial {trial.number}/{len(job.trials)} of the {plan.searcher} search {plan.label}"
    if not job.quiet:
        print(f"dtwork: {note} on ranks {ranks[0]}-{ranks[-1]}: {said(trial.hparams)}")
    cell: TrialCell | None = None
    try:
        cell = TrialCell(cluster.session, ranks, job.config_for(work), note)
        cell.start(job.code, rebuild, job.resume_from(work))
        return cell
    except Exception as exc:
        trial.status, trial.error = "failed", error_text(exc)
        if cell is not None:
            cell.session.writer.run_status(cell.run_id, "failed")
        if not job.quiet:
            print(f"dtwork: trial {trial.number} did not start: {trial.error}")
        return None if cell is None else cell.run_id


def _end(cluster: Cluster, r: _Running, stopping: bool, quiet: bool) -> str:
    """Conclude a trial whose cell ended; return its group's state: "lost" (a rank died), "broken"
    (made again before its next trial) or "ok"."""
    watcher = r.cell.watcher
    assert watcher is not None  # started
    result = watcher.finish()
    r.trial.status = r.cell.conclude(result, stopping)
    state = "lost" if watcher.dead else "broken" if result.errors or r.cell.broken else "ok"
    if result.errors:
        r.trial.error = r.cell.error or r.cell.cause(result)
        if not quiet and r.trial.status == "failed":
            print(f"dtwork: trial {r.trial.number} failed: {r.trial.error}")
        if watcher.dead:
            return state
        cluster.engines.settle(list(result.errors))
    cluster.engines.call(trials.end_trial, (), {}, r.cell.ranks)
    return state
