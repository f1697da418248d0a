"""The records that flow ranks -> kernel -> store -> views, and the one rule that turns them into rows.

A rank publishes *records*: one per kind and step, ``{"kind", "step", "rank", "time", "values"}``
(events add ``event`` and ``message``). The kernel stores each value as a *row*
``{"kind", "step", "rank", "name", "value", "time"}``; the dashboard, the report, the server and
the exports read rows. Logged metrics and GNS estimates are agreed across ranks by the loop's sync,
so their rows carry rank None (aggregated), as does the kernel's scaling-efficiency estimate;
throughput and GPU rows stay per rank.

This module imports nothing but the standard library: the ranks and the kernel both use it.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterable, Mapping
from enum import Enum
from typing import Any, TypedDict, cast

__all__ = [
    "AGGREGATED_KINDS",
    "CELL_SETTINGS",
    "CellSettings",
    "DIVERGED",
    "FOLLOWS",
    "Mark",
    "SEGMENT",
    "SETTINGS_KEY",
    "TRAINING_KINDS",
    "Kind",
    "ModelSettings",
    "OptimizerSettings",
    "Record",
    "Row",
    "adaptive_decisions",
    "batch_changes",
    "batch_key",
    "batch_mark",
    "finite",
    "divergence_text",
    "first_non_finite",
    "is_own",
    "make_perf_record",
    "make_record",
    "segment_text",
    "to_rows",
]


class Kind(str, Enum):
    """What a record holds; its value is the string that travels and is stored."""

    LOG = "log"  # user metrics from ctx.log, averaged over ranks
    GNS = "gns"  # gradient noise scale estimates, agreed over ranks
    PERF = "perf"  # a rank's throughput and step-time split
    GPU = "gpu"  # a rank's NVML telemetry
    EVENT = "event"  # something that happened on a rank (a warning, a checkpoint)
    SCALING = "scaling"  # the kernel's estimate of the run's scaling efficiency, from the perf records
    ADAPTIVE = "adaptive"  # an adaptive-batch decision: batch, LR factor, efficiency, goodput (rank 0's)

    def __str__(self) -> str:
        return self.value


DIVERGED = "diverged"  # the event of a run's first non-finite logged value
SEGMENT = "segment"  # the event of a training loop's start: a segment of its run's step axis
FOLLOWS = "follows"  # in a run's first segment: {"run", "cell"} it followed on from (a new ctx.wrap)
CELL_SETTINGS = "cell_settings"  # the stored result of what a cell ran with: its options, optimizers, GNS
Mark = tuple[int, str, int]  # a published batch: (rank, stream of its cell on that rank, seq in the stream)
SETTINGS_KEY = "settings"  # where the cell's first rank publishes what the cell left, beside its records
AGGREGATED_KINDS = frozenset({Kind.LOG.value, Kind.GNS.value, Kind.SCALING.value, Kind.ADAPTIVE.value})
# What a re-run of the same code on the same data reproduces: not the timings.
TRAINING_KINDS = frozenset({Kind.LOG.value, Kind.GNS.value})


class Record(TypedDict, total=False):
    """One rank's values of one kind at one step, as published."""

    kind: str
    step: int | None
    rank: int
    time: float
    values: dict[str, float]
    event: str
    message: str


class ModelSettings(TypedDict):
    gns: bool  # the wrapped model measures the gradient noise scale


OptimizerSettings = TypedDict(
    "OptimizerSettings",
    {"class": str, "groups": list[dict[str, object]]},  # hyperparameters by parameter group
)


class CellSettings(TypedDict, total=False):
    """A ``CELL_SETTINGS`` result: the cell's options (the session's) and what it left (the rank's)."""

    seq: int
    rank0: bool
    models: list[ModelSettings]
    optimizers: list[OptimizerSettings]
    calls: dict[str, dict[str, object]]  # the ctx helpers' effective arguments, by helper


class Row(TypedDict):
    """One stored value: what the store's ``metrics`` table holds and every view reads."""

    kind: str
    step: int
    rank: int | None
    name: str
    value: float | None  # None for a missing value; NaN and infinities stay as they are
    time: float | None


def make_record(
    kind: Kind | str, step: int | None, rank: int, values: dict[str, float], **extra: object
) -> Record:
    """Build a record stamped with the current time."""
    rec: Record = {"kind": str(kind), "step": step, "rank": rank, "time": time.time(), "values": values}
    rec.update(extra)  # type: ignore[typeddict-item]
    return rec


def make_perf_record(
    step: int,
    rank: int,
    *,
    samples: float,
    seconds: float,
    steps: int,
    comm: float | None,
    data: float | None = None,
) -> Record:
    """A rank's throughput over a window of ``steps`` optimizer steps that took ``seconds``.

    Values: ``samples_per_s`` = samples / seconds, ``step_time`` = seconds / steps, ``comm_time`` =
    comm / steps (communication not hidden behind compute; left out, with no efficiency to estimate,
    when the window exchanged no gradients: ``comm`` None); where the loop sees its data loading
    (``ctx.steps``; a hand-written loop does not), ``data_time`` = data / steps and ``compute_time``
    = step_time - data_time - comm_time (at least 0).
    """
    steps = max(1, steps)
    step_time = seconds / steps
    values = {"samples_per_s": samples / seconds if seconds > 0 else 0.0, "step_time": step_time}
    if comm is not None:
        values["comm_time"] = comm / steps
    if data is not None:
        values["data_time"] = data / steps
        values["compute_time"] = max(0.0, step_time - (data + (comm or 0.0)) / steps)
    return make_record(Kind.PERF, step, rank, values)


