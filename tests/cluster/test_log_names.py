"""Ranks that ``ctx.log`` different names fail at once on every rank, naming each rank's names."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from dtwork.errors import RankFailure

SETUP = """
import torch, torch.nn as nn, torch.nn.functional as F
net = ctx.wrap(nn.Linear(4, 1))
opt = ctx.optimizer(net.parameters())
g = torch.Generator().manual_seed(3)
data = torch.utils.data.TensorDataset(torch.randn(64, 4, generator=g), torch.randn(64, 1, generator=g))
"""

STEPS = """
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=4):
    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt)
    {log}
"""

HAND = """
for x, y in ctx.loader(data):
    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt)
    {log}
    break
"""

# rank 0 logs one name more; equal counts with different names
EXTRA = 'ctx.log(loss=loss, **({"acc": 1.0} if ctx.rank == 0 else {}))'
SWAPPED = 'ctx.log(**{("acc" if ctx.rank == 0 else "err"): 1.0}, loss=loss)'
BOUND = 60.0  # a hang would run into the group's timeout; the failure comes within a few seconds


def _fails_fast(cluster: object, source: str) -> str:
    """The cell's failure, waited for at most BOUND seconds (a hang fails the test, not the suite)."""
    pool = ThreadPoolExecutor(1)
    done = pool.submit(cluster.run, source, quiet=True)  # type: ignore[attr-defined]
    try:
        with pytest.raises(RankFailure) as failed:
            done.result(timeout=BOUND)
    finally:
        pool.shutdown(wait=False)
    return str(failed.value)


@pytest.mark.parametrize("loop", [STEPS, HAND], ids=["ctx.steps", "hand loop"])
@pytest.mark.parametrize(
    ("log", "said"),
    [
        (EXTRA, r"rank 0: acc, loss; rank 1: loss\)"),
        (SWAPPED, r"rank 0: acc, loss; rank 1: err, loss\)"),
    ],
    ids=["one name more", "other names"],
)
def test_different_names_fail_on_every_rank_and_the_cluster_stays_usable(
    fresh_run: object, loop: str, log: str, said: str
) -> None:
    c = fresh_run
    c.configure({"global_batch_size": 8})  # type: ignore[attr-defined]
    c.run(SETUP, quiet=True)  # type: ignore[attr-defined]
    text = _fails_fast(c, loop.format(log=log))
    assert re.search(r"ctx.log names differ across ranks at step \d+ \(" + said, text), text
    assert "log the same names on every rank" in text
    assert re.search(r"rank 1: DtworkError: ctx.log names differ", text), text  # no rank left waiting
    # a new run at step 0 (the same model would go on from where the failed loop left the run's steps)
    again = STEPS.format(log="ctx.log(loss=loss)").replace("max_steps=4", "max_steps=4, new_run=True")
    c.run(again, quiet=True)  # type: ignore[attr-defined]
    losses = c.pull("step")  # type: ignore[attr-defined]
    assert losses == [3, 3]


def test_same_names_average_and_keep_their_labels(fresh_run: object) -> None:
    c = fresh_run
    c.configure({"global_batch_size": 8})  # type: ignore[attr-defined]
    c.run(SETUP, quiet=True)  # type: ignore[attr-defined]
    c.run(STEPS.format(log="ctx.log(b=float(ctx.rank), a=10.0 + ctx.rank)"), quiet=True)  # type: ignore[attr-defined]
    store, run = c.session.store, c.session.run_id  # type: ignore[attr-defined]
    by_name = {(r["name"], r["step"]): r["value"] for r in store.metrics(run)}
    assert by_name[("a", 3)] == pytest.approx(10.5)
    assert by_name[("b", 3)] == pytest.approx(0.5)
