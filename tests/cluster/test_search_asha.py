"""An adaptive_asha search on the warm cluster (issue 48, item 2): the trials with a learning rate too
small to learn stop at the first rung, the best trial is promoted and trains on to max_length from
where its first rung ended (its checkpoint), to the same weights as one run of the whole length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

CELL = """
import torch, torch.nn as nn, torch.nn.functional as F
g = torch.Generator().manual_seed(5)
x_all = torch.randn(256, 4, generator=g)
data = torch.utils.data.TensorDataset(x_all, x_all @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))
torch.manual_seed(ctx.hparams["init"])
net = ctx.wrap(nn.Linear(4, 1))
opt = torch.optim.SGD(net.parameters(), lr=ctx.hparams["lr"])
for step, (x, y) in ctx.steps(ctx.loader(data)):  # as long as the searcher's rung says
    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt); ctx.log(loss=loss)
with torch.no_grad():
    ctx.log(val_loss=float(F.mse_loss(net(x_all), data.tensors[1])))
params = [p.detach().clone() for p in net.parameters()]
"""

# Seed 1 draws lr 1e-4, 1e-4, 0.1, 0.1 for the four trials; two rungs: 4 and 16 batches.
SEARCH = """
name: asha
global_batch_size: 32
hyperparameters:
  lr: {{type: categorical, vals: [0.0001, 0.1]}}
  init: {{type: int, minval: 0, maxval: 1000}}
searcher:
  name: adaptive_asha
  metric: val_loss
  smaller_is_better: true
  time_metric: batches
  max_time: 16
  max_trials: 4
  mode: aggressive
  max_rungs: 2
reproducibility: {{experiment_seed: 1}}
checkpoint: {{directory: {folder}}}
"""


def test_asha_stops_the_worse_trials_at_the_first_rung_and_resumes_the_best(
    fresh_run: Any, tmp_path: Path
) -> None:
    import dtwork

    c = fresh_run
    path = tmp_path / "asha.yaml"
    path.write_text(SEARCH.format(folder=tmp_path / "checkpoints"))
    result = dtwork.search(path, CELL, quiet=True)
    trials = result.trials
    assert [t.hparams["lr"] for t in trials] == [0.0001, 0.0001, 0.1, 0.1]
    best = result.best
    assert best is not None and best.hparams["lr"] == 0.1
    assert (best.status, best.rung, len(best.runs)) == ("completed", 1, 2)
    others = [t for t in trials if t is not best]
    assert [(t.status, t.rung, len(t.runs)) for t in others] == [("stopped", 0, 1)] * 3
    store = c.session.store
    first, top = best.runs
    # the rung-0 run trained 4 batches; the promotion went on from its checkpoint to max_length (16)
    assert [r["step"] for r in store.metrics(first, "val_loss", rank="all")][-1] == 3
    assert [r["step"] for r in store.metrics(top, "val_loss", rank="all")][-1] == 15
    assert sorted({r["step"] for r in store.metrics(top, "loss", rank="all")}) == list(range(4, 16))
    assert store.segments(top)[0]["first_step"] == 4
    assert all(store.metrics(t.run_id, "val_loss", rank="all")[-1]["step"] == 3 for t in others)
    assert best.metric is not None and best.metric < min(t.metric or 0.0 for t in others)
    table = result.table()
    assert f"trial {best.number} (run {top}, completed, to 16 batches" in table
    assert table.count("stopped, to 4 batches") == 3
    # the promoted trial's weights equal one uninterrupted run of 16 batches with its hyperparameters
    c.run("searched = params", quiet=True)
    c.configure(result.search.configs[best.number - 1])
    c.run(CELL, quiet=True)
    c.run("assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(searched, params))", quiet=True)
