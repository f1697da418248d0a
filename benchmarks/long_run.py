"""A long run's store and its readers (issue 43), by simulation in accelerated time: no training.

Records at dtwork's own rates (each rank's perf record every 0.1 s with 5 values, its NVML telemetry
every second with 5 values, 3 user metrics at 4 steps/s) go through the real ``StoreWriter`` into a
real store, ``WRITE_EVERY`` simulated seconds per write, after ``EARLIER`` short runs, and into the
live view's data side (``Intake``: fed every simulated second, read and snapshot at every write, as
a redraw does), so that the process's CPU and memory are the kernel's for them (no widgets, no
comm). After 10 simulated minutes and at the end, each reader is timed: the sidebar's run list and
run card, the reopened cell's figure, ``dtwork runs show`` and the report export.
"""

from __future__ import annotations

import contextlib
import io
import os
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

PERF_HZ, GPU_HZ, STEPS_HZ = 10, 1, 4
PERF = ("samples_per_s", "step_time", "data_time", "comm_time", "compute_time")
GPU = ("utilization", "memory_used_mb", "memory_total_mb", "power_w", "temperature_c")
USER = ("loss", "accuracy", "grad_norm")
EARLIER = 40  # short runs before the long one, as a notebook's store holds
EARLIER_SECONDS = 2
WRITE_EVERY = 10  # simulated seconds per transaction: the writer joins what waits, as when it runs behind
FIRST_CHECK = 600  # simulated seconds: the "after 10 minutes" readings


def _second(t: int, ranks: int) -> list[dict[str, Any]]:
    """The records of simulated second ``t`` (one flush of the collector)."""
    out: list[dict[str, Any]] = []
    base = 1.7e9 + t
    for i in range(PERF_HZ):
        step = (t * PERF_HZ + i) * STEPS_HZ // PERF_HZ
        for r in range(ranks):
            spike = 5.0 if (t * 7 + i + r) % 9973 == 0 else 1.0
            values = {n: (100.0 + (t + r) % 13) * spike / (k + 1) for k, n in enumerate(PERF)}
            out.append(
                {"kind": "perf", "step": step, "rank": r, "time": base + i / PERF_HZ, "values": values}
            )
    for r in range(ranks):
        values = {n: 50.0 + (t * (k + 1) + r) % 40 for k, n in enumerate(GPU)}
        out.append({"kind": "gpu", "step": t * STEPS_HZ, "rank": r, "time": base, "values": values})
    for s in range(t * STEPS_HZ, (t + 1) * STEPS_HZ):
        values = {n: 2.0 / (1 + s) ** 0.3 + (k * 0.1) for k, n in enumerate(USER)}
        out.append(
            {"kind": "log", "step": s, "rank": 0, "time": base + (s % STEPS_HZ) / STEPS_HZ, "values": values}
        )
    return out


def _mib(path: Path) -> float:
    """The store's size on disk, its write-ahead log included."""
    wal = path.with_name(path.name + "-wal")
    return (path.stat().st_size + (wal.stat().st_size if wal.exists() else 0)) / 2**20


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        yield


READINGS = 3  # each reader's time is the median of this many calls, each reading afresh


def _timed(fn: Callable[[], object]) -> float:
    """The median of ``READINGS`` calls, each with the server's memoised reads dropped first (the
    sidebar's poll after its run logged a step: what a running run's poll costs), after one call
    that warms the imports and the page cache (so the readings after 10 minutes and at the end
    both come from a warmed process)."""
    from dtwork.server import queries

    times = []
    for i in range(READINGS + 1):
        queries.forget()
        t0 = time.perf_counter()
        with _quiet():
            fn()
        if i:
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def readers(root: Path, store: Path, run_id: int, seq: int) -> dict[str, float]:
    """Seconds each reader takes now, on a store opened afresh (as the server and CLI open it)."""
    from dtwork import cli
    from dtwork.report import export
    from dtwork.server import queries

    return {
        "sidebar_list_s": _timed(lambda: queries.list_runs(str(root))),
        "run_card_s": _timed(lambda: queries.get_run(str(root), run_id)),
        "reopened_figure_s": _timed(lambda: queries.cell_live(str(root), run_id, seq)),
        "runs_show_s": _timed(lambda: cli.main(["runs", "--store", str(store), "show", str(run_id)])),
        "report_export_s": _timed(lambda: export(run_id, root / "reports" / "r.ipynb", store=store)),
    }


