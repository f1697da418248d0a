"""The gradient noise scale measured in real 2-rank DDP runs, against the truth in closed form."""

from __future__ import annotations

import pytest
import torch

from dtwork import commands as measure

DATA = """
import torch, torch.nn as nn, torch.nn.functional as F
g = torch.Generator().manual_seed(SEED)
N, D = 4096, 8
X = torch.randn(N, D, generator=g)
w_true = torch.randn(D, 1, generator=g)
Y = X @ w_true + 0.5 * torch.randn(N, 1, generator=g)
data = torch.utils.data.TensorDataset(X, Y)
torch.manual_seed(0)
net = nn.Linear(D, 1)
with torch.no_grad():
    net.weight.copy_((w_true + 0.3).T); net.bias.fill_(0.2)
"""

STEPS_LOOP = """
model = ctx.wrap(net)
opt = torch.optim.SGD(model.parameters(), lr=0.0)  # parameters held fixed: one true B_simple
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=STEPS):
    ctx.backward(F.mse_loss(model(x), y)); ctx.step(opt)
"""

HAND_LOOP = """
model = ctx.wrap(net, gns=True)
opt = torch.optim.SGD(model.parameters(), lr=0.0)
loader = ctx.loader(data)
step = epoch = 0
while step < STEPS:
    loader.sampler.set_epoch(epoch); epoch += 1
    for x, y in loader:
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
        step += 1
        if step == STEPS:
            break
"""

RESULT = """
est = ctx.gns_state
estimate, decay, measured = ctx.gns, est.ema_decay, est.steps
interval = (est.interval.lo, est.interval.hi) if est.interval is not None else None
settled = est.settled
"""


def _truth(seed: int) -> float:
    """B_simple = tr(Sigma) / |G|^2 from a full per-example pass at the fixed parameters."""
    ns: dict = {}
    exec(DATA.replace("SEED", str(seed)), ns)
    X, Y, net = ns["X"], ns["Y"], ns["net"]
    with torch.no_grad():
        r = net(X) - Y  # per-example loss (f(x) - y)^2 has gradient 2 r [x, 1]
        per_example = torch.cat([2 * r * X, 2 * r], dim=1).double()
    G = per_example.mean(0)
    trace_sigma = ((per_example - G) ** 2).sum(1).mean()
    return float(trace_sigma / G.pow(2).sum())


def _run(
    cluster, loop: str, seed: int, steps: int, gns: dict | None = None, keep: str = "", **config: object
) -> dict:
    """Train ``steps`` steps on the closed-form problem with the parameters held fixed; return
    rank 0's estimate (and whether rank 1 agrees) and the run's stored rows."""
    cluster.configure(
        {"global_batch_size": 64, "seed": seed, "gns": {"enabled": True, **(gns or {})}, **config}
    )
    code = keep + DATA.replace("SEED", str(seed)) + loop.replace("STEPS", str(steps)) + RESULT
    cluster.run(code, quiet=True)
    out = {name: cluster.pull(name)[0] for name in ("estimate", "decay", "measured", "interval", "settled")}
    out["agree"] = len(set(cluster.pull("estimate"))) == 1
    store, rid = cluster.session.store, cluster.session.run_id
    out["rows"] = {n: store.metrics(rid, n) for n in ("b_simple", "b_simple_lo", "settled")}
    out["rows"]["samples_per_s"] = store.metrics(rid, "samples_per_s", rank="all")
    return out


def test_defaults_in_ctx_steps_give_b_simple_within_5_percent_with_an_interval(cluster, capsys) -> None:
    got, truth = _run(cluster, STEPS_LOOP, seed=7, steps=3000), _truth(7)
    assert got["agree"] and got["measured"] == 3000  # every step measured by default
    assert got["estimate"] == pytest.approx(truth, rel=0.05), (got["estimate"], truth)
    lo, hi = got["interval"]
    assert lo <= truth <= hi and got["settled"], (lo, hi, truth)
    rows = got["rows"]
    # the estimate goes to the store at most every 0.1 s, and the loop's last one always
    assert len(rows["b_simple"]) >= 2 and rows["b_simple"][-1]["value"] == pytest.approx(got["estimate"])
    assert rows["b_simple"][-1]["step"] == 2999
    assert rows["b_simple_lo"][-1]["value"] == pytest.approx(lo) and rows["settled"][-1]["value"] == 1.0
    assert rows["settled"][0]["value"] == 0.0  # "not yet settled" at first
    capsys.readouterr()
    measure.gns_advice(cluster, quiet=False)
    assert f"B_simple ~ {got['estimate']:.1f} (95% interval {lo:.1f}-{hi:.1f}) at " in capsys.readouterr().out


