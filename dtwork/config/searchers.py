"""What a search runs next: the seam between a search's trials and whoever runs them.

A searcher hands out pieces of work (a trial, trained to a length) and hears back how each ended,
as Determined's searchers do with their operations. ``Sweep`` (single, grid, random) hands out each
trial once at its own config's length; an adaptive searcher may hand out the same trial again at a
longer length (a promotion) or never again (stopped). The runner asks ``next()`` whenever it can
start something (one rank group free), so a sequential runner and one running trial groups side by
side drive the same searcher.
"""

from __future__ import annotations

from dataclasses import dataclass

from dtwork.config._rules import Length
from dtwork.config.search import Search

__all__ = ["Searcher", "Sweep", "Work", "searcher_for"]


@dataclass(frozen=True)
class Work:
    """One piece of a search: train ``trial`` (1-based) to ``length`` (None: its config's own)."""

    trial: int
    length: Length | None = None
    resume: bool = False  # True: the trial trained before (a shorter length) and goes on from there


class Searcher:
    """Hands out work until the search is done; ``report`` tells it how each piece ended."""

    def __init__(self, plan: Search) -> None:
        self.plan = plan
        self.running: set[int] = set()

    def next(self) -> Work | None:
        """The next piece that can start now, or None (done, or waiting for a running piece)."""
        raise NotImplementedError

    def report(self, work: Work, metric: float | None, ok: bool) -> None:
        """``work`` ended: ``ok`` False when it failed or was interrupted; ``metric`` its last value."""
        self.running.discard(work.trial)

    @property
    def finished(self) -> bool:
        raise NotImplementedError


class Sweep(Searcher):
    """single, grid and random: every trial once, in order, at its config's length."""

    def __init__(self, plan: Search) -> None:
        super().__init__(plan)
        self._queue = list(range(1, len(plan.configs) + 1))

    def next(self) -> Work | None:
        if not self._queue:
            return None
        trial = self._queue.pop(0)
        self.running.add(trial)
        return Work(trial)

    @property
    def finished(self) -> bool:
        return not self._queue and not self.running


def searcher_for(plan: Search) -> Searcher:
    """The searcher a search file names."""
    return Sweep(plan)
