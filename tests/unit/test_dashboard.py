"""Tests for the live dashboard: traces, bars, throttling, threads and the end state (no browser)."""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any

import ipywidgets as widgets
import plotly.graph_objects as go
import pytest

from dtwork import plots
from dtwork.kernel.watcher import CellResult
from dtwork.shared.records import to_rows
from dtwork.widgets.dashboard import BAR_COLOURS, Dashboard, format_duration
from dtwork.widgets.drawer import MAX_INTERVAL, MAX_SHARE, Pacer


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def log(step: int, **values: float) -> dict[str, Any]:
    return {"kind": "log", "step": step, "rank": 0, "time": 10.0 + step, "values": values}


def perf(step: int, rank: int, samples: float, step_time: float = 0.1) -> dict[str, Any]:
    values = {"samples_per_s": samples, "step_time": step_time, "compute_time": 0.08, "data_time": 0.01}
    return {"kind": "perf", "step": step, "rank": rank, "time": 10.0 + step, "values": values}


def trace(fig: go.Figure, name: str) -> Any:
    matches = [t for t in fig.data if t.name == name]
    assert len(matches) == 1, [t.name for t in fig.data]
    return matches[0]


def no_data(fig: go.Figure) -> bool:
    return any(a.name == plots.NO_DATA_NAME for a in fig.layout.annotations)


def wait_until(condition: Callable[[], bool], within: float = 30.0) -> bool:
    """Poll ``condition`` until it holds (return True) or ``within`` seconds pass (return False)."""
    deadline = time.monotonic() + within
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


@pytest.fixture
def dash() -> Iterator[Dashboard]:
    d = Dashboard.for_cell(7, [0, 1], title="mnist", global_batch=64, display=False)
    yield d
    d.close()


def test_log_records_land_exactly_in_the_metrics_trace(dash: Dashboard) -> None:
    dash.feed([log(s, loss=1 / (s + 1)) for s in range(40)])
    dash.flush()
    loss = trace(dash.figures["metrics"], "loss")
    assert list(loss.x) == list(range(40))
    assert list(loss.y) == [1 / (s + 1) for s in range(40)]
    assert not no_data(dash.figures["metrics"])


def test_new_metric_names_add_traces_and_existing_traces_update_in_place(dash: Dashboard) -> None:
    dash.feed([log(0, loss=1.0)])
    dash.flush()
    first = trace(dash.figures["metrics"], "loss")
    dash.feed([log(1, loss=0.5, acc=0.9)])
    dash.flush()
    assert trace(dash.figures["metrics"], "loss") is first
    assert list(first.y) == [1.0, 0.5]
    assert list(trace(dash.figures["metrics"], "acc").x) == [1]


def test_throughput_trace_is_the_sum_over_ranks(dash: Dashboard) -> None:
    dash.feed([perf(s, r, 100.0 * (r + 1) + s) for s in range(5) for r in (0, 1)])
    dash.flush()
    fig = dash.figures["throughput"]
    assert list(trace(fig, "global").x) == list(range(5))
    assert list(trace(fig, "global").y) == [300.0 + 2 * s for s in range(5)]
    assert list(trace(fig, "rank 1").y) == [200.0 + s for s in range(5)]
    assert list(trace(dash.figures["step_time"], "compute").y) == pytest.approx([0.08] * 5)
    assert "308 samples/s" in dash.header.html  # 104 + 204 at the last step


