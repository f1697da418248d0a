"""A grid search on the warm cluster (issue 48, item 2, trials one after another on the whole
cluster): each trial a run with its hyperparameters, a failing trial costs only itself, the metric
read from the store, and a trial's model equal to a standalone run with the same hyperparameters."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

CELL = """
import torch, torch.nn as nn, torch.nn.functional as F
if ctx.hparams["mode"] == "fail":
    raise ValueError("this trial fails on purpose")
torch.manual_seed(0)
g = torch.Generator().manual_seed(5)
data = torch.utils.data.TensorDataset(torch.randn(256, 4, generator=g), torch.randn(256, 1, generator=g))
net = ctx.wrap(nn.Linear(4, 1))
opt = torch.optim.SGD(net.parameters(), lr=ctx.hparams["lr"])
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=8):
    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt)
ctx.log(val_loss=float(loss))
params = [p.detach().clone() for p in net.parameters()]
"""

SEARCH = """
name: tiny
global_batch_size: 32
hyperparameters:
  lr: {type: categorical, vals: [0.01, 0.1]}
  mode: {type: categorical, vals: [ok, fail]}
searcher: {name: grid, metric: val_loss, smaller_is_better: true}
"""


def test_a_grid_runs_each_trial_as_a_run_and_a_failing_trial_costs_only_itself(
    fresh_run: Any, tmp_path: Path, capsys: Any
) -> None:
    import dtwork
    from dtwork.store import searches

    c = fresh_run
    path = tmp_path / "tiny.yaml"
    path.write_text(SEARCH)
    result = dtwork.search(path, CELL, quiet=True)
    trials = result.trials
    assert [(t.hparams["lr"], t.hparams["mode"]) for t in trials] == [
        (0.01, "ok"),
        (0.01, "fail"),
        (0.1, "ok"),
        (0.1, "fail"),
    ]
    assert [t.status for t in trials] == ["completed", "failed", "completed", "failed"]
    assert all("fails on purpose" in (t.error or "") for t in trials[1::2])
    assert len({t.run_id for t in trials}) == 4 and None not in {t.run_id for t in trials}
    store = c.session.store
    for t in trials:
        config = yaml.safe_load(store.get_run(t.run_id)["config_yaml"])
        assert config["hyperparameters"] == t.hparams  # constants, as ctx.hparams gave them
        events = [e for e in store.events(t.run_id) if e["kind"] == "search"]
        assert len(events) == 1 and f"trial {t.number}/4 of the grid search tiny.yaml" in events[0]["message"]
    for t in trials[::2]:
        logged = store.metrics(t.run_id, "val_loss", rank="all")
        assert t.metric is not None and t.metric == logged[-1]["value"]
    assert [t.metric for t in trials[1::2]] == [None, None]
    best = min(trials[::2], key=lambda t: t.metric)
    assert result.best is best
    assert c.config.global_batch_size is None and c.config.hyperparameters == {}  # its own config back
    # the search's record: its trials point to their runs, with what the result says of them
    record = searches.get(store.db, result.search_id)
    tally = (record["label"], record["status"], record["trials"], record["done"], record["failed"])
    assert tally == ("tiny.yaml", "completed", 4, 2, 2)
    assert record["best"] == best.metric and record["cluster_id"] == c.cluster_id and record["code"] == CELL
    assert yaml.safe_load(record["config_yaml"]) == yaml.safe_load(SEARCH)
    rows = searches.trials(store.db, result.search_id)
    assert [(r["number"], r["run_id"], r["status"], r["metric"], r["hparams"]) for r in rows] == [
        (t.number, t.run_id, t.status, t.metric, t.hparams) for t in trials
    ]
    assert all(store.get_run(r["run_id"])["config_yaml"] for r in rows)
    # the last completed trial's model, against a standalone run of the same hyperparameters
    c.run("searched = params", quiet=True)
    c.configure(result.search.configs[2])
    c.run(CELL, quiet=True)
    c.run("assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(searched, params))", quiet=True)


def test_the_cell_magic_runs_a_search_and_prints_its_trials(
    fresh_run: Any, ip: Any, tmp_path: Path, capsys: Any
) -> None:
    path = tmp_path / "one.yaml"
    path.write_text(SEARCH.replace("vals: [ok, fail]", "vals: [ok]").replace("[0.01, 0.1]", "[0.05]"))
    ip.run_cell_magic("dtrain", f"search {path} --quiet", CELL)
    out = capsys.readouterr().out
    found = re.search(r"grid search one\.yaml \(search (\d+)\): 1 trials, val_loss", out)
    assert found is not None, out
    run = re.search(r"best: trial 1 \(run (\d+)\)", out)
    assert run is not None, out
    # the shell's view of the search, through %dtrain runs on the cluster's store
    ip.run_line_magic("dtrain", f"runs list --search {found[1]}")
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].startswith(f"search {found[1]}  one.yaml  grid  completed  metric val_loss")
    assert listed[2].split()[:4] == ["1", "*", run[1], "completed"]
    ip.run_line_magic("dtrain", "runs searches")
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:]}
    assert rows[found[1]][1:4] == ["one.yaml", "grid", "completed"]
