"""``%dtrain tune``: time a step at each DDP bucket size and keep the fastest in the config."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from dtwork.commands import bench_call
from dtwork.commands.bench_call import Shape
from dtwork.errors import DtworkError
from dtwork.shared.bench import BenchRequest

if TYPE_CHECKING:
    from dtwork.cluster import Cluster

__all__ = ["DEFAULT_SIZES", "tune_buckets"]

DEFAULT_SIZES: tuple[float, ...] = (1, 4, 16, 64, 256)


def tune_buckets(
    cluster: Cluster,
    model_expr: str,
    *,
    sizes: Sequence[float] = DEFAULT_SIZES,
    steps: int = 10,
    warmup: int = 2,
    per_slot: int | None = None,
    shape: Shape = None,
    write: bool = True,
    quiet: bool = False,
) -> dict[float, float]:
    """Time a step at each DDP bucket size (MB) on all ranks; return ``{size: step_time}``.

    The fastest (``analysis.scaling.best_bucket``) becomes ``optimizations.tensor_fusion_threshold``
    of the cluster config (with ``write``); stored as the "tensor_fusion" result.
    """
    from dtwork.analysis.scaling import best_bucket
    from dtwork.plots import bucket_figure
    from dtwork.widgets.updating import UpdatingFigure

    sizes = [float(s) for s in sizes]
    if not sizes or min(sizes) <= 0:
        raise DtworkError(f"--sizes takes positive bucket sizes in MB such as 1,4,16 — got {sizes}")
    b = per_slot or bench_call.default_per_slot(cluster)
    request = BenchRequest(
        model_expr, cluster.world_size, b, steps, warmup, shape=bench_call.parse_shape(shape)
    )
    results: dict[float, float] = {}
    shown = UpdatingFigure()
    try:
        for mb in sizes:
            r = bench_call.synthetic(cluster, replace(request, bucket_mb=mb))
            if r["shape"]:
                request = replace(request, shape=tuple(r["shape"]))
            results[mb] = r["step_time"]
            shown.show(bucket_figure(results))
    finally:
        shown.done()
    best = best_bucket(results)
    # stored in the run that was measured; writing the config then starts a new run
    bench_call.store_result(
        cluster, "tensor_fusion", {"results": {str(k): v for k, v in results.items()}, "best": best}
    )
    if write:
        cluster.configure(cluster.config.with_path("optimizations.tensor_fusion_threshold", best))
    if not quiet:
        times = ", ".join(f"{mb:g} MB {t * 1e3:.1f} ms" for mb, t in results.items())
        where = "; written to optimizations.tensor_fusion_threshold" if write else ""
        print(f"dtwork: fastest bucket {best:g} MB ({times}){where}")
    return results