def test_progress_sets_bars_value_max_and_label() -> None:
    dash = Dashboard(3, [0, 1], min_interval=0.0, draw_share=None)
    dash.feed([perf(4, 0, 250.0, step_time=0.5), perf(4, 1, 240.0, step_time=0.5)])
    dash.progress({0: {"rank": 0, "time": 100.0, "step": 10, "total": 100, "phase": "train", "epoch": 0}})
    dash.progress({0: {"rank": 0, "time": 110.0, "step": 20, "total": 100, "phase": "train", "epoch": 0}})
    dash.progress({1: {"rank": 1, "time": 110.0, "step": 20, "total": None, "phase": "train", "epoch": 0}})
    dash.flush()
    bars = dash.header.rank_bars
    assert (bars[0].value, bars[0].max) == (20, 100)
    # 10 steps in 10 s -> 1 s/step, 80 steps left
    assert bars[0].description == "rank 0: step 20/100 · 250 samples/s · ETA 1 min 20 s"
    assert bars[1].value == 20 and bars[1].description == "rank 1: step 20 · 240 samples/s"
    assert "step 20/100" in dash.header.html and "ETA 1 min 20 s" in dash.header.html
    # the bars are drawn in the header's one widget: each rank's label, then its bar filled to value / max
    shown = dash.header.html
    assert shown.count("dtwork-rank-bar") == 2
    assert shown.index("rank 0: step 20/100 · 250 samples/s · ETA 1 min 20 s") < shown.index("width:20.0%")
    assert shown.index("rank 1: step 20 · 240 samples/s") < shown.index(
        "width:100.0%"
    )  # no total: full at its step
    assert dash.children[0] is dash.header.widget and not any(
        isinstance(c, widgets.IntProgress) for c in dash.children
    )
    dash.close()


def test_progress_eta_falls_back_to_step_times() -> None:
    dash = Dashboard(3, [0], min_interval=0.0, draw_share=None)
    dash.feed([perf(s, 0, 100.0, step_time=2.0) for s in range(3)])
    dash.progress({0: {"rank": 0, "time": 5.0, "step": 3, "total": 10}})
    dash.flush()
    assert dash.header.rank_bars[0].description.endswith("ETA 14 s")
    dash.close()


def test_feeding_twice_within_the_interval_redraws_once_unless_flushed() -> None:
    """The drawer (stepped by hand here: ``wake`` is one of its wakes) redraws at most once an
    interval; ``flush`` draws now."""
    clock = FakeClock()
    dash = Dashboard(1, [0], clock=clock)
    dash.feed([log(0, loss=1.0)])
    dash.wake()
    clock.now += 0.1
    dash.feed([log(1, loss=0.5)])
    dash.wake()
    assert dash.redraws == 1
    assert list(trace(dash.figures["metrics"], "loss").x) == [0]
    dash.flush()
    assert dash.redraws == 2
    assert list(trace(dash.figures["metrics"], "loss").x) == [0, 1]
    clock.now += 1.0
    dash.feed([log(2, loss=0.25)])
    dash.wake()
    assert dash.redraws == 3
    dash.wake()
    assert dash.redraws == 3  # nothing new
    dash.close()


def test_the_default_dashboard_redraws_twice_a_second_while_records_flow() -> None:
    """Records every 1/8 s for 5 s: a redraw at 0, 0.5, ..., 4.5 s (the issue asks for at least two
    a second). ``draw_share=None``: what a redraw costs on this machine does not enter the count."""
    clock = FakeClock()
    dash = Dashboard(1, [0], clock=clock, draw_share=None)
    for step in range(40):
        dash.feed([log(step, loss=1.0 / (step + 1))])
        dash.wake()
        clock.now += 0.125
    assert dash.redraws == 10
    dash.close()


def test_late_wakes_do_not_slow_the_redraws_and_a_pause_does_not_bunch_them() -> None:
    """A drawer that wakes 50 ms after each redraw is due still redraws every 0.5 s (the next one is
    due an interval after this one was due, not after it happened): 20 in 10 s, not 19. After a
    pause the schedule starts again from the first redraw, without redraws to catch up."""
    clock = FakeClock()
    dash = Dashboard(1, [0], clock=clock, draw_share=None)
    start, step = clock.now, 0
    while clock.now - start < 10.0:
        dash.feed([log(step, loss=1.0)])
        step += 1
        dash.wake()
        clock.now = max(clock.now, dash.next_draw + 0.05)
    assert dash.redraws == 20
    clock.now += 3.0  # nothing fed for 3 s
    dash.feed([log(step, loss=1.0)])
    dash.wake()
    assert dash.redraws == 21
    for _ in range(4):  # 0.1 s apart: none of these is due yet
        clock.now += 0.1
        dash.feed([log(step := step + 1, loss=1.0)])
        dash.wake()
    assert dash.redraws == 21
    clock.now += 0.1
    dash.wake()
    assert dash.redraws == 22
    dash.close()


