"""Adaptive batch size by goodput on 2 real gloo ranks: ctx.steps and a hand loop, and a resume.

The workload is a multi-output linear regression started far from its optimum: its gradient
noise lives in many dimensions, so 2 ranks settle the GNS interval within ~150 steps, and on
this CPU the step time hardly grows with the batch, so goodput asks for larger batches.
"""

from __future__ import annotations

import pytest

CONFIG = {"global_batch_size": 16, "seed": 3, "gns": {"enabled": True, "ema_decay": 0.98}}
DATA = """
import torch, torch.nn as nn, torch.nn.functional as F
from dtwork.analysis import goodput
g = torch.Generator().manual_seed(3)
N, D, K = 4096, 32, 4
X = torch.randn(N, D, generator=g)
Y = X @ (3 * torch.randn(D, K, generator=g)) + 0.5 * torch.randn(N, K, generator=g)
data = torch.utils.data.TensorDataset(X, Y, torch.arange(N))
torch.manual_seed(0)
model = ctx.wrap(nn.Linear(D, K))
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = ctx.loader(data, adaptive=True)
seen, traj, lrs = {}, [], []
"""

# every step: the indices each epoch took, the batch, and (rank 0) the LR against AdaScale's gain
STEPS = """
for step, (x, y, i) in ctx.steps(loader, adaptive=True, max_global_batch=256, decide_every=20,
                                  max_steps=MAX, checkpoint_every=CKPT, resume=RESUME):
    seen.setdefault(ctx.epoch, []).extend(i.tolist())
    if not traj:
        first = (ctx.global_batch_size, ctx.per_slot_batch_size, ctx.accumulation, loader.sampler.position)
    ctx.backward(F.mse_loss(model(x), y)); ctx.step(opt)
    traj.append((step, ctx.epoch, ctx.global_batch_size))
    d = ctx.state.adaptive.decision
    if d is not None and d.efficiency is not None:
        lrs.append((opt.param_groups[0]["lr"], ctx.global_batch_size, d.efficiency))
split = ctx.state.adaptive.split  # as the last step's end left it
end = (split.global_batch, split.accumulation, loader.sampler.epoch, loader.sampler.position)
"""


def _exactly_once(seen: list[dict[int, list[int]]], n: int, complete: set[int]) -> None:
    for epoch in seen[0]:
        both = seen[0][epoch] + seen[1][epoch]
        assert len(both) == len(set(both)), f"epoch {epoch} repeated a sample"
        if epoch in complete:
            assert sorted(both) == list(range(n)), f"epoch {epoch} skipped a sample"


def test_steps_loop_grows_the_batch_sees_each_sample_once_scales_the_lr_and_resumes(
    cluster, tmp_path
) -> None:
    cluster.configure({**CONFIG, "checkpoint": {"directory": str(tmp_path)}})
    code = DATA + STEPS.replace("MAX", "800").replace("CKPT", "40").replace("RESUME", "False")
    cluster.run(code, quiet=True)
    traj, seen, lrs = cluster.pull("traj"), cluster.pull("seen"), cluster.pull("lrs")[0]
    assert traj[0] == traj[1]  # both ranks ran the same batches at the same steps
    batches = [b for _, _, b in traj[0]]
    # the step time hardly grows with the batch here: the batch grows (timing noise may step it back)
    assert batches[0] == 16 and max(batches) >= 64, sorted(set(batches))
    changed_in = {
        e for (_, e, b1), (_, e2, b2) in zip(traj[0], traj[0][1:], strict=False) if e == e2 and b1 != b2
    }
    last = traj[0][-1][1]
    assert changed_in - {last}, "no batch change inside a complete epoch"
    _exactly_once(seen, 4096, set(range(last)))
    # SGD: AdaScale's gain r = S E(M) on the LR it started with, S = M / M0
    assert lrs, "no decision on a settled interval"
    for lr, m, eff in lrs:
        assert lr == pytest.approx(0.01 * m / 16 * eff, rel=1e-9)
    store, rid = cluster.session.store, cluster.session.run_id
    rows = store.metrics(rid, "global_batch")
    assert rows and rows[-1]["value"] == batches[-1] and rows[-1]["rank"] is None
    assert any("global batch" in e["message"] for e in store.events(rid, kind="batch"))

    # a new cell resumes: the same batch, accumulation and sampler place; the epoch completes once
    end = cluster.pull("end")[0]
    code = DATA + STEPS.replace("MAX", "1100").replace("CKPT", "0").replace("RESUME", "True")
    cluster.run(code.replace("seen, traj, lrs = {}, [], []", "traj, lrs = [], []"), quiet=True)
    first = cluster.pull("first")[0]
    assert (first[0], first[2], first[3]) == (end[0], end[1], end[3] + first[1] * 2), (first, end)
    seen = cluster.pull("seen")
    _exactly_once(seen, 4096, {end[2]})
    assert len(seen[0][end[2]]) * 2 == 4096


HAND = """
loader = ctx.loader(data, adaptive=True, max_global_batch=128, decide_every=20, lr_rule="linear")
steps = 0
while ctx.epoch < 2:
    epoch = ctx.epoch
    for x, y, i in loader:
        seen.setdefault(epoch, []).extend(i.tolist())
        model.zero_grad(); F.mse_loss(model(x), y).backward(); ctx.step(opt)
        steps += 1
        traj.append((steps, opt.param_groups[0]["lr"], ctx.global_batch_size, len(x)))
"""


def test_a_hand_loop_decides_in_ctx_step_with_the_linear_rule(cluster) -> None:
    cluster.configure(CONFIG)
    cluster.run(DATA + HAND, quiet=True)
    traj, seen = cluster.pull("traj"), cluster.pull("seen")
    assert traj[0] == traj[1]
    assert traj[0][-1][2] > 16, traj[0][-1]
    for _, lr, m, _ in traj[0]:  # linear: M / M0 on the LR it started with
        assert lr == pytest.approx(0.01 * m / 16, rel=1e-9)
    _exactly_once(seen, 4096, {0, 1})
    assert sum(n for *_, n in traj[0]) * 2 == 2 * 4096
