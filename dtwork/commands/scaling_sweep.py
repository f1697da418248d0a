"""``%dtrain scaling``: throughput at each world size, weak or strong, and the scaling efficiency.

Scaling efficiency E(n) = T(n) / (n T(1)) with T in samples/s (``analysis.scaling``).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from dtwork.commands import bench_call
from dtwork.commands.bench_call import Shape
from dtwork.errors import DtworkError
from dtwork.shared.bench import BenchRequest, BenchResult

if TYPE_CHECKING:
    from dtwork.analysis.scaling import ScalingPoint, ScalingResult
    from dtwork.cluster import Cluster

__all__ = ["scaling"]


def scaling(
    cluster: Cluster,
    model_expr: str,
    *,
    slots: Sequence[int] | None = None,
    mode: str = "weak",
    steps: int = 20,
    warmup: int = 3,
    per_slot: int | None = None,
    global_batch: int | None = None,
    shape: Shape = None,
    bucket_mb: float | None = None,
    repeats: tuple[int, int] = (3, 8),
    quiet: bool = False,
) -> ScalingResult:
    """Measure throughput at each world size in ``slots`` and return a ``ScalingResult``.

    Weak scaling keeps the per-slot batch b (global b n); strong scaling keeps the global batch
    B (per slot B // n). Efficiency E(n) = T(n) / (n T(1)). Synthetic batches of
    ``(per_slot, *shape)`` (shape defaults to the in_features of the model's first layer, a Linear). Each world
    size is timed ``repeats[0]`` to ``repeats[1]`` times, until its throughput's 95% interval is
    within ``analysis.scaling.SETTLE_REL`` of its mean (else the point says it did not settle).
    """
    from dtwork.analysis.scaling import ScalingResult, plan_sizes
    from dtwork.plots import scaling_figure
    from dtwork.widgets.updating import UpdatingFigure

    if mode not in ("weak", "strong"):
        raise DtworkError(f"scaling mode is weak or strong, got {mode!r}")
    if steps < 1:
        raise DtworkError(f"--steps must be at least 1, got {steps}")
    sizes = bench_call.check_slots(cluster, slots)
    b = per_slot or bench_call.default_per_slot(cluster)
    big = global_batch or cluster.global_batch_size or b * sizes[-1]
    request = BenchRequest(
        model_expr, 1, b, steps, warmup, shape=bench_call.parse_shape(shape), bucket_mb=bucket_mb
    )
    result = ScalingResult(mode=mode)  # type: ignore[arg-type]
    shown = UpdatingFigure()
    try:
        for n in sizes:
            try:
                ps, gb = plan_sizes(mode, b, big, n)
            except ValueError as exc:
                raise DtworkError(str(exc)) from None
            request = replace(request, world=n, per_slot=ps)
            point, request = _point(cluster, request, gb, repeats)
            result = ScalingResult(mode=result.mode, points=[*result.points, point])
            shown.show(scaling_figure(result))
    finally:
        shown.done()
    bench_call.store_result(cluster, "scaling", result.to_dict())
    if not quiet:
        print(f"dtwork: {mode} scaling of {model_expr}: {result.headline()}")
        for warning in result.warnings():
            print(f"dtwork: warning: {warning}")
    return result


def _point(
    cluster: Cluster, request: BenchRequest, global_batch: int, repeats: tuple[int, int]
) -> tuple[ScalingPoint, BenchRequest]:
    """Time one world size until settled (or ``repeats[1]`` times); the request with the shape found."""
    from dtwork.analysis.scaling import ScalingPoint, mean_interval, settled

    runs: list[BenchResult] = []
    while len(runs) < max(1, repeats[0]) or (
        len(runs) < repeats[1] and not settled([r["world_samples_per_s"] for r in runs])
    ):
        r = bench_call.synthetic(cluster, request)
        if r["shape"]:
            request = replace(request, shape=tuple(r["shape"]))
        runs.append(r)
    mean, low, high = mean_interval([r["world_samples_per_s"] for r in runs])
    point = ScalingPoint(
        world_size=request.world,
        throughput=mean,
        step_time=statistics.median(r["step_time"] for r in runs),
        comm_time=statistics.median(r["comm_time"] for r in runs),
        per_slot_batch=request.per_slot,
        global_batch=global_batch,
        low=low,
        high=high,
        repeats=len(runs),
        settled=len(runs) < 2 or settled([r["world_samples_per_s"] for r in runs], at_least=2),
    )
    return point, request
