"""Tests for dtwork.plots: records/rows -> plotly figures (pure, no widgets)."""

from __future__ import annotations

from typing import Any

import plotly.graph_objects as go
import pytest

from dtwork import plots
from dtwork.analysis.scaling import ScalingPoint, ScalingResult
from dtwork.shared.records import to_rows
from dtwork.store.runs import RunStore


def log_records(n: int) -> list[dict[str, Any]]:
    return [
        {"kind": "log", "step": s, "rank": 0, "time": 100.0 + s, "values": {"loss": 1 / (s + 1), "lr": 0.1}}
        for s in range(n)
    ]


def perf_records(steps: int, ranks: int) -> list[dict[str, Any]]:
    out = []
    for s in range(steps):
        for r in range(ranks):
            values = {
                "samples_per_s": 100.0 * (r + 1) + s,
                "step_time": 0.2 + 0.01 * r,
                "compute_time": 0.1 + 0.01 * r,
                "comm_time": 0.05,
                "data_time": 0.02 * (r + 1),
            }
            out.append({"kind": "perf", "step": s, "rank": r, "time": 1.0 + s, "values": values})
    return out


def trace(fig: go.Figure, name: str) -> Any:
    matches = [t for t in fig.data if t.name == name]
    assert len(matches) == 1, [t.name for t in fig.data]
    return matches[0]


def annotations(fig: go.Figure) -> list[str]:
    return [a.text for a in fig.layout.annotations]


# -- training figures ----------------------------------------------------------------------------


def test_metrics_figure_one_trace_per_metric_with_exact_values() -> None:
    fig = plots.metrics_figure(to_rows(log_records(50)))
    assert [t.name for t in fig.data] == ["loss", "lr"]
    loss = trace(fig, "loss")
    assert list(loss.x) == list(range(50))
    assert list(loss.y) == [1 / (s + 1) for s in range(50)]
    assert not annotations(fig)


def test_metrics_figure_names_and_gns_excluded_by_default() -> None:
    records = log_records(3) + [{"kind": "gns", "step": 2, "rank": 0, "values": {"b_simple": 5.0}}]
    rows = to_rows(records)
    assert [t.name for t in plots.metrics_figure(rows).data] == ["loss", "lr"]
    assert [t.name for t in plots.metrics_figure(rows, names=["lr", "b_simple"]).data] == ["lr", "b_simple"]
    assert annotations(plots.metrics_figure(rows, names=["missing"])) == [plots.NO_DATA]


def test_throughput_figure_sums_ranks_per_step() -> None:
    rows = to_rows(perf_records(6, 3))
    fig = plots.throughput_figure(rows)
    assert [t.name for t in fig.data] == ["global", "rank 0", "rank 1", "rank 2"]
    assert list(trace(fig, "global").x) == list(range(6))
    assert list(trace(fig, "global").y) == [sum(100.0 * (r + 1) + s for r in range(3)) for s in range(6)]
    assert list(trace(fig, "rank 1").y) == [200.0 + s for s in range(6)]


def test_throughput_global_skips_steps_not_every_rank_reported() -> None:
    rows = to_rows(perf_records(3, 2) + perf_records(4, 1)[-1:])
    steps, total = plots.global_throughput(rows)
    assert steps == [0, 1, 2]
    assert list(trace(plots.throughput_figure(rows), "rank 0").x) == [0, 1, 2, 3]


def test_step_time_figure_stacks_means_over_ranks() -> None:
    fig = plots.step_time_figure(to_rows(perf_records(4, 2)))
    assert [t.name for t in fig.data] == ["compute", "communication wait", "data loading", "step time"]
    assert {t.stackgroup for t in fig.data[:3]} == {"split"}
    assert trace(fig, "step time").stackgroup is None
    assert list(trace(fig, "compute").y) == pytest.approx([0.105] * 4)
    assert list(trace(fig, "data loading").y) == pytest.approx([0.03] * 4)
    assert list(trace(fig, "step time").y) == pytest.approx([0.205] * 4)


def test_step_time_figure_leaves_out_unmeasured_comm() -> None:
    records = perf_records(3, 2)
    for rec in records:
        del rec["values"]["comm_time"]
    fig = plots.step_time_figure(to_rows(records))
    assert "communication wait" not in [t.name for t in fig.data]


