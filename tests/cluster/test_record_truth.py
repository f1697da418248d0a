"""The record of an experiment tells the truth while it is iterated (issue 33): no false alarm
after a failed cell, no silent unwrapped model, non-finite values kept and named, the learning rate
the optimizer has, dtwork's own measurements apart, interrupted loops named, what each cell ran with."""

from __future__ import annotations

import pytest

from dtwork.errors import RankFailure

DATA = """
import torch, torch.nn as nn, torch.nn.functional as F
g = torch.Generator().manual_seed(3)
data = torch.utils.data.TensorDataset(torch.randn(512, 4, generator=g), torch.randn(512, 1, generator=g))
"""

WRAP = """
net = ctx.wrap(nn.Linear(4, 1))
opt = ctx.optimizer(net.parameters())
"""

SHAPE_ERROR = """
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=50):
    if ctx.rank == 1 and step == 5:
        x = x[:, :3]  # a shape error on one rank, mid-training
    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt)
"""

FRESH_TRAIN = """
net2 = ctx.wrap(nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1)))
opt2 = ctx.optimizer(net2.parameters())
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=300):
    loss = F.mse_loss(net2(x), y); ctx.backward(loss); ctx.step(opt2)
"""


def test_no_replica_false_alarm_after_a_one_rank_failure(fresh_run) -> None:
    c = fresh_run
    c.configure({"global_batch_size": 16})
    c.run(DATA, quiet=True)
    for _ in range(3):  # the stale counts raised the false alarm every time (3 of 3) before the fix
        c.run(WRAP, quiet=True)
        with pytest.raises(RankFailure, match="rank 1"):
            c.run(SHAPE_ERROR, quiet=True)
        c.run(FRESH_TRAIN, quiet=True)  # raised "the model replicas differ" before the fix


UNWRAPPED_STEPS = """
plain = nn.Linear(4, 1)
popt = torch.optim.SGD(plain.parameters(), lr=0.1)
w0 = plain.weight.detach().clone()
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=100):
    loss = F.mse_loss(plain(x), y); ctx.backward(loss); STEP
"""

UNWRAPPED_HAND = """
plain = nn.Linear(4, 1)
popt = torch.optim.SGD(plain.parameters(), lr=0.1)
w0 = plain.weight.detach().clone()
for i, (x, y) in enumerate(ctx.loader(data)):
    loss = F.mse_loss(plain(x), y); loss.backward(); ctx.step(popt)
"""

NO_EXCHANGE = """
net3 = ctx.wrap(nn.Linear(4, 1))
with torch.no_grad():
    for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=40):
        ctx.log(val=F.mse_loss(net3(x), y))
"""


@pytest.mark.parametrize(
    "cell",
    [
        UNWRAPPED_STEPS.replace("STEP", "ctx.step(popt)"),
        UNWRAPPED_STEPS.replace("STEP", "popt.step(); popt.zero_grad()"),
        UNWRAPPED_HAND,
    ],
    ids=["ctx.steps+ctx.step", "ctx.steps+opt.step", "hand loop+ctx.step"],
)
def test_an_unwrapped_model_is_caught_at_its_first_step(fresh_run, cell: str) -> None:
    c = fresh_run
    c.configure({"global_batch_size": 16})
    c.run(DATA, quiet=True)
    with pytest.raises(RankFailure, match=r"ctx\.wrap\(model\)") as failed:
        c.run(cell + "\nreached = True", quiet=True)
    assert "at step 1" not in str(failed.value) and "at step 2" not in str(failed.value)
    assert "never exchanged" in str(failed.value)
    c.run("unchanged = torch.equal(w0, plain.weight)", quiet=True)
    assert c.pull("unchanged") == [True, True]  # no rank stepped it even once


def test_steps_that_exchange_nothing_show_no_efficiency(fresh_run) -> None:
    c = fresh_run
    c.configure({"global_batch_size": 16})
    c.run(DATA, quiet=True)
    c.run(NO_EXCHANGE, quiet=True)
    store, run = c.session.store, c.session.run_id
    assert store.metrics(run, "val")  # the loop ran and logged
    assert not store.metrics(run, "scaling_efficiency")
    assert not store.metrics(run, "comm_time", rank="all")


DIVERGES = """
net4 = ctx.wrap(nn.Linear(4, 1), gns=True)
opt4 = ctx.optimizer(net4.parameters())
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=STEPS):
    loss = F.mse_loss(net4(x), y)
    if step >= DIVERGE_AT:
        loss = loss * float('nan')  # the loss turns NaN, and with it the gradients
    ctx.backward(loss); ctx.step(opt4)
    ctx.log(loss=loss)
"""


