"""The ranks' progress as a cell's watcher sees it: steps, step times, stalls, stops at
``breakpoint()``, plain lines of text.

Each rank publishes its latest progress (``runtime/core/publish.py``); this keeps the latest by
rank, the slowest rank's step time (an interrupt's grace follows it), names a stall once, and,
outside a notebook, says the slowest rank's step and the last logged values now and then.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import TypedDict

from dtwork.shared.records import Kind

PROGRESS_SECONDS = 5.0  # how often a cell outside a notebook prints a line of progress


class Progress(TypedDict, total=False):
    """One rank's latest progress, as its publisher sends it."""

    rank: int
    time: float  # when it was sent (time.time())
    step: int
    total: int | None
    phase: str


def stopped_first(progress: Mapping[int, Progress]) -> dict[int, Progress]:
    """The ranks whose progress stopped first: the fewest steps (a rank waiting in a collective has
    gone on to the next step); all of them when the steps do not tell."""
    going = {r: p for r, p in progress.items() if p.get("phase") != "done"} or dict(progress)
    steps = {r: p["step"] for r, p in going.items() if isinstance(p.get("step"), int)}
    if not steps:
        return dict(going)
    low = min(steps.values())
    return {r: going[r] for r, s in steps.items() if s == low}


class ProgressWatch:
    """The latest progress by rank, the slowest step time, stalls named once, plain progress lines."""

    def __init__(self, text: bool) -> None:
        self.progress: dict[int, Progress] = {}
        self.changed = False  # since the live view was last given it
        self.text = text  # say progress in plain lines (no live view: a script, a terminal)
        self._step_times: dict[object, float] = {}  # each rank's latest measured step time (perf records)
        self._stall_warned: set[tuple[int, object]] = set()  # (rank, step) already named
        self._said_at = time.monotonic()
        self._last_values: dict[str, object] = {}
        self.stops: list[tuple[int, dict[str, object]]] = []  # ranks at breakpoint(), not yet prompted
        self._stops_seen: dict[int, object] = {}  # each rank's latest stop number

    def take(self, rank: int, progress: Progress) -> None:
        """A rank's latest progress, as found in its metadata."""
        if progress != self.progress.get(rank):
            self.progress[rank] = progress
            self.changed = True

    def stopped(self, rank: int, stop: Mapping[str, object]) -> bool:
        """A rank says it stopped at ``breakpoint()`` (its metadata keeps saying so): whether this
        stop is new, queued once for its prompt."""
        if self._stops_seen.get(rank) == stop.get("stop"):
            return False
        self._stops_seen[rank] = stop.get("stop")
        self.stops.append((rank, dict(stop)))
        return True

    def excuse(self) -> None:
        """The ranks waited while one was at a pdb prompt: the progress they show now is no stall."""
        self._stall_warned.update((r, p.get("step")) for r, p in self.progress.items())

    def keep(self, batch: Sequence[Mapping[str, object]]) -> None:
        """The slowest rank's latest step time, and (for plain lines) the last logged values."""
        for rec in batch:
            values = rec.get("values") if isinstance(rec, Mapping) else None
            if not isinstance(values, dict):
                continue
            if rec.get("kind") == Kind.PERF:
                t = values.get("step_time")
                if isinstance(t, (int, float)) and t >= 0:
                    self._step_times[rec.get("rank")] = float(t)
            elif self.text and rec.get("kind") == Kind.LOG:
                self._last_values.update(values)

    @property
    def step_time(self) -> float:
        """The slowest rank's latest step time in seconds (0 before any was measured)."""
        return max(self._step_times.values(), default=0.0)

    @property
    def anything(self) -> bool:
        """Whether any progress or logged value arrived."""
        return bool(self.progress or self._last_values)

    def line(self, end: str = "") -> str | None:
        """One plain line when due: the slowest rank's step and the last logged values (at most 4)."""
        now = time.monotonic()
        if not end and (not self.progress or now - self._said_at < PROGRESS_SECONDS):
            return None
        self._said_at, self.changed = now, False
        steps = [int(p["step"]) for p in self.progress.values() if isinstance(p.get("step"), int)]
        total = next((p["total"] for p in self.progress.values() if p.get("total")), None)
        parts = [f"step {min(steps)}" + (f"/{total}" if total else "")] if steps else []
        for name, value in list(self._last_values.items())[:4]:
            parts.append(f"{name} {value:.4g}" if isinstance(value, float) else f"{name} {value}")
        if end:
            parts.append(end)
        return "dtwork: " + ", ".join(parts) if parts else None

    def stall(self, limit: float) -> tuple[str, dict[str, list[int]]] | None:
        """A stall to name (its message and event data), once per stall; None when there is none."""
        if not limit or not self.progress:
            return None
        now = time.time()
        stalled = {
            r: p
            for r, p in self.progress.items()
            if now - p.get("time", now) > limit and (r, p.get("step")) not in self._stall_warned
        }
        if not stalled:
            return None
        first = stopped_first(self.progress)
        if any(now - p.get("time", now) <= limit for p in first.values()):
            return None  # the rank that stopped first still moves (or just caught up): nothing to name
        self._stall_warned.update((r, p.get("step")) for r, p in self.progress.items())  # once per stall
        names = ", ".join(
            f"rank {r} (step {p.get('step')}, {p.get('phase', '?')}, {now - p.get('time', now):.0f} s ago)"
            for r, p in sorted(first.items())
        )
        waiting = sorted(set(self.progress) - set(first))
        after = f", stopped first; waiting for it: {', '.join(f'rank {r}' for r in waiting)}"
        msg = f"dtwork: no progress for {limit:.0f} s from {names}" + (after if waiting else "")
        return msg, {"ranks": sorted(first), "waiting": waiting}
