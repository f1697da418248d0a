"""Faults with real processes: interrupts, a killed rank, a stalled rank."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from dtwork.errors import RankFailure

SETUP = """
import time, torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
model = ctx.wrap(nn.Linear(4, 1)); opt = ctx.optimizer(model.parameters())
data = ctx.synthetic((4,), (1,), size=512)
"""

LOOP = """
last = -1
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=100000):
    loss = F.mse_loss(model(x), y); ctx.backward(loss); ctx.step(opt); ctx.log(loss=loss)
    last = step
    time.sleep(0.005)
"""


def test_watchdog_names_a_stalled_rank(cluster, capsys) -> None:
    cluster.configure({"global_batch_size": 8})
    cluster.session.stall_seconds = 1.5
    cluster.run(SETUP, quiet=True)
    try:
        cluster.run(
            # rank 1 stalls 12 s, far past the 1.5 s limit: on a loaded machine the watcher's polls
            # come seconds apart and a rank may pause on its own first (named, then rank 1 still is)
            LOOP.replace(
                "time.sleep(0.005)", "time.sleep(12 if (step == 20 and ctx.rank == 1) else 0.001)"
            ).replace("100000", "40"),
            quiet=True,
        )
    finally:
        cluster.session.stall_seconds = 60.0
    err = capsys.readouterr().err
    assert "no progress for 2 s from" in err and "rank 1 (step" in err


def test_sigint_stops_every_rank_at_the_same_step_and_the_next_cell_works(cluster, capsys) -> None:
    cluster.configure({"global_batch_size": 8})
    cluster.run(SETUP, quiet=True)
    timer = threading.Timer(3.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    t0 = time.monotonic()
    result = cluster.run(LOOP, quiet=True)
    assert time.monotonic() - t0 < 15
    assert result.status == "interrupted"
    last = cluster.pull("last")
    assert last[0] == last[1] and 0 < last[0] < 100000
    assert "stop at the same step" in capsys.readouterr().err
    cluster.run("after = ctx.rank", quiet=True)
    assert cluster.pull("after") == [0, 1]


def test_killed_rank_is_detected_named_and_the_cluster_recovers(cluster, capsys) -> None:
    cluster.configure({"global_batch_size": 8})
    cluster.run(SETUP, quiet=True)
    pid = cluster.rank_info[1]["pid"]
    killed_at: list[float] = []

    def kill() -> None:
        killed_at.append(time.time())
        os.kill(pid, signal.SIGKILL)

    threading.Timer(3.0, kill).start()
    with pytest.raises(RankFailure) as info:
        cluster.run(LOOP, quiet=True)
    failure = next(
        e for e in cluster.session.store.events(cluster.session.run_id) if e["kind"] == "rank_failure"
    )
    assert failure["time"] - killed_at[0] < 40.0  # named before the group's 60 s timeout
    text = str(info.value) + capsys.readouterr().err
    assert "rank 1" in text and "died" in text
    store, run_id = cluster.session.store, cluster.session.run_id
    assert len(store.metrics(run_id, "loss")) > 10
    assert any(e["kind"] == "rank_failure" for e in store.events(run_id))
    assert cluster.state == "running"  # restarted with fresh engines
    cluster.run("alive = ctx.rank", quiet=True)
    assert cluster.pull("alive") == [0, 1]


TRIAL = """
import torch, torch.nn as nn, torch.nn.functional as F, time
torch.manual_seed(0)
model = ctx.wrap(nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1))); opt = ctx.optimizer(model.parameters())
data = ctx.synthetic((4,), (1,), size=512, seed=1)
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=60):
    ctx.backward(F.mse_loss(model(x), y)); ctx.step(opt)
    time.sleep(0.05)
