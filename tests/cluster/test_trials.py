"""Trial helpers on 2 real CPU ranks: accumulation, compression, LR rules, evaluation, resume, store."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from dtwork.store.runs import RunStore

LINEAR = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
g = torch.Generator().manual_seed(3)
X = torch.randn(64, 6, generator=g); Y = X @ torch.randn(6, 1, generator=g) + 0.01 * torch.randn(64, 1, generator=g)
data = torch.utils.data.TensorDataset(X, Y)
"""


def _net() -> tuple[torch.nn.Module, torch.Tensor, torch.Tensor]:
    ns: dict = {}
    exec(LINEAR, ns)
    return ns["net"], ns["X"], ns["Y"]


def test_aggregation_frequency_equals_one_process_with_the_whole_batch(cluster) -> None:
    b, k, steps = 4, 2, 3
    cluster.configure(
        {
            "global_batch_size": 2 * b,
            "optimizations": {"aggregation_frequency": k},
            "lr": 0.05,
            "optimizer": {"type": "sgd", "momentum": 0.0},
        }
    )
    cluster.run(
        LINEAR
        + f"""
model = ctx.wrap(net)
opt = ctx.optimizer(model.parameters())
for step, (x, y) in ctx.steps(ctx.loader(data, shuffle=False), max_steps={steps}):
    ctx.backward(F.mse_loss(model(x), y)); ctx.step(opt)
params = [p.detach().clone() for p in model.module.parameters()]
""",
        quiet=True,
    )
    p0, p1 = cluster.pull("params")
    net, X, Y = _net()
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    big = 2 * k * b
    for s in range(steps):
        loss = F.mse_loss(net(X[s * big : (s + 1) * big]), Y[s * big : (s + 1) * big])
        opt.zero_grad()
        loss.backward()
        opt.step()
    for a, c, r in zip(p0, p1, net.parameters(), strict=True):
        assert torch.equal(a, c)
        assert torch.allclose(a, r.detach(), atol=1e-5)


@pytest.mark.parametrize("compression", ["fp16", "bf16", "powersgd"])
def test_compression_hooks_train(cluster, compression: str) -> None:
    cluster.configure(
        {"global_batch_size": 32, "optimizations": {"gradient_compression": compression}, "lr": 0.05}
    )
    cluster.run(
        LINEAR
        + """
model = ctx.wrap(net)
opt = ctx.optimizer(model.parameters())
losses = []
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=40):
    loss = F.mse_loss(model(x), y); ctx.backward(loss); ctx.step(opt); ctx.log(loss=loss)
    losses.append(loss.item())
""",
        quiet=True,
    )
    losses = cluster.pull("losses")[0]
    assert len(losses) == 40
    assert sum(losses[-5:]) / 5 < 0.8 * sum(losses[:5]) / 5


@pytest.mark.parametrize(
    ("rule", "expected"), [("linear", 0.1 * 64 / 16), ("sqrt", 0.1 * math.sqrt(64 / 16)), ("none", 0.1)]
)
def test_lr_after_warmup_follows_the_scaling_rule(cluster, rule: str, expected: float) -> None:
    cluster.configure(
        {"global_batch_size": 64, "lr": {"base": 0.1, "scaling": rule, "base_batch_size": 16, "warmup": 5}}
    )
    cluster.run(
        LINEAR
        + """
model = ctx.wrap(net)
opt = ctx.optimizer(model.parameters()); sched = ctx.scheduler(opt)
lrs = []
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=8):
    ctx.backward(F.mse_loss(model(x), y)); ctx.step(opt); lrs.append(opt.param_groups[0]["lr"])
""",
        quiet=True,
    )
    lrs = cluster.pull("lrs")[0]
    assert lrs[0] < expected  # warming up
    assert lrs[-1] == pytest.approx(expected, rel=1e-12)


