"""The incremental series behind the figures give exactly what a batch computation over all rows
gives, whatever the order, duplicates and batching of the rows, and whenever they are asked."""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtwork import plots

Row = dict[str, Any]

# -- the batch reference: each figure's data computed from scratch over all rows ------------------


def by_rank(rows: Sequence[Row], name: str) -> dict[int, dict[int, float]]:
    out: dict[int, dict[int, float]] = defaultdict(dict)
    for r in rows:
        if r["rank"] is not None and r["name"] == name:
            out[r["rank"]][r["step"]] = r["value"]
    return dict(sorted(out.items()))


def mean_over_ranks(rows: Sequence[Row], name: str) -> dict[int, float]:
    by_step: dict[int, list[float]] = defaultdict(list)
    for values in by_rank(rows, name).values():
        for step, v in values.items():
            by_step[step].append(v)
    return {s: sum(vs) / len(vs) for s, vs in sorted(by_step.items())}


def series(rows: Sequence[Row], name: str) -> tuple[list[int], list[float]]:
    pairs = [(r["step"], r["value"]) for r in rows if r["rank"] is None and r["name"] == name]
    return [s for s, _ in pairs], [v for _, v in pairs]


def reference_global(rows: Sequence[Row]) -> tuple[list[int], list[float]]:
    per_rank = by_rank(rows, "samples_per_s")
    if not per_rank:
        return [], []
    first = max(min(values) for values in per_rank.values())
    last = min(max(values) for values in per_rank.values())
    steps = sorted({s for values in per_rank.values() for s in values if first <= s <= last})
    keyed = [(sorted(values), values) for values in per_rank.values()]
    out = [sum(values[keys[bisect.bisect_right(keys, step) - 1]] for keys, values in keyed) for step in steps]
    return steps, out


Expected = list[tuple[str, list[float], list[float]]]


def reference_metrics(rows: Sequence[Row]) -> Expected:
    names = list(
        dict.fromkeys(r["name"] for r in rows if r["rank"] is None and r["name"] not in plots.GNS_NAMES)
    )
    return [(name, *series(rows, name)) for name in names]


def reference_throughput(rows: Sequence[Row]) -> Expected:
    out: Expected = []
    steps, total = reference_global(rows)
    if steps:
        out.append(("global", steps, total))
    for rank, values in by_rank(rows, "samples_per_s").items():
        out.append((f"rank {rank}", list(values), list(values.values())))
    return out


def reference_step_time(rows: Sequence[Row]) -> Expected:
    parts = {label: mean_over_ranks(rows, name) for name, label in plots.STEP_PARTS}
    parts = {label: means for label, means in parts.items() if means}
    steps = sorted({s for means in parts.values() for s in means})
    out: Expected = [(label, steps, [means.get(s, 0.0) for s in steps]) for label, means in parts.items()]
    measured = mean_over_ranks(rows, "step_time")
    if measured:
        out.append(("step time", list(measured), list(measured.values())))
    return out


def reference_gpu(rows: Sequence[Row]) -> Expected:
    out: Expected = []
    for rank, values in by_rank(rows, "utilization").items():
        out.append((f"rank {rank} utilization", list(values), list(values.values())))
    memory = by_rank(rows, "memory_used_mb")
    for rank, values in memory.items():
        out.append((f"rank {rank} memory", list(values), list(values.values())))
    totals = [v for values in by_rank(rows, "memory_total_mb").values() for v in values.values()]
    steps = [s for values in memory.values() for s in values]
    if totals and steps:
        out.append(("memory total", [min(steps), max(steps)], [max(totals)] * 2))
    return out


def reference_gns(rows: Sequence[Row], global_batch: int) -> Expected:
    steps, values = series(rows, "b_simple")
    if not steps:
        return []
    out: Expected = [
        ("B_simple", steps, values),
        ("global batch", [min(steps), max(steps)], [float(global_batch)] * 2),
    ]
    bounds = plots.robust_range(values, [float(global_batch)])
    off = None if bounds is None else plots.off_scale(steps, values, bounds)
    if off is not None:
        out.append(("off scale", *off))
    return out


