"""FSDP checkpoints through torch.distributed.checkpoint: written sharded by 2 real gloo ranks,
resumed on 2 ranks and on 1 (a one-rank gloo group in this process), exported to one file."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

import dtwork
from dtwork.config import load_config
from dtwork.errors import DtworkWarning
from dtwork.runtime.checkpoint import folders
from dtwork.runtime.context import Context
from tests.cluster.test_fsdp import MODEL, SETUP, TRAIN

LOSS = """
xs = torch.cat([x for x, _ in data]); ys = torch.cat([y for _, y in data])
with torch.no_grad():
    loss = float(F.mse_loss(model(xs), ys))
"""


def _cell(max_steps: int, resume: Any) -> str:
    train = TRAIN.replace("MAX", str(max_steps)).replace("RESUME", repr(resume))
    return MODEL + SETUP + 'ctx.register("optimizers", opt)\n' + train + LOSS  # a resume restores it too


def _on_one_rank(directory: Path, cell: str, every: int | None = None) -> dict[str, Any]:
    """Run a training cell as the single rank of this process's group; return its namespace."""
    cfg = load_config(
        {"optimizations": {"strategy": "fsdp"}, "checkpoint": {"directory": str(directory), "every": every}}
    )
    ctx = Context(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo", config=cfg)
    ns: dict[str, Any] = {"ctx": ctx, "F": F, "torch": torch}
    exec(cell, ns)
    return ns


def test_dcp_checkpoint_resumes_on_two_ranks_and_on_one(fresh_run: Any, tmp_path: Path) -> None:
    fresh_run.configure(
        {"optimizations": {"strategy": "fsdp"}, "checkpoint": {"every": 4, "directory": str(tmp_path)}}
    )
    fresh_run.run(_cell(4, False), quiet=True)
    at_4, loss_4 = fresh_run.pull("params")[0], fresh_run.pull("loss")[0]
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir()]
    (saved,) = folders.checkpoints(run)
    assert saved.name == "step-00000004.dcp"
    names = sorted(p.name for p in saved.iterdir())
    assert names == [".metadata", "__0_0.distcp", "__1_0.distcp", "extra.pt"]  # a shard file per rank
    assert not [p for p in run.iterdir() if p.name.endswith(".tmp")]
    fresh_run.configure({"optimizations": {"strategy": "fsdp"}})
    fresh_run.run(_cell(8, False), quiet=True)
    straight, straight_loss = fresh_run.pull("params")[0], fresh_run.pull("loss")[0]
    assert abs(straight_loss - loss_4) > 1e-3  # four more steps changed the loss

    fresh_run.run(_cell(8, str(saved)), quiet=True)  # resumed on 2 ranks
    for a, b in zip(fresh_run.pull("params")[0], straight, strict=True):
        assert torch.allclose(a, b, atol=1e-6)
    assert fresh_run.pull("loss")[0] == pytest.approx(straight_loss, abs=1e-6)

    out = dtwork.export_checkpoint(run, tmp_path / "whole.pt")  # one file, no group needed
    whole = torch.load(out, weights_only=True)
    assert [v.shape for v in whole["models"][0].values()] == [p.shape for p in at_4]
    for a, b in zip(whole["models"][0].values(), at_4, strict=True):
        assert torch.equal(a, b)
    assert whole["loop"]["step"] == 4 and whole["optimizers"][0]["state"]

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        with pytest.warns(DtworkWarning, match="written by 2 ranks and resumes on 1"):
            ns = _on_one_rank(tmp_path, _cell(8, str(saved)))  # the same global batch on one rank
    finally:
        dist.destroy_process_group()
    for a, b in zip(ns["params"], straight, strict=True):
        assert torch.allclose(a, b, atol=1e-5)
    assert ns["loss"] == pytest.approx(straight_loss, abs=1e-5)
