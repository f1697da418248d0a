"""The JSON answers of the ``/dtwork/`` routes, one TypedDict each (mirrored in ``extension/src/types.ts``).

A None stands for "not known" (NaN and infinities travel as null).
"""

from __future__ import annotations

from typing import TypedDict

__all__ = [
    "AdaptiveBatch",
    "ClusterInfo",
    "ClustersReply",
    "GpuInfo",
    "GpusReply",
    "MetricsReply",
    "RankInfo",
    "ReportReply",
    "RunDetail",
    "RunReply",
    "RunSummary",
    "RunsReply",
    "SegmentInfo",
    "StopReply",
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


class ClusterInfo(TypedDict):
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
    notebook: str | None
    started_at: float | None
    ranks: list[RankInfo]
    pids: list[int]


class ClustersReply(TypedDict):
    """GET /dtwork/clusters."""

    clusters: list[ClusterInfo]


class StopReply(TypedDict):
    """POST /dtwork/clusters/<id>/stop."""

    stopped: str
    killed: list[int]


class AdaptiveBatch(TypedDict):
    """An adaptive run's batch trajectory (IAdaptiveBatch): ``changes`` ``[[step, global_batch], ...]``."""

    changes: list[list[float]]
    n_changes: int
    global_batch: float | None
    lr_factor: float | None


class RunSummary(TypedDict):
    """One run as the panel lists it (IRunSummary)."""

    id: int
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


class RunsReply(TypedDict):
    """GET /dtwork/runs."""

    store_exists: bool
    total: int
    runs: list[RunSummary]


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
