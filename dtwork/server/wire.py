"""What the ``/dtwork/`` routes send: their JSON answers, one TypedDict each (mirrored in
``extension/src/types.ts``), the errors the handlers turn into statuses, and the JSON hygiene.

A None stands for "not known" (NaN and infinities travel as null).
"""

from __future__ import annotations

from pathlib import Path
from typing import TypedDict, TypeVar, cast

from dtwork.shared.records import finite

T = TypeVar("T")

__all__ = [
    "AdaptiveBatch",
    "ClusterInfo",
    "ClustersReply",
    "GpuInfo",
    "GpusReply",
    "MetricsReply",
    "NotFound",
    "RankInfo",
    "ReportFailed",
    "ReportReply",
    "ReportUnavailable",
    "RunDetail",
    "RunReply",
    "RunSummary",
    "RunsReply",
    "SearchGroup",
    "SegmentInfo",
    "StopReply",
    "StoreUnavailable",
    "display_path",
    "json_safe",
]


class RankInfo(TypedDict):
    """One rank of a cluster (IRankInfo)."""

    rank: int
    hostname: str | None
    local_rank: int | None
    device: str | None
    gpu_name: str | None
    pid: int | None
    engine_id: int | None


class ClusterInfo(TypedDict):  # one field per fact the panel shows of a cluster (IClusterInfo)
    """One registered cluster (IClusterInfo)."""

    id: str
    state: str | None
    n: int | None
    backend: str | None
    profile: str | None
    master: str | None
    kernel_pid: int | None
    kernel_host: str | None
    kernel_alive: bool
    notebook: str | None  # its kernel's notebook as the server's session names it now (after renames)
    origin: str  # "notebook", or "script": started by a program outside any notebook
    program: str | None  # a script's file (or executable) name, when the kernel runs on this host
    started_at: float | None
    ranks: list[RankInfo]
    pids: list[int]
    keep: float | None  # seconds a kept cluster outlives its kernel (None: not kept)
    keep_left: float | None  # seconds left for a notebook to attach, once its kernel is gone


class ClustersReply(TypedDict):
    """GET /dtwork/clusters."""

    clusters: list[ClusterInfo]


class StopReply(TypedDict):
    """POST /dtwork/clusters/<id>/stop."""

    stopped: str
    killed: list[int]


class AdaptiveBatch(TypedDict):
    """An adaptive run's batch trajectory (IAdaptiveBatch): ``changes`` ``[[step, global_batch], ...]``."""

    changes: list[list[float | None]]
    n_changes: int
    global_batch: float | None
    lr_factor: float | None


class RunSummary(TypedDict):  # one field per column of the panel's runs table (IRunSummary)
    """One run as the panel lists it (IRunSummary)."""

    id: int
    store: str  # its store's key: "" the server's default store, else its folder (server/stores.py)
    name: str | None
    status: str | None
    created_at: float | None
    ended_at: float | None
    world_size: int | None
    backend: str | None
    cluster_id: str | None
    notebook: str | None
    n_cells: int | None
    last_step: int | None
    global_batch_size: int | None
    throughput: float | None
    scaling_efficiency: float | None
    b_simple: float | None
    loss: float | None
    sparkline: list[list[float]]
    diverged: str | None
    adaptive_batch: AdaptiveBatch | None
    sparkline_colour: str


class SegmentInfo(TypedDict):
    """One segment of a run's step axis, as GET /dtwork/runs/<id> lists it."""

    seq: int
    cell_seq: int | None
    first_step: int
    changed: list[str]


class RunDetail(RunSummary):
    """One run with every metric's latest value and its segments (IRunReply's run)."""

    last_metrics: dict[str, float]
    metric_names: list[str]
    per_slot_batch_size: int | None
    segments: list[SegmentInfo]


class SearchGroup(TypedDict):  # one field per fact the panel's search header shows (ISearchGroup)
    """A search as the panel groups its trial runs under it (ISearchGroup)."""

    id: int
    store: str  # its store's key, as its runs'
    label: str
    searcher: str
    status: str
    metric: str | None
    best: float | None
    trials: int
    running: int
    stopped: int
    done: int
    failed: int
    run_ids: list[int]  # its trials' runs, in trial order (the running ones last)


class RunsReply(TypedDict):
    """GET /dtwork/runs: the runs of every store under the root; ``searches``: each store's newest
    searches, each grouping its trials' runs; ``notes``: where else to look (a walk stopped at its
    bounds, a store that cannot be read)."""

    store_exists: bool
    total: int
    runs: list[RunSummary]
    searches: list[SearchGroup]
    notes: list[str]


class RunReply(TypedDict):
    """GET /dtwork/runs/<id>."""

    run: RunDetail


class MetricsReply(TypedDict):
    """GET /dtwork/runs/<id>/metrics?name=NAME: points are ``[step, value, time]``."""

    run_id: int
    name: str
    total: int
    points: list[list[float | None]]


class ReportReply(TypedDict):
    """POST /dtwork/runs/<id>/report: ``path`` relative to the Jupyter root."""

    run_id: int
    path: str


class GpuInfo(TypedDict):
    """One GPU sample (IGpuInfo)."""

    index: int
    name: str | None
    uuid: str | None
    driver: str | None
    utilization: float | None
    memory_used_mb: float | None
    memory_total_mb: float | None
    temperature_c: float | None
    power_w: float | None


class GpusReply(TypedDict):
    """GET /dtwork/gpus."""

    available: bool
    reason: str | None
    gpus: list[GpuInfo]


# -- errors ------------------------------------------------------------------------------------


class NotFound(Exception):
    """A malformed or unknown id; the message is safe to show (no paths)."""


class StoreUnavailable(Exception):
    """The run store exists but cannot be read (damaged, locked, newer): the message says why and
    what to do, with the store named relative to the server root."""


class ReportUnavailable(Exception):
    """``dtwork.report`` cannot be imported (not installed yet, or a dependency is missing)."""


class ReportFailed(Exception):
    """The export raised; the message has its paths reduced to file names.

    ``status`` is 409 when dtwork refused the export (a DtworkError: e.g. a run with no cells),
    500 when it broke.
    """

    def __init__(self, message: str, status: int = 500) -> None:
        super().__init__(message)
        self.status = status


# -- JSON hygiene ------------------------------------------------------------------------------


def json_safe(value: T) -> T:
    """Replace NaN and infinities by None, recursively: browsers' JSON.parse rejects them (the
    answers' TypedDicts already allow None wherever a float may be)."""
    if isinstance(value, float):
        return cast(T, finite(value))
    if isinstance(value, dict):
        return cast(T, {str(k): json_safe(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        return cast(T, [json_safe(v) for v in value])
    return value


def display_path(path: object, root_dir: str) -> str | None:
    """A notebook path relative to the server root, or its bare file name when outside it."""
    if not path or not isinstance(path, str):
        return None
    try:
        rel = Path(path).resolve().relative_to(Path(root_dir).resolve())
        return rel.as_posix()
    except (ValueError, OSError):
        return Path(path).name or None
