"""Asynchronous successive halving (ASHA), as Determined's ``adaptive_asha`` and ``async_halving`` run it.

Li et al., "A System for Massively Parallel Hyperparameter Tuning" (MLSys 2020). A bracket of
``n`` rungs trains trials to rung lengths

    length_k = max(floor(max_length / divisor^(n-1-k)), 1),  k = 0 .. n-1

(the top rung is ``max_length``). Every trial starts at rung 0. When a trial completes rung k
with metric m, m joins rung k's sorted list; with c results there, the best floor(c / divisor) of
them are promoted to rung k+1, each once, as soon as they are among those best: the new result at
once when it ranks within them, else the result at place floor((c-1)/divisor) when that count
grew. A trial that fails counts as the worst result of its rung (it is never promoted unless every
other place is taken, and then ends there too). A promotion or a new trial (up to ``max_trials``)
follows each result; a trial not promoted is stopped at its rung (Determined closes it once every
trial has a rung-0 result; it is never promoted after that).

This is Determined's promotion-based searcher (``master/pkg/searcher/asha.go``, its
``promotionsAsync``) with its rung lengths (``asha_stopping.go``'s
``makeRungs``: a rung's length is the total a trial has trained at it). ``adaptive_asha`` runs
several brackets side by side (``adaptive_asha.go``'s ``makeBrackets``): ``max_rungs`` capped so
that the top rung still gets a trial,

    max_rungs' = min(max_rungs, floor(log(max_length)/log(divisor)) + 1,
                     floor(log(max_trials)/log(divisor)) + 1)

and ``mode`` picking the brackets' rung counts (aggressive: max_rungs'; standard:
floor((max_rungs'-1)/2)+1 .. max_rungs'; conservative: 1 .. max_rungs'), or ``bracket_rungs``
naming them. Trials split across brackets for equal budget: bracket i's weight is
divisor^(n_i-1)/n_i, it gets max(floor(weight_i/total * max_trials), 1) trials and the first
bracket the remainder; ``max_concurrent_trials`` splits evenly (the remainder to the first).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dtwork.config._rules import LENGTH_UNITS, Length, error

__all__ = ["ASHA_SEARCHERS", "AshaPlan", "Bracket", "BracketPlan", "asha_plan", "rung_lengths"]

ASHA_SEARCHERS = ("adaptive_asha", "async_halving")
MODES = ("aggressive", "standard", "conservative")
WORST = math.inf  # a failed trial's result: below every real one
# The searcher fields an ASHA search reads; a trial's own config does not carry them.
ASHA_FIELDS = (
    "max_trials",
    "max_concurrent_trials",
    "divisor",
    "max_rungs",
    "mode",
    "bracket_rungs",
    "num_rungs",
    "time_metric",
    "max_time",
    "stop_once",
)


@dataclass(frozen=True)
class BracketPlan:
    """One bracket: its rung lengths (in ``unit``), its trials and how many may run at once."""

    lengths: tuple[int, ...]
    max_trials: int
    max_concurrent_trials: int


@dataclass(frozen=True)
class AshaPlan:
    """An ASHA search's brackets, most aggressive first, over lengths in ``unit``."""

    unit: str
    divisor: float
    brackets: tuple[BracketPlan, ...]

    @property
    def max_length(self) -> Length:
        return Length(self.unit, max(b.lengths[-1] for b in self.brackets))


def rung_lengths(max_length: int, num_rungs: int, divisor: float) -> tuple[int, ...]:
    """Each rung's length: max(floor(max_length / divisor^(num_rungs-1-k)), 1)."""
    return tuple(max(int(max_length / divisor ** (num_rungs - k - 1)), 1) for k in range(num_rungs))


def _int(searcher: Mapping[str, Any], name: str, label: str, default: int | None, lo: int) -> int:
    value = searcher.get(name, default)
    if value is None:
        value = default
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise error(
            f"{label}: searcher.{name}: {searcher.get('name')} needs {name}: N (a whole number >= {lo})"
        )
    return value


