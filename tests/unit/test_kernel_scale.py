"""Many ranks on the dashboard: per-rank lines folded into percentile bands; the kernel-scale benchmark runs."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dtwork.plots import ThroughputSeries
from dtwork.plots.bands import BAND_RANKS
from dtwork.shared.records import make_record, to_rows


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
    names = [t.name for t in throughput(BAND_RANKS).traces(1000)]
    assert names == ["global", *(f"rank {r}" for r in range(BAND_RANKS))]


def test_many_ranks_become_three_bands_beside_the_global_line() -> None:
    n = BAND_RANKS * 4
    traces = throughput(n).traces(1000)
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
    names = [t.name for t in gpu.traces(1000)]
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


def test_many_ranks_show_one_bar_for_all_then_the_slowest() -> None:
    from dtwork.widgets.dashboard import Dashboard
    from dtwork.widgets.header import SLOWEST

    n = BAND_RANKS * 4
    dash = Dashboard(1, list(range(n)), min_interval=0.0, draw_share=None)
    assert dash.header.html.count("dtwork-rank-bar") == 1 and f"{n} ranks: waiting" in dash.header.html
    steps = {r: 100 for r in range(n)} | {17: 5, 40: 60, 3: 99, 9: 99}
    dash.progress({r: {"rank": r, "time": 1.0, "step": s, "total": 1000} for r, s in steps.items()})
    dash.flush()
    shown = dash.header.html
    assert shown.count("dtwork-rank-bar") == 1 + SLOWEST
    assert f"{n} ranks: steps 5-100/1000 (median 100)" in shown
    order = [shown.index(f"rank {r}: step {steps[r]}/1000") for r in (17, 40, 3, 9)]  # slowest first
    assert order == sorted(order) and "rank 0: step" not in shown
    dash.close()
