"""Searches that run several trials at once on rank groups of the warm cluster (issue 48, item 2):
4 ranks as 2 groups of 2. ONE test on ONE 4-rank cluster of its own (it needs 4 ranks: the shared
cluster has 2) does every check on that start; the standalone runs it compares against are the
shared 2-rank cluster's (running beside it), a genuine 2-rank world."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml

from dtwork.store import searches

CELL = """
import torch, torch.nn as nn, torch.nn.functional as F
if ctx.hparams["mode"] == "fail" and ctx.rank == 1:
    raise ValueError("this trial fails on purpose")
if ctx.hparams.get("hold"):  # trial "ok" keeps its group busy until "ok2" has begun on the other one
    import os, time
    held = f"{ctx.hparams['hold']}-ok2"
    if ctx.hparams["mode"] == "ok2" and ctx.rank == 0:
        open(held, "w").close()
    until = time.monotonic() + 120
    while ctx.hparams["mode"] == "ok" and not os.path.exists(held) and time.monotonic() < until:
        time.sleep(0.02)
torch.manual_seed(0)
g = torch.Generator().manual_seed(5)
data = torch.utils.data.TensorDataset(torch.randn(256, 4, generator=g), torch.randn(256, 1, generator=g))
net = ctx.wrap(nn.Linear(4, 1))  # rank 0 of a failing trial waits here for rank 1, which never comes
opt = torch.optim.SGD(net.parameters(), lr=ctx.hparams["lr"])
for step, (x, y) in ctx.steps(ctx.loader(data), max_steps=ctx.hparams.get("steps", 12)):
    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt)
    ctx.log(val_loss=float(loss))
    if step == 3 and ctx.rank == 0 and "mark" in ctx.hparams:  # this trial trains: the test may stop it
        open(f"{ctx.hparams['mark']}-{ctx.hparams['lr']}", "w").close()
params = [p.detach().clone() for p in net.parameters()]
finals = globals().setdefault("finals", {})
finals[ctx.hparams["lr"]] = (ctx.rank, ctx.world_size, [p.tolist() for p in params])
"""

GRID = """
name: pairs
global_batch_size: 32
resources: {slots_per_trial: 2}
hyperparameters:
  lr: {type: categorical, vals: [0.01, 0.03, 0.1, 0.3]}
  mode: ok
searcher: {name: grid, metric: val_loss, max_concurrent_trials: 2}
"""

FAILING = """
name: failing
global_batch_size: 32
resources: {slots_per_trial: 2}
hyperparameters:
  lr: 0.05
  mode: {type: categorical, vals: [fail, ok, ok2, ok3]}
  hold: HOLD
searcher: {name: grid, metric: val_loss}
"""

LONG = """
name: long
resources: {slots_per_trial: 2}
global_batch_size: 32
hyperparameters:
  lr: {type: categorical, vals: [0.01, 0.02, 0.04]}
  mode: ok
  steps: 100000
  mark: MARK
searcher: {name: grid, metric: val_loss}
"""


# ASHA on the groups: seed 1 draws lr 1e-4, 1e-4, 0.1, 0.1; rungs of 4 and 16 batches (test_search_asha.py)
ASHA_CELL = """
import torch, torch.nn as nn, torch.nn.functional as F
g = torch.Generator().manual_seed(5)
x_all = torch.randn(256, 4, generator=g)
data = torch.utils.data.TensorDataset(x_all, x_all @ torch.tensor([[1.0], [-2.0], [0.5], [3.0]]))
torch.manual_seed(ctx.hparams["init"])
net = ctx.wrap(nn.Linear(4, 1))
opt = torch.optim.SGD(net.parameters(), lr=ctx.hparams["lr"])
for step, (x, y) in ctx.steps(ctx.loader(data)):
    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt); ctx.log(loss=loss)
with torch.no_grad():
    ctx.log(val_loss=float(F.mse_loss(net(x_all), data.tensors[1])))
"""

ASHA = """
name: asha-groups
global_batch_size: 32
resources: {{slots_per_trial: 2}}
hyperparameters:
  lr: {{type: categorical, vals: [0.0001, 0.1]}}
  init: {{type: int, minval: 0, maxval: 1000}}
searcher: {{name: adaptive_asha, metric: val_loss, time_metric: batches, max_time: 16, max_trials: 4,
           mode: aggressive, max_rungs: 2}}