def _write(writer: Any, view: Any, run_id: int, seq: int, seconds: range, ranks: int) -> tuple[int, float]:
    """Hand ``seconds`` of records to the writer and the live view as a cell's watcher does; return the
    rows written and the CPU seconds this process took for them."""
    rows, cpu = 0, time.process_time()
    for t in seconds:
        recs = _second(t, ranks)
        rows += sum(len(r["values"]) for r in recs)
        writer.records(run_id, seq, recs)
        view.feed(recs)
        if (t + 1) % WRITE_EVERY == 0:
            if not writer.flush():
                raise RuntimeError(f"the store refused writes: {writer.problem}")
            view.read_queued()
            view.snapshot()  # what a redraw reads (its figures drawn again within their share of a core)
    writer.flush()
    return rows, time.process_time() - cpu


def _view(ranks: int) -> Any:
    """The live view's data side (what a cell's dashboard reads records into and redraws from)."""
    from dtwork.widgets.dashboard import MAX_POINTS
    from dtwork.widgets.intake import Intake

    return Intake(ranks, None, MAX_POINTS)


def measure(hours: float, ranks: int, folder: Path) -> dict[str, Any]:
    """Write ``hours`` of an ``ranks``-rank run (after ``EARLIER`` short ones); time the readers."""
    from dtwork.store.runs import RunStore
    from dtwork.store.writer import StoreWriter

    path = folder / ".dtwork" / "runs.sqlite"
    os.environ["DTWORK_STORE"] = str(path)
    end = int(hours * 3600)
    with RunStore(path) as store:
        # rows_every=0: each flush here is one transaction of WRITE_EVERY simulated seconds
        writer = StoreWriter(lambda: store, path, say=lambda _: None, rows_every=0)
        for _ in range(EARLIER):
            rid = store.create_run(world_size=ranks, backend="nccl", name="short")
            _write(writer, _view(ranks), rid, store.add_cell(rid, "train()"), range(EARLIER_SECONDS), ranks)
            store.set_run_status(rid, "completed", ended=True)
        run_id = store.create_run(world_size=ranks, backend="nccl", name="day")
        seq = store.add_cell(run_id, "train()")
        view = _view(ranks)
        rss0, t0 = _rss_mib(), time.perf_counter()
        rows, cpu = _write(writer, view, run_id, seq, range(FIRST_CHECK), ranks)
        write_s = time.perf_counter() - t0
        at_10 = readers(folder, path, run_id, seq) | {"store_mib": _mib(path)}
        t1 = time.perf_counter()
        more, more_cpu = _write(writer, view, run_id, seq, range(FIRST_CHECK, end), ranks)
        rows, cpu = rows + more, cpu + more_cpu
        write_s += time.perf_counter() - t1
        rss = _rss_mib() - rss0
        held = view.long.size()
    at_end = readers(folder, path, run_id, seq) | {"store_mib": _mib(path)}
    return {
        "hours": hours,
        "ranks": ranks,
        "rows_written": rows,
        "write_rows_per_s": rows / write_s,
        "simulated_s_per_wall_s": end / write_s,
        "kernel_rss_growth_mib": rss,
        "kernel_cpu_share": cpu / end,  # of one core, at the run's real rate
        "live_view_held": held,
        "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "after_10_min": at_10,
        "at_end": at_end,
    }


if __name__ == "__main__":
    import json
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        print(json.dumps(measure(float(sys.argv[1]), int(sys.argv[2]), Path(d)), indent=1))
