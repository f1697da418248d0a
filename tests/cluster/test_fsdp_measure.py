"""What ctx.wrap measures under strategy='fsdp', on 2 real gloo ranks: the gradient noise scale
(norms taken around the reduce-scatter) and the step-time split (all-gathers and reduce-scatters
counted as communication)."""

from __future__ import annotations

from typing import Any

import pytest

from dtwork.errors import RankFailure
from tests.cluster.test_fsdp import MODEL
from tests.cluster.test_gns import DATA, RESULT, STEPS_LOOP

STEPS = 300


def _gns(cluster: Any, strategy: str) -> tuple[float, list[dict[str, Any]]]:
    cluster.configure({"global_batch_size": 64, "seed": 7, "gns": {"enabled": True}})
    loop = STEPS_LOOP.replace("ctx.wrap(net)", f"ctx.wrap(net, strategy={strategy!r})")
    cluster.run(DATA.replace("SEED", "7") + loop.replace("STEPS", str(STEPS)) + RESULT, quiet=True)
    estimates, measured = cluster.pull("estimate"), cluster.pull("measured")
    assert len(set(estimates)) == 1 and measured == [STEPS, STEPS]  # every step, the same on both ranks
    store, rid = cluster.session.store, cluster.session.run_id
    return estimates[0], store.metrics(rid, "comm_time", rank="all")


def test_fsdp_gns_equals_ddp_gns_and_its_collectives_count_as_communication(fresh_run: Any) -> None:
    fsdp, fsdp_comm = _gns(fresh_run, "fsdp")
    ddp, _ = _gns(fresh_run, "ddp")
    assert fsdp == pytest.approx(ddp, rel=0.05), (fsdp, ddp)
    assert {r["rank"] for r in fsdp_comm} == {0, 1} and all(r["value"] > 0 for r in fsdp_comm)


def test_fsdp_gns_with_accumulation_is_refused_in_one_line(fresh_run: Any) -> None:
    fresh_run.configure({"optimizations": {"aggregation_frequency": 2}})
    with pytest.raises(
        RankFailure, match="not measured under strategy='fsdp' with aggregation_frequency > 1"
    ):
        fresh_run.run(MODEL + "ctx.wrap(net, strategy='fsdp', gns=True)", quiet=True)


WIDE = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
net = nn.Sequential(*[nn.Sequential(nn.Linear(256, 256), nn.Tanh()) for _ in range(4)])
model = ctx.wrap(net, strategy=STRATEGY)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
ctx.register("optimizers", opt)
for step, (x,) in ctx.steps([(torch.randn(8, 256),)] * 2, max_steps=2):
    ctx.backward(model(x).square().mean())
    ctx.step(opt)
held = ctx.memory()
"""


def _held(cluster: Any, strategy: str) -> tuple[list[dict[str, float]], list[dict[str, Any]]]:
    cluster.configure(None)
    cluster.run(WIDE.replace("STRATEGY", repr(strategy)), quiet=True)
    store, rid = cluster.session.store, cluster.session.run_id
    return cluster.pull("held"), store.events(rid, "memory")


def test_fsdp_holds_about_half_the_parameter_and_optimizer_memory_of_ddp(fresh_run: Any) -> None:
    ddp, _ = _held(fresh_run, "ddp")
    fsdp, events = _held(fresh_run, "fsdp")
    params = 4 * (256 * 256 + 256) * 4  # fp32 bytes of the whole model
    assert [d["param_bytes"] for d in ddp] == [params, params]
    assert [d["optimizer_bytes"] for d in ddp] == [2 * params + 8 * 4] * 2  # AdamW: two moments, steps
    for d, f in zip(ddp, fsdp, strict=True):
        ratio = (f["param_bytes"] + f["optimizer_bytes"]) / (d["param_bytes"] + d["optimizer_bytes"])
        assert ratio <= 0.55, ratio
    assert sum(f["param_bytes"] for f in fsdp) == params  # the shards add up to the model
    assert sorted(e["data"]["rank"] for e in events) == [0, 1]  # recorded at the first step, per rank
    assert all(e["data"]["values"]["param_bytes"] == params / 2 for e in events)
    assert f"holds parameters {params / 2 / 1024:.1f} KiB, gradients" in events[0]["message"]
