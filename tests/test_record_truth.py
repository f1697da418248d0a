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