def _length(searcher: Mapping[str, Any], label: str) -> Length:
    """``time_metric`` + ``max_time`` (Determined's newer form) or ``max_length`` (the older one)."""
    if "max_time" in searcher or "time_metric" in searcher:
        unit, count = searcher.get("time_metric"), searcher.get("max_time")
        if unit not in LENGTH_UNITS:
            raise error(
                f"{label}: searcher.time_metric: dtwork measures a trial's length in "
                f"{', '.join(LENGTH_UNITS)}: use time_metric: batches (got {unit!r})"
            )
        raw: Any = {unit: count}
    else:
        raw = searcher.get("max_length")
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = {"batches": raw}  # Determined's legacy bare length
    if isinstance(raw, Mapping) and len(raw) == 1:
        unit, count = next(iter(raw.items()))
        if unit in LENGTH_UNITS and isinstance(count, int) and not isinstance(count, bool) and count >= 1:
            return Length(unit, count)
    raise error(
        f"{label}: searcher.max_time: {searcher.get('name')} needs the longest a trial trains: "
        "time_metric: batches and max_time: N (or max_length: {batches: N})"
    )


def _divisor(searcher: Mapping[str, Any], label: str) -> float:
    value = searcher.get("divisor", 4)
    value = 4 if value is None else value
    if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 1:
        raise error(f"{label}: searcher.divisor must be a number > 1 (the default is 4), got {value!r}")
    return float(value)


def asha_plan(searcher: Mapping[str, Any], label: str) -> AshaPlan:
    """The brackets of an ``adaptive_asha`` or ``async_halving`` searcher section, with Determined's
    defaults (divisor 4, max_rungs 5, mode standard, max_concurrent_trials 16)."""
    name = searcher.get("name")
    length, divisor = _length(searcher, label), _divisor(searcher, label)
    max_trials = _int(searcher, "max_trials", label, None, 1)
    concurrent = _int(searcher, "max_concurrent_trials", label, 16, 0)
    if name == "async_halving":
        rungs = [_int(searcher, "num_rungs", label, None, 1)]
    else:
        rungs = _bracket_rungs(searcher, label, length.value, max_trials, divisor)
    rungs.sort(reverse=True)  # the brackets that stop most early first
    trials = _bracket_trials(max_trials, divisor, rungs)
    at_once = _bracket_concurrency(concurrent, divisor, trials)
    brackets = tuple(
        BracketPlan(rung_lengths(length.value, n, divisor), t, c)
        for n, t, c in zip(rungs, trials, at_once, strict=True)
    )
    return AshaPlan(length.unit, divisor, brackets)


def _bracket_rungs(
    searcher: Mapping[str, Any], label: str, max_length: int, max_trials: int, divisor: float
) -> list[int]:
    given = searcher.get("bracket_rungs") or []
    if given:
        if not isinstance(given, list) or not all(
            isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in given
        ):
            raise error(f"{label}: searcher.bracket_rungs is a list of rung counts >= 1, got {given!r}")
        return list(given)
    mode = searcher.get("mode") or "standard"
    if mode not in MODES:
        raise error(f"{label}: searcher.mode must be one of {', '.join(MODES)}, got {mode!r}")
    max_rungs = min(
        _int(searcher, "max_rungs", label, 5, 1),
        int(math.log(max_length) / math.log(divisor)) + 1,  # the top rung still longer than rung 0
        int(math.log(max_trials) / math.log(divisor)) + 1,  # and still reached by a trial
    )
    if mode == "aggressive":
        return [max_rungs]
    first = 1 if mode == "conservative" else (max_rungs - 1) // 2 + 1
    return list(range(first, max_rungs + 1))