def test_a_costly_redraw_still_comes_every_couple_of_seconds_within_a_larger_share() -> None:
    """On a busy machine (the drawer found every core busy), past ``draw_share`` the interval stops at
    MAX_INTERVAL while a redraw costs at most MAX_SHARE of a core over it (issue 45); past that it grows to
    keep MAX_SHARE. A quiet kernel keeps the budget alone."""
    pacer = Pacer(0.5, 0.01, clock=lambda: 0.0)

    def redraw_costing(seconds: float) -> float:
        pacer.drew(0.0, time.thread_time() - seconds, False)
        return pacer.interval

    redraw_costing(1.0)  # the first redraw builds the widgets: not budgeted
    assert redraw_costing(0.044) == pytest.approx(4.4, rel=0.01)  # quiet: the 1% budget
    pacer.busy = True
    assert redraw_costing(0.003) == 0.5  # 0.3 s by the budget: the least interval
    assert redraw_costing(0.044) == pytest.approx(MAX_INTERVAL)  # 4.4 s by the budget alone
    assert redraw_costing(0.150) == pytest.approx(0.150 / MAX_SHARE, rel=0.01)  # 3 s: the larger share


def test_costly_redraws_come_less_often() -> None:
    """The interval stretches to a redraw's CPU time over ``draw_share`` of a core, and not below
    ``min_interval``; the first redraw (it builds the widgets) is not budgeted."""
    clock = FakeClock()
    cheap = Dashboard(1, [0], clock=clock, min_interval=0.1, draw_share=None)
    costly = Dashboard(1, [0], clock=clock, min_interval=0.1, draw_share=1e-9)
    for s in (0, 1):
        for dash in (cheap, costly):
            dash.feed([log(s, loss=1.0 / (s + 1))])
            dash.wake()
        if s == 0:
            assert costly.interval == 0.1  # the first redraw's one-time cost sets nothing
        clock.now += 0.2
    assert cheap.interval == 0.1 and costly.interval > 1000  # any redraw costs more than 1 us
    for dash in (cheap, costly):
        dash.feed([log(2, loss=0.25)])
        dash.wake()
    assert (cheap.redraws, costly.redraws) == (3, 2)
    costly.flush()  # a flush still draws now
    assert list(trace(costly.figures["metrics"], "loss").x) == [0, 1, 2]
    generous = Dashboard(1, [0], clock=clock, min_interval=0.1, draw_share=1.0)
    for s in (0, 1):
        generous.feed([log(s, loss=1.0)])
        generous.wake()
        clock.now += 0.2
    assert generous.redraws == 2 and generous.interval == 0.1  # a redraw's CPU time is well under 0.1 s
    for dash in (cheap, costly, generous):
        dash.close()


def test_records_fed_after_a_redraw_are_drawn_by_the_drawer_without_more_feeding() -> None:
    # no CPU budget: the first redraw is cold, and with the default budget on a loaded machine it
    # would stretch the interval past the test's bound
    dash = Dashboard(1, [0], min_interval=0.05, draw_share=None)
    dash.start_drawer()
    for step in range(2):
        dash.feed([log(step, loss=1.0 / (step + 1))])
        assert wait_until(lambda step=step: len(trace_or_none(dash, "loss")) > step)
    assert list(trace(dash.figures["metrics"], "loss").x) == [0, 1]
    dash.close()
    assert not dash.drawing


def trace_or_none(dash: Dashboard, name: str) -> list[Any]:
    """The x of the metrics trace ``name``, or [] before it is drawn."""
    return next((list(t.x) for t in dash.figures["metrics"].data if t.name == name), [])