def test_evaluate_equals_one_process_on_an_odd_dataset(cluster) -> None:
    cluster.configure({"global_batch_size": 8})
    cluster.run(
        LINEAR
        + """
model = ctx.wrap(net)
odd = torch.utils.data.TensorDataset(X[:37], Y[:37])
mse = ctx.evaluate(model, odd, lambda out, batch: ((out - batch[1]) ** 2).mean(dim=1))
preds = ctx.evaluate(model, odd)
""",
        quiet=True,
    )
    net, X, Y = _net()
    with torch.no_grad():
        ref = ((net(X[:37]) - Y[:37]) ** 2).mean(dim=1).double().mean().item()  # the one-process metric
        ref_preds = net(X[:37])
    for mse in cluster.pull("mse"):
        assert mse == pytest.approx(
            ref, rel=1e-6
        )  # float32 forward in other batch shapes; a padded duplicate moves it by ~3%
    for preds in cluster.pull("preds"):
        assert preds.shape == (37, 1)
        assert torch.allclose(preds, ref_preds)


RESUMABLE = (
    LINEAR
    + """
model = ctx.wrap(net)
opt = ctx.optimizer(model.parameters())
drop = nn.Dropout(0.2)
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=MAX, resume=RESUME):
    ctx.backward(F.mse_loss(model(drop(x)), y)); ctx.step(opt)
params = [p.detach().clone() for p in model.module.parameters()]
"""
)


def test_checkpoint_and_resume_is_bitwise_equal(cluster, tmp_path) -> None:
    ck = str(tmp_path / "ck")
    base = {"global_batch_size": 8, "lr": 0.05, "checkpoint": {"every": 3, "directory": ck + "-full"}}
    cluster.configure(base)
    cluster.run(RESUMABLE.replace("MAX", "10").replace("RESUME", "False"), quiet=True)
    full = cluster.pull("params")[0]
    cluster.configure({**base, "checkpoint": {"every": 3, "directory": ck}})
    cluster.run(
        RESUMABLE.replace("MAX", "7").replace("RESUME", "False"), quiet=True
    )  # stops after a checkpoint at 6
    cluster.run(RESUMABLE.replace("MAX", "10").replace("RESUME", "True"), quiet=True)
    resumed = cluster.pull("params")[0]
    # this run's folder only (its owner in run.json); the loop's end (7, then 10) checkpoints too
    assert sorted(os.listdir(Path(ck) / f"run-{cluster.session.run_id}")) == [
        "run.json",
        "step-00000007.pt",
        "step-00000009.pt",
        "step-00000010.pt",
    ]
    for a, b in zip(full, resumed, strict=True):
        assert torch.equal(a, b)


def test_log_records_reach_the_store_in_order(cluster) -> None:
    cluster.configure({"global_batch_size": 16})
    cluster.run(
        LINEAR
        + """
model = ctx.wrap(net); opt = ctx.optimizer(model.parameters())
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=12):
    loss = F.mse_loss(model(x), y); ctx.backward(loss); ctx.step(opt); ctx.log(loss=loss, rank_value=ctx.rank)
""",
        quiet=True,
    )
    store = cluster.session.store
    run_id = cluster.session.run_id
    rows = store.metrics(run_id, "rank_value")
    assert [r["step"] for r in rows] == list(range(12))
    assert {r["value"] for r in rows} == {0.5}  # averaged over ranks 0 and 1
    perf = store.metrics(run_id, "samples_per_s", rank="all")
    assert {r["rank"] for r in perf} == {0, 1}
    cells = store.cells(run_id)
    assert cells[-1]["status"] == "ok" and "ctx.steps" in cells[-1]["source"]