def test_a_hand_loop_gets_the_estimate_and_throughput_and_a_new_wrap_starts_over(cluster, capsys) -> None:
    got, truth = _run(cluster, HAND_LOOP, seed=11, steps=3000), _truth(11)
    assert got["agree"] and got["measured"] >= 3000 - 64  # the last few steps wait for the next sum
    assert got["estimate"] == pytest.approx(truth, rel=0.05), (got["estimate"], truth)
    lo, hi = got["interval"]
    assert lo <= truth <= hi and got["settled"], (lo, hi, truth)
    rows = got["rows"]
    assert rows["b_simple"] and rows["b_simple"][-1]["value"] == pytest.approx(got["estimate"])
    perf = rows["samples_per_s"]
    assert {r["rank"] for r in perf} == {0, 1} and all(r["value"] > 0 for r in perf)
    # the old model stays alive; a new wrap in ctx.steps on another problem starts a new estimate
    again = _run(cluster, STEPS_LOOP, seed=12, steps=200, keep="old_model = model\n")
    assert again["measured"] == 200 and again["estimate"] != got["estimate"]
    assert again["interval"] is None and not again["settled"]
    capsys.readouterr()
    measure.gns_advice(cluster, quiet=False)
    assert "not yet settled: train more steps" in capsys.readouterr().out


def test_gns_every_nth_step_samples_those_steps_and_keeps_the_span(cluster) -> None:
    """gns.every: 4 measures steps 0, 4, 8, ...; with decay^4 per sample the estimate stays close
    to the truth (looser: a quarter of the samples)."""
    got = _run(cluster, STEPS_LOOP, seed=7, steps=1500, gns={"every": 4})
    assert got["decay"] == pytest.approx(0.999**4) and got["measured"] == 375
    assert got["estimate"] == pytest.approx(_truth(7), rel=0.10), (got["estimate"], _truth(7))
    rows = got["rows"]["b_simple"]
    assert rows and all(r["step"] % 4 == 0 for r in rows) and rows[-1]["step"] == 1496


def test_accumulation_micro_batches_are_the_small_batches_at_world_size_two(cluster) -> None:
    """k = 2 on 2 ranks: B_small is one micro-batch of 32, B_big the step's 128 examples."""
    got = _run(cluster, STEPS_LOOP, seed=7, steps=2000, optimizations={"aggregation_frequency": 2})
    assert got["measured"] == 2000
    assert got["estimate"] == pytest.approx(_truth(7), rel=0.05), (got["estimate"], _truth(7))


TRAIN = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))
g = torch.Generator().manual_seed(1)
X = torch.randn(256, 8, generator=g); Y = X[:, :1] * 2 + 0.1 * torch.randn(256, 1, generator=g)
model = ctx.wrap(net, gns=GNS)
opt = ctx.optimizer(model.parameters())
for step, (x, y) in ctx.steps(ctx.loader(torch.utils.data.TensorDataset(X, Y)), max_steps=30):
    ctx.backward(F.mse_loss(model(x), y)); ctx.step(opt)
params = [p.detach().clone() for p in model.module.parameters()]
"""


@pytest.mark.parametrize("accumulation", [1, 2])
def test_gns_hook_measures_without_changing_training(cluster, accumulation: int) -> None:
    cluster.configure(
        {"global_batch_size": 16, "lr": 0.05, "optimizations": {"aggregation_frequency": accumulation}}
    )
    cluster.run(TRAIN.replace("GNS", "False"), quiet=True)
    without = cluster.pull("params")[0]
    cluster.run(TRAIN.replace("GNS", "True") + "\nestimate = ctx.gns", quiet=True)
    with_gns = cluster.pull("params")[0]
    assert all(torch.equal(a, b) for a, b in zip(without, with_gns, strict=True))
    assert cluster.pull("estimate")[0] is not None
    # the micro-batches are the small batches at every world size: B_small = 8, B_big = 8 * k * 2
    store, rid = cluster.session.store, cluster.session.run_id
    assert store.metrics(rid, "b_small")[-1]["value"] == 8.0
    assert store.metrics(rid, "b_big")[-1]["value"] == 16.0 * accumulation
