"""Issue 48's phase: an ASHA search on rank groups against the same trials one after another.

On one warm 4-rank cluster, two arms take turns: ``adaptive_asha`` with ``max_trials`` trials on
groups of ``slots`` ranks (two trials at a time on 4 ranks, the worse ones stopped at a rung), and a
``random`` search of the same trials (the same seed draws the same hyperparameters, checked) each
trained to ``max_length`` on the whole cluster, one after another. Both train at the same global
batch, so a trial's steps are the same computation on either. Each arm's wall time, the batches it
trained, its best trial and the time from its start to the end of that trial's last piece.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from typing import TYPE_CHECKING, Any

from benchmarks.stats import median, summarize
from benchmarks.turns import rotate
from benchmarks.util import log

if TYPE_CHECKING:
    from benchmarks.plan import Plan

# an MLP regression whose width and learning rate the search draws; its length is the searcher's
CELL = """
import torch, torch.nn as nn, torch.nn.functional as F
g = torch.Generator().manual_seed(7)
x_all = torch.randn({samples}, 32, generator=g)
y_all = torch.sin(x_all[:, :8]).sum(1, keepdim=True) + 0.1 * torch.randn({samples}, 1, generator=g)
data = torch.utils.data.TensorDataset(x_all, y_all)
torch.manual_seed(0)
width = ctx.hparams["width"]
net = ctx.wrap(nn.Sequential(nn.Linear(32, width), nn.ReLU(), nn.Linear(width, width), nn.ReLU(),
                             nn.Linear(width, 1)))
opt = torch.optim.Adam(net.parameters(), lr=ctx.hparams["lr"])
for step, (x, y) in ctx.steps(ctx.loader(data)):
    loss = F.mse_loss(net(x), y); ctx.backward(loss); ctx.step(opt)
with torch.no_grad():
    ctx.log(val_loss=float(F.mse_loss(net(x_all[:1024]), y_all[:1024])))
"""

HPARAMS = """
hyperparameters:
  lr: {{type: log, minval: -4, maxval: -1}}
  width: {{type: categorical, vals: [64, 256]}}
reproducibility: {{experiment_seed: 3}}
global_batch_size: {batch}
checkpoint: {{directory: {folder}}}
"""

ASHA = """
name: asha-on-groups
resources: {{slots_per_trial: {slots}}}
searcher: {{name: adaptive_asha, metric: val_loss, smaller_is_better: true, max_length: {{batches: {length}}},
           max_trials: {trials}, max_rungs: {rungs}, divisor: {divisor}}}
"""

SEQUENTIAL = """
name: one-after-another
searcher: {{name: random, metric: val_loss, smaller_is_better: true, max_length: {{batches: {length}}},
           max_trials: {trials}}}
"""


def files(plan: Plan, folder: str) -> dict[str, str]:
    """Each arm's search file; ASHA's promoted trials resume from checkpoints in ``folder`` (a
    folder of this phase's own: the suite's other clusters write theirs under other run stores)."""
    p = plan.search
    common = HPARAMS.format(batch=p["global_batch"], folder=folder)
    return {
        "asha": ASHA.format(**p) + common,
        "sequential": SEQUENTIAL.format(**p) + common,
    }


def _arm(cluster: Any, text: str, code: str) -> dict[str, Any]:
    import dtwork

    t0 = time.time()
    result = dtwork.search(text, code, cluster=cluster, quiet=True)
    wall = time.time() - t0
    store = cluster.session.store
    batches = 0
    for t in result.trials:
        for run in t.runs:  # each piece trains from its first segment's step to where val_loss is logged
            ends = store.metrics(run, "val_loss", rank="all")
            first = store.segments(run)[0]["first_step"] if store.segments(run) else 0
            batches += ends[-1]["step"] + 1 - first if ends else 0
    best = result.best
    to_best = None
    if best is not None and best.run_id is not None:
        to_best = store.get_run(best.run_id)["ended_at"] - t0
    return {
        "wall_s": wall,
        "batches": batches,
        "to_best_s": to_best,
        "best": None
        if best is None
        else {"trial": best.number, "metric": best.metric, "hparams": best.hparams, "length": best.length},
        "statuses": [t.status for t in result.trials],
        "trial_errors": sorted({t.error for t in result.trials if t.error}),
        "hparams": [t.hparams for t in result.trials],
        "search_id": result.search_id,
    }


def measure(plan: Plan) -> dict[str, Any]:
    """Both arms in turns on one 4-rank cluster of their own, ``reps`` times."""
    import dtwork

    p, folder = plan.search, tempfile.mkdtemp(prefix="dtwork-search-phase-")
    texts, code = files(plan, folder), CELL.format(samples=p["samples"])
    log(f"a {p['ranks']}-rank cluster for the search phase")
    cluster = dtwork.start(n=p["ranks"], backend="gloo", timeout=120)
    out: dict[str, Any] = {"arms": {"asha": [], "sequential": []}, "errors": []}
    try:
        cluster.session.live = False
        for rep in range(p["reps"]):
            for arm in rotate(["asha", "sequential"], rep):
                log(f"search phase, repetition {rep + 1}/{p['reps']}: {arm}")
                try:
                    out["arms"][arm].append(_arm(cluster, texts[arm], code))
                except Exception as exc:
                    out["errors"].append(f"{arm}, repetition {rep + 1}: {type(exc).__name__}: {exc}")
    finally:
        cluster.stop()
        shutil.rmtree(folder, ignore_errors=True)
    a, s = out["arms"]["asha"], out["arms"]["sequential"]
    out["same_trials"] = bool(a and s) and a[0]["hparams"] == s[0]["hparams"]
    for arm, runs in out["arms"].items():
        out[f"{arm}_summary"] = {
            k: summarize([r[k] for r in runs if r[k] is not None]) for k in ("wall_s", "to_best_s", "batches")
        }
    if a and s:
        out["wall_ratio"] = median([r["wall_s"] for r in a]) / median([r["wall_s"] for r in s])
        out["to_best_ratio"] = median([r["to_best_s"] or 0.0 for r in a]) / median(
            [r["to_best_s"] or 0.0 for r in s]
        )
    return out