def test_gpu_figure_per_rank_traces() -> None:
    records = [
        {
            "kind": "gpu",
            "step": s,
            "rank": r,
            "time": 0.0,
            "values": {
                "utilization": 50.0 + r,
                "memory_used_mb": 1000.0 * (r + 1),
                "memory_total_mb": 8000.0,
            },
        }
        for s in range(3)
        for r in range(2)
    ]
    fig = plots.gpu_figure(to_rows(records))
    assert list(trace(fig, "rank 1 utilization").y) == [51.0] * 3
    assert list(trace(fig, "rank 0 memory").y) == [1000.0] * 3
    assert list(trace(fig, "memory total").y) == [8000.0, 8000.0]
    assert not [a for a in fig.layout.annotations if a.name == plots.NO_DATA_NAME]


def test_gns_figure_b_simple_and_global_batch() -> None:
    records = [
        {"kind": "gns", "step": s, "rank": 0, "values": {"b_simple": 10.0 * s, "g2": 1.0}} for s in range(4)
    ]
    fig = plots.gns_figure(to_rows(records), global_batch=64)
    assert list(trace(fig, "B_simple").x) == [0, 1, 2, 3]
    assert list(trace(fig, "B_simple").y) == [0.0, 10.0, 20.0, 30.0]
    assert list(trace(fig, "global batch").y) == [64.0, 64.0]


EMPTY_FIGURES = {
    "metrics": lambda: plots.metrics_figure([]),
    "throughput": lambda: plots.throughput_figure([]),
    "step_time": lambda: plots.step_time_figure([]),
    "gpu": lambda: plots.gpu_figure([]),
    "gns": lambda: plots.gns_figure([]),
    "scaling": lambda: plots.scaling_figure(ScalingResult("weak")),
    "scaling_none": lambda: plots.scaling_figure(None),
    "bucket": lambda: plots.bucket_figure({}),
    "tradeoff": lambda: plots.tradeoff_figure(None, 64),
    "tradeoff_negative": lambda: plots.tradeoff_figure(-3.0, 64),
}


@pytest.mark.parametrize("key", sorted(EMPTY_FIGURES))
def test_empty_input_gives_titled_figure_with_annotation(key: str) -> None:
    fig = EMPTY_FIGURES[key]()
    assert isinstance(fig, go.Figure)
    assert not fig.data
    notes = [a for a in fig.layout.annotations if a.name == plots.NO_DATA_NAME]
    assert [a.text for a in notes] == [plots.NO_DATA]
    assert fig.layout.title.text
    assert fig.layout.xaxis.title.text


# -- analysis figures ----------------------------------------------------------------------------


def scaling_result() -> ScalingResult:
    return ScalingResult(
        "weak",
        [
            ScalingPoint(4, 340.0, 0.12, 0.03, 32, 128),
            ScalingPoint(1, 100.0, 0.1, 0.0, 32, 32),
            ScalingPoint(2, 190.0, 0.11, 0.02, 32, 64),
        ],
    )


def test_scaling_figure_throughput_ideal_efficiency_comm() -> None:
    fig = plots.scaling_figure(scaling_result())
    assert list(trace(fig, "measured").x) == [1, 2, 4]
    assert list(trace(fig, "measured").y) == [100.0, 190.0, 340.0]
    assert list(trace(fig, "ideal").y) == [n * 100.0 for n in (1, 2, 4)]
    assert list(trace(fig, "efficiency").y) == pytest.approx([1.0, 0.95, 0.85])
    assert list(trace(fig, "comm share").y) == pytest.approx([0.0, 0.02 / 0.11, 0.25])
    assert trace(fig, "efficiency").xaxis == "x2"
    assert "Weak scaling" in fig.layout.title.text


def test_bucket_figure_sorted_log_x_with_fastest() -> None:
    fig = plots.bucket_figure({25: 0.10, 1: 0.20, 100: 0.15, 5: 0.10})
    assert fig.layout.xaxis.type == "log"
    assert list(trace(fig, "step time").x) == [1.0, 5.0, 25.0, 100.0]
    assert list(trace(fig, "step time").y) == [0.20, 0.10, 0.10, 0.15]
    assert list(trace(fig, "fastest").x) == [5.0]