def _runs_show(store_path: object, run_id: int, capsys: pytest.CaptureFixture[str]) -> str:
    from dtwork import cli

    capsys.readouterr()
    assert cli.main(["runs", "show", str(run_id), "--store", str(store_path)]) == 0
    return capsys.readouterr().out


def test_a_nan_at_step_k_is_an_event_a_warning_and_shown_by_runs_show(fresh_run, capsys, tmp_path) -> None:
    import math

    from dtwork import commands as measure
    from dtwork.server import queries as server_data

    c = fresh_run
    c.configure({"global_batch_size": 16, "gns": {"enabled": True}})
    c.run(DATA, quiet=True)
    capsys.readouterr()
    c.run(DIVERGES.replace("STEPS", "400").replace("DIVERGE_AT", "300"), quiet=True)
    warned = capsys.readouterr().err
    assert warned.count("training diverged") == 1, warned  # once per run, one line
    assert "dtwork: warning: loss is nan at step 300: training diverged" in warned
    store, run = c.session.store, c.session.run_id
    (event,) = store.events(run, "diverged")
    assert event["data"]["step"] == 300 and event["data"]["name"] == "loss"
    loss = {r["step"]: r["value"] for r in store.metrics(run, "loss")}
    assert math.isfinite(loss[299]) and math.isnan(loss[300]) and math.isnan(loss[399])  # not missing
    shown = _runs_show(store.path, run, capsys)
    assert "diverged  at step 300 (loss nan)" in shown, shown
    assert server_data.diverged_text(store, run) == "diverged at step 300 (loss nan)"
    from dtwork.report import export

    export(run, tmp_path / "r.ipynb", store=store.path)
    assert "| diverged | at step 300 (loss nan) |" in (tmp_path / "r.ipynb").read_text()
    measure.gns_advice(c, quiet=False)
    advice = capsys.readouterr().out
    assert "B_simple ~ " in advice
    assert "non-finite gradients left out" in advice and "diverged at step 300" in advice, advice


EXTREMES = """
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=30):
    ctx.log(big=1e308, up=float('inf'), down=torch.tensor(float('-inf')))
ctx.log(big_hand=1e308, step=30)
"""


def test_inf_round_trips_and_1e308_averaged_over_ranks_stays_1e308(fresh_run) -> None:
    import math

    c = fresh_run
    c.configure({"global_batch_size": 16})
    c.run(DATA, quiet=True)
    c.run(EXTREMES, quiet=True)
    store, run = c.session.store, c.session.run_id
    values = {n: {r["value"] for r in store.metrics(run, n)} for n in ("big", "up", "down", "big_hand")}
    assert values == {"big": {1e308}, "up": {math.inf}, "down": {-math.inf}, "big_hand": {1e308}}
    assert len(store.metrics(run, "up")) == 30


HAND_LOOP = """
import pathlib, time
hand = ctx.wrap(nn.Linear(4, 1))
hopt = torch.optim.SGD(hand.parameters(), lr=0.01)
for i in range(100000):
    x, y = torch.randn(8, 4), torch.randn(8, 1)
    loss = F.mse_loss(hand(x), y); loss.backward(); ctx.step(hopt); ctx.log(loss=loss)
    if i == 10 and ctx.rank == 0:
        pathlib.Path(MARK).touch()  # the loop is under way: the test presses stop now
    time.sleep(0.002)
"""


def test_an_interrupted_hand_loop_is_stored_as_interrupted(fresh_run, tmp_path) -> None:
    import os
    import signal
    import threading

    c = fresh_run
    c.run(DATA, quiet=True)
    mark = tmp_path / "started"
    pressed = threading.Event()

    def press_stop() -> None:  # the stop button: an interrupt of the kernel, once the loop runs
        while not mark.exists() and not pressed.is_set():
            pressed.wait(0.01)
        if not pressed.is_set():
            os.kill(os.getpid(), signal.SIGINT)

    stopper = threading.Thread(target=press_stop)
    stopper.start()
    try:
        result = c.run(HAND_LOOP.replace("MARK", repr(str(mark))), quiet=True)
    finally:
        pressed.set()
        stopper.join()
    assert result.status == "interrupted"
    store, run = c.session.store, c.session.run_id
    assert store.cells(run)[-1]["status"] == "interrupted"
    assert store.get_run(run)["status"] == "running"  # not failed
    c.session.new_run()  # the run ends after the interrupted cell
    assert store.get_run(run)["status"] == "interrupted"
    c.run("after = ctx.rank", quiet=True)  # the next cell runs on a working group
    assert c.pull("after") == [0, 1]


