"""Many ranks on the dashboard: per-rank lines folded into percentile bands; the kernel-scale benchmark runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dtwork.plots import ThroughputSeries
from dtwork.plots.bands import BAND_RANKS, rank_bands
from dtwork.records import make_record, to_rows


def throughput(ranks: int, steps: int = 50) -> ThroughputSeries:
    series = ThroughputSeries()
    # ranks report at steps of their own (offset by rank), as ranks timing themselves do
    recs = [
        make_record("perf", s + r % 3, r, {"samples_per_s": float(100 + r)})
        for r in range(ranks)
        for s in range(0, steps, 5)
    ]
    series.add(to_rows(recs))
    return series


def test_few_ranks_keep_their_lines() -> None:
    traces = throughput(4).traces(1000)
    assert rank_bands(traces, 4) == traces


def test_many_ranks_become_three_bands_beside_the_global_line() -> None:
    n = BAND_RANKS * 4
    traces = rank_bands(throughput(n).traces(1000), n)
    assert [t.name for t in traces] == ["global", "ranks p10", "ranks p90", "ranks median"]
    lo, hi, mid = (np.asarray(t.y) for t in traces[1:])
    assert np.all(lo <= mid) and np.all(mid <= hi)
    assert mid[-1] == pytest.approx(np.median(100 + np.arange(n)))
    assert traces[2].style["fill"] == "tonexty"


def test_gpu_subplots_band_apart() -> None:
    from dtwork.plots import GpuSeries

    gpu = GpuSeries()
    n = BAND_RANKS + 1
    gpu.add(
        to_rows(
            make_record("gpu", s, r, {"utilization": 50.0 + r, "memory_used_mb": 1e3, "memory_total_mb": 8e3})
            for r in range(n)
            for s in range(10)
        )
    )
    names = [t.name for t in rank_bands(gpu.traces(1000), n)]
    assert names[:3] == ["ranks utilization p10", "ranks utilization p90", "ranks utilization median"]
    assert names[3:6] == ["ranks memory p10", "ranks memory p90", "ranks memory median"]
    assert names[-1] == "memory total"


def test_benchmark_feeds_the_kernel_path(tmp_path: Path) -> None:
    from benchmarks.kernel_scale import measure, wired
    from benchmarks.tables import kernel_scale_table

    with wired():  # widget messages serialized as the kernel's comm would, then dropped
        result = measure(4, 1.0, tmp_path)
    assert result["ranks"] == 4 and result["cpu_share"] > 0 and result["store_mb_per_hour"] > 0
    assert result["redraw_interval_s"] > 0
    assert "| 4 |" in kernel_scale_table({"kernel_scale": [result]})
