"""Mixed precision in ctx.steps, and the gradient noise scale at world size 1."""

from __future__ import annotations

import math

import pytest
import torch

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
scaler = type(ctx.state.scaler).__name__ if ctx.state.scaler is not None else None
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


SKIP = """
import torch, torch.nn as nn, torch.nn.functional as F
ctx.state.scaler = None  # each run starts from a fresh loss scale
torch.manual_seed(0)
g = torch.Generator().manual_seed(1)
X = torch.randn(512, 8, generator=g); Y = 0.01 * X @ torch.randn(8, 1, generator=g)  # no fp16 overflow
model = ctx.wrap(nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1)), gns=True)
opt = ctx.optimizer(model.parameters())
sched = ctx.scheduler(opt, warmup=30)
stepped, norms = [], []
for step, (x, y) in ctx.steps(ctx.loader(torch.utils.data.TensorDataset(X, Y)), max_steps=20):
    if BY_HAND and step == 7:
        continue  # the same step left out by hand
    loss = F.mse_loss(model(x).float(), y)
    if not BY_HAND and step == 7 and ctx.rank == 0:
        loss = loss * float("inf")  # inf gradients on rank 0; the exchange spreads them
    ctx.backward(loss)
    norms.append(float(ctx.clip_grad_norm(model, 1e6)))
    stepped.append((step, ctx.step(opt)))
params = [p.detach().clone() for p in model.module.parameters()]
lr, gns_steps, estimate = sched.get_last_lr()[0], ctx.gns_state.steps, ctx.gns
scale = ctx.state.scaler.get_scale()
"""


def test_fp16_skipped_step_is_skipped_everywhere_and_equals_skipping_it_by_hand(cluster) -> None:
    cluster.configure({"global_batch_size": 32, "lr": 0.02, "mixed_precision": "fp16"})
    cluster.run(SKIP.replace("BY_HAND", "False"), quiet=True)
    injected = {
        n: cluster.pull(n) for n in ("params", "stepped", "norms", "lr", "gns_steps", "estimate", "scale")
    }
    cluster.configure({"global_batch_size": 32, "lr": 0.02, "mixed_precision": "fp16"})
    cluster.run(SKIP.replace("BY_HAND", "True"), quiet=True)
    by_hand = {
        n: cluster.pull(n) for n in ("params", "stepped", "norms", "lr", "gns_steps", "estimate", "scale")
    }
    # the first steps may overflow at the initial scale 65536 in both runs: the same ones
    natural = [step for step, ok in by_hand["stepped"][0] if not ok]
    for rank in (0, 1):  # skipped on every rank
        assert [step for step, ok in injected["stepped"][rank] if not ok] == sorted({*natural, 7})
    assert 7 not in natural and len(natural) < 5
    for a, b in zip(injected["params"][0], by_hand["params"][0], strict=True):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=0)
    # the schedule and the noise scale did not count the skipped step; the scale backed off
    used = 19 - len(natural)
    assert injected["lr"] == by_hand["lr"] and injected["gns_steps"] == by_hand["gns_steps"] == [used, used]
    assert injected["estimate"][0] == pytest.approx(by_hand["estimate"][0], rel=1e-6)
    assert injected["scale"][0] == by_hand["scale"][0] / 2
    # clip_grad_norm unscaled first: the same norms under loss scales that differ by 2 after step 7
    finite = [n for n in injected["norms"][0] if math.isfinite(n)]
    assert finite == pytest.approx(by_hand["norms"][0], rel=1e-5) and len(finite) == used


FRESH_SCALE = """
import torch, torch.nn.functional as F
def train(overflow_at_first_step):
    model = ctx.wrap(torch.nn.Linear(8, 1))
    opt = ctx.optimizer(model.parameters())
    data = torch.utils.data.TensorDataset(torch.randn(128, 8), torch.randn(128, 1))
    first = None
    for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=3):
        loss = F.mse_loss(model(x).float(), y)
        if overflow_at_first_step and step == 0:
            loss = loss * float("inf")  # inf gradients: the step is skipped and the scale backs off
        first = float(ctx.state.scaler.get_scale()) if first is None else first
        ctx.backward(loss); ctx.step(opt)
    return first, float(ctx.state.scaler.get_scale())
backed_off = train(True)
fresh = train(False)
"""


def test_a_new_model_trains_from_a_fresh_loss_scale_not_the_last_runs(cluster) -> None:
    cluster.configure({"global_batch_size": 32, "lr": 0.02, "mixed_precision": "fp16"})
    cluster.run(FRESH_SCALE, quiet=True)
    backed_off, fresh = cluster.pull("backed_off")[0], cluster.pull("fresh")[0]
    assert backed_off[1] == backed_off[0] / 2  # the first run's scale backed off once
    assert fresh[0] == backed_off[0]  # the new model's run starts at the initial scale again


def test_an_earlier_runs_fsdp_model_kept_by_a_name_leaves_the_scaler_plain(cluster) -> None:
    """fp16 on a DDP model takes torch's GradScaler even while an FSDP model of an earlier run is
    still held by a name (it made the scaler a ShardedGradScaler, whose all-reduce no DDP run needs)."""
    cluster.configure({"global_batch_size": 32, "lr": 0.02})
    cluster.run(
        "import torch, torch.nn as nn\n"
        "kept = ctx.wrap(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1)), strategy='fsdp')\n"
        "opt = ctx.optimizer(kept.parameters())\n"
        "for step, (x,) in ctx.steps(ctx.loader(torch.utils.data.TensorDataset(torch.randn(128, 8))), max_steps=2):\n"
        "    ctx.backward(kept(x).pow(2).mean()); ctx.step(opt)\n",
        quiet=True,
    )
    cluster.configure({"global_batch_size": 32, "lr": 0.02, "mixed_precision": "fp16"})
    cluster.run(TRAIN.replace("GNS", "False"), quiet=True)
    assert cluster.pull("scaler") == ["GradScaler", "GradScaler"]
