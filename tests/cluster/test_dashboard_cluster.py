"""Tests for the live dashboard: traces, bars, throttling, threads and the end state (no browser).

Its tests that need engines (a cluster, a kernel, a process group across processes); the others are
in tests/unit/test_dashboard.py.
"""

from __future__ import annotations

import contextlib
import io
import sys
from typing import Any

from tests.unit.test_dashboard import trace, wait_until


def test_a_cells_logged_steps_reach_its_live_dashboard(cluster: Any) -> None:
    """Through the real collector: what 2 ranks log in a %%dtrain cell is in the FigureWidget."""
    cluster.configure(None)
    cluster.session.live = True
    try:
        with contextlib.redirect_stdout(io.StringIO()):  # display() outside IPython prints a repr
            cluster.run(
                "for step, _ in ctx.steps(range(12), max_steps=12):\n    ctx.log(loss=float(step + ctx.rank))\n"
            )
        loss = trace(cluster.session.dashboard.figures["metrics"], "loss")
        assert list(loss.x) == list(range(12))
        assert list(loss.y) == [s + 0.5 for s in range(12)]  # averaged over the ranks
        assert cluster.session.dashboard.status == "finished"
    finally:
        cluster.session.live = False


def _stored(session: Any) -> int:
    """The loss rows the store holds for the session's run."""
    return len(session.store.metrics(session.run_id, "loss"))


def test_switching_live_off_mid_cell_pauses_the_dashboard_but_not_the_store(
    cluster: Any, tmp_path: Any
) -> None:
    cluster.configure(None)
    session = cluster.session
    session.live = True
    done = tmp_path / "done"
    # the ranks train until the test has seen what it needs (however slow the machine), then stop together
    source = (
        "import os, time, torch, torch.distributed as dist\n"
        "for step, _ in ctx.steps(range(100_000)):\n"
        "    ctx.log(loss=float(step))\n"
        "    time.sleep(0.02)\n"
        f"    stop = torch.tensor([float(os.path.exists({str(done)!r}))])\n"
        "    dist.all_reduce(stop, op=dist.ReduceOp.MAX)\n"
        "    if stop.item():\n"
        "        break\n"
    )
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            cluster.run(source, bg=True)
            assert wait_until(lambda: session.dashboard is not None and session.dashboard.rows_fed > 0, 120)
            session.live = False
            # a batch handed over at the switch lands; the collector writes a batch to the store before
            # it feeds it, so once the store holds a batch written after the switch nothing more comes
            switched = _stored(session)
            assert wait_until(lambda: _stored(session) > switched, 120)
            paused_at = session.dashboard.read_fed()  # read at once here, not at the drawer's pace
            stored = _stored(session)
            assert wait_until(lambda: _stored(session) >= stored + 5, 120)  # the ranks train on, paused
            assert session.dashboard.read_fed() == paused_at  # nothing fed while paused
            session.live = True
            assert wait_until(lambda: session.dashboard.read_fed() > paused_at, 120)  # fed again
            done.touch()
            session.wait_background()
        steps = [r["step"] for r in session.store.metrics(session.run_id, "loss")]
        last = steps[-1]
        assert last > 10 and steps[-(last + 1) :] == list(range(last + 1))  # the store has every step
        drawn = list(trace(session.dashboard.figures["metrics"], "loss").x)
        assert 0 < len(drawn) < last + 1 and drawn[-1] == last  # a gap where it was paused, then the end
    finally:
        done.touch()
        session.live = False


WARM_PROBE = """
import json, sys
from dtwork import Cluster, widgets
c = Cluster(n=2, backend="gloo")
c.session.live = True  # as in a notebook (a script shows no live view)
try:
    c.start()
    out = {"spare": c.engines.spare_core(), "started": widgets.warming() is not None,
           "loaded_at_start": widgets.dashboard_ready(0), "plotly_at_start": "plotly.basewidget" in sys.modules}
    c.session.run_cell("x = 1", ranks=None, rank0=False, bg=False, quiet=False)
    out["loaded_after_cell"] = widgets.dashboard_ready(0)
finally:
    c.stop()
print("RESULT " + json.dumps(out))
"""


def test_a_starting_cluster_loads_the_dashboard_while_its_engines_start_only_with_a_core_to_spare(
    tmp_path: Any,
) -> None:
    """In a fresh kernel-like process: with a core beyond the engines' and the kernel's, the live
    view's modules load while the engines start and have loaded when ``start`` returns; without one
    (two ranks on two cores), they start loading once the engines are up, ``start`` does not wait
    for them, and the next shown cell waits for them before its ranks start."""
    import json
    import subprocess

    proc = subprocess.run(
        [sys.executable, "-c", WARM_PROBE], cwd=tmp_path, capture_output=True, text=True, timeout=300
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.split("RESULT ", 1)[1])
    assert out["started"]
    if out["spare"]:
        assert out["loaded_at_start"] and out["plotly_at_start"]
    else:
        assert not out["loaded_at_start"]  # ~1.5 s of imports still running in the background
    assert out["loaded_after_cell"]