CASES: dict[str, tuple[Callable[[], plots.Series], Callable[[Sequence[Row]], Expected]]] = {
    "metrics": (plots.MetricsSeries, reference_metrics),
    "throughput": (plots.ThroughputSeries, reference_throughput),
    "step_time": (plots.StepTimeSeries, reference_step_time),
    "gpu": (plots.GpuSeries, reference_gpu),
    "gns": (lambda: plots.GnsSeries(64), lambda rows: reference_gns(rows, 64)),
}


def as_lists(traces: Sequence[plots.Trace]) -> Expected:
    return [(t.name, list(t.x), list(t.y)) for t in traces]


def assert_same(got: Expected, want: Expected) -> None:
    assert [name for name, _, _ in got] == [name for name, _, _ in want]
    for (name, gx, gy), (_, wx, wy) in zip(got, want, strict=True):
        assert gx == wx, name
        assert gy == pytest.approx(wy), name


# -- rows ----------------------------------------------------------------------------------------

NAMES = ["loss", "acc", "b_simple", *plots.PERF_NAMES, *plots.GPU_NAMES]
# the names each series draws, plus one it does not (rows of every name are tried too)
FOCUS = {
    "metrics": ["loss", "acc", "b_simple"],
    "throughput": ["samples_per_s", "loss"],
    "step_time": ["compute_time", "comm_time", "step_time", "samples_per_s"],
    "gpu": [*plots.GPU_NAMES, "loss"],
    "gns": ["b_simple", "loss"],
}


def kind_of(rank: int | None, name: str) -> str:
    """The kind a record of this rank and name has when training sends it."""
    if rank is None:
        return "gns" if name in plots.GNS_NAMES else "log"
    return "gpu" if name in plots.GPU_NAMES else "perf"


def make_row(step: int, rank: int | None, name: str, value: float) -> Row:
    return {
        "kind": kind_of(rank, name),
        "step": step,
        "rank": rank,
        "name": name,
        "value": value,
        "time": None,
    }


@st.composite
def row_streams(draw: st.DrawFn, names: Sequence[str]) -> tuple[list[Row], list[int]]:
    """Rows (steps out of order and repeated too), and where to cut them in batches."""
    row = st.builds(
        make_row,
        st.integers(0, 12),
        st.one_of(st.none(), st.integers(0, 2)),
        st.sampled_from(names) | st.sampled_from(NAMES),
        st.integers(0, 1000).map(float),
    )
    rows = draw(st.lists(row, max_size=120))
    cuts = sorted(draw(st.lists(st.integers(0, len(rows)), max_size=6)))
    return rows, cuts


