"""The step-time split shows the typical step: a few slow steps are marked off scale instead of
setting the axis (two spikes used to flatten compute, communication and data to slivers)."""

from __future__ import annotations

from typing import Any

from dtwork import plots
from dtwork.plots.series import SPIKES


def _rows(step_times: dict[int, float]) -> list[dict[str, Any]]:
    rows = []
    for step, t in step_times.items():
        for rank in (0, 1):
            rows += [
                {"kind": "perf", "name": "step_time", "rank": rank, "step": step, "value": t},
                {"kind": "perf", "name": "compute_time", "rank": rank, "step": step, "value": 0.6 * t},
                {"kind": "perf", "name": "comm_time", "rank": rank, "step": step, "value": 0.3 * t},
                {"kind": "perf", "name": "data_time", "rank": rank, "step": step, "value": 0.1 * t},
            ]
    return rows


def test_spikes_are_marked_off_scale_and_the_axis_fits_the_typical_step() -> None:
    times = {s: 0.10 + 0.001 * (s % 5) for s in range(40)}
    times[7], times[30] = 5.0, 8.0  # a checkpoint, a recompile
    series = plots.StepTimeSeries().add(_rows(times))
    traces = series.traces()
    spikes = next(t for t in traces if t.name == SPIKES)
    axis = series.y_axis(traces)
    assert list(spikes.x) == [7, 30]
    assert axis["range"][0] == 0.0 and 0.104 <= axis["range"][1] < 0.2 and axis["autorange"] is False
    assert all(y == axis["range"][1] for y in spikes.y)  # drawn at the axis' top
    # the same reading in the figures the report and the finished cell draw
    fig = plots.step_time_figure(_rows(times))
    assert [t.name for t in fig.data][-1] == SPIKES
    assert fig.layout.yaxis.range == (0.0, axis["range"][1])


def test_a_steady_run_keeps_plotlys_autorange() -> None:
    series = plots.StepTimeSeries().add(_rows({s: 0.1 + 0.001 * (s % 3) for s in range(40)}))
    traces = series.traces()
    assert SPIKES not in [t.name for t in traces]
    assert series.y_axis(traces) == {"autorange": True}
