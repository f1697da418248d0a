"""Records that neither flip nor land wrong (issue 45): no stall alarm about a finished loop after idle
time, a run's status set by its own cells only, after-loop logs at the run's last step, ``ctx.run_id``
naming a run in the cell that begins it, a resumed run beginning at the resumed step."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from dtwork.errors import DtworkError, RankFailure

DATA = """
import time, torch, torch.nn as nn, torch.nn.functional as F
g = torch.Generator().manual_seed(7)
data = torch.utils.data.TensorDataset(torch.randn(256, 4, generator=g), torch.randn(256, 1, generator=g))
"""

TRAIN = """
net = ctx.wrap(nn.Linear(4, 1)); opt = ctx.optimizer(net.parameters())
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=5):
    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt); ctx.log(loss=loss)
ctx.log(test_loss=0.5)
ctx.log(test_acc=0.9)
run_seen = ctx.run_id
"""


def _status(c: Any, run: int) -> str:
    return str(c.session.store.get_run(run)["status"])


def test_idle_time_then_a_training_cell_raises_no_stall_alarm(fresh_run, capsys) -> None:
    c = fresh_run
    c.configure({"global_batch_size": 16})
    c.run(DATA, quiet=True)
    c.run(TRAIN, quiet=True)
    c.session.stall_seconds = 1.0
    try:
        time.sleep(2.0)  # the idle time itself: the last loop's progress is now older than the limit
        # a log before the loop sends a batch at once; the pause gives the watchdog its rounds
        c.run("ctx.log(before=1.0)\ntime.sleep(1.5)\n" + TRAIN, quiet=True)
    finally:
        c.session.stall_seconds = 60.0
    assert "no progress" not in capsys.readouterr().err
    assert not c.session.store.events(c.session.run_id, "stall")


def test_a_runs_status_is_set_by_its_own_cells(fresh_run) -> None:
    c = fresh_run
    c.configure({"global_batch_size": 16})
    c.run(DATA, quiet=True)
    c.run(TRAIN, quiet=True)
    first = c.session.run_id
    with pytest.raises(RankFailure):
        c.run("raise ValueError('a plot that fails')", quiet=True)
    with pytest.raises(RankFailure):  # a new model: a new run, whose training fails
        c.run(TRAIN.replace("ctx.log(loss=loss)", "ctx.log(loss=loss)\n    assert step < 2"), quiet=True)
    failed = c.session.run_id
    assert failed != first
    assert (_status(c, first), _status(c, failed)) == ("completed", "failed")
    c.run("ok = 1", quiet=True)
    c.run(TRAIN, quiet=True)  # another new run: the failed one stays failed
    assert _status(c, failed) == "failed", "a failed run became completed"
    c.configure({"global_batch_size": 16})  # the next cell starts a new run
    with pytest.raises(RankFailure):
        c.run("raise ValueError('fails before any training')", quiet=True)
    assert _status(c, c.session.run_id) != "failed"


def test_after_loop_logs_land_at_the_runs_last_step_and_run_id_is_the_sessions(fresh_run) -> None:
    c = fresh_run
    c.configure({"global_batch_size": 16})
    c.run(DATA, quiet=True)
    store = c.session.store
    for _ in range(2):  # the second cell begins a new run mid-cell: its ctx.run_id names it at once
        c.run(TRAIN, quiet=True)
        run = c.session.run_id
        assert c.pull("run_seen") == [run, run]
        assert [m["step"] for m in store.metrics(run, "loss")] == [0, 1, 2, 3, 4]
        assert [m["step"] for m in store.metrics(run, "test_loss")] == [4]
        assert [m["step"] for m in store.metrics(run, "test_acc")] == [4]


def test_a_run_resumed_from_another_runs_checkpoint_begins_at_the_resumed_step(
    fresh_run, tmp_path, capsys
) -> None:
    c = fresh_run
    c.configure({"global_batch_size": 16, "checkpoint": {"directory": str(tmp_path)}})
    c.run(DATA, quiet=True)
    c.run(TRAIN.replace("max_steps=5", "max_steps=4, checkpoint_every=2"), quiet=True)
    source = c.session.run_id
    c.run(TRAIN.replace("max_steps=5", f"max_steps=2, resume='run-{source}'"), quiet=True)
    out = capsys.readouterr().out
    run = c.session.run_id
    assert run != source
    assert f"run {run} begins at step 4" in out, out
    assert [s["first_step"] for s in c.session.store.segments(run)] == [4]


def test_runs_compare_of_three_runs_in_the_magic(fresh_run, ip, capsys, tmp_path, monkeypatch) -> None:
    c = fresh_run
    monkeypatch.chdir(tmp_path)  # the notebook's folder: a compare writes nothing there unasked
    c.configure({"global_batch_size": 16})
    c.run(DATA, quiet=True)
    runs = []
    for _ in range(3):  # a new model each time: three runs
        c.run(TRAIN, quiet=True)
        runs.append(c.session.run_id)
    capsys.readouterr()
    ip.run_line_magic("dtrain", "runs compare " + " ".join(map(str, runs)))
    out = capsys.readouterr().out.splitlines()
    assert out[0].split()[:6] == [w for r in runs for w in ("run", str(r))]
    assert [line.split()[:2] for line in out if line.startswith("status")] == [["status", "completed"]]
    plot = Path(out[-1].removeprefix("plot: "))
    assert plot.is_file() and plot.parent == c.session.store_file.parent / "compare"
    assert not list(tmp_path.iterdir())
    with pytest.raises(DtworkError, match="runs compare: see the usage above"):
        ip.run_line_magic("dtrain", "runs compare")  # argparse's refusal, not a SystemExit
