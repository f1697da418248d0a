"""Runs told apart (issue 45) on the shared ranks: a config's name labels the run it was loaded for,
not the next model's; ``%%dtrain --name`` names a cell's run; the list says what changed (the lr
``ctx.optimizer`` made)."""

from __future__ import annotations

from typing import Any

from dtwork.cli import runs_table

DATA = """
import torch, torch.nn as nn, torch.nn.functional as F
g = torch.Generator().manual_seed(3)
data = torch.utils.data.TensorDataset(torch.randn(256, 4, generator=g), torch.randn(256, 1, generator=g))
"""

TRAIN = """
net = ctx.wrap(nn.Linear(4, 1)); opt = ctx.optimizer(net.parameters(), lr={lr})
loader = ctx.loader(data)
for step, (x, y) in ctx.steps(loader, max_steps=3):
    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt); ctx.log(loss=loss)
"""


def test_a_configs_name_labels_its_run_and_the_list_says_what_changed(fresh_run: Any) -> None:
    c = fresh_run
    c.configure({"name": "sweep", "hyperparameters": {"hidden": 8}, "global_batch_size": 16})
    c.run(DATA, quiet=True)
    c.run(TRAIN.format(lr=0.05), quiet=True)
    named = c.session.run_id
    c.run(TRAIN.format(lr=0.2), quiet=True)  # a new model: a new run, with no name of its own
    later = c.session.run_id
    store = c.session.store
    assert later == named + 1
    assert store.get_run(named)["name"] == "sweep" and store.get_run(later)["name"] is None
    lines = runs_table(c.session.store_file).splitlines()
    row = {line.split()[0]: line for line in lines[2:]}
    assert "lr=0.05" in row[str(named)].split() and "lr=0.2" in row[str(later)].split()
    # (the shared store's other runs differ in more settings, so the column lists those too)
    assert c.name_run("wide") == later and store.get_run(later)["name"] == "wide"  # a name of its own


def test_dtrain_name_names_the_run_its_cell_trained_in(fresh_run: Any, ip: Any) -> None:
    c = fresh_run
    c.configure({"global_batch_size": 16})
    c.run(DATA, quiet=True)
    ip.run_cell_magic("dtrain", "--quiet --name first", TRAIN.format(lr=0.1))
    ip.run_cell_magic("dtrain", "--quiet --name second", TRAIN.format(lr=0.1))  # a new model: its own run
    store, run = c.session.store, c.session.run_id
    assert [store.get_run(r)["name"] for r in (run - 1, run)] == ["first", "second"]