def test_a_drawer_reads_and_draws_what_is_fed_in_its_own_thread_at_idle_priority() -> None:
    """With a drawer (as the collector makes it) ``feed`` only queues: the records are read and drawn
    in the dashboard's own thread, which runs at the OS's idle priority on Linux, so that the live
    view does not take a core from ranks that fill the machine."""
    dash = Dashboard(1, [0], min_interval=0.05, draw_share=None)
    drawn_in: list[tuple[str, int | None]] = []
    draw = dash.redraw

    def spy() -> None:
        policy = os.sched_getscheduler(0) if hasattr(os, "sched_getscheduler") else None
        drawn_in.append((threading.current_thread().name, policy))
        draw()

    dash.redraw = spy  # type: ignore[method-assign]
    dash.start_drawer()
    for s in range(40):
        dash.feed([log(s, loss=float(s)), perf(s, 0, 100.0)])
        dash.progress({0: {"step": s + 1, "total": 40, "time": 10.0 + s}})
        time.sleep(0.005)  # the workload: records arrive over time, as from a training loop
    assert wait_until(lambda: dash.rows_fed == 40 * 5 and dash.redraws >= 1)
    assert {name for name, _ in drawn_in} == {"dtwork-dashboard"}  # never in the feeding thread
    if sys.platform.startswith("linux"):
        policies = [policy for _, policy in drawn_in]
        assert policies[0] == os.SCHED_IDLE and set(policies) <= {os.SCHED_IDLE, os.SCHED_OTHER}
        # a busy machine (this test beside others) may make a wake late: then, and only then, niced normal
        assert dash.drawer_busy or set(policies) == {os.SCHED_IDLE}
    dash.feed([log(40, loss=40.0)])
    dash.finish(
        CellResult(seq=1, ranks=[0], status="ok", seconds=1.0)
    )  # stops the drawer, then draws what it had not read
    assert not dash.drawing and not any(
        t.name == "dtwork-dashboard" and t.is_alive() for t in threading.enumerate()
    )
    assert drawn_in[-1][0] == threading.current_thread().name
    assert list(trace(dash.figures["metrics"], "loss").x) == list(range(41))
    assert "step 40/40" in dash.header.html
    dash.close()


def test_two_threads_feeding_lose_nothing() -> None:
    dash = Dashboard(1, [0, 1], min_interval=0.01)
    errors: list[BaseException] = []

    def worker(rank: int) -> None:
        try:
            for s in range(150):
                batch = [perf(s, rank, 10.0)]
                if rank == 0:
                    batch.append(log(s, loss=float(s)))
                dash.feed(batch)
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(r,)) for r in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dash.flush()
    assert not errors
    assert dash.rows_fed == 150 * 4 * 2 + 150
    assert list(trace(dash.figures["metrics"], "loss").x) == list(range(150))
    assert list(trace(dash.figures["throughput"], "global").y) == [20.0] * 150
    dash.close()


def test_empty_dashboard_shows_no_data_annotations(dash: Dashboard) -> None:
    assert set(dash.figures) == {"metrics", "throughput", "step_time"}
    assert all(no_data(fig) and not fig.data for fig in dash.figures.values())
    dash.feed([log(0, loss=1.0)])
    dash.flush()
    assert not no_data(dash.figures["metrics"])
    assert no_data(dash.figures["throughput"])


def test_gpu_and_gns_figures_appear_with_their_records(dash: Dashboard) -> None:
    dash.feed([log(0, loss=1.0)])
    dash.flush()
    assert "gpu" not in dash.figures and "gns" not in dash.figures
    gpu = {"utilization": 80.0, "memory_used_mb": 1000.0, "memory_total_mb": 16000.0}
    dash.feed([{"kind": "gpu", "step": 0, "rank": 1, "time": 0.0, "values": gpu}])
    dash.feed([{"kind": "gns", "step": 0, "rank": 0, "time": 0.0, "values": {"b_simple": 120.0}}])
    dash.flush()
    assert list(trace(dash.figures["gpu"], "rank 1 utilization").y) == [80.0]
    assert list(trace(dash.figures["gns"], "B_simple").y) == [120.0]
    assert list(trace(dash.figures["gns"], "global batch").y) == [64.0, 64.0]
    views = [p.view for p in dash.panels.values()]
    assert all(v in dash.views for v in views)
    sections = {s.titles[0]: s.selected_index for s in dash.children[1:]}
    # the base figures open, the others folded: the view stays one screen tall
    assert sections == {"Metrics · throughput · step time": 0, "GPUs": None, "Gradient noise scale": None}


