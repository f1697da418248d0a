"""Mixed precision in ctx.steps, and the gradient noise scale at world size 1."""

from __future__ import annotations

import pytest

import dtwork

TRAIN = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
X = torch.randn(512, 8, generator=g); Y = X @ torch.randn(8, 1, generator=g)
model = ctx.wrap(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)), gns=GNS)
opt = ctx.optimizer(model.parameters())
losses = []
for step, (x, y) in ctx.steps(ctx.loader(torch.utils.data.TensorDataset(X, Y)), max_steps=60):
    out = model(x)
    loss = F.mse_loss(out.float(), y)
    ctx.backward(loss); ctx.step(opt); losses.append(loss.item())
dtype = str(out.dtype)
scaler = type(ctx._scaler).__name__ if ctx._scaler is not None else None
estimate = ctx.gns
"""


@pytest.mark.parametrize(
    ("precision", "dtype", "scaler"),
    [("bf16", "torch.bfloat16", None), ("fp16", "torch.float16", "GradScaler")],
)
def test_mixed_precision_autocasts_and_trains(
    cluster, precision: str, dtype: str, scaler: str | None
) -> None:
    cluster.configure({"global_batch_size": 32, "lr": 0.02, "mixed_precision": precision})
    cluster.run(TRAIN.replace("GNS", "False"), quiet=True)
    assert cluster.pull("dtype") == [dtype, dtype]
    assert cluster.pull("scaler")[0] == scaler
    losses = cluster.pull("losses")[0]
    assert sum(losses[-5:]) < 0.5 * sum(losses[:5])


def test_gns_at_world_size_one_uses_the_micro_batches(capfd) -> None:
    with dtwork.start(n=1, backend="gloo") as one:
        one.session.live = False
        one.configure({"global_batch_size": 16, "lr": 0.02})
        one.run(TRAIN.replace("GNS", "True"))
        assert one.pull("estimate") == [None]
        assert "No gradient noise scale estimate at world size 1" in capfd.readouterr().out
        one.configure({"global_batch_size": 16, "lr": 0.02, "optimizations": {"aggregation_frequency": 4}})
        one.run(TRAIN.replace("GNS", "True"), quiet=True)
        estimate = one.pull("estimate")[0]
        assert estimate is not None and estimate > 0
        rows = one.session.store.metrics(one.session.run_id, "b_small")
        assert rows and rows[-1]["value"] == 16.0
        assert one.session.store.metrics(one.session.run_id, "b_big")[-1]["value"] == 64.0