def in_order_stream(ranks: int, steps: int, seed: int) -> list[Row]:
    """What training sends: each rank's perf and gpu rows in step order, ranks interleaved."""
    rng = np.random.default_rng(seed)
    queues: list[list[Row]] = []
    for rank in range(ranks):
        queue = []
        for step in sorted(rng.choice(steps, size=steps // 3, replace=False).tolist()):
            for name in (*plots.PERF_NAMES, *plots.GPU_NAMES):
                queue.append(make_row(step, rank, name, float(rng.integers(1, 999))))
        queues.append(queue)
    rows = [make_row(s, None, "loss", 1.0 / (s + 1)) for s in range(steps)]
    while any(queues):
        queue = queues[int(rng.integers(len(queues)))]
        if queue:
            rows.append(queue.pop(0))
    return rows


def feed(series: plots.Series, rows: Sequence[Row], cuts: Sequence[int]) -> None:
    """Add the rows batch by batch, asking for the traces in between (as the dashboard redraws)."""
    start = 0
    for cut in [*cuts, len(rows)]:
        series.add(rows[start:cut])
        series.traces(max_points=7)
        start = max(start, cut)


# -- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("key", list(CASES))
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_incremental_traces_equal_the_batch_computation(key: str, data: st.DataObject) -> None:
    rows, cuts = data.draw(row_streams(FOCUS[key]))
    make, reference = CASES[key]
    live = make()
    feed(live, rows, cuts)
    assert_same(as_lists(live.traces()), reference(rows))


@pytest.mark.parametrize("key", list(CASES))
@pytest.mark.parametrize("seed", range(4))
def test_training_order_streams_match_in_every_batching(key: str, seed: int) -> None:
    rows = in_order_stream(ranks=3, steps=300, seed=seed)
    make, reference = CASES[key]
    for size in (1, 13, len(rows)):
        live = make()
        feed(live, rows, list(range(size, len(rows), size)))
        assert_same(as_lists(live.traces()), reference(rows))


def test_a_step_between_two_drawn_steps_after_an_earlier_late_one_reaches_the_global_trace() -> None:
    """Found by the property above: a rank's steps 2 then 0, a draw, then 1. Step 1 comes after the last
    one to arrive (0) but before the highest (2), which the drawn global trace holds already."""
    series = plots.ThroughputSeries()
    series.add([make_row(2, 0, "samples_per_s", 1.0), make_row(0, 0, "samples_per_s", 2.0)])
    assert list(series.traces()[0].x) == [0, 2]
    series.add([make_row(1, 0, "samples_per_s", 3.0)])
    glob = series.traces()[0]
    assert (list(glob.x), list(glob.y)) == ([0, 1, 2], [2.0, 3.0, 1.0])
    assert series.latest() == {0: 1.0}


def test_thinned_traces_are_bounded_numpy_arrays_keeping_the_first_and_last_points() -> None:
    rows = in_order_stream(ranks=2, steps=5000, seed=1)
    for key, (make, _) in CASES.items():
        live = make().add(rows)
        full = {t.name: t for t in live.traces()}
        for t in live.traces(max_points=100):
            assert isinstance(t.x, np.ndarray) and isinstance(t.y, np.ndarray), key
            assert len(t.x) == len(t.y) <= 101, (key, t.name, len(t.x))
            whole = full[t.name]
            assert (t.x[0], t.x[-1]) == (whole.x[0], whole.x[-1]), (key, t.name)
            assert set(t.x.tolist()) <= set(whole.x), (key, t.name)


def test_version_moves_only_when_a_row_concerns_the_series() -> None:
    live = plots.ThroughputSeries()
    live.add([make_row(1, None, "loss", 1.0)])
    assert live.version == 0
    live.add([make_row(1, 0, "samples_per_s", 10.0)])
    assert live.version == 1


def test_figure_functions_keep_plain_lists() -> None:
    rows = in_order_stream(ranks=2, steps=40, seed=0)
    for fig in (plots.throughput_figure(rows), plots.step_time_figure(rows), plots.gpu_figure(rows)):
        for t in fig.data:
            assert isinstance(t.x, tuple | list) and all(isinstance(v, int) for v in t.x)


def test_the_memory_total_follows_replaced_values_both_ways() -> None:
    """The dashed memory total is the largest total: a replaced largest value falls back to the next
    largest, a smaller one replaced leaves it, a larger one raises it."""
    gpu = plots.GpuSeries()

    def total(rank: int, step: int, value: float) -> float | None:
        gpu.add(
            [
                {
                    "kind": "gpu",
                    "step": step,
                    "rank": rank,
                    "name": "memory_total_mb",
                    "value": value,
                    "time": 1.0,
                    "run_id": 1,
                    "cell_seq": 1,
                }
            ]
        )
        gpu.add(
            [
                {
                    "kind": "gpu",
                    "step": step,
                    "rank": rank,
                    "name": "memory_used_mb",
                    "value": 1.0,
                    "time": 1.0,
                    "run_id": 1,
                    "cell_seq": 1,
                }
            ]
        )
        return gpu.traces(None)[-1].y[0]

    assert total(0, 1, 80.0) == 80.0 and total(1, 1, 40.0) == 80.0
    assert total(0, 1, 20.0) == 40.0  # the largest replaced by less: the next largest
    assert total(1, 1, 30.0) == 30.0 and total(1, 1, 90.0) == 90.0