@pytest.mark.parametrize(
    ("status", "word", "bar_style"),
    [("ok", "finished", "success"), ("error", "failed", "danger"), ("interrupted", "interrupted", "warning")],
)
def test_finish_header_says_how_the_cell_ended(
    dash: Dashboard, status: str, word: str, bar_style: str
) -> None:
    dash.progress({0: {"rank": 0, "time": 1.0, "step": 5, "total": 10}})
    assert "running" in dash.header.html
    dash.finish(CellResult(seq=1, ranks=[0, 1], status=status, seconds=75.0))
    assert f"{word} in 1 min 15 s" in dash.header.html
    assert "running" not in dash.header.html
    assert dash.header.rank_bars[0].bar_style == bar_style
    assert f"background:{BAR_COLOURS[bar_style]}" in dash.header.html  # the bar takes the ending's colour
    assert dash.status == word


def test_finish_draws_what_is_pending() -> None:
    clock = FakeClock()
    dash = Dashboard(1, [0], clock=clock)
    dash.feed([log(0, loss=1.0)])
    dash.feed([log(1, loss=0.5)])
    dash.finish(SimpleNamespace(status="ok"))
    assert list(trace(dash.figures["metrics"], "loss").x) == [0, 1]
    dash.close()


def test_for_cell_displays_with_its_title(monkeypatch: pytest.MonkeyPatch) -> None:
    shown: list[Any] = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kw: shown.append(obj))
    dash = Dashboard.for_cell(12, [0, 1, 2, 3], title="cifar", global_batch=64)
    assert shown == [dash._repr_mimebundle_()]  # the widget, named by its model
    assert isinstance(dash, widgets.VBox)
    assert "cifar" in dash.header.html and "run 12" in dash.header.html and "ranks 0-3" in dash.header.html
    assert sorted(dash.header.rank_bars) == [0, 1, 2, 3]
    dash.close()
    bare = Dashboard.for_cell(1, [0], display=False)
    assert bare.title == "dtwork" and bare.global_batch is None
    bare.close()


def test_figures_are_figure_widgets(dash: Dashboard) -> None:
    dash.feed([log(0, loss=1.0)])
    dash.flush()
    assert isinstance(dash.panels["metrics"].view, go.FigureWidget)


def test_format_duration() -> None:
    assert [format_duration(s) for s in (4.4, 65, 3725)] == ["4 s", "1 min 05 s", "1 h 02 min"]


def test_a_trace_that_belongs_earlier_redraws_the_figure_in_report_order(dash: Dashboard) -> None:
    dash.feed([perf(0, 1, 50.0)])  # rank 1 reports first
    dash.flush()
    assert [t.name for t in dash.figures["throughput"].data] == ["global", "rank 1"]
    dash.feed([perf(0, 0, 40.0), perf(1, 1, 60.0), perf(1, 0, 45.0)])
    dash.flush()
    fig = dash.figures["throughput"]
    assert (
        [t.name for t in fig.data]
        == [
            t.name
            for t in plots.throughput_figure(
                to_rows([perf(0, 1, 50.0), perf(0, 0, 40.0), perf(1, 1, 60.0), perf(1, 0, 45.0)])
            ).data
        ]
        == ["global", "rank 0", "rank 1"]
    )
    assert list(trace(fig, "global").y) == [90.0, 105.0]
    assert not no_data(fig)


def test_gpu_memory_traces_sit_on_the_right_hand_plot(dash: Dashboard) -> None:
    gpu = {"utilization": 80.0, "memory_used_mb": 1000.0, "memory_total_mb": 16000.0}
    dash.feed([{"kind": "gpu", "step": s, "rank": 0, "time": 0.0, "values": gpu} for s in range(3)])
    dash.flush()
    fig = dash.figures["gpu"]
    assert trace(fig, "rank 0 utilization").xaxis in (None, "x")
    assert (trace(fig, "rank 0 memory").xaxis, trace(fig, "rank 0 memory").yaxis) == ("x2", "y2")
    assert list(trace(fig, "memory total").x) == [0, 2]
    assert [a.text for a in fig.layout.annotations] == ["utilization", "memory"]


