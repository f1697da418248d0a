"""Rank records or store rows -> plotly figures, shared by the live dashboard and the reports.

The live view and the report draw the same figure from the same data: :mod:`.series` keeps each
training figure's data as rows come (bounded redraws however long the run), :mod:`.figures` turns
series and analysis results into titled plotly figures. ``from dtwork import plots`` and
``plots.metrics_figure(rows)`` is the public way in.
"""

from __future__ import annotations

from dtwork.plots.figures import (
    HEIGHT,
    NO_DATA,
    NO_DATA_NAME,
    bucket_figure,
    empty_figure,
    gns_figure,
    gpu_figure,
    metrics_figure,
    no_data_note,
    row_axes,
    scaling_figure,
    scatter,
    series_figure,
    stacked_figure,
    step_time_figure,
    throughput_figure,
    tradeoff_figure,
)
from dtwork.plots.series import (
    GNS_NAMES,
    GPU_NAMES,
    PERF_NAMES,
    STEP_PARTS,
    GnsSeries,
    GpuSeries,
    MetricsSeries,
    Series,
    StepTimeSeries,
    ThroughputSeries,
    Trace,
    global_throughput,
)

__all__ = [
    "GNS_NAMES",
    "GPU_NAMES",
    "HEIGHT",
    "NO_DATA",
    "NO_DATA_NAME",
    "PERF_NAMES",
    "STEP_PARTS",
    "GnsSeries",
    "GpuSeries",
    "MetricsSeries",
    "Series",
    "StepTimeSeries",
    "ThroughputSeries",
    "Trace",
    "bucket_figure",
    "empty_figure",
    "global_throughput",
    "gns_figure",
    "gpu_figure",
    "metrics_figure",
    "no_data_note",
    "row_axes",
    "scaling_figure",
    "scatter",
    "series_figure",
    "stacked_figure",
    "step_time_figure",
    "throughput_figure",
    "tradeoff_figure",
]
