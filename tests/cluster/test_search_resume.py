"""A search stopped by Ctrl-C and resumed (issue 48: "the search can be resumed where it stopped"), on the
shared 2-rank cluster: the stop button is a SIGINT to this kernel while a trial trains, as a user
presses it. Resuming keeps the ended trials' runs, runs the rest once, and closes the record completed;
an ASHA search interrupted in its promotion goes on from that piece's checkpoint to what an
uninterrupted search gives."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.cluster.test_search_asha import CELL as ASHA_CELL
from tests.cluster.test_search_asha import SEARCH as ASHA_SEARCH

# Rank 0 counts the pieces it begins and trains the PIECE-th slowly, writing MARK when the test is to
# press stop; once MARK exists no piece is slow. (The other rank waits for it at each step's allreduce.)
_SLOW = """
import os, pathlib, time
_slow = False
if ctx.rank == 0:
    with open(MARK + ".pieces", "a") as f:
        f.write("piece\\n")
    _slow = not os.path.exists(MARK) and len(open(MARK + ".pieces").read().splitlines()) == PIECE
"""
_TRAIN = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
g = torch.Generator().manual_seed(5)
data = torch.utils.data.TensorDataset(torch.randn(256, 4, generator=g), torch.randn(256, 1, generator=g))
net = ctx.wrap(nn.Linear(4, 1))
opt = torch.optim.SGD(net.parameters(), lr=ctx.hparams["lr"])
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=8):
    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt)
    if _slow:  # slow from its first step: the ranks agree on a stop at every step
        time.sleep(0.25)
        if step >= 2:
            pathlib.Path(MARK).touch()  # the test presses stop now
ctx.log(val_loss=float(loss))
"""
GRID = """
name: resumed
global_batch_size: 32
hyperparameters:
  lr: {type: categorical, vals: [0.01, 0.03, 0.1, 0.3]}
searcher: {name: grid, metric: val_loss, smaller_is_better: true}
"""


def _press_stop_once(mark: Path) -> threading.Event:
    """SIGINT to this kernel once a rank wrote ``mark`` (the stop button); set the event to give up."""
    done = threading.Event()

    def wait_and_interrupt() -> None:
        deadline = time.monotonic() + 120
        while not mark.exists() and not done.is_set() and time.monotonic() < deadline:
            done.wait(0.02)
        if mark.exists() and not done.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=wait_and_interrupt, daemon=True).start()
    return done


def _stopped(code: str, source: Path, mark: Path) -> Any:
    import dtwork

    done = _press_stop_once(mark)
    try:
        return dtwork.search(source, code, quiet=True)
    finally:
        done.set()


def _pieces(store: Any, search_id: int) -> dict[int, list[int]]:
    from dtwork.store import searches

    runs: dict[int, list[int]] = {}
    for p in searches.pieces(store.db, search_id):
        runs.setdefault(p["trial"], []).append(p["run_id"])
    return runs


def test_a_grid_stopped_at_trial_3_resumes_there_and_keeps_trials_1_and_2(
    fresh_run: Any, ip: Any, tmp_path: Path, capsys: Any
) -> None:
    import dtwork
    from dtwork.errors import DtworkError
    from dtwork.store import searches

    c = fresh_run
    path, mark = tmp_path / "resumed.yaml", tmp_path / "stop"
    path.write_text(GRID)
    code = f"MARK = {str(mark)!r}; PIECE = 3\n" + _SLOW + _TRAIN
    first = _stopped(code, path, mark)
    assert [t.status for t in first.trials] == ["completed", "completed", "interrupted", "not run"]
    store, sid = c.session.store, first.search_id
    assert searches.get(store.db, sid)["status"] == "interrupted"
    kept = [(t.run_id, t.metric) for t in first.trials[:2]]
    # %dtrain search --resume ID (no file, no cell): the stored file and code
    capsys.readouterr()
    ip.run_line_magic("dtrain", f"search --resume {sid}")
    out = capsys.readouterr().out
    assert f"dtwork: resuming search {sid} (resumed.yaml): 2 of 4 trials ended" in out, out
    assert f"grid search resumed.yaml (search {sid}): 4 trials" in out, out
    with pytest.raises(DtworkError, match=rf"^search {sid} \(resumed.yaml\) completed already: nothing"):
        dtwork.search(None, None, resume=sid)
    rows = searches.trials(store.db, sid)
    assert [t["status"] for t in rows] == ["completed"] * 4
    assert [(t["run_id"], t["metric"]) for t in rows[:2]] == kept  # not run again
    assert all(t["metric"] is not None for t in rows)
    runs = _pieces(store, sid)
    assert [len(runs[n]) for n in (1, 2, 3, 4)] == [1, 1, 2, 1]  # trial 3: its interrupted run, then one
    assert rows[2]["run_id"] == runs[3][1] and store.get_run(runs[3][0])["status"] == "interrupted"
    record = searches.get(store.db, sid)
    best = min(t["metric"] for t in rows)
    assert (record["status"], record["done"], record["best"]) == ("completed", 4, best)
    # trial 3, run whole, gives what its resumed run gave
    c.configure(first.search.configs[2])
    c.run(code, quiet=True)
    whole = store.metrics(c.session.run_id, "val_loss", rank="all")[-1]["value"]
    assert whole == pytest.approx(rows[2]["metric"], rel=1e-6)


def test_an_asha_search_stopped_in_its_promotion_resumes_to_the_uninterrupted_result(
    fresh_run: Any, tmp_path: Path
) -> None:
    import dtwork

    c = fresh_run
    path, mark = tmp_path / "asha.yaml", tmp_path / "stop"
    path.write_text(ASHA_SEARCH.format(folder=tmp_path / "checkpoints"))
    # the 5th piece is the promotion (4 trials at rung 0 first): slow, stopped from its 7th step on
    train = ASHA_CELL.replace(
        "ctx.step(opt); ctx.log(loss=loss)",
        "ctx.step(opt); ctx.log(loss=loss)\n"
        "    if _slow:\n"
        "        time.sleep(0.25)\n"
        "        if step >= 6: pathlib.Path(MARK).touch()",
    )
    assert train != ASHA_CELL
    code = f"MARK = {str(mark)!r}; PIECE = 5\n" + _SLOW + train
    first = _stopped(code, path, mark)
    statuses = [t.status for t in first.trials]
    assert statuses.count("interrupted") == 1 and statuses.count("stopped") == 3, statuses
    cut = next(t for t in first.trials if t.status == "interrupted")
    again = dtwork.search(path, code, resume=first.search_id, quiet=True)  # the same file and cell
    best = again.best
    assert best is not None and best.number == cut.number and best.hparams["lr"] == 0.1
    assert [(t.status, t.rung) for t in again.trials] == [
        ("completed", 1) if t is best else ("stopped", 0) for t in again.trials
    ]
    store = c.session.store
    runs = _pieces(store, again.search_id)[best.number]
    assert len(runs) == 3  # rung 0, the interrupted promotion, and its resumption from its checkpoint
    resumed_from = store.segments(runs[2])[0]["first_step"]
    assert 6 < resumed_from < 16  # from the interrupted piece's checkpoint, not from rung 0's
    assert [r["step"] for r in store.metrics(runs[2], "val_loss", rank="all")][-1] == 15
    # its weights equal one uninterrupted run of 16 batches with its hyperparameters
    c.run("searched = params", quiet=True)
    c.configure(again.search.configs[best.number - 1])
    c.run(code, quiet=True)
    c.run("assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(searched, params))", quiet=True)