def test_a_long_cell_draws_at_most_max_points_per_trace() -> None:
    from dtwork.widgets.dashboard import MAX_POINTS

    dash = Dashboard(1, [0], min_interval=0.0, draw_share=None)
    dash.feed([log(s, loss=float(s)) for s in range(5 * MAX_POINTS)])
    dash.flush()
    loss = trace(dash.figures["metrics"], "loss")
    assert len(loss.x) <= MAX_POINTS + 1
    assert (loss.x[0], loss.x[-1], loss.y[-1]) == (0, 5 * MAX_POINTS - 1, 5 * MAX_POINTS - 1.0)
    dash.close()


def test_the_dashboard_modules_load_once_in_a_thread() -> None:
    """``warm_dashboard`` loads the dashboard's imports in a thread, once per process."""
    from dtwork import widgets

    widgets.warm_dashboard()
    assert widgets.dashboard_ready(60.0)
    assert "plotly.basewidget" in sys.modules and "dtwork.widgets.dashboard" in sys.modules
    first = widgets.warming()
    widgets.warm_dashboard()
    assert widgets.warming() is first is not None  # started once


def test_the_three_base_figures_are_rows_of_one_widget_updated_in_one_restyle(dash: Dashboard) -> None:
    """Metrics, throughput and step time are the rows of one figure: a redraw that changes all three sends
    one restyle (plotly's trace edit id moves by one), and each row keeps its own traces and note."""
    panel = dash.panels["metrics"]
    assert dash.panels["throughput"] is panel and dash.panels["step_time"] is panel
    assert [v for v in dash.views if v is panel.view] == [panel.view]  # on screen once
    for step in range(2):  # the first draws add the traces (and plotly settles the axes once)
        dash.feed([log(step, loss=1.0 / (step + 1)), *(perf(step, r, 100.0 + step) for r in (0, 1))])
        dash.flush()
    edits = panel.figure.trace_edits
    for step in range(2, 5):
        dash.feed([log(step, loss=1.0 / (step + 1)), *(perf(step, r, 100.0 + step) for r in (0, 1))])
        dash.flush()
        assert panel.figure.trace_edits == edits + step - 1  # one restyle for the three rows
    assert list(trace(dash.figures["metrics"], "loss").y) == [1.0, 0.5, 1 / 3, 0.25, 0.2]
    assert list(trace(dash.figures["throughput"], "global").y) == [200.0, 202.0, 204.0, 206.0, 208.0]
    assert [t.name for t in dash.figures["metrics"].data] == ["loss"]
    assert not any(no_data(dash.figures[k]) for k in ("metrics", "throughput", "step_time"))
    # every row is drawn on its own axes, the legend grouped by row
    axes = {(t.legendgroup, t.xaxis, t.yaxis) for t in panel.figure.data if t.legendgroup}
    assert axes == {("metrics", "x", "y"), ("throughput", "x2", "y2"), ("step_time", "x3", "y3")}


def test_a_restyle_is_one_widget_message_that_stays_until_the_next_one_and_the_end(dash: Dashboard) -> None:
    """A redraw's restyle sets plotly's two edit ids and the restyle message together (one widget message,
    ``hold_sync``) and leaves the message in place: each carries a new trace edit id, so the frontend takes
    each as a change. When the cell ends the message is cleared (the figure's data hold the values)."""
    panel = dash.panels["metrics"]
    fig = panel.figure
    sent: list[set[str]] = []
    send_state = fig.send_state
    fig.send_state = lambda key=None: (
        sent.append(set([key] if isinstance(key, str) else key or ())),
        send_state(key),
    )[1]
    for step in range(4):
        dash.feed([log(step, loss=10.0 - step), *(perf(step, r, 100.0) for r in (0, 1))])
        dash.flush()
        if step < 1:  # the first draw adds the traces (plotly's own messages)
            sent.clear()
    # one message a redraw; the first ones also ask the browser to fit the figure to the cell's width
    fit = {"_py2js_restyle", "_py2js_relayout", "_last_layout_edit_id", "_last_trace_edit_id"}
    assert sent == [fit] * 3, sent
    relayout, msg = fig.pending_relayout, fig.pending_restyle
    assert relayout is not None and msg is not None
    assert relayout["relayout_data"] == {"autosize": True}
    assert msg["trace_edit_id"] == fig.trace_edits
    assert msg["layout_edit_id"] + 1 == relayout["layout_edit_id"] == fig.layout_edits
    at = [t.name for t in fig.data].index("loss")
    assert list(msg["restyle_data"]["y"][msg["restyle_traces"].index(at)]) == [10.0, 9.0, 8.0, 7.0]
    dash.finish(CellResult(seq=1, ranks=[0, 1], status="ok"))
    assert fig.pending_restyle is None and fig.pending_relayout is None
    assert list(trace(dash.figures["metrics"], "loss").y) == [10.0, 9.0, 8.0, 7.0]


