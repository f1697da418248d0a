"""What a search runs next: the seam between a search's trials and whoever runs them.

A searcher hands out pieces of work (a trial, trained to a length) and hears back how each ended,
as Determined's searchers do with their operations. ``Sweep`` (single, grid, random) hands out each
trial once at its own config's length; an adaptive searcher may hand out the same trial again at a
longer length (a promotion) or never again (stopped). The runner asks ``next()`` whenever it can
start something (one rank group free), so a sequential runner and one running trial groups side by
side drive the same searcher.
"""

from __future__ import annotations

import abc
import math
from dataclasses import dataclass

from dtwork.config._rules import Length
from dtwork.config.asha import WORST, Bracket
from dtwork.config.search import Search

__all__ = ["AshaSearcher", "Searcher", "Sweep", "Work", "searcher_for"]


@dataclass(frozen=True)
class Work:
    """One piece of a search: train ``trial`` (1-based) to ``length`` (None: its config's own)."""

    trial: int
    length: Length | None = None
    resume: bool = False  # True: the trial trained before (a shorter length) and goes on from there


class Searcher(abc.ABC):
    """Hands out work until the search is done; ``report`` tells it how each piece ended."""

    def __init__(self, plan: Search) -> None:
        self.plan = plan
        self.running: set[int] = set()

    @abc.abstractmethod
    def next(self) -> Work | None:
        """The next piece that can start now, or None (done, or waiting for a running piece)."""

    def report(self, work: Work, metric: float | None, ok: bool) -> None:
        """``work`` ended: ``ok`` False when it failed or was interrupted; ``metric`` its last value."""
        self.running.discard(work.trial)

    @property
    @abc.abstractmethod
    def finished(self) -> bool:
        """Whether every piece has been handed out and has ended."""

    def rung(self, trial: int) -> int | None:
        """The rung (0-based) ``trial`` trains to now, or trained to last, for a searcher with rungs."""
        return None

    def stopped(self, trial: int) -> bool:
        """Whether the searcher stopped ``trial`` short of its full length (not a failure)."""
        return False


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


class AshaSearcher(Searcher):
    """adaptive_asha and async_halving (``config/asha.py``): each bracket's queue of trials to train
    to a rung. Trials are numbered as they start, in the order of the plan's drawn configs. The next
    piece is a promotion before a new trial (the highest rung first, as in Li et al.'s ASHA), taken
    from the brackets in turn, each within its ``max_concurrent_trials``; a promoted trial resumes."""

    def __init__(self, plan: Search) -> None:
        super().__init__(plan)
        assert plan.asha is not None  # load_search made it for these searchers
        self.asha = plan.asha
        self.brackets = [Bracket(b, plan.asha.divisor) for b in plan.asha.brackets]
        self.bracket_of: dict[int, Bracket] = {}
        self.started = 0
        self.turn = 0  # the bracket that goes first on a tie

    def next(self) -> Work | None:
        choices = []
        for i, b in enumerate(self.brackets):
            busy = sum(1 for t in self.running if self.bracket_of[t] is b)
            if b.queue and busy < b.plan.max_concurrent_trials:
                best = max(range(len(b.queue)), key=lambda j: (b.queue[j][1], -j))
                choices.append((b.queue[best][1], -((i - self.turn) % len(self.brackets)), i, best))
        if not choices:
            return None
        rung, _, i, j = max(choices)
        bracket = self.brackets[i]
        trial, _ = bracket.queue.pop(j)
        self.turn = (i + 1) % len(self.brackets)
        if trial is None:
            self.started += 1
            trial = self.started
            bracket.start(trial)
            self.bracket_of[trial] = bracket
        self.running.add(trial)
        return Work(trial, Length(self.asha.unit, bracket.plan.lengths[rung]), resume=rung > 0)

    def report(self, work: Work, metric: float | None, ok: bool) -> None:
        super().report(work, metric, ok)
        bracket = self.bracket_of[work.trial]
        if not ok or metric is None or not math.isfinite(metric):
            bracket.failed.add(work.trial)  # the worst of its rung, as Determined counts an exited trial
            value = WORST
        else:
            value = metric if self.plan.smaller_is_better else -metric
        bracket.result(work.trial, value)

    @property
    def finished(self) -> bool:
        return not self.running and not any(b.queue for b in self.brackets)

    def rung(self, trial: int) -> int | None:
        bracket = self.bracket_of.get(trial)
        return None if bracket is None else bracket.rung_of[trial]

    def stopped(self, trial: int) -> bool:
        bracket = self.bracket_of.get(trial)
        return bracket is not None and trial not in bracket.failed and bracket.stopped(trial)


def searcher_for(plan: Search) -> Searcher:
    """The searcher a search file names."""
    return AshaSearcher(plan) if plan.asha is not None else Sweep(plan)
