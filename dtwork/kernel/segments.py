"""The kernel's side of one step axis per run: which records open a segment, and what changed.

A rank's training loop sends a ``SEGMENT`` event when it starts (``runtime/core/run_axis.py``); the
session starts a new run when the loop says it began one mid-cell (it names the pending folder it
checkpoints in: the rank decides, as it knows whether its run already trained), and stores each
segment with what differs from the run's previous one.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping

from dtwork.shared.records import SEGMENT, Kind

PENDING = "pending"  # in a segment's data: the folder its loop checkpointed in (checkpoint.adopt)

# What a segment can change, and the settings that say it.
_WHAT = {
    "lr": ("lr",),
    "batch": ("global_batch_size", "per_slot_batch_size", "accumulation"),
    "precision": ("precision",),
    "code": ("code",),
}


def is_segment(rec: object) -> bool:
    """Whether ``rec`` is a training loop's segment event."""
    return isinstance(rec, Mapping) and rec.get("kind") == Kind.EVENT.value and rec.get("event") == SEGMENT


def code_hash(source: str | None) -> str:
    """A short hash of a cell's source: two segments of one code hash alike."""
    return hashlib.sha256((source or "").encode("utf-8", "replace")).hexdigest()[:12]


def settings(rec: Mapping[str, object], source: str | None) -> dict[str, object]:
    """What the segment trains with: the rank's settings and the cell's code hash."""
    sent = rec.get("settings")
    return {**(dict(sent) if isinstance(sent, Mapping) else {}), "code": code_hash(source)}


def changed(prev: Mapping[str, object] | None, now: Mapping[str, object]) -> list[str]:
    """What differs between a run's previous segment and this one ([] for its first)."""
    if prev is None:
        return []
    return [what for what, keys in _WHAT.items() if any(prev.get(k) != now.get(k) for k in keys)]


class RunBook:
    """What the session keeps of its runs' step axes: each run's last segment settings, the runs a
    rank's loop began mid-cell, the running cell's source and its seq in the run it moved to, what
    the ranks were told, and the runs whose divergence was told."""

    def __init__(self) -> None:
        self.last_segment: dict[int, dict[str, object]] = {}
        self.loop_runs: set[int] = set()
        self.adopt: list[tuple[int, str]] = []  # (run, pending folder): rank 0 renames it next cell
        self.source: str | None = None
        self.moved: dict[int, int] = {}  # a cell's seq -> its seq in the run its loop began
        self.ranks_run: int | None = None  # the run the ranks were told (their ctx.run_id)
        self.diverged: dict[int, str] = {}  # run -> the dashboard's line about its divergence
        # A run's status is set by its own cells only: those that trained in it (a loop's segment, a
        # measured step, a script), not a later cell that merely ran while it was current.
        self.trained: set[int] = set()  # the runs the running cell trained in
        self.outcome: dict[int, str] = {}  # run -> how the last cell that trained in it ended
        # A config's name labels the run made next after it is loaded (start --config, %dtrain
        # config), not every later run: later runs differ and are told apart by what changed.
        self.config_named = False

    def begin_cell(self, source: str) -> None:
        self.source, self.moved, self.trained = source, {}, set()

    def final_status(self, run_id: int) -> str:
        """How a run ended, from its last training cell: completed (also when none trained in it),
        failed or interrupted."""
        return {"error": "failed", "interrupted": "interrupted"}.get(
            self.outcome.get(run_id, "ok"), "completed"
        )

    def cell_seq(self, seq: int | None) -> int | None:
        """The running cell's seq in the current run (it changed if its training began a new run)."""
        return None if seq is None else self.moved.get(seq, seq)

    def segment(self, run_id: int, rec: Mapping[str, object]) -> tuple[list[str], dict[str, object]]:
        """A loop's segment of ``run_id``: what changed since the run's previous one, and its settings."""
        now = settings(rec, self.source)
        what = changed(self.last_segment.get(run_id), now)
        self.last_segment[run_id] = now
        return what, dict(now)
