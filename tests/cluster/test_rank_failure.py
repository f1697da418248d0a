"""One rank's error costs one cell: the others leave their collectives at once, the engines,
their namespaces and the cluster stay, the next cell trains on a rebuilt process group."""

from __future__ import annotations

import re
import time

import pytest

from dtwork.errors import RankFailure

SETUP = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
kept = 41 + ctx.rank
net = ctx.wrap(nn.Linear(4, 1))
opt = ctx.optimizer(net.parameters())
g = torch.Generator().manual_seed(3)
data = torch.utils.data.TensorDataset(torch.randn(512, 4, generator=g), torch.randn(512, 1, generator=g))
"""

STEPS = """
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=50):
    if ctx.rank == 1 and step == 5:
        raise RuntimeError('bad batch on rank 1')
    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt)
"""

HAND = """
import torch.distributed as dist
t = torch.ones(1)
dist.all_reduce(t)
if ctx.rank == 1:
    raise RuntimeError('bad batch on rank 1')
dist.all_reduce(t)
"""

TRAIN = """
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=3):
    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt)
same = [p.detach().clone() for p in net.parameters()]
"""


@pytest.mark.parametrize("cell", [STEPS, HAND], ids=["ctx.steps", "hand loop"])
def test_a_failing_rank_fails_the_cell_at_once_and_keeps_the_engines(fresh_run, cell: str) -> None:
    c = fresh_run
    c.configure({"global_batch_size": 8})
    c.run(SETUP, quiet=True)
    cluster_id = c.cluster_id
    t0 = time.monotonic()
    with pytest.raises(RankFailure) as failed:
        c.run(cell, quiet=True)
    seconds = time.monotonic() - t0
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(failed.value))  # coloured where a kernel shell exists
    # under the group's 60 s timeout, which would end it otherwise (the speed: benchmarks/dead_rank.py)
    assert seconds < 40, f"the cell took {seconds:.1f} s to fail"
    assert text.startswith("dtwork: the cell failed on rank 1")
    assert text.count("RuntimeError: bad batch on rank 1") == 1, text
    assert "rank 0: " in text
    assert c.cluster_id == cluster_id and c.state == "running"
    assert c.pull("kept") == [41, 42]
    store = c.session.store
    # a run's status is set by the cells that trained in it: the loop's, not the collectives' alone
    assert store.get_run(c.session.run_id)["status"] == ("failed" if cell is STEPS else "running")
    c.run(TRAIN, quiet=True)  # the rebuilt group trains, the model kept its DDP wrapper
    a, b = c.pull("same")
    assert all((x == y).all() for x, y in zip(a, b, strict=True))
    assert store.get_run(c.session.run_id)["status"] == "running"