def batch_key(seq: int, stream: str) -> str:
    """The datapub key of a rank's batch: ``r<seq>:<stream>`` (keys sort by seq, the stream names the
    rank's cell, so that the store keeps each batch once, ``runtime/core/journal.py``)."""
    return f"r{seq:08d}:{stream}"


def batch_mark(rank: int, key: str) -> Mark | None:
    """The mark of the batch published under ``key`` by ``rank``; None for a key of another shape."""
    seq, _, stream = key[1:].partition(":")
    return (rank, stream, int(seq)) if key.startswith("r") and seq.isdigit() and stream else None


def finite(value: object) -> float | None:
    """``value`` as a finite float, or None: missing, NaN, infinite or not a number (the one rule
    for every reader of values: rows, figures, the server's JSON)."""
    try:
        out = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def to_rows(records: Iterable[Mapping[str, Any]]) -> list[Row]:  # Any: records as they arrive, unchecked
    """Flatten records into rows: one per value, rank None for aggregated kinds.

    Records without a step (events) give no rows; NaN and infinite values are kept (readers that
    need a finite number use ``finite``); a value that is not a number, or a record that is
    not a mapping of the expected shape, is left out, so one malformed record never stops the rest.
    """
    rows: list[Row] = []
    for rec in records:
        try:
            kind, step, values = str(rec.get("kind", Kind.LOG.value)), rec.get("step"), rec.get("values")
            if step is None or not isinstance(values, Mapping):
                continue
            rank = None if kind in AGGREGATED_KINDS or rec.get("rank") is None else int(rec["rank"])
            stamp = rec.get("time")
            when = None if stamp is None else float(stamp)
            step = int(step)
        except (AttributeError, TypeError, ValueError):
            continue
        for name, value in values.items():
            try:
                number = float(value)  # a NaN or an infinity stays what it is
            except (TypeError, ValueError, OverflowError):
                continue
            rows.append(
                {"kind": kind, "step": step, "rank": rank, "name": str(name), "value": number, "time": when}
            )
    return rows


def first_non_finite(records: Iterable[Mapping[str, Any]]) -> tuple[int, str, float] | None:
    """The first logged value (kind "log") that is NaN or infinite, as (step, name, value), or None."""
    for rec in records:
        if not isinstance(rec, Mapping) or rec.get("kind") != Kind.LOG.value or rec.get("step") is None:
            continue
        values = rec.get("values")
        if not isinstance(values, Mapping):
            continue
        for name, value in values.items():
            try:
                number = float(value)
            except (TypeError, ValueError, OverflowError):
                continue
            if not math.isfinite(number):
                return int(rec["step"]), str(name), number
    return None


def divergence_text(data: Mapping[str, object]) -> str:
    """What a ``DIVERGED`` event's data says: "diverged at step k (loss nan)"."""
    return f"diverged at step {data.get('step')} ({data.get('name')} {data.get('value')})"


def segment_text(segment: Mapping[str, object]) -> str:
    """One stored segment as the CLI and the report list it: "step 100 (cell 3): lr, code changed"."""
    what = cast("list[str]", segment.get("changed") or [])
    cell = segment.get("cell_seq")
    where = f" (cell {cell})" if cell is not None else ""
    return f"step {segment.get('first_step')}{where}" + (f": {', '.join(what)} changed" if what else "")


def is_own(row: Mapping[str, object]) -> bool:
    """Whether a row is dtwork's own measurement (the GNS estimator's values, throughput, GPU
    telemetry, the efficiency estimate), not a metric the user logged: the one rule for every list
    or plot of the user's metrics. Only ``ctx.log`` writes kind "log" rows."""
    return str(row.get("kind") or Kind.LOG.value) != Kind.LOG.value


def adaptive_decisions(rows: Iterable[Row]) -> list[tuple[int, dict[str, float | None]]]:
    """The adaptive batch's decisions (the rows of kind "adaptive") in step order, each one's values
    by name; other rows are left out (a user may log a metric of the same name)."""
    by_step: dict[int, dict[str, float | None]] = {}
    for row in rows:
        if row.get("kind") == Kind.ADAPTIVE.value:
            by_step.setdefault(int(row["step"]), {})[str(row["name"])] = row["value"]
    return sorted(by_step.items())


def batch_changes(
    decisions: Iterable[tuple[int, Mapping[str, float | None]]],
) -> list[tuple[int, Mapping[str, float | None]]]:
    """The decisions that changed the global batch, the first one included: the batch's trajectory,
    as the report lists it and the sidebar shows it (the one rule for both)."""
    out: list[tuple[int, Mapping[str, float | None]]] = []
    last = None
    for step, values in decisions:
        batch = finite(values.get("global_batch"))
        if batch is None or batch == last:
            continue
        out.append((step, values))
        last = batch
    return out