TRAIN_AT_LR = """
net5 = ctx.wrap(nn.Linear(4, 1), gns=True)
opt5 = torch.optim.SGD(net5.parameters(), lr=0.05)
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=300):
    loss = F.mse_loss(net5(x), y); ctx.backward(loss); ctx.step(opt5)
"""


def test_gns_advice_names_the_learning_rate_the_optimizer_has_now(fresh_run, capsys) -> None:
    from dtwork import commands as measure

    c = fresh_run
    c.configure({"global_batch_size": 16, "gns": {"enabled": True}})  # lr.base stays the default 0.1
    c.run(DATA, quiet=True)
    c.run(TRAIN_AT_LR, quiet=True)
    capsys.readouterr()
    measure.gns_advice(c, quiet=False)
    out = capsys.readouterr().out
    assert "learning rate now: 0.05 (the optimizer's, after its schedule)" in out, out
    assert "Batch 16 (8/slot): lr 0.05 linear" in out, out
    c.run("opt5.param_groups[0]['lr'] = 0.01", quiet=True)  # a schedule's or the user's change
    measure.gns_advice(c, quiet=False)
    out = capsys.readouterr().out
    assert "learning rate now: 0.01 (" in out and "Batch 16 (8/slot): lr 0.01 linear" in out, out


def test_dtworks_own_measurements_are_kept_apart_from_the_users_metrics(fresh_run, capsys, tmp_path) -> None:
    from dtwork import cli
    from dtwork.report import export

    c = fresh_run
    c.configure({"global_batch_size": 16, "gns": {"enabled": True}})
    c.run(DATA, quiet=True)
    c.run(TRAIN_AT_LR.replace("ctx.step(opt5)", "ctx.step(opt5); ctx.log(loss=loss)"), quiet=True)
    store, run = c.session.store, c.session.run_id
    assert {"b_simple", "b_big", "g2", "settled", "trace_sigma"} <= set(store.metric_names(run))
    shown = _runs_show(store.path, run, capsys)
    table = shown.split("\nmetric ", 1)[1].splitlines()[1:]
    assert [line.split()[0] for line in table] == ["loss"], shown
    assert "  measured  B_simple " in shown and "scaling efficiency " in shown, shown
    plot = tmp_path / "compare.html"
    args = ["runs", "compare", str(run), str(run), "--store", str(store.path), "--plot", str(plot)]
    assert cli.main(args) == 0
    compared = capsys.readouterr().out
    assert "loss (last)" in compared and "b_big" not in compared and "settled" not in compared, compared
    panels = plot.read_text()
    assert "b_big" not in panels and "trace_sigma" not in panels
    export(run, tmp_path / "r.ipynb", store=store.path)
    header = (tmp_path / "r.ipynb").read_text().split("## ", 1)[0]
    assert "final loss" in header and "final settled" not in header and "final b_big" not in header
    assert "B_simple |" in header


def test_a_divergence_is_marked_on_the_live_dashboard(fresh_run) -> None:
    import contextlib
    import io

    c = fresh_run
    c.session.live = True
    try:
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            c.run(
                "for step, _ in ctx.steps(range(12), max_steps=12):\n"
                "    ctx.log(loss=float('nan') if step >= 7 else 1.0)\n"
            )
        dash = c.session.dashboard
        assert dash is not None and dash.diverged == "diverged at step 7 (loss nan)"
        assert "diverged at step 7 (loss nan)" in (dash.static_figure().layout.title.text or "")
    finally:
        c.session.live = False


def test_the_report_records_what_the_cell_ran_with_and_keeps_its_options(fresh_run, tmp_path) -> None:
    import nbformat

    from dtwork.report import export

    c = fresh_run
    c.configure({"global_batch_size": 16})  # gns.enabled false and lr.base 0.1 in the config
    c.run(DATA, quiet=True)
    c.run(TRAIN_AT_LR, quiet=True, rank0=True)  # ctx.wrap(..., gns=True), SGD at lr 0.05
    store, run = c.session.store, c.session.run_id
    rep = export(run, tmp_path / "r.ipynb", store=store.path)
    nb = nbformat.read(rep.path, as_version=4)
    (what,) = [cell.source for cell in nb.cells if cell.source.startswith("## What ran")]
    assert "GNS on; SGD lr 0.05, momentum 0" in what, what
    trained = [cell.source for cell in nb.cells if cell.cell_type == "code" and "opt5" in cell.source]
    assert trained and trained[0].startswith("%%dtrain --rank0\n"), trained
    data = [cell.source for cell in nb.cells if "RECORDED = json.loads(" in cell.source]
    assert data and '"base": 0.05' in data[0].replace("\\\\", "")  # the advice scales lr 0.05
