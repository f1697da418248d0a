"""The adaptive batch on three workloads of different shapes (issue 46), each beside a control.

Each workload regresses a teacher's output from its inputs with SGD, the student starting with a
zero output layer: a linear model of 16 features (the issue's linear regression), a small convnet
and a one-layer transformer; the student's other layers are the teacher's, so that without label
noise the task is exactly learnable. With label noise (SIGMA = 1, lr 0.05) the gradient's mean shrinks
as the student nears the teacher while its noise stays, so B_simple grows far past the batch; the
control (SIGMA = 0, lr 0.01: its gradient shrinks slowly enough for the GNS windows to follow it)
keeps B_simple flat near the features' dimension, about half the batch. Every micro-batch also
sleeps (``WORK``: 1 ms fixed and 0.25 ms a sample), so that a step is mostly per-sample compute.

What goodput rightly does with each, and the tests rest on: at a flat B_simple of about half the
batch and a step that is mostly per-sample, a larger batch loses goodput (at 64: about 0.67 of 32's)
and a smaller one gains (about 12 is best). A control without a floor rightly shrinks its batch,
after which the fit has two batch sizes and may move on (a full suite run saw 32 -> 18 -> 64): that
is goodput at work, not a control. So the control sets the floor a user who only wants growth sets
(``min_per_slot_batch=16``, its start) and must keep its batch. Until a second batch size is measured
the throughput fit splits the step's compute evenly into fixed and per-sample time, which predicts
at most 4/3 the throughput at twice the batch, so the first move up needs a GNS lower end of about
2.7x the batch: the linear workload's reaches it after about 200 steps, hence STEPS.
"""

from __future__ import annotations

import pytest

CONFIG = {"global_batch_size": 32, "seed": 3, "gns": {"enabled": True, "ema_decay": 0.99}}
STEPS = 400  # at the starting batch; decisions from the GNS interval's first (~100 steps) on

LINEAR = """
N, D = 8192, 16
X = torch.randn(N, D, generator=g)
Y = X @ torch.randn(D, 1, generator=g) + SIGMA * torch.randn(N, 1, generator=g)
net = nn.Linear(D, 1, bias=False)
head = net
"""

CONVNET = """
N = 8192
X = torch.randn(N, 1, 4, 4, generator=g)
net = nn.Sequential(nn.Conv2d(1, 2, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(32, 1))
with torch.no_grad():
    Y = net(X) + SIGMA * torch.randn(N, 1, generator=g)
head = net[-1]
"""

TRANSFORMER = """
N, T, E = 8192, 8, 16
X = torch.randn(N, T, E, generator=g)
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = nn.TransformerEncoderLayer(E, 2, 32, dropout=0.0, batch_first=True)
        self.head = nn.Linear(E, 1)
    def forward(self, x):
        return self.head(self.block(x).mean(1))
net = Net()
with torch.no_grad():
    Y = net(X) + SIGMA * torch.randn(N, 1, generator=g)
head = net.head
"""

# the student: the teacher with its output layer at zero; every step's batch and B_simple lower end
LOOP = """
with torch.no_grad():
    for p in head.parameters():
        p.zero_()
model = ctx.wrap(net)
opt = torch.optim.SGD(model.parameters(), lr=LR)
loader = ctx.loader(torch.utils.data.TensorDataset(X, Y), adaptive=True)
traj = []
for step, (x, y) in ctx.steps(loader, adaptive=True, max_global_batch=256, decide_every=20, max_steps=STEPS,
                              min_per_slot_batch=FLOOR):
    ctx.backward(0.5 * (model(x) - y).pow(2).mean()); ctx.step(opt)
    time.sleep(0.001 + 0.00025 * len(x))  # WORK: a step's compute, fixed and per sample
    gi = ctx.state.gns_state.decision_interval
    traj.append((step, ctx.global_batch_size, None if gi is None else gi.lo))
"""

WORKLOADS = {"linear": LINEAR, "convnet": CONVNET, "transformer": TRANSFORMER}


def _run(
    cluster: object, workload: str, sigma: float, lr: float, floor: int = 1
) -> list[tuple[int, int, float | None]]:
    head = "import torch, torch.nn as nn, time\ntorch.manual_seed(3)\ng = torch.Generator().manual_seed(3)\n"
    loop = LOOP.replace("STEPS", str(STEPS)).replace("LR", str(lr)).replace("FLOOR", str(floor))
    source = head + WORKLOADS[workload].replace("SIGMA", str(sigma)) + loop
    cluster.configure(CONFIG)  # type: ignore[attr-defined]
    cluster.run(source, quiet=True)  # type: ignore[attr-defined]
    traj: list[tuple[int, int, float | None]] = cluster.pull("traj")[0]  # type: ignore[attr-defined]
    other = cluster.pull("traj")[1]  # type: ignore[attr-defined]
    assert [b for _, b, _ in traj] == [b for _, b, _ in other]  # both ranks ran the same batches
    return traj


@pytest.mark.parametrize("workload", list(WORKLOADS))
def test_the_batch_grows_with_the_noise_scale_and_stays_with_a_flat_one(cluster, workload: str) -> None:
    flat = _run(cluster, workload, 0.0, 0.01, floor=16)  # growth only: 16 a rank, the start
    flat_lows = [lo for *_, lo in flat if lo is not None]
    assert flat_lows, "the control never had a GNS interval to decide on"
    assert max(flat_lows) <= 32, (workload, min(flat_lows), max(flat_lows))  # flat, below the batch
    assert {b for _, b, _ in flat} == {32}, (workload, sorted({b for _, b, _ in flat}))

    noisy = _run(cluster, workload, 1.0, 0.05)
    batches = [b for _, b, _ in noisy]
    lows = [lo for *_, lo in noisy if lo is not None]
    assert batches[0] == 32 and max(batches) >= 48, (workload, sorted(set(batches)), lows[::20])
    first = next(i for i, b in enumerate(batches) if b != 32)
    # the first move is up, on a GNS lower end above all the control's (which kept its batch)
    assert batches[first] > 32 and (noisy[first][2] or 0) > max(flat_lows), (noisy[first], max(flat_lows))
