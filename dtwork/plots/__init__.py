"""Rank records or store rows -> plotly figures, shared by the live dashboard and the reports.

The live view and the report draw the same figure from the same data: :mod:`.series` keeps each
training figure's data as rows come (bounded redraws however long the run), :mod:`.figures` turns
series and analysis results into titled plotly figures. ``from dtwork import plots`` and
``plots.metrics_figure(rows)`` is the public way in.
"""

from __future__ import annotations

from dtwork.plots.compare import compare_figure
from dtwork.plots.figures import (
    HEIGHT,
    NO_DATA,
    NO_DATA_NAME,
    bucket_figure,
    dashboard_figure,
    empty_figure,
    gns_figure,
    gpu_figure,
    loading_figure,
    mark_segments,
    metrics_figure,
    no_data_note,
    on_row,
    row_axes,
    row_legend,
    scaling_figure,
    scatter,
    series_figure,
    stacked_figure,
    step_time_figure,
    throughput_figure,
    tradeoff_figure,
)
from dtwork.plots.rank_series import GpuSeries, StepTimeSeries, ThroughputSeries, global_throughput
from dtwork.plots.series import (
    ADAPTIVE_NAMES,
    EFFICIENCY_NAME,
    GNS_INTERVAL,
    GNS_NAMES,
    GPU_NAMES,
    LOG_SPAN,
    PERF_NAMES,
    STEP_PARTS,
    AdaptiveSeries,
    AxisLayout,
    GnsSeries,
    MetricsSeries,
    Series,
    Trace,
    off_scale,
    robust_range,
)
from dtwork.plots.training import BASE_FIGURES, KIND_FIGURES, cell_series

__all__ = [
    "ADAPTIVE_NAMES",
    "BASE_FIGURES",
    "KIND_FIGURES",
    "cell_series",
    "AdaptiveSeries",
    "AxisLayout",
    "EFFICIENCY_NAME",
    "GNS_INTERVAL",
    "GNS_NAMES",
    "LOG_SPAN",
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
    "compare_figure",
    "mark_segments",
    "dashboard_figure",
    "empty_figure",
    "global_throughput",
    "off_scale",
    "robust_range",
    "gns_figure",
    "gpu_figure",
    "loading_figure",
    "metrics_figure",
    "no_data_note",
    "on_row",
    "row_axes",
    "row_legend",
    "scaling_figure",
    "scatter",
    "series_figure",
    "stacked_figure",
    "step_time_figure",
    "throughput_figure",
    "tradeoff_figure",
]