def _bracket_trials(max_trials: int, divisor: float, rungs: list[int]) -> list[int]:
    weights = [divisor ** (n - 1) / n for n in rungs]
    total = sum(weights)
    trials = [max(int(w / total * max_trials), 1) for w in weights]
    trials[0] += max(max_trials - sum(trials), 0)
    return trials


def _bracket_concurrency(concurrent: int, divisor: float, trials: list[int]) -> list[int]:
    n = len(trials)
    if concurrent == 0:
        return [max(trials[-1], int(divisor))] * n
    concurrent = max(concurrent, n)
    each, extra = divmod(concurrent, n)
    return [each + (1 if i < extra else 0) for i in range(n)]


@dataclass
class _Rung:
    length: int
    results: list[tuple[float, int]] = field(default_factory=list)  # (metric, trial), best first
    promoted: set[int] = field(default_factory=set)


class Bracket:
    """One bracket's rungs and its queue of work: (trial, rung) pairs, a trial None for a new one.

    The caller numbers a new trial when it starts it (``start``) and reports each trial's metric at
    the rung it trained to (``result``; smaller is better here: the caller negates a metric where
    larger is better, and gives WORST for a failed trial). Each result queues what Determined's
    searcher asks for next: the trials it promotes, else a new trial while fewer than max_trials
    exist. The first queue holds as many new trials as may run at once.
    """

    def __init__(self, plan: BracketPlan, divisor: float) -> None:
        self.plan = plan
        self.divisor = divisor
        self.rungs = [_Rung(n) for n in plan.lengths]
        self.rung_of: dict[int, int] = {}  # trial -> the rung it trains to, or reached
        self.failed: set[int] = set()  # failed, or ended without a metric: the worst of its rung
        first = plan.max_concurrent_trials or int(divisor ** (len(plan.lengths) - 1))
        self.queue: list[tuple[int | None, int]] = [(None, 0)] * max(1, min(first, plan.max_trials))
        self.made = len(self.queue)  # trials made so far, started or queued (Determined's TrialRungs)

    def start(self, trial: int) -> None:
        """``trial``, new, begins at rung 0."""
        self.rung_of[trial] = 0

    def stopped(self, trial: int) -> bool:
        """Whether ``trial`` completed a rung below the top without a promotion (so far)."""
        k = self.rung_of.get(trial)
        return k is not None and k < len(self.rungs) - 1 and any(t == trial for _, t in self.rungs[k].results)

    def result(self, trial: int, metric: float) -> None:
        """``trial`` completed its rung with ``metric``: its promotions, or a new trial, are queued."""
        promoted = self._result(trial, metric)
        self.queue.extend((t, self.rung_of[t]) for t in promoted)
        if not promoted and self.made < self.plan.max_trials:
            self.queue.append((None, 0))
            self.made += 1

    def _result(self, trial: int, metric: float) -> list[int]:
        k = self.rung_of[trial]
        rung = self.rungs[k]
        if k == len(self.rungs) - 1:
            bisect.insort(rung.results, (metric, trial))
            return []
        promoted: list[int] = []
        for chosen in self._promotions(rung, trial, metric):
            self.rung_of[chosen] = k + 1
            if chosen in self.failed:  # as if it trained on and came last again
                return self._result(chosen, WORST)
            promoted.append(chosen)
        return promoted

    def _promotions(self, rung: _Rung, trial: int, metric: float) -> list[int]:
        """asha.go's promotionsAsync: the best floor(c / divisor) of a rung's c results go on."""
        before = int(len(rung.results) / self.divisor)
        after = int((len(rung.results) + 1) / self.divisor)
        # after equal results already there (Determined's sort.Search for the first greater)
        place = bisect.bisect_right([m for m, _ in rung.results], metric)
        rung.results.insert(place, (metric, trial))
        if place < after:
            rung.promoted.add(trial)
            return [trial]
        if after != before:
            other = rung.results[before][1]
            if other not in rung.promoted:
                rung.promoted.add(other)
                return [other]
        return []
