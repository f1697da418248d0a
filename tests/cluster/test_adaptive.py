"""Adaptive batch size by goodput on 2 real gloo ranks: ctx.steps and a hand loop, and a resume.

The workload is a linear regression from 4 inputs to 1024 outputs with label noise SIGMA, started
at zero. Its B_simple is 5 + SIGMA^2 / (squared error per weight): about 5 at the start, growing
as the model nears its optimum; without label noise it stays at 5 (D + 1) all the way. Each
micro-batch also does fixed and per-sample work (``WORK``: 10 ms + 1 ms a sample, as a real
model's step), so a step's time grows with the batch and goodput asks for a larger batch only
when the noise scale does: the two runs differ in SIGMA alone.
"""

from __future__ import annotations

import pytest

from dtwork import commands as measure
from dtwork import plots
from dtwork.report import helpers
from dtwork.report.build import COLUMNS
from dtwork.server import queries as data_routes

CONFIG = {"global_batch_size": 16, "seed": 3, "gns": {"enabled": True, "ema_decay": 0.98}}


DATA = """
import torch, torch.nn as nn, time
g = torch.Generator().manual_seed(3)
N, D, K = 4096, 4, 1024
X = torch.randn(N, D, generator=g)
Y = X @ torch.randn(D, K, generator=g) + SIGMA * torch.randn(N, K, generator=g)
data = torch.utils.data.TensorDataset(X, Y, torch.arange(N))
model = ctx.wrap(nn.Linear(D, K, bias=False))
with torch.no_grad():
    model.module.weight.zero_()
opt = torch.optim.SGD(model.parameters(), lr=0.01)
loader = ctx.loader(data, adaptive=True)
loss_of = lambda x, y: 0.5 * (model(x) - y).pow(2).sum(1).mean()
seen, traj, lrs = {}, [], []
WORK = lambda x: time.sleep(0.010 + 0.001 * len(x))  # a step's time: fixed, and per sample
"""


