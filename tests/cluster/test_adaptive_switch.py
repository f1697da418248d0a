"""One switch: ``ctx.steps(ctx.loader(dataset), adaptive=True)`` on 2 real gloo ranks, with a plain
``ctx.loader`` (the form the adaptive issue specified; it was refused before)."""

from __future__ import annotations

from typing import Any

CELL = """
import torch, torch.nn as nn, torch.nn.functional as F
g = torch.Generator().manual_seed(3)
X = torch.randn(256, 4, generator=g); Y = X.sum(1, keepdim=True)
before = ctx.state.adaptive  # an earlier cell's hand-loop adaptive batch, if any (a shared cluster)
model = ctx.wrap(nn.Linear(4, 1), gns=True)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = ctx.loader(torch.utils.data.TensorDataset(X, Y))
sizes = []
for step, (x, y) in ctx.steps(loader, adaptive=True, max_global_batch=64, decide_every=2, max_steps=6):
    sizes.append(len(x))
    ctx.backward(F.mse_loss(model(x), y)); ctx.step(opt)
decided = ctx.loop is None and ctx.state.adaptive is before  # the twin is not a hand loop's batch
"""


def test_ctx_steps_adaptive_takes_a_plain_ctx_loader(fresh_run: Any) -> None:
    fresh_run.configure({"global_batch_size": 16})
    assert fresh_run.run(CELL, quiet=True).ok
    assert fresh_run.pull("decided") == [True, True]
    assert fresh_run.pull("sizes") == [
        [8] * 6,
        [8] * 6,
    ]  # the starting per-slot batch, by the adaptive sampler
