"""Live scaling efficiency: estimated kernel-side from the ranks' perf records, stored as an aggregated
log row, read by the server's run list and the report; and the sweep's intervals and warnings.

Its tests that need engines (a cluster, a kernel, a process group across processes); the others are
in tests/unit/test_live_efficiency.py.
"""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from dtwork.analysis.scaling import (
    EFFICIENCY_NAME,
)

CELL = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
model = ctx.wrap(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1)))
opt = ctx.optimizer(model.parameters())
data = ctx.synthetic((32,), (1,), size=2048)
for step, (x, y) in ctx.steps(ctx.loader(data, batch_size=16), max_steps=60):
    loss = F.mse_loss(model(x), y); ctx.backward(loss); ctx.step(opt); ctx.log(loss=loss)
"""


def test_a_two_rank_run_writes_its_efficiency_for_the_sidebar_and_report(
    fresh_run: object, tmp_path: Path
) -> None:
    from dtwork.report import export
    from dtwork.server import queries

    cluster = fresh_run
    cluster.run(CELL, quiet=True)  # type: ignore[attr-defined]
    session = cluster.session  # type: ignore[attr-defined]
    run_id, store = session.run_id, session.store.path
    session.writer.flush(force=True)
    eff = session.store.last_metrics(run_id)[EFFICIENCY_NAME]
    assert 0.0 < eff <= 1.0
    rows = [r for r in session.store.metrics(run_id, EFFICIENCY_NAME)]
    assert rows and all(r["rank"] is None and r["kind"] == "scaling" for r in rows)
    last_perf = max(r["step"] for r in session.store.metrics(run_id, "step_time", rank="all"))
    assert rows[-1]["step"] == last_perf  # the cell's last estimate is written when it ends

    listed = {r["id"]: r for r in queries.list_runs(str(tmp_path))["runs"]}  # GET /dtwork/runs
    assert listed[run_id]["scaling_efficiency"] == pytest.approx(eff)

    rep = export(run_id, tmp_path / "r.ipynb", store=store)
    text = "\n".join(c.source for c in nbformat.read(rep.path, as_version=4).cells)
    assert f"| scaling efficiency | {eff:.0%} |" in text
    assert "final scaling_efficiency" not in text