def test_fast_steps_share_a_sync_and_still_stop_together_with_every_row(cluster) -> None:
    """Steps far faster than SYNC_SECONDS: one all-reduce carries many steps; a stop asked on
    rank 1 alone, between two syncs, still ends both ranks at the same step, and every step
    keeps its own averaged row."""
    cluster.configure({"global_batch_size": 16})
    cluster.run(
        LINEAR
        + """
from dtwork.runtime.core import control
model = ctx.wrap(net); opt = ctx.optimizer(model.parameters())
last, most = -1, 1
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=100000, max_epochs=1000):
    loss = F.mse_loss(model(x), y); ctx.backward(loss); ctx.step(opt)
    ctx.log(sync_value=ctx.rank + step)
    if ctx.rank == 1 and step == 150:
        control.request()
    last, most = step, max(most, ctx.loop.sync_every)
""",
        quiet=True,
    )
    last, most = cluster.pull("last"), cluster.pull("most")
    assert last[0] == last[1], f"ranks stopped at different steps: {last}"
    assert 150 < last[0] < 150 + 2 * 64 + 2  # within two syncs of the request
    assert most[0] == most[1] > 1  # batched, and the same on both ranks
    rows = cluster.session.store.metrics(cluster.session.run_id, "sync_value")
    assert [r["step"] for r in rows] == list(range(last[0] + 1))
    assert [r["value"] for r in rows] == [s + 0.5 for s in range(last[0] + 1)]  # (s + s + 1) / 2


def test_logged_numbers_and_tensors_mix_and_average_over_ranks_and_calls(fresh_run) -> None:
    """ctx.log takes numbers and tensors (0-d or one element), even a number on one rank where the
    other logs a tensor; a name logged twice in a step gives the mean of the two."""
    c = fresh_run
    c.run(
        "import torch\n"
        "for step, _ in ctx.steps(range(6), max_steps=6):\n"
        "    v = float(step + ctx.rank)\n"
        "    ctx.log(mix_a=torch.tensor(v) if ctx.rank == 0 else v, mix_b=2.0 * step, mix_c=torch.tensor([float(step)]))\n"
        "    ctx.log(mix_c=float(step + 2))\n",
        quiet=True,
    )
    store, run = c.session.store, c.session.run_id
    for name, expect in (
        ("mix_a", lambda s: s + 0.5),
        ("mix_b", lambda s: 2.0 * s),
        ("mix_c", lambda s: s + 1.0),
    ):
        rows = store.metrics(run, name)
        assert [r["step"] for r in rows] == list(range(6)), name
        assert [r["value"] for r in rows] == [expect(s) for s in range(6)], name


def test_background_cell_and_wait(cluster) -> None:
    cluster.configure(None)
    result = cluster.run(
        "import time\nfor i in range(5):\n    time.sleep(0.2)\ndone = ctx.rank", bg=True, quiet=True
    )
    assert result.status == "running"
    t0 = time.monotonic()
    cluster.session.wait_background()
    assert time.monotonic() - t0 < 10
    assert cluster.pull("done") == [0, 1]


KILLED_KERNEL = """
import sys, time, dtwork
c = dtwork.start(n=2, backend="gloo")
c.session.live = False
c.configure({"global_batch_size": 8})
print(c.session.ensure_run(), flush=True)
c.run('''
import time, torch
for step in range(100000):
    ctx.log(step=step, loss=1.0 / (step + 1))
    time.sleep(0.01)
''', quiet=True)
"""


def test_store_survives_a_killed_kernel(tmp_path) -> None:
    store_path = tmp_path / "runs.sqlite"
    script = tmp_path / "kernel.py"
    script.write_text(KILLED_KERNEL)
    env = {**os.environ, "DTWORK_STORE": str(store_path)}
    proc = subprocess.Popen(
        [sys.executable, str(script)], stdout=subprocess.PIPE, text=True, cwd=tmp_path, env=env
    )
    run_id = int(proc.stdout.readline())  # type: ignore[union-attr]
    deadline = time.monotonic() + 60
    seen = 0
    while time.monotonic() < deadline and seen < 50:
        time.sleep(0.5)
        with RunStore(store_path, readonly=True) as s:
            seen = len(s.metrics(run_id, "loss"))
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    killed_at = time.time()
    with RunStore(store_path, readonly=True) as s:
        rows = s.metrics(run_id, "loss")
    assert len(rows) >= 50
    steps = [r["step"] for r in rows]
    assert steps == list(range(len(steps)))  # nothing missing before the kill
    assert all(r["value"] == pytest.approx(1.0 / (r["step"] + 1)) for r in rows)
    assert killed_at - rows[-1]["time"] < 2.0  # at most about the last second lost
    json.dumps(rows)
