"""The record of an experiment tells the truth while it is iterated (issue 33): no false alarm
after a failed cell, no silent unwrapped model, non-finite values kept, interrupted loops named."""

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
    for _ in range(10):
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