reproducibility: {{experiment_seed: 1}}
checkpoint: {{directory: {folder}}}
"""


def _interrupt_when_both_train(mark: Path) -> None:
    """Press the stop button (SIGINT to this kernel) once both running trials have trained a few steps."""
    marks = [Path(f"{mark}-{lr}") for lr in (0.01, 0.02)]

    def wait_and_interrupt() -> None:
        deadline = time.monotonic() + 120
        while not all(m.exists() for m in marks) and time.monotonic() < deadline:
            time.sleep(0.05)
        os.kill(os.getpid(), signal.SIGINT)

    threading.Thread(target=wait_and_interrupt, daemon=True).start()


def _overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return max(a["created_at"], b["created_at"]) < min(a["ended_at"], b["ended_at"])


def test_four_ranks_run_trials_two_at_a_time_on_groups_of_two(cluster: Any, tmp_path: Path) -> None:
    import dtwork

    (tmp_path / "pairs.yaml").write_text(GRID)
    (tmp_path / "failing.yaml").write_text(FAILING.replace("HOLD", str(tmp_path / "hold")))
    c = dtwork.start(n=4, backend="gloo", timeout=60)
    try:
        c.session.live = False
        # slots that do not divide the ranks: one line saying what to do
        with pytest.raises(
            dtwork.DtworkError, match=r"slots_per_trial 3 does not divide the cluster's 4 ranks"
        ):
            dtwork.search(
                GRID.replace("slots_per_trial: 2", "slots_per_trial: 3"), CELL, cluster=c, quiet=True
            )

        result = dtwork.search(tmp_path / "pairs.yaml", CELL, cluster=c, quiet=True)
        trials = result.trials
        assert [t.status for t in trials] == ["completed"] * 4, result.table()
        store = c.session.store
        runs = {t.number: store.get_run(t.run_id) for t in trials}
        assert len({t.run_id for t in trials}) == 4
        # two at a time: the first two trials (one per group) ran side by side
        assert _overlap(runs[1], runs[2]), runs
        assert not _overlap(runs[1], runs[3]) or not _overlap(runs[2], runs[4])  # never more than 2
        for t in trials:
            run = runs[t.number]
            assert run["world_size"] == 2 and run["status"] == "completed"
            assert store.environment(t.run_id)["world_size"] == 2
            assert yaml.safe_load(run["config_yaml"])["hyperparameters"] == t.hparams
            rows = [
                r for name in store.metric_names(t.run_id) for r in store.metrics(t.run_id, name, rank="all")
            ]
            assert {r["rank"] for r in rows} - {None} == {0, 1}, rows  # the group's own ranks (perf)
            assert len(store.metrics(t.run_id, "val_loss")) == 12
            assert t.metric is not None
        # each group's ranks were the group's world: rank 0 and 1 of 2 (pulled from the 4 ranks)
        finals = c.pull("finals")
        assert all(
            rank == i % 2 and world == 2 for i, f in enumerate(finals) for rank, world, _ in f.values()
        )
        searched = {lr: p for f in finals[::2] for lr, (_, _, p) in f.items()}
        assert sorted(searched) == [0.01, 0.03, 0.1, 0.3]
        assert c.config.hyperparameters == {} and c.run(lambda ctx: ctx.world_size) == [4] * 4
        # the search's record, as the sequential path writes it
        record = searches.get(store.db, result.search_id)
        assert (record["status"], record["trials"], record["done"]) == ("completed", 4, 4)
        assert [(r["run_id"], r["status"]) for r in searches.trials(store.db, result.search_id)] == [
            (t.run_id, "completed") for t in trials
        ]

        # ASHA on the groups: the worse trials stop at the first rung, the best is promoted on a free
        # group and goes on from its first rung's checkpoint (step 4) to max_length
        asha = dtwork.search(ASHA.format(folder=tmp_path / "ckpt"), ASHA_CELL, cluster=c, quiet=True)
        best = asha.best
        assert best is not None and best.hparams["lr"] == 0.1, asha.table()
        assert (best.status, best.length, len(best.runs)) == ("completed", "16 batches", 2), asha.table()
        assert [t.status for t in asha.trials if t is not best] == ["stopped"] * 3, asha.table()
        assert store.segments(best.runs[1])[0]["first_step"] == 4
        assert sorted({r["step"] for r in store.metrics(best.runs[1], "loss", rank="all")}) == list(
            range(4, 16)
        )

        # a trial that fails (on one rank of its group, the other waiting for it) costs only itself
        failing = dtwork.search(tmp_path / "failing.yaml", CELL, cluster=c, quiet=True)
        statuses = [t.status for t in failing.trials]
        assert statuses == ["failed", "completed", "completed", "completed"], failing.table()
        assert failing.trials[0].error == "ValueError: this trial fails on purpose"
        fruns = [store.get_run(t.run_id) for t in failing.trials]
        assert fruns[0]["status"] == "failed" and _overlap(fruns[0], fruns[1])
        # the failed group (ranks 0-1) was made again, by its ranks, and trained a later trial: trial 2
        # holds the other group until trial 3 has begun, so trial 3 can only have run on the failed one
        third = failing.trials[2]
        assert "on ranks [0, 1]" in store.events(third.run_id, "start")[0]["message"]
        assert third.metric is not None
        assert c.run(lambda ctx: ctx.rank) == [0, 1, 2, 3]

        # Ctrl-C stops the search: both running trials stop and are recorded interrupted
        _interrupt_when_both_train(tmp_path / "mark")
        stopped = dtwork.search(LONG.replace("MARK", str(tmp_path / "mark")), CELL, cluster=c, quiet=True)
        assert [t.status for t in stopped.trials] == ["interrupted", "interrupted", "not run"], (
            stopped.table()
        )
        assert [store.get_run(t.run_id)["status"] for t in stopped.trials[:2]] == ["interrupted"] * 2
        assert searches.get(store.db, stopped.search_id)["status"] == "interrupted"
        assert c.run(lambda ctx: (ctx.rank, ctx.world_size)) == [(r, 4) for r in range(4)]
    finally:
        c.stop()

    # the standalone 2-rank runs, on the shared 2-rank cluster, with the same hyperparameters
    two = cluster
    try:
        for t in trials:
            two.configure(result.search.configs[t.number - 1])
            two.run(CELL, quiet=True)
            rank, world, alone = two.pull("finals")[0][t.hparams["lr"]]
            assert (rank, world) == (0, 2)
            for a, b in zip(searched[t.hparams["lr"]], alone, strict=True):
                torch.testing.assert_close(torch.tensor(a), torch.tensor(b), atol=1e-5, rtol=0)
    finally:
        two.configure(None)
