"""Which series a training cell shows, in which order: the live dashboard and the view a reopened
notebook reads back from the store (:mod:`.cell_view`) draw the same ones."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from dtwork.plots.rank_series import GpuSeries, StepTimeSeries, ThroughputSeries
from dtwork.plots.series import AdaptiveSeries, GnsSeries, MetricsSeries, Series

__all__ = ["BASE_FIGURES", "KIND_FIGURES", "KIND_SERIES", "cell_series", "drawn_series"]

BASE_FIGURES = ("metrics", "throughput", "step_time")  # a training cell's rows, always shown
KIND_FIGURES = ("gpu", "gns", "adaptive")  # shown once they have data, in this order
KIND_SERIES = {  # the series each kind of row goes to, live and read back alike
    "log": ("metrics",),
    "perf": ("throughput", "step_time"),
    "gpu": ("gpu",),
    "gns": ("gns",),
    "adaptive": ("adaptive",),
}


def cell_series(global_batch: int | None = None) -> dict[str, Series]:
    """A training cell's series by figure key: the live dashboard and the view a reopened notebook
    reads back from the store draw the same ones."""
    return {
        "metrics": MetricsSeries(),
        "throughput": ThroughputSeries(),
        "step_time": StepTimeSeries(),
        "gpu": GpuSeries(),
        "gns": GnsSeries(global_batch),
        "adaptive": AdaptiveSeries(),
    }


def drawn_series(rows: Iterable[Mapping[str, object]], global_batch: int | None = None) -> dict[str, Series]:
    """A training cell's series with ``rows`` (a store's figure rows), each row in the series of its
    kind (KIND_SERIES): what a reopened notebook's view and the live view of a long cell draw."""
    by_kind: dict[object, list[Mapping[str, object]]] = {}
    for row in rows:
        by_kind.setdefault(row["kind"], []).append(row)
    series = cell_series(global_batch)
    for kind, kind_rows in by_kind.items():
        for key in KIND_SERIES.get(str(kind), ()):
            series[key].add(kind_rows)
    return series