# every step: the indices each epoch took, the batch, and (rank 0) the LR against AdaScale's gain
STEPS = """
for step, (x, y, i) in ctx.steps(loader, adaptive=True, max_global_batch=256, decide_every=20,
                                  max_steps=MAX, checkpoint_every=CKPT, resume=RESUME):
    seen.setdefault(ctx.epoch, []).extend(i.tolist())
    if not traj:
        first = (ctx.global_batch_size, ctx.per_slot_batch_size, ctx.accumulation, loader.sampler.position)
    ctx.backward(loss_of(x, y)); ctx.step(opt); WORK(x)
    traj.append((step, ctx.epoch, ctx.global_batch_size, ctx.gns))
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


def _cell(sigma: float, max_steps: int, checkpoint_every: int, resume: bool) -> str:
    steps = STEPS.replace("MAX", str(max_steps)).replace("CKPT", str(checkpoint_every))
    return DATA.replace("SIGMA", str(sigma)) + steps.replace("RESUME", str(resume))


def _grows_with(traj: list[tuple[int, int, int, float | None]]) -> list[tuple[int, int, float]]:
    """The (step, new batch, B_simple) of every change of the batch along a trajectory."""
    return [(s, b, gns) for (s, _, b, gns), (*_, b0, _) in zip(traj[1:], traj, strict=False) if b != b0]


def test_steps_loop_grows_the_batch_as_the_noise_scale_grows_sees_each_sample_once_and_resumes(
    cluster, tmp_path, capsys
) -> None:
    cluster.configure({**CONFIG, "checkpoint": {"directory": str(tmp_path)}})
    cluster.run(_cell(1.0, 800, 40, False), quiet=True)
    traj, seen, lrs = cluster.pull("traj"), cluster.pull("seen"), cluster.pull("lrs")[0]
    assert traj[0] == traj[1]  # both ranks ran the same batches at the same steps
    batches = [b for _, _, b, _ in traj[0]]
    # the noise scale grows tenfold and more as the model nears its optimum; the batch follows it up,
    # each change at a larger B_simple than the one before (the same run without label noise, below,
    # keeps both flat: the timing alone does not grow the batch). How far each move goes rests on the
    # measured step times (the fit's split into fixed and per-sample time, which load shifts); what
    # the mechanism guarantees is the direction, so: two moves up or more, to twice the start at least
    noise = [gns for *_, gns in traj[0] if gns is not None]
    moves = _grows_with(traj[0])
    assert batches[0] == 16 and max(batches) >= 32 and len(moves) >= 2, moves
    assert noise[-1] >= 10 * noise[0], (noise[0], noise[-1])
    ups = [(b, gns) for _, b, gns in moves]
    assert all(b1 < b2 and g1 < g2 for (b1, g1), (b2, g2) in zip(ups, ups[1:], strict=False)), moves
    changed_in = {
        e for (_, e, b1, _), (_, e2, b2, _) in zip(traj[0], traj[0][1:], strict=False) if e == e2 and b1 != b2
    }
    last = traj[0][-1][1]
    assert changed_in - {last}, "no batch change inside a complete epoch"
    _exactly_once(seen, 4096, set(range(last)))
    # SGD: AdaScale's gain r = S E(M) on the LR it started with, S = M / M0
    assert lrs, "no decision on a settled interval"
    for lr, m, eff in lrs:
        assert lr == pytest.approx(0.01 * m / 16 * eff, rel=1e-9)
    # the last step's end may decide once more, after the loop body's last look at the batch
    end = cluster.pull("end")[0]
    batches.append(end[0])
    store, rid = cluster.session.store, cluster.session.run_id
    rows = store.metrics(rid, "global_batch")
    assert rows and rows[-1]["value"] == batches[-1] and rows[-1]["rank"] is None
    assert any("global batch" in e["message"] for e in store.events(rid, kind="batch"))
    # %dtrain gns says why; the report lists the trajectory; the dashboard draws it
    capsys.readouterr()
    measure.gns_advice(cluster, quiet=False)
    said = capsys.readouterr().out
    assert f"adaptive batch: global batch {batches[-1]} = " in said
    # the last decision weighed a switch, or (B_simple far above the batch, its interval wide) kept it
    kept = f"no settled GNS interval at the last decision: the batch stays at {batches[-1]}"
    assert "a switch needs more than 5%" in said or kept in said, said
    rows = store.metrics(rid, rank="all")
    data = {"columns": COLUMNS, "rows": [[r[c] for c in COLUMNS] for r in rows]}
    trajectory = helpers.adaptive_trajectory(data)
    changes = [b for i, b in enumerate(batches) if i == 0 or b != batches[i - 1]]
    assert [int(line.split("global batch ")[1].split()[0]) for line in trajectory] == changes
    shown = data_routes.adaptive_batch(store, rid, n=len(changes))  # the sidebar's, by the same rule
    assert shown is not None and [b for _, b in shown["changes"]] == changes
    assert shown["global_batch"] == batches[-1] and shown["n_changes"] == len(changes)
    traces = plots.AdaptiveSeries().add(rows).traces()
    assert [t.name for t in traces][:2] == ["global_batch", "lr_factor"] and traces[0].y[-1] == batches[-1]

    # a new cell resumes: the same batch, accumulation and sampler place; the epoch completes once
    cluster.run(
        _cell(1.0, 1100, 0, True).replace("seen, traj, lrs = {}, [], []", "traj, lrs = [], []"), quiet=True
    )
    first = cluster.pull("first")[0]
    assert (first[0], first[2], first[3]) == (end[0], end[1], end[3] + first[1] * 2), (first, end)
    seen = cluster.pull("seen")
    _exactly_once(seen, 4096, {end[2]})
    assert len(seen[0][end[2]]) * 2 == 4096


def test_without_label_noise_the_noise_scale_and_the_batch_stay_flat(cluster) -> None:
    """The same workload and step times, no label noise: B_simple stays at D + 1 = 5 as the model
    converges, and goodput keeps the batch at most 32 (one move at most, where the noisy run makes
    two or more)."""
    cluster.configure(CONFIG)
    cluster.run(_cell(0.0, 500, 0, False), quiet=True)
    traj = cluster.pull("traj")[0]
    noise = [gns for *_, gns in traj if gns is not None]
    assert noise and all(3.5 <= g <= 7.0 for g in noise[len(noise) // 4 :]), (min(noise), max(noise))
    assert max(b for _, _, b, _ in traj) <= 32, _grows_with(traj)


HAND = """
loader = ctx.loader(data, adaptive=True, max_global_batch=128, decide_every=20, lr_rule="linear")
steps = 0
while ctx.epoch < 2:
    epoch = ctx.epoch
    for x, y, i in loader:
        seen.setdefault(epoch, []).extend(i.tolist())
        model.zero_grad(); loss_of(x, y).backward(); ctx.step(opt); WORK(x)
        steps += 1
        traj.append((steps, opt.param_groups[0]["lr"], ctx.global_batch_size, len(x)))
"""


def test_a_hand_loop_decides_in_ctx_step_with_the_linear_rule(cluster) -> None:
    cluster.configure(CONFIG)
    cluster.run(DATA.replace("SIGMA", "1.0") + HAND, quiet=True)
    traj, seen = cluster.pull("traj"), cluster.pull("seen")
    _exactly_once(seen, 4096, {0, 1})
    assert traj[0] == traj[1]
    assert traj[0][-1][2] > 16, traj[0][-1]
    for _, lr, m, _ in traj[0]:  # linear: M / M0 on the LR it started with
        assert lr == pytest.approx(0.01 * m / 16, rel=1e-9)
    assert sum(n for *_, n in traj[0]) * 2 == 2 * 4096