def test_tradeoff_curve_satisfies_identity_and_marks_current_batch() -> None:
    fig = plots.tradeoff_figure(200.0, current_batch=512)
    curve = trace(fig, "trade-off")
    assert len(curve.x) > 50
    for e, s in zip(curve.x, curve.y, strict=True):
        assert (s - 1) * (e - 1) == pytest.approx(1.0)
    current = trace(fig, "current batch 512")
    assert list(current.x) == pytest.approx([1 + 512 / 200])
    assert list(current.y) == pytest.approx([1 + 200 / 512])
    assert list(trace(fig, "B = B_noise").x) == pytest.approx([2.0])
    assert fig.layout.xaxis.type == "log" and fig.layout.yaxis.type == "log"


# -- shared properties ---------------------------------------------------------------------------


def all_figures() -> list[go.Figure]:
    rows = to_rows(log_records(5) + perf_records(5, 2))
    return [
        plots.metrics_figure(rows),
        plots.throughput_figure(rows),
        plots.step_time_figure(rows),
        plots.scaling_figure(scaling_result()),
        plots.bucket_figure({1: 0.2, 25: 0.1}),
        plots.tradeoff_figure(100.0, 64),
    ]


def test_figures_are_titled_and_hold_plain_numbers() -> None:
    for fig in all_figures():
        assert fig.layout.title.text
        assert fig.layout.xaxis.title.text and fig.layout.yaxis.title.text
        for t in fig.data:
            for v in [*t.x, *t.y]:
                assert type(v) in (int, float), (t.name, type(v))


def test_records_and_store_rows_draw_the_same_figure(tmp_path: Any) -> None:
    records = log_records(10) + perf_records(10, 2)
    live = to_rows(records)
    with RunStore(tmp_path / "runs.sqlite") as store:
        run = store.create_run(world_size=2, backend="gloo")
        store.add_metrics(run, [{**r, "cell_seq": 1} for r in live])
        stored = store.metrics(run, rank="all")
    for build in (plots.metrics_figure, plots.throughput_figure, plots.step_time_figure):
        assert build(live).to_plotly_json() == build(stored).to_plotly_json()


def test_compare_figure_has_a_panel_per_metric_and_a_curve_per_run() -> None:
    a = [{"name": "loss", "step": 1, "value": 1.0}, {"name": "loss", "step": 2, "value": float("nan")}]
    b = [{"name": "loss", "step": 1, "value": 2.0}, {"name": "acc", "step": 1, "value": 0.5}]
    fig = plots.compare_figure([(1, a), (2, b)], ["acc", "loss"])
    assert fig.layout.title.text == "run 1 vs run 2"
    assert [ann.text for ann in fig.layout.annotations] == ["acc", "loss"]
    curves = {(t.name, t.yaxis): (list(t.x), list(t.y)) for t in fig.data}
    assert curves[("run 1", "y2")] == ([1], [1.0])  # the NaN point is left out
    assert curves[("run 2", "y2")] == ([1], [2.0]) and curves[("run 1", "y")] == ([], [])
    assert [t.showlegend for t in fig.data if t.yaxis == "y"] == [True, True]
    assert plots.compare_figure([(1, []), (2, [])], []).layout.annotations[0].text == "(no metrics)"


def test_compare_figure_colours_each_run_and_draws_losses_on_a_log_scale() -> None:
    runs = [
        (i, [{"name": "loss", "step": 0, "value": 10.0**i}, {"name": "acc", "step": 0, "value": 0.5}])
        for i in (1, 2, 3)
    ]
    fig = plots.compare_figure(runs, ["acc", "loss"], [[0, 5], [], [0, 7]])
    assert fig.layout.title.text == "run 1 vs run 2 vs run 3"
    colours = [t.line.color for t in fig.data if t.yaxis == "y2"]
    assert len(set(colours)) == 3 and colours == [t.line.color for t in fig.data if t.yaxis == "y"]
    assert fig.layout.yaxis2.type == "log" and fig.layout.yaxis.type != "log"
    assert {s.line.color for s in fig.layout.shapes} == {
        colours[0],
        colours[2],
    }  # segments in the run's colour
    negative = [(1, [{"name": "loss", "step": 0, "value": -1.0}])]
    assert plots.compare_figure(negative, ["loss"]).layout.yaxis.type != "log"


def test_loading_figure_bars_real_against_synthetic() -> None:
    fig = plots.loading_figure(80.0, 100.0, "the loader is the bottleneck")
    assert list(fig.data[0].y) == [80.0, 100.0] and fig.layout.title.text == "the loader is the bottleneck"
