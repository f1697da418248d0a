"""One colour per metric in every view: the live dashboard, the finished cell, the report,
``runs compare`` and the sidebar's run summary all take it from dtwork.plots.palette."""

from __future__ import annotations

from typing import Any

from dtwork import plots
from dtwork.plots.palette import METRIC_COLOURS, metric_colour
from dtwork.widgets.live_figure import RowsPanel

ROWS: list[dict[str, Any]] = [
    {"kind": "log", "name": name, "rank": None, "step": step, "value": value + step}
    for step in range(1, 6)
    for name, value in (("accuracy", 0.5), ("loss", 2.0), ("my_metric", 7.0))
] + [
    {"kind": "perf", "name": name, "rank": rank, "step": step, "value": value}
    for step in range(1, 6)
    for rank in (0, 1)
    for name, value in (("step_time", 0.1), ("compute_time", 0.06), ("comm_time", 0.03), ("data_time", 0.01))
]


def _colours(traces: Any) -> dict[str, str]:
    return {t.name: t.line.color for t in traces if t.name}


def test_a_metric_has_one_colour_in_every_figure() -> None:
    metrics, steps = plots.MetricsSeries().add(ROWS), plots.StepTimeSeries().add(ROWS)
    report = {**_colours(plots.metrics_figure(ROWS).data), **_colours(plots.step_time_figure(ROWS).data)}
    finished = _colours(plots.dashboard_figure([(metrics, metrics.traces()), (steps, steps.traces())]).data)
    live = RowsPanel({"metrics": plots.MetricsSeries(), "step_time": plots.StepTimeSeries()})
    # the live rows fill in arrival order (step time first here): colours must not follow it
    live.show_rows({"step_time": steps.traces(50)})
    live.show_rows({"metrics": metrics.traces(50)})
    shown = _colours(live.figure.data)
    names = ["loss", "accuracy", "my_metric", "compute", "communication wait", "data loading", "step time"]
    for name in names:
        assert report[name] == finished[name] == shown[name] == metric_colour(name), name
    compare = plots.compare_figure([(1, ROWS), (2, ROWS)], ["loss", "my_metric"])
    # runs compare tells runs apart within a panel: there a colour is a run's, the same in every panel
    by_panel = {(t.yaxis, t.name): t.line.color for t in compare.data}
    assert by_panel[("y", "run 1")] == by_panel[("y2", "run 1")] != by_panel[("y", "run 2")]
    assert by_panel[("y", "run 2")] == by_panel[("y2", "run 2")]
    assert len({metric_colour(n) for n in ("loss", "accuracy", "compute", "data loading")}) == 4


def test_unlisted_names_keep_their_colour_and_listed_ones_are_fixed() -> None:
    assert metric_colour("loss") == METRIC_COLOURS["loss"]
    assert metric_colour("my_metric") == metric_colour("my_metric").upper()  # a palette entry
    assert metric_colour("my_metric") == metric_colour("my" + "_metric")


def test_the_sidebar_draws_the_loss_in_its_colour(tmp_path: Any, monkeypatch: Any) -> None:
    from dtwork.server import queries
    from dtwork.store.runs import RunStore

    path = tmp_path / "runs.sqlite"
    monkeypatch.setenv("DTWORK_STORE", str(path))
    store = RunStore(path)
    run_id = store.create_run(name="x", world_size=2, backend="gloo")
    store.add_metrics(run_id, [{"kind": "log", "name": "loss", "rank": None, "step": 1, "value": 1.0}])
    store.close()
    (run,) = queries.list_runs(str(tmp_path))["runs"]
    assert run["sparkline_colour"] == metric_colour("loss")
