"""Each common mistake fails at once with one line that says what to do (no hang, no silent drift)."""

from __future__ import annotations

import re
import time

import pytest

from dtwork.errors import RankFailure

SETUP = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
net = ctx.wrap(nn.Linear(4, 1))
opt = ctx.optimizer(net.parameters())
g = torch.Generator().manual_seed(3)
data = torch.utils.data.TensorDataset(torch.randn(256, 4, generator=g), torch.randn(256, 1, generator=g))
"""


def _fails(cluster: object, source: str, pattern: str, **kw: object) -> str:
    with pytest.raises(RankFailure) as failed:
        cluster.run(source, quiet=True, **kw)  # type: ignore[attr-defined]
    text = str(failed.value)
    assert re.search(pattern, text), text
    return text


def test_a_plain_step_inside_an_accumulating_loop_is_refused_at_its_first_micro_batch(fresh_run) -> None:
    c = fresh_run
    c.configure({"global_batch_size": 8, "optimizations": {"aggregation_frequency": 2}})
    c.run(SETUP, quiet=True)
    _fails(
        c,
        "for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=4):\n"
        "    loss = F.mse_loss(net(x), y); loss.backward(); opt.step(); opt.zero_grad()\n",
        r"optimizer step at micro-batch 1 of 2 \(aggregation_frequency 2\): inside ctx.steps call "
        r"ctx.backward\(loss\) and ctx.step\(opt\)",
    )
    c.run(  # the right way still trains on the same (rebuilt) group, replicas identical
        "for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=4):\n"
        "    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt)\n",
        quiet=True,
    )


def test_replicas_that_differ_are_named_at_the_end_of_the_loop(fresh_run) -> None:
    c = fresh_run
    c.configure({"global_batch_size": 8})
    c.run(SETUP + "with torch.no_grad():\n    net.module.bias.add_(float(ctx.rank))\n", quiet=True)
    _fails(
        c,
        "for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=3):\n"
        "    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt)\n",
        r"the model replicas differ across ranks after step 3 .*ctx.backward\(loss\) and ctx.step\(opt\)",
    )


def test_replicas_checked_every_step_name_the_first_step_they_differ_at(fresh_run) -> None:
    c = fresh_run
    c.configure({"global_batch_size": 8})
    c.run(SETUP, quiet=True)
    _fails(
        c,
        "for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=6, check_replicas_every=1):\n"
        "    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt)\n"
        "    if step == 2:\n"
        "        with torch.no_grad():\n"
        "            net.module.bias.add_(float(ctx.rank))\n",
        r"the model replicas differ across ranks after step 3 ",
    )


def test_a_collective_in_a_cell_on_some_ranks_is_refused_before_it_starts(fresh_run) -> None:
    c = fresh_run
    c.run("import torch.nn as nn", quiet=True)
    text = _fails(
        c,
        "other = ctx.wrap(nn.Linear(2, 2))",
        r"ctx.wrap needs every rank \(a collective\), but this cell runs on rank\(s\) 0 of 2: "
        r"run it on every rank",
        ranks=[0],
    )
    assert "rank 1" not in text
    assert c.run(lambda: __import__("dtwork").runtime.current().cell_ranks) == [[0, 1], [0, 1]]
    c.run("other = ctx.wrap(nn.Linear(2, 2))", quiet=True)  # on every rank: fine


def test_a_collective_that_one_rank_skips_fails_in_seconds_not_the_group_timeout(fresh_run) -> None:
    c = fresh_run
    c.run(
        "import torch.nn as nn\nimport dtwork.runtime.context as context\nwait, context.RANKS_ARRIVE_SECONDS = context.RANKS_ARRIVE_SECONDS, 3",
        quiet=True,
    )
    t0 = time.monotonic()
    _fails(
        c,
        "if ctx.rank == 0:\n    other = ctx.wrap(nn.Linear(2, 2))",
        r"ctx.wrap needs every rank, but not all reached it in 3 s .*Ranks 1 failed to pass monitoredBarrier.*"
        r"call it on every rank, not under `if ctx.rank == ...`",
    )
    assert time.monotonic() - t0 < 30
    c.run("other = ctx.wrap(nn.Linear(2, 2))\ncontext.RANKS_ARRIVE_SECONDS = wait", quiet=True)


def test_wrapping_a_wrapped_model_is_refused(fresh_run) -> None:
    c = fresh_run
    c.run(SETUP, quiet=True)
    _fails(c, "ctx.wrap(net)", r"already wrapped \(DistributedDataParallel or FSDP\): use it as it is")
