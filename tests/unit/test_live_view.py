"""The live view reads well (issue 22 item 6), driven without a browser: bookkeeping values are not
metrics; each panel has its own legend and axes; a loss that falls by decades is on a log axis; the
noise scale shows its interval on a robust axis that marks a spike instead of scaling to it; the
figures take the cell's width; a finished cell leaves its figures as plotly JSON (issue 27 item 5)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest

from dtwork import plots
from dtwork.kernel.watcher import CellResult
from dtwork.shared.records import to_rows
from dtwork.widgets.dashboard import Dashboard


def log(step: int, **values: float) -> dict[str, Any]:
    return {"kind": "log", "step": step, "rank": 0, "time": 1.0 + step, "values": values}


def perf(step: int, rank: int) -> dict[str, Any]:
    values = {"samples_per_s": 100.0, "step_time": 0.1, "compute_time": 0.08, "data_time": 0.01}
    return {"kind": "perf", "step": step, "rank": rank, "time": 1.0 + step, "values": values}


def gns(step: int, b: float, interval: bool = True) -> dict[str, Any]:
    """A GNS record as the loop sends it: the estimate, its parts and the batch sizes it used."""
    values = {"b_simple": b, "g2": 1.0, "trace_sigma": b, "b_small": 32.0, "b_big": 64.0}
    if interval:
        values |= {"b_simple_lo": 0.8 * b, "b_simple_hi": 1.25 * b}
    return {"kind": "gns", "step": step, "rank": 0, "time": 1.0 + step, "values": values}


def spiky_gns(steps: int = 40, spike_at: int = 20) -> list[dict[str, Any]]:
    """B_simple near 100 with one spike to 10M (|G|^2 near 0 at one step); no interval at the spike."""
    return [gns(s, 1e7, interval=False) if s == spike_at else gns(s, 100.0 + (s % 5)) for s in range(steps)]


def names(fig: Any) -> list[str]:
    return [t.name for t in fig.data]


def by_name(fig: Any, name: str) -> Any:
    (match,) = [t for t in fig.data if t.name == name]
    return match


@pytest.fixture
def dash() -> Iterator[Dashboard]:
    d = Dashboard(7, [0, 1], global_batch=64, draw_share=None)
    yield d
    d.close()


def test_gns_bookkeeping_values_are_not_plotted_as_metrics(dash: Dashboard) -> None:
    records = [r for s in range(5) for r in (log(s, loss=1.0 / (s + 1)), gns(s, 50.0))]
    dash.feed(records)
    dash.flush()
    assert names(dash.figures["metrics"]) == ["loss"]
    assert "b_small" not in names(dash.figures["gns"]) and "b_big" not in names(dash.figures["gns"])
    assert names(plots.metrics_figure(to_rows(records))) == ["loss"]


def test_each_row_of_the_live_figure_has_its_own_legend_and_axes(dash: Dashboard) -> None:
    dash.feed([r for s in range(3) for r in (log(s, loss=1.0), perf(s, 0), perf(s, 1))])
    dash.flush()
    layout = dash.panels["metrics"].figure.layout
    for row, key in enumerate(("metrics", "throughput", "step_time"), 1):
        legend = plots.row_legend(row)
        x_axis, y_axis = plots.row_axes(row)
        traces = dash.figures[key].data
        assert traces and {(t.legend or "legend", t.xaxis, t.yaxis) for t in traces} == {
            (legend, x_axis, y_axis)
        }
        # each legend sits beside its own row, at the row's top
        top = layout[y_axis.replace("y", "yaxis", 1)].domain[1]
        assert layout[legend].y == pytest.approx(top) and layout[legend].x > 1
    assert layout.width is None and layout.autosize  # as wide as the cell, whatever its width


def test_a_loss_falling_by_decades_goes_on_a_log_axis_live_and_in_the_report(dash: Dashboard) -> None:
    dash.feed([log(s, loss=2.0 / (s + 1)) for s in range(5)])  # 2.0 -> 0.4: one linear axis
    dash.flush()
    assert dash.panels["metrics"].figure.layout.yaxis.type == "linear"
    dash.feed([log(s, loss=2.0 * 10 ** (-s / 10)) for s in range(5, 40)])  # down to ~1e-4
    dash.flush()
    assert dash.panels["metrics"].figure.layout.yaxis.type == "log"
    assert dash.panels["metrics"].figure.layout.yaxis2.type != "log"  # throughput keeps its own axis
    falling = to_rows([log(s, loss=2.0 * 10 ** (-s / 10)) for s in range(40)])
    assert plots.metrics_figure(falling).layout.yaxis.type == "log"
    with_zero = to_rows([log(s, loss=2.0 * 10 ** (-s / 10), acc=s / 40) for s in range(40)])
    assert plots.metrics_figure(with_zero).layout.yaxis.type == "linear"  # acc starts at 0: no log axis


def assert_robust_gns(fig: Any) -> None:
    """The estimate with its band; the axis scaled to the bulk and the global batch; the spike marked."""
    assert names(fig) == ["B_simple", "interval low", "95% interval", "global batch", "off scale"]
    band = names(fig).index("95% interval")
    assert (
        fig.data[band].fill == "tonexty" and fig.data[band - 1].name == "interval low"
    )  # fills between them
    assert fig.data[band - 1].showlegend is False
    low, high = fig.layout.yaxis.range
    assert low < 64 and 104 < high < 1000  # the bulk (100-104) and the global batch, not the 10M spike
    off = by_name(fig, "off scale")
    assert list(off.x) == [20] and list(off.y) == pytest.approx([high])  # the spike, at the top edge


def test_the_gns_panel_shows_the_interval_on_a_robust_axis(dash: Dashboard) -> None:
    records = spiky_gns()
    assert_robust_gns(plots.gns_figure(to_rows(records), global_batch=64))
    dash.feed(records)
    dash.flush()
    assert_robust_gns(dash.figures["gns"])


def test_without_an_interval_or_a_spike_the_gns_panel_is_the_estimate_on_plotlys_axis() -> None:
    fig = plots.gns_figure(to_rows([gns(s, 100.0 + s, interval=False) for s in range(20)]), global_batch=64)
    assert names(fig) == ["B_simple", "global batch"]
    assert fig.layout.yaxis.range is None


def test_robust_range_follows_the_bulk() -> None:
    assert plots.robust_range([1.0, 2.0, 3.0]) is None  # too few values to call one an outlier
    assert plots.robust_range([float(v) for v in range(20)]) is None  # nothing outside: autorange
    low, high = plots.robust_range([*[10.0] * 10, 11.0, 1e9, -1e9])  # type: ignore[misc]
    assert 9 < low < 10 and 11 < high < 12
    assert plots.off_scale([1, 2, 3], [10.0, 1e9, -1e9], (low, high)) == ([2, 3], [high, low])


def test_the_finished_cells_static_figure_has_every_panel_with_its_legend(dash: Dashboard) -> None:
    gpu = {"utilization": 80.0, "memory_used_mb": 1000.0, "memory_total_mb": 16000.0}
    dash.feed([log(s, loss=1.0 / (s + 1)) for s in range(30)])
    dash.feed([{"kind": "gpu", "step": s, "rank": 0, "time": 0.0, "values": gpu} for s in range(3)])
    dash.feed(spiky_gns())
    dash.finish(CellResult(seq=1, ranks=[0, 1], status="ok", seconds=12.0))
    fig = dash.static_figure()
    titles = [a.text for a in fig.layout.annotations if a.name != plots.NO_DATA_NAME]
    assert titles[:3] == ["Metrics", "Throughput", "Step time split (mean over ranks)"]
    assert titles[3:] == ["GPUs: utilization", "GPUs: memory", "Gradient noise scale"]
    assert "finished in 12 s" in fig.layout.title.text and "run 7" in fig.layout.title.text
    legends = {t.legend or "legend" for t in fig.data}
    assert legends == {plots.row_legend(r) for r in (1, 4, 5, 6)}  # the rows with data, each its own
    assert by_name(fig, "off scale").yaxis == "y6" and fig.layout.yaxis6.range[1] < 1000
    assert fig.layout.width is None and fig.layout.autosize


def test_a_finished_cell_leaves_plotly_json_in_its_output_and_closes_its_widgets() -> None:
    """Through IPython's display machinery: the output the dashboard was displayed in is updated to
    the static figure (plotly's mimetype), and the figure widgets drop plotly's JavaScript from their
    state before they close, so that a saved notebook holds neither."""
    from IPython.core.interactiveshell import InteractiveShell
    from IPython.utils.capture import capture_output

    InteractiveShell.instance()
    with capture_output() as captured:
        dash = Dashboard.for_cell(3, [0, 1], seq=2)
        dash.feed([log(s, loss=1.0 / (s + 1)) for s in range(10)])
        dash.feed(spiky_gns())
        dash.finish(CellResult(seq=1, ranks=[0, 1], status="ok", seconds=2.0))
    first, *_, last = captured.outputs
    assert first.data["application/vnd.jupyter.widget-view+json"]["model_id"]
    # beside the widget, the run's cell: what a notebook reopened mid-training draws from the store
    assert first.data["application/vnd.dtwork.cell+json"] == {"run_id": 3, "seq": 2}
    assert last.update and last.transient["display_id"] == first.transient["display_id"]
    spec = last.data["application/vnd.plotly.v1+json"]
    assert {t["name"] for t in spec["data"]} >= {"loss", "B_simple", "off scale"}
    assert "width" not in spec["layout"] and "legend2" in spec["layout"]
    assert len(json.dumps(spec)) < 100_000
    assert "finished" in last.data["text/plain"]
    loss = next(t for t in spec["data"] if t["name"] == "loss")
    assert loss["y"] == [1.0 / (s + 1) for s in range(10)]  # plain lists, which every reader takes
    figures = [dash.panels["metrics"].figure, dash.panels["gns"].figure]
    assert all(f.released and f.comm is None for f in figures)
    assert dash.comm is None and dash.header.widget.comm is None
    assert not dash.drawing


def test_the_gns_axis_says_not_yet_settled_until_the_records_say_settled() -> None:
    records = [gns(s, 100.0) for s in range(4)]
    assert plots.gns_figure(to_rows(records)).layout.yaxis.title.text == "B_simple (samples)"
    for rec in records:
        rec["values"]["settled"] = float(rec["step"] >= 3)
    unsettled = plots.gns_figure(to_rows(records[:3])).layout.yaxis.title.text
    assert unsettled == "B_simple (samples), not yet settled"
    assert plots.gns_figure(to_rows(records)).layout.yaxis.title.text == "B_simple (samples)"