params = [p.detach().clone() for p in model.module.parameters()]
"""


def test_max_restarts_resumes_the_trial_and_matches_an_uninterrupted_run(cluster, tmp_path) -> None:
    import torch

    cfg = {
        "global_batch_size": 8,
        "lr": 0.05,
        "max_restarts": 1,
        "checkpoint": {"every": 10, "directory": str(tmp_path / "a")},
    }
    cluster.configure(cfg)
    cluster.run(TRIAL.replace("time.sleep(0.05)", "pass"), quiet=True)
    reference = cluster.pull("params")[0]
    cluster.configure({**cfg, "checkpoint": {"every": 10, "directory": str(tmp_path / "b")}})
    pid = cluster.rank_info[1]["pid"]
    threading.Timer(2.5, os.kill, (pid, signal.SIGKILL)).start()
    result = cluster.run(TRIAL, quiet=True)
    assert result.ok
    resumed = cluster.pull("params")[0]
    assert all(torch.equal(a, b) for a, b in zip(reference, resumed, strict=True))
    kinds = [e["kind"] for e in cluster.session.store.events(cluster.session.run_id)]
    assert "rank_failure" in kinds and "resume" in kinds


SLOW_LOOP = """
import pathlib
kept = "still here"
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=4):
    if step == 1 and ctx.rank == 0:
        pathlib.Path(MARK).touch()  # the test interrupts now, inside step 1
    loss = F.mse_loss(model(x), y); ctx.backward(loss); ctx.step(opt); ctx.log(loss=loss)
    last = step
    time.sleep(6)
"""


def _interrupt_once_it_exists(mark: Path) -> None:
    """Press the stop button (SIGINT to this kernel) once a rank has written ``mark``: inside step 1."""

    def wait_and_interrupt() -> None:
        deadline = time.monotonic() + 120
        while not mark.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=wait_and_interrupt, daemon=True).start()


def test_one_interrupt_of_slow_steps_stops_at_that_step_and_keeps_every_name(
    cluster, tmp_path, capsys
) -> None:
    cluster.configure({"global_batch_size": 8})
    cluster.run(SETUP, quiet=True)
    pids = [info["pid"] for info in cluster.rank_info]
    mark = tmp_path / "in-step-1"

    _interrupt_once_it_exists(mark)
    result = cluster.run(f"MARK = {str(mark)!r}\n" + SLOW_LOOP, quiet=True)
    err = capsys.readouterr().err
    assert result.status == "interrupted", err
    assert "waiting up to" in err and "aborting" not in err, err
    assert [info["pid"] for info in cluster.rank_info] == pids  # no restart
    assert cluster.pull("last") == [1, 1]  # left at the end of the step the interrupt fell in
    assert cluster.pull("kept") == ["still here"] * 2
    cluster.run("alive = type(model).__name__", quiet=True)
    assert cluster.pull("alive") == ["DistributedDataParallel"] * 2


def test_a_grace_run_out_only_says_so_and_a_second_interrupt_is_the_only_abort(
    cluster, tmp_path, capsys, monkeypatch
) -> None:
    from dtwork.kernel import watcher

    monkeypatch.setattr(watcher, "INTERRUPT_GRACE", 0.2)  # runs out long before the step ends
    monkeypatch.setattr(watcher, "GRACE_STEPS", 0)
    cluster.configure({"global_batch_size": 8})
    cluster.run(SETUP, quiet=True)
    pids = [info["pid"] for info in cluster.rank_info]
    mark = tmp_path / "in-step-1"

    _interrupt_once_it_exists(mark)
    cell = f"MARK = {str(mark)!r}\n" + SLOW_LOOP.replace("time.sleep(6)", "time.sleep(3)")
    result = cluster.run(cell, quiet=True)
    err = capsys.readouterr().err
    assert result.status == "interrupted", err
    assert "ranks have not stopped after 0 s: still waiting; interrupt again to abort" in err, err
    assert [info["pid"] for info in cluster.rank_info] == pids  # no restart
    assert cluster.pull("last") == [1, 1] and cluster.pull("kept") == ["still here"] * 2