def test_a_row_without_data_keeps_its_note_while_the_others_draw(dash: Dashboard) -> None:
    dash.feed([log(0, loss=1.0)])
    dash.flush()
    assert not no_data(dash.figures["metrics"])
    assert no_data(dash.figures["throughput"]) and no_data(dash.figures["step_time"])
    assert not dash.figures["throughput"].data


def test_a_redraw_leaves_the_figure_as_plotlys_own_restyle_would(dash: Dashboard) -> None:
    """The rows' restyle sets the traces' arrays without plotly's checks: fed the same records, the
    figure ends exactly as one redrawn through ``plotly_restyle`` (same traces, values and figure
    JSON), and a trace that comes later is still added after the ones on screen."""
    panel = dash.panels["metrics"]
    other = Dashboard.for_cell(7, [0, 1], title="mnist", global_batch=64, display=False)
    slow = other.panels["metrics"].figure
    slow.restyle_xy = lambda xs, ys, index: slow.plotly_restyle({"x": list(xs), "y": list(ys)}, list(index))
    try:
        for step in range(8):
            extra = {"acc": 0.1 * step} if step >= 5 else {}  # a metric that comes later
            records = [
                log(step, loss=2.0 - step / 10, **extra),
                *(perf(step, r, 50.0 + r + step) for r in (0, 1)),
            ]
            for d in (dash, other):
                d.feed(records)
                d.flush()
            assert _plain_json(panel.figure) == _plain_json(slow)
    finally:
        other.close()
    assert list(trace(dash.figures["throughput"], "rank 1").y) == [51.0 + s for s in range(8)]
    assert list(trace(dash.figures["metrics"], "loss").x) == list(range(8))
    assert [t.name for t in dash.figures["metrics"].data] == ["loss", "acc"]
    assert list(trace(dash.figures["metrics"], "acc").x) == [5, 6, 7]


def _plain_json(fig: go.Figure) -> Any:
    """The figure as plotly writes it (plain JSON), without the traces' random uids."""
    import json

    import plotly.io as pio

    spec = json.loads(pio.to_json(fig, validate=False))
    for t in spec["data"]:
        t.pop("uid", None)
    return spec


def test_a_drawer_whose_wakes_come_late_leaves_idle_priority_for_a_niced_normal_one() -> None:
    """Where every core stays busy an idle-priority drawer waits seconds for each wake (the figure
    stayed empty for a whole cell): once a wake comes ``DRAWER_LATE`` beyond the CPU it used, the
    drawer goes back to the normal policy, niced. The clock here runs 2 s a reading: every wake late."""
    if not sys.platform.startswith("linux"):
        return
    ticks = itertools.count()
    dash = Dashboard(1, [0], min_interval=0.05, draw_share=None, clock=lambda: 2.0 * next(ticks))
    policies: list[int] = []
    draw = dash.redraw

    def spy() -> None:
        policies.append(os.sched_getscheduler(0))
        draw()

    dash.redraw = spy  # type: ignore[method-assign]
    dash.start_drawer()
    try:
        dash.feed([log(0, loss=0.0)])
        assert wait_until(lambda: dash.drawer_busy and len(policies) == 1)
        dash.feed([log(1, loss=1.0)])  # drawn after the drawer left idle priority
        assert wait_until(lambda: len(policies) >= 2)
        assert policies[0] == os.SCHED_IDLE and policies[-1] == os.SCHED_OTHER
    finally:
        dash.close()
