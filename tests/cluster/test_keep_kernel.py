"""A cluster that outlives its kernel (``--keep``), as a notebook meets it: real kernels through
jupyter_client (JupyterLab's restart, a second notebook beside it, a killed kernel), 2 real gloo
ranks, the real reaper and run store."""

from __future__ import annotations

import ast
import os
import signal
import time
from pathlib import Path

import psutil
from real_kernel import Notebook

from dtwork.launch import registry
from dtwork.store.runs import RunStore

START = "%load_ext dtwork\n%dtrain start -n 2 --backend gloo --timeout 120"
TRAIN = "%%dtrain\nfor step, _ in ctx.steps(range(3)):\n    ctx.log(loss=float(step))\n"
FACTS = "from dtwork.cluster import current\nprint(repr((current().cluster_id, current().session.run_id)))"
GONE_WITHIN = 120.0  # keep time + the reaper's kill grace, on a busy 2-core machine


def losses(store: Path, run: int) -> list[int]:
    with RunStore(store, readonly=True) as s:
        return [int(r["step"]) for r in s.metrics(run, "loss")]


def marked(cluster_id: str) -> list[psutil.Process]:
    """The live processes carrying the cluster's mark (controller, engines, nannies)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.environ().get(registry.MARK) == cluster_id and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except psutil.Error:
            continue
    return found


def end_all(home: Path) -> None:
    """What a failed test left in its dtwork home (a kept cluster would wait for its time)."""
    for path in (home / "clusters").glob("*.json"):
        registry.kill_processes(registry.read(path).get("processes", []) if registry.read(path) else [])
        for proc in marked(path.stem):
            proc.kill()


def test_a_restarted_kernel_attaches_its_kept_cluster_and_the_run_goes_on(tmp_path: Path) -> None:
    nb, other = Notebook(tmp_path), Notebook(tmp_path)
    try:
        nb.run(START + " --keep 10m")
        nb.run("%%dtrain\nx = 41 + ctx.rank")
        nb.run(TRAIN)
        cid, run = ast.literal_eval(nb.run(FACTS))
        assert losses(tmp_path / "runs.sqlite", run) == [0, 1, 2]

        # A second notebook cannot take a cluster its kernel still drives.
        refused = other.fails("%load_ext dtwork\n%dtrain attach")
        assert "driven by" in refused and "one notebook drives a cluster at a time" in refused, refused

        nb.km.restart_kernel(now=False)  # JupyterLab's Restart Kernel: a clean exit, atexit and all
        nb.kc.wait_for_ready(timeout=120)
        offer = nb.run(START)
        assert f"%dtrain attach {cid} takes it up" in offer, offer  # it started nothing
        out = nb.run("%dtrain attach")
        assert f"attached to {cid}" in out and f"run #{run} goes on" in out, out
        assert "[41, 42]" in nb.run("from dtwork.cluster import current\nprint(current().pull('x'))")
        nb.run(TRAIN)
        assert losses(tmp_path / "runs.sqlite", run) == [0, 1, 2, 3, 4, 5]  # one run, one step axis

        refused = other.fails("%dtrain attach")  # now the new kernel drives it
        assert "driven by" in refused, refused

        # Detaching is the agreement: the other notebook takes the cluster over, names and all.
        assert f"let go of {cid}" in nb.run("%dtrain detach")
        assert "no cluster is running" in nb.fails("%%dtrain\nprint(x)")  # not this kernel's any more
        assert f"attached to {cid}" in other.run("%dtrain attach")
        assert "[41, 42]" in other.run("from dtwork.cluster import current\nprint(current().pull('x'))")
        other.run("%dtrain stop")
    finally:
        other.close(stop=False)
        nb.close()
        end_all(tmp_path)


def test_a_kept_cluster_nobody_attaches_to_ends_when_its_time_is_up(tmp_path: Path) -> None:
    nb = Notebook(tmp_path)
    try:
        nb.run(START + " --keep 3s")
        nb.run(TRAIN)
        cid, run = ast.literal_eval(nb.run(FACTS))
        entry = tmp_path / "clusters" / f"{cid}.json"  # the kernel's registry: its own dtwork home
        assert entry.exists() and marked(cid), "the cluster is registered, its processes carry its mark"
        os.kill(int(nb.km.provisioner.pid), signal.SIGKILL)
        deadline = time.monotonic() + GONE_WITHIN
        while (entry.exists() or marked(cid)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not entry.exists() and not marked(cid), [p.cmdline() for p in marked(cid)]
        with RunStore(tmp_path / "runs.sqlite", readonly=True) as s:
            assert s.get_run(run)["status"] == "interrupted"
            said = [e["message"] for e in s.events(run)]
        assert any("no notebook attached within its keep time (3 s)" in m for m in said), said
    finally:
        nb.close(stop=False)
        end_all(tmp_path)


LONG = """%%dtrain
import os, time
for step, _ in ctx.steps(range(40)):
    ctx.log(loss=float(step))
    if step == 3 and ctx.rank == 0:
        open(MARK, "w").close()
    while step == 20 and not os.path.exists(GO):  # until attach is seen waiting for the cell's end
        time.sleep(0.05)
    time.sleep(0.1)
done = step
"""


def test_a_cell_training_when_its_kernel_is_killed_trains_on_and_attach_stores_all_its_records(
    tmp_path: Path,
) -> None:
    nb = Notebook(tmp_path)
    again = None
    try:
        nb.run(START + " --keep 10m")
        cid, _ = ast.literal_eval(nb.run(FACTS))
        mark, go = tmp_path / "training", tmp_path / "go"
        cell = LONG.replace("MARK", repr(str(mark))).replace("GO", repr(str(go)))
        nb.kc.execute(cell)  # not waited for: the kernel dies in it
        deadline = time.monotonic() + GONE_WITHIN
        while not mark.exists():
            assert time.monotonic() < deadline, "the cell reached step 3"
            time.sleep(0.05)
        os.kill(int(nb.km.provisioner.pid), signal.SIGKILL)
        again = Notebook(tmp_path)
        out = again.run("%load_ext dtwork\n%dtrain status")
        assert "its ranks still train the cell that kernel started" in out, out  # not a run that ended
        out = again.run("%dtrain attach", heard=lambda text: "still run" in text and go.touch())
        assert (
            "the ranks still run the cell the last kernel started" in out and f"attached to {cid}" in out
        ), out
        assert "[39, 39]" in again.run("%%dtrain --rank0\nprint([done, done])"), "the cell trained to its end"
        _, run = ast.literal_eval(again.run(FACTS))
        with RunStore(tmp_path / "runs.sqlite", readonly=True) as s:
            cells = s.cells(run)
            perf = [(int(r["step"]), r["rank"]) for r in s.metrics(run, "step_time", rank="all")]
            said = [e["message"] for e in s.events(run)]
        assert [c["status"] for c in cells] == ["ok", "ok"], cells  # the cell's real end
        assert losses(tmp_path / "runs.sqlite", run) == list(range(40))  # every step once
        assert {r for _, r in perf} == {0, 1} and len(set(perf)) == len(perf), perf  # each rank's, once
        assert any("batches the ranks kept while no kernel listened" in m for m in said), said
    finally:
        if again is not None:
            again.close()
        nb.close(stop=False)
        end_all(tmp_path)
