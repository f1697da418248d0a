"""The rows the run store returns, one TypedDict per table (JSON columns decoded)."""

from __future__ import annotations

from typing import Any, TypedDict

from dtwork.shared.records import Row

__all__ = [
    "CellRow",
    "EventRow",
    "MetricRow",
    "ResultRow",
    "RunRow",
    "SearchRow",
    "SegmentRow",
    "TrialRow",
]


class RunRow(TypedDict):
    """One run: its columns, how many cells it has and its highest logged step."""

    id: int
    name: str | None
    status: str
    created_at: float
    ended_at: float | None
    world_size: int
    backend: str
    cluster_id: str | None
    notebook: str | None
    config_yaml: str | None
    global_batch_size: int | None
    per_slot_batch_size: int | None
    n_cells: int
    last_step: int | None


class CellRow(TypedDict):
    """One cell of a run; ``ranks`` the ranks it ran on (None: all)."""

    run_id: int
    seq: int
    source: str
    started_at: float
    ended_at: float | None
    status: str
    error: str | None
    ranks: list[int] | None


class SegmentRow(TypedDict):
    """One segment of a run's step axis; ``changed`` what differs from the previous segment."""

    seq: int
    cell_seq: int | None
    first_step: int
    time: float
    changed: list[str]
    data: dict[str, Any]  # JSON the training loop wrote


class DeliveryRow(TypedDict):
    """The last batch stored of one rank's stream (its cell on that rank): seq, and where it went."""

    rank: int
    stream: str
    run_id: int
    cell_seq: int | None
    seq: int


class MetricRow(Row):
    """One stored metric value with the run and cell it belongs to."""

    run_id: int
    cell_seq: int | None


class EventRow(TypedDict):
    """One event (``run_id`` None: store-wide)."""

    id: int
    run_id: int | None
    time: float
    kind: str
    message: str
    data: Any  # JSON as the writer gave it, None when it gave none


class ResultRow(TypedDict):
    """One analysis result (``run_id`` None: store-wide)."""

    id: int
    run_id: int | None
    kind: str
    created_at: float
    data: Any  # JSON as the analysis gave it


class SearchRow(TypedDict):  # one row of a table: its columns and its trials' tally
    """One hyperparameter search and its trials' tally: ``running`` trials whose run has begun and not
    ended, ``done`` completed ones, ``best`` the best metric so far (None before any)."""

    id: int
    label: str
    searcher: str
    metric: str | None
    smaller_is_better: bool
    config_yaml: str | None
    code: str | None
    cluster_id: str | None
    world_size: int | None
    backend: str | None
    started_at: float
    ended_at: float | None
    status: str
    trials: int
    running: int
    done: int
    stopped: int
    failed: int
    best: float | None


class TrialRow(TypedDict):
    """One trial of a search: its run (None before it began), hyperparameters, status and metric."""

    search_id: int
    number: int
    run_id: int | None
    hparams: dict[str, Any]
    status: str
    metric: float | None
    error: str | None
