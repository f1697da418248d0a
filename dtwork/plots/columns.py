"""Incremental columns behind the series: per-rank values, means over ranks, sorted steps.

Adding a row costs O(1) when steps come in order (ranks report that way); anything out of order
is still placed exactly. Traces are thinned to evenly spaced points on request, so a redraw of the
live view costs what is drawn, not the length of the run.
"""

from __future__ import annotations

import bisect
from array import array as Column
from collections.abc import Sequence
from typing import Any, NamedTuple, TypeAlias

import numpy as np

__all__ = [
    "Column",
    "MeanColumn",
    "Points",
    "RankSeries",
    "StepMeans",
    "Steps",
    "Trace",
    "pick",
    "step_column",
    "take",
    "value_column",
]


Points: TypeAlias = "list[float] | np.ndarray"  # a trace's x or y: a list, or a numpy array for the widgets


class Trace(NamedTuple):
    """One trace of a figure: its name, x and y (lists, or numpy arrays when thinned) and its
    plotly style (keyword arguments of ``go.Scatter``, axes of a subplot included)."""

    name: str
    x: Any
    y: Any
    style: dict[str, Any]


def step_column() -> Column[int]:
    return Column("q")


def value_column() -> Column[float]:
    return Column("d")


def pick(n: int, max_points: int | None) -> np.ndarray | None:
    """Return evenly spaced indices (the last one always kept) when ``n`` exceeds ``max_points``,
    as an index array numpy takes at once; None when every point stays."""
    if max_points is None or n <= max_points:
        return None
    stride = -(-n // max_points)
    keep = np.arange(0, n, stride)
    if keep[-1] != n - 1:
        keep = np.append(keep, n - 1)
    return keep


def take(seq: Sequence[float], keep: np.ndarray | None, array: bool) -> Points:
    """Return ``seq`` (or its items at ``keep``) as a list, or as a numpy array for the widgets.

    Integer arrays come as int32 when they fit (else float64): the widget protocol sends those
    as binary buffers, while int64 arrays go as JSON lists.
    """
    if not array:
        return list(seq) if keep is None else [seq[i] for i in keep.tolist()]
    out: np.ndarray
    if isinstance(seq, Column) and len(seq):
        # a copy, never a view: a column exporting its buffer could not grow any more
        view = np.frombuffer(seq, dtype=np.int64 if seq.typecode == "q" else np.float64)
        out = view.copy() if keep is None else view[keep]
        del view
    else:
        out = np.asarray(seq if keep is None else [seq[i] for i in keep.tolist()])
    if out.dtype.kind in "iu":
        small = out.size == 0 or (int(out.min()) >= -(2**31) and int(out.max()) < 2**31)
        out = out.astype(np.int32 if small else np.float64)
    return out


class RankSeries:
    """One rank's values of one name: steps in arrival order, the last value of a step wins."""

    __slots__ = ("at", "in_order", "steps", "top", "values")

    def __init__(self) -> None:
        self.steps = step_column()
        self.values = value_column()
        self.at: dict[int, int] = {}  # step -> index
        self.in_order = True  # steps strictly increasing so far
        self.top: int | None = None  # the highest step so far

    def set(self, step: int, value: float) -> bool:
        """Store ``value`` at ``step``; return False unless the step is after every step so far."""
        i = self.at.get(step)
        if i is not None:
            self.values[i] = value
            return False
        fresh = self.top is None or step > self.top
        if fresh:
            self.top = step
        self.in_order = self.in_order and fresh
        self.at[step] = len(self.steps)
        self.steps.append(step)
        self.values.append(value)
        return fresh

    def latest(self) -> float:
        """The value at the highest step."""
        if self.in_order:
            return self.values[-1]
        return self.values[self.at[self.top]]  # type: ignore[index]  # a value was set: top is a step

    def sorted_keys(self) -> Sequence[int]:
        return self.steps if self.in_order else sorted(self.steps)

    def carried(self, keys: Sequence[int], step: int) -> float:
        """The value at the last step at or before ``step`` (``keys``: sorted_keys())."""
        return self.values[self.at[keys[bisect.bisect_right(keys, step) - 1]]]

    def trace(self, keep_max: int | None, array: bool) -> tuple[Points, Points]:
        keep = pick(len(self.steps), keep_max)
        return take(self.steps, keep, array), take(self.values, keep, array)


class StepMeans:
    """Means over ranks per step of one per-rank name (the last value of a rank's step wins)."""

    __slots__ = ("by_rank", "low", "sums")

    def __init__(self) -> None:
        self.sums: dict[int, list[float]] = {}  # step -> [sum, count]
        self.by_rank: dict[int, RankSeries] = {}
        self.low: int | None = None  # the lowest step whose mean changed since take_low()

    def add(self, step: int, rank: int, value: float) -> bool:
        """Add a value; return True when ``step`` is new for this name."""
        if self.low is None or step < self.low:
            self.low = step
        series = self.by_rank.get(rank)
        if series is None:  # not setdefault: a long cell's drawing adds a million rows
            series = self.by_rank[rank] = RankSeries()
        i = series.at.get(step)
        total = self.sums.get(step)
        if i is not None and total is not None:  # a rank's step reported again: replace it
            total[0] += value - series.values[i]
            series.set(step, value)
            return False
        series.set(step, value)
        if total is None:
            self.sums[step] = [value, 1]
            return True
        total[0] += value
        total[1] += 1
        return False

    def take_low(self) -> int | None:
        """The lowest step whose mean changed since the last call (None: none did)."""
        low, self.low = self.low, None
        return low


class Steps:
    """A sorted list of distinct steps, appended to in O(1) when steps come in order."""

    __slots__ = ("low", "seen", "steps")

    def __init__(self) -> None:
        self.steps = step_column()
        self.seen: set[int] = set()
        self.low: int | None = None  # the lowest index changed since take_low()

    def add(self, step: int) -> None:
        if step in self.seen:
            return
        self.seen.add(step)
        if not self.steps or step > self.steps[-1]:
            i = len(self.steps)
            self.steps.append(step)
        else:
            i = bisect.bisect_left(self.steps, step)
            self.steps.insert(i, step)
        if self.low is None or i < self.low:
            self.low = i

    def take_low(self) -> int:
        """The lowest index changed since the last call (the length when none was)."""
        low, self.low = self.low, None
        return len(self.steps) if low is None else low


class MeanColumn:
    """The means of a :class:`StepMeans` at every step of a :class:`Steps` (0.0 where no rank
    reported), brought up to date from the first step that changed, so that a redraw computes the
    means of the new steps only."""

    __slots__ = ("means", "values")

    def __init__(self, means: StepMeans) -> None:
        self.means = means
        self.values = value_column()

    def update(self, steps: Sequence[int], changed: int) -> Column[float]:
        """Bring the column up to date; ``changed``: the lowest index of ``steps`` that changed
        (inserted) since the last update. Return the column (one value per step)."""
        start = min(changed, len(self.values))
        low = self.means.take_low()
        if low is not None:
            start = min(start, bisect.bisect_left(steps, low))
        del self.values[start:]
        sums = self.means.sums
        self.values.extend(
            (t[0] / t[1]) if (t := sums.get(steps[i])) else 0.0 for i in range(start, len(steps))
        )
        return self.values
