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

from dtwork.config.search import Search
from dtwork.config.searchers import Searcher, Work
from dtwork.errors import DtworkError
from dtwork.kernel.trial_cell import TrialCell
from dtwork.kernel.watcher import POLL_SECONDS, interrupts_as_flags
from dtwork.runtime import trials

if TYPE_CHECKING:
    from dtwork.cluster import Cluster

__all__ = ["concurrency", "error_text", "layout", "run_in_groups", "said"]


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


Record = Callable[["Trial", "int | None"], None]  # note a trial that ended (search._record)


def run_in_groups(
    cluster: Cluster,
    plan: Search,
    code: str,
    trials_: Sequence[Trial],
    searcher: Searcher,
    groups: list[list[int]],
    record: Record,
    quiet: bool = False,
) -> None:
    """Run the search's work on ``groups`` of ``cluster``'s ranks, several trials at once: ``trials_``
    by number (1-based), ``record`` notes each as it ends."""
    if cluster.checks_collectives:  # the checking wrapper groups are the world's, not a trial group's
        raise DtworkError(
            "a search on rank groups runs with collectives unchecked: %dtrain collectives off first"
        )
    engines, n = cluster.engines, len(trials_)
    engines.call(trials.make_groups, (groups,), {})  # every rank, every group, in the same order
    free = list(range(concurrency(len(groups), plan.max_concurrent_trials)))
    broken: set[int] = set()  # groups whose sockets a failure shut: made again before their next trial
    running: list[_Running] = []
    stopping = False
    try:
        with interrupts_as_flags() as pending:
            while True:
                while free and not stopping and (work := searcher.next()) is not None:
                    g = free.pop(0)
                    now = _start(
                        cluster, plan, code, trials_[work.trial - 1], work, groups[g], g in broken, n, quiet
                    )
                    broken.discard(g)
                    if isinstance(now, TrialCell):
                        running.append(_Running(g, work, trials_[work.trial - 1], now))
                    else:  # it failed before its cell ran: the group is made again for the next
                        broken.add(g)
                        free.append(g)
                        record(trials_[work.trial - 1], now)
                        searcher.report(work, None, ok=False)
                if not running:
                    break
                running[0].cell.watcher.ar.wait(POLL_SECONDS / len(running))  # type: ignore[union-attr]
                for r in [r for r in running if r.cell.ended()]:
                    running.remove(r)
                    if _end(cluster, r, stopping, quiet):
                        broken.add(r.group)
                    free.append(r.group)
                    record(r.trial, r.cell.run_id)
                    searcher.report(r.work, r.trial.metric, ok=r.trial.status == "completed")
                if pending and running:
                    pending.clear()
                    if not stopping and not quiet:
                        print(f"dtwork: search stopped: {len(running)} running trial(s) asked to stop")
                    stopping = True
                    for r in running:
                        r.cell.watcher.interrupt()  # type: ignore[union-attr]
                elif pending:
                    stopping = True
    finally:
        engines.call(trials.end_search, (), {})


def _start(
    cluster: Cluster,
    plan: Search,
    code: str,
    trial: Trial,
    work: Work,
    ranks: list[int],
    rebuild: bool,
    n: int,
    quiet: bool,
) -> TrialCell | int | None:
    """Start a trial's cell on ``ranks``; the cell, or (it failed to start) its run id if it had one."""
    note = f"trial {trial.number}/{n} of the {plan.searcher} search {plan.label}"
    if not quiet:
        print(f"dtwork: {note} on ranks {ranks[0]}-{ranks[-1]}: {said(trial.hparams)}")
    cell: TrialCell | None = None
    try:
        cell = TrialCell(cluster.session, ranks, plan.configs[work.trial - 1], note)
        cell.start(code, rebuild)
        return cell
    except Exception as exc:
        trial.status, trial.error = "failed", error_text(exc)
        if cell is not None:
            cell.session.writer.run_status(cell.run_id, "failed")
        if not quiet:
            print(f"dtwork: trial {trial.number} did not start: {trial.error}")
        return None if cell is None else cell.run_id


def _end(cluster: Cluster, r: _Running, stopping: bool, quiet: bool) -> bool:
    """Conclude a trial whose cell ended; return whether its group must be made again."""
    watcher = r.cell.watcher
    assert watcher is not None  # started
    result = watcher.finish()
    r.trial.status = r.cell.conclude(result, stopping)
    failed = bool(result.errors) or r.cell.broken
    if result.errors:
        r.trial.error = error_text(watcher.failure())
        if not quiet and r.trial.status == "failed":
            print(f"dtwork: trial {r.trial.number} failed: {r.trial.error}")
        cluster.engines.settle([x for x in result.errors if x not in watcher.dead])
    cluster.engines.call(trials.end_trial, (), {}, r.cell.ranks)
    return failed
