"""The kernel's cost against the rank count, by simulation (issue 25): no training, the real kernel path.

A child process publishes what N ranks publish, at their rates (``publish``); this process does what
the cell watcher does at every poll: ``Session.persist``, then ``Dashboard.feed`` and ``progress``,
the dashboard's drawer redrawing through a comm that serializes each widget message (``wired``).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import queue
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace
from typing import Any

STEP_SECONDS = 0.05  # the simulated step; rank 0 logs the loss every step
WARMUP = 3.0  # seconds before the window: widgets built, the first figures sent
PERF = dict(samples_per_s=640.0, step_time=STEP_SECONDS, data_time=0.001, comm_time=0.005, compute_time=0.044)
GPU = dict(utilization=90.0, memory_used_mb=30e3, memory_total_mb=80e3, power_w=400.0)
GNS = dict(b_simple=900.0, g2=0.1, trace_sigma=90.0)


def publish(n: int, out: Any, stop: Any, perf: float | None = None) -> None:
    """Put the batches that ``n`` ranks publish each FLUSH_SECONDS, as ``{rank: data}``, on ``out``."""
    from dtwork.shared.records import make_record as rec
    from dtwork.shared.timing import FLUSH_SECONDS, GPU_SECONDS, PERF_SECONDS

    t0, step, flushes, every = time.monotonic(), 0, 0, max(1, round((perf or PERF_SECONDS) / STEP_SECONDS))
    while not stop.is_set():
        flushes += 1
        time.sleep(max(0.0, t0 + flushes * FLUSH_SECONDS - time.monotonic()))
        first, step = step, int((time.monotonic() - t0) / STEP_SECONDS)
        gpu = flushes % round(GPU_SECONDS / FLUSH_SECONDS) == 0
        batch = {}
        for r in range(n):
            recs = [rec("perf", s, r, dict(PERF)) for s in range(first + 1, step + 1, every)]
            recs += [rec("gpu", step, r, dict(GPU))] if gpu else []
            if r == 0:
                recs += [rec("log", s, 0, {"loss": 2.0 / (1 + s)}) for s in range(first + 1, step + 1)]
                recs.append(rec("gns", step, 0, dict(GNS)))
            progress = {"rank": r, "time": time.time(), "step": step, "total": 10**6, "phase": "train"}
            batch[r] = {"records": recs, "progress": progress}
        out.put(batch)


@contextlib.contextmanager
def wired() -> Iterator[None]:
    """Give the widgets a comm that serializes each message as the kernel's would, then drops it."""
    import comm
    from comm.base_comm import BaseComm

    class Wire(BaseComm):
        def publish_msg(self, msg_type: str, data: Any = None, *more: Any, **keys: Any) -> None:
            json.dumps(data, default=str)

    before, comm.create_comm = comm.create_comm, Wire
    try:
        yield
    finally:
        comm.create_comm = before


def measure(n: int, seconds: float, folder: Path, perf: float | None = None) -> dict[str, Any]:
    """Feed ``n`` simulated ranks through the kernel's path for ``seconds``; its CPU, redraws, store."""
    from dtwork.analysis.scaling import LiveEfficiency
    from dtwork.kernel.session import Session
    from dtwork.kernel.watcher import POLL_SECONDS
    from dtwork.widgets.dashboard import Dashboard

    path = folder / f"runs-{n}.sqlite"
    config = SimpleNamespace(name="sim", tensorboard=None)
    engines = SimpleNamespace(world_size=n, config=config, global_batch_size=None)  # what Session reads
    session = Session(engines, path)  # type: ignore[arg-type]
    run = session.run_id = session.store.create_run(name="sim", world_size=n, backend="nccl")
    seq = session.store.add_cell(run, "# simulated")
    session.efficiency = LiveEfficiency(n)
    dash = session.dashboard = Dashboard(run, list(range(n)), title=f"{n} simulated ranks")
    # At normal priority: on this shared machine an idle-priority drawer measures the others' load.
    dash.start_drawer(idle=False)
    out, stop = (ctx := mp.get_context("spawn")).Queue(), ctx.Event()
    ctx.Process(target=publish, args=(n, out, stop, perf), daemon=True).start()
    pending = [out.get(timeout=120)]  # the child's imports take a few seconds
    t_start, marks = time.monotonic(), []
    try:
        while len(marks) < 2:
            if time.monotonic() - t_start >= (WARMUP, WARMUP + seconds)[len(marks)]:
                marks.append(_reading(dash, path))
            batches, pending = pending, []
            try:  # what CellWatcher.poll does with the ranks' data
                batches.append(out.get(timeout=POLL_SECONDS))
                while True:
                    batches.append(out.get_nowait())
            except queue.Empty:
                pass
            records = [rec for b in batches for d in b.values() for rec in d["records"]]
            if records:
                session.persist(records, seq)
                dash.feed(records)
                dash.progress({r: d["progress"] for r, d in batches[-1].items()})
    finally:
        stop.set()
        dash.close()
        session.close()
    (w0, c0, r0, b0, f0), (w1, c1, r1, b1, f1) = marks
    wall = w1 - w0
    out = dict(ranks=n, seconds=wall, cpu_share=(c1 - c0) / wall, redraw_interval_s=wall / max(1, r1 - r0))
    # a long cell's figures drawn again from its rollups (none while the cell keeps every row)
    out["figure_interval_s"] = wall / (f1 - f0) if f1 > f0 else None
    out["chosen_interval_s"] = dash.interval  # what the drawer's CPU budget allows
    return out | {"store_mb_per_hour": (b1 - b0) / wall * 3600 / 1e6}


def _reading(dash: Any, path: Path) -> tuple[float, float, int, int, int]:
    """(wall, process CPU, redraws, store bytes, long-cell figure drawings): the store's size as SQLite
    counts it, WAL included."""
    with sqlite3.connect(path) as db:
        size = db.execute("PRAGMA page_count").fetchone()[0] * db.execute("PRAGMA page_size").fetchone()[0]
    return time.monotonic(), time.process_time(), dash.redraws, size, dash.rebuilds
