"""Live scaling efficiency: estimated kernel-side from the ranks' perf records, stored as an aggregated
log row, read by the server's run list and the report; and the sweep's intervals and warnings."""

from __future__ import annotations

import pytest

from dtwork.analysis.scaling import (
    EFFICIENCY_NAME,
    LiveEfficiency,
    ScalingPoint,
    ScalingResult,
    mean_interval,
    settled,
    sweep_baseline,
)
from dtwork.shared.records import make_record, to_rows


def perf(rank: int, step: int, samples: float, step_time: float, comm: float) -> dict[str, object]:
    values = {"samples_per_s": samples, "step_time": step_time, "comm_time": comm}
    return dict(make_record("perf", step, rank, values))


def test_estimate_waits_for_every_rank_then_reports_the_share_not_waiting() -> None:
    live = LiveEfficiency(2, every=1.0)
    assert live.add([perf(0, 5, 100.0, 0.1, 0.02)], now=0.0) is None  # rank 1 not heard from yet
    rec = live.add([perf(1, 6, 100.0, 0.1, 0.04)], now=0.1)
    assert rec is not None and rec["values"][EFFICIENCY_NAME] == pytest.approx(0.7)  # 1 - (0.2+0.4)/2
    assert live.add([perf(0, 7, 100.0, 0.1, 0.0)], now=0.5) is None  # at most once a second
    rows = to_rows([live.add([], now=1.2)])  # type: ignore[list-item]
    assert rows[0]["rank"] is None and rows[0]["kind"] == "scaling" and rows[0]["step"] == 7
    assert rows[0]["value"] == pytest.approx(0.8)


def test_a_sweep_baseline_gives_the_measured_ratio() -> None:
    sweep = ScalingResult("weak", [ScalingPoint(1, 100.0, 0.1, 0.0, 16, 16)]).to_dict()
    assert sweep_baseline([sweep], per_slot=8) is None  # another per-slot batch: not comparable
    live = LiveEfficiency(2, sweep_baseline([sweep], per_slot=16))
    rec = live.add([perf(0, 1, 90.0, 0.1, 0.05), perf(1, 1, 80.0, 0.1, 0.05)], now=0.0)
    assert rec is not None and rec["values"][EFFICIENCY_NAME] == pytest.approx(170 / 200)


def test_one_rank_has_no_estimate() -> None:
    assert LiveEfficiency(1).add([perf(0, 1, 90.0, 0.1, 0.05)], now=0.0) is None


def test_interval_settles_and_bounds_efficiency() -> None:
    mean, low, high = mean_interval([100.0, 102.0, 98.0, 101.0])
    assert low is not None and high is not None and low < mean < high
    assert settled([100.0, 101.0, 99.0]) and not settled([100.0, 150.0, 60.0]) and not settled([1.0, 1.0])
    res = ScalingResult(
        "weak",
        [
            ScalingPoint(1, 100.0, 0.1, 0.0, 16, 16, low=95.0, high=105.0, repeats=3),
            ScalingPoint(2, 160.0, 0.1, 0.06, 16, 32, low=150.0, high=170.0, repeats=5, settled=False),
        ],
    )
    lo, hi = res.efficiency_intervals()[2]
    assert lo == pytest.approx(150 / 210) and hi == pytest.approx(170 / 190)
    assert "95% interval" in res.headline()
    warnings = res.warnings()
    assert not any("latency dominates" in w for w in warnings)  # 60% waiting, yet 80% efficient
    assert any("did not settle" in w for w in warnings)
    short = ScalingResult(
        "weak", [ScalingPoint(1, 100.0, 0.001, 0.0, 16, 16), ScalingPoint(2, 78.0, 0.0025, 0.002, 16, 32)]
    )
    assert any("latency dominates" in w for w in short.warnings()) and "95% interval" not in short.headline()
    assert ScalingResult.from_dict(res.to_dict()) == res


def test_dashboard_shows_it_beside_throughput_not_among_the_metrics() -> None:
    from dtwork.widgets.dashboard import Dashboard

    dash = Dashboard(1, [0, 1])
    dash.feed([perf(0, 3, 100.0, 0.1, 0.02), perf(1, 3, 100.0, 0.1, 0.02)])
    dash.feed([make_record("log", 3, 0, {"loss": 1.0}), make_record("scaling", 3, 0, {EFFICIENCY_NAME: 0.8})])
    dash.flush()
    assert "samples/s · 80% scaling efficiency" in dash.header.html
    assert [t.name for t in dash.series["metrics"].traces()] == ["loss"]
    dash.close()


def test_scaling_figure_draws_the_intervals_as_error_bars() -> None:
    from dtwork.plots import scaling_figure

    res = ScalingResult(
        "weak",
        [
            ScalingPoint(1, 100.0, 0.1, 0.0, 16, 16, low=95.0, high=105.0, repeats=3),
            ScalingPoint(2, 170.0, 0.1, 0.02, 16, 32, low=160.0, high=180.0, repeats=3),
        ],
    )
    fig = scaling_figure(res)
    measured, efficiency = fig.data[0], fig.data[2]
    assert list(measured.error_y.array) == [5.0, 10.0] and list(measured.error_y.arrayminus) == [5.0, 10.0]
    assert efficiency.error_y.array[1] == pytest.approx(180 / 190 - 0.85)
