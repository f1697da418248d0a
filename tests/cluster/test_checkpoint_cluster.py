"""Checkpoints per run: folders, pruning, resume targets, safe loading, RNG restore on any device.

Its tests that need engines (a cluster, a kernel, a process group across processes); the others are
in tests/unit/test_checkpoint.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from dtwork.errors import RankFailure
from dtwork.runtime.checkpoint import folders
from tests.unit import test_checkpoint as unit_tests
from tests.unit.test_checkpoint import steps_in

small_disk = unit_tests.small_disk  # a fixture, used by name

TRAIN = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
net = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1))
g = torch.Generator().manual_seed(3)
X = torch.randn(64, 6, generator=g); Y = X @ torch.randn(6, 1, generator=g)
model = ctx.wrap(net)
opt = ctx.optimizer(model.parameters())
first = None
for step, (x, y) in ctx.steps(ctx.loader(TensorDataset(X, Y)), max_steps=MAX, resume=RESUME):
    first = step if first is None else first
    ctx.backward(F.mse_loss(model(x), y)); ctx.step(opt)
params = [p.detach().clone() for p in model.module.parameters()]
""".replace("TensorDataset", "torch.utils.data.TensorDataset")


def train(cluster: Any, max_steps: int, resume: object = False) -> list[Any]:
    result = cluster.run(TRAIN.replace("MAX", str(max_steps)).replace("RESUME", repr(resume)), quiet=True)
    assert result.ok, result.errors
    return cluster.pull("first")


def test_two_experiments_in_one_folder_keep_their_checkpoints_and_resume_their_own(
    cluster: Any, tmp_path: Path
) -> None:
    cfg = {
        "global_batch_size": 8,
        "lr": 0.05,
        "checkpoint": {"every": 10, "keep": 3, "directory": str(tmp_path)},
    }
    cluster.configure(cfg)
    train(cluster, 50)
    run_a = cluster.session.run_id
    params_a = cluster.pull("params")[0]
    cluster.configure(cfg)  # a new experiment: a new run, the same folder
    train(cluster, 20)
    run_b = cluster.session.run_id
    folder_a, folder_b = tmp_path / f"run-{run_a}", tmp_path / f"run-{run_b}"
    assert run_a != run_b
    assert steps_in(folder_a) == [30, 40, 50] and steps_in(folder_b) == [10, 20]

    assert train(cluster, 25, resume=True) == [20, 20]  # this run's newest, not the other's 50
    assert steps_in(folder_b) == [10, 20, 25]  # a final checkpoint where the loop ended
    assert train(cluster, 50, resume=run_a) == [None, None]  # named: run A's step 50, nothing left
    assert all(torch.equal(a, b) for a, b in zip(params_a, cluster.pull("params")[0], strict=True))
    assert steps_in(folder_a) == [30, 40, 50] and steps_in(folder_b) == [10, 20, 25]


@pytest.mark.parametrize(
    ("extra", "saved"),
    [({"gns": {"enabled": True}}, "gns"), ({"mixed_precision": "fp16"}, "scaler")],
)
def test_gns_and_scaler_state_resume_under_weights_only(
    cluster: Any, tmp_path: Path, extra: dict[str, Any], saved: str
) -> None:
    cluster.configure(
        {"global_batch_size": 8, "checkpoint": {"every": 5, "directory": str(tmp_path)}, **extra}
    )
    train(cluster, 10)
    payload = torch.load(tmp_path / f"run-{cluster.session.run_id}" / "step-00000010.pt", weights_only=True)
    assert payload[saved] is not None
    assert train(cluster, 12, resume=True) == [10, 10]


def test_a_cell_whose_run_folder_another_store_owns_fails_before_training(
    cluster: Any, tmp_path: Path
) -> None:
    cluster.configure({"global_batch_size": 8, "checkpoint": {"every": 10, "directory": str(tmp_path)}})
    assert cluster.run("started = True", quiet=True).ok  # the run exists from its first cell
    folder = tmp_path / f"run-{cluster.session.run_id}"
    folder.mkdir()
    (folder / folders.OWNER).write_text('{"run": "run-1", "store": "/elsewhere/runs.sqlite"}')
    with pytest.raises(RankFailure, match="holds run run-1 of the run store /elsewhere/runs.sqlite, not of"):
        cluster.run(TRAIN.replace("MAX", "20").replace("RESUME", "False"), quiet=True)
    assert cluster.pull("first") == [None, None] and steps_in(folder) == []  # not one step trained
    cluster.configure(
        {"global_batch_size": 8, "checkpoint": {"every": 10, "directory": str(tmp_path / "own")}}
    )
    train(cluster, 20)
    owner = (tmp_path / "own" / f"run-{cluster.session.run_id}" / folders.OWNER).read_text()
    assert str(cluster.store_file) in owner


def test_a_truncated_newest_checkpoint_resumes_from_the_one_before_on_the_ranks(
    cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.configure({"global_batch_size": 8, "checkpoint": {"every": 10, "directory": str(tmp_path)}})
    train(cluster, 20)
    folder = tmp_path / f"run-{cluster.session.run_id}"
    newest = folder / "step-00000020.pt"
    newest.write_bytes(newest.read_bytes()[:1000])
    capsys.readouterr()
    result = cluster.run(TRAIN.replace("MAX", "25").replace("RESUME", "True"))
    assert result.ok, result.errors
    assert cluster.pull("first") == [10, 10]
    out = capsys.readouterr()
    assert "step-00000020.pt cannot be read" in out.out + out.err


def test_a_full_disk_on_the_ranks_fails_the_cell_with_one_line_and_no_temp_file(
    cluster: Any, small_disk: Path
) -> None:
    cluster.configure({"global_batch_size": 8, "checkpoint": {"every": 5, "directory": str(small_disk)}})
    big = TRAIN.replace(
        "nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 1)", "nn.Linear(6, 1024), nn.Linear(1024, 1024)"
    )
    big = big.replace("model(x), y", "model(x)[:, :1], y")  # 4 MiB of weights on a 1 MiB disk
    with pytest.raises(RankFailure, match=r"no space left in .*run-\d+ \(it needs about \d+\.\d MiB"):
        cluster.run(big.replace("MAX", "5").replace("RESUME", "False"), quiet=True)
    folder = small_disk / f"run-{cluster.session.run_id}"
    assert [p.name for p in folder.iterdir()] == [folders.OWNER]  # the temp file is gone


PLAIN = """
import torch, torch.nn as nn, torch.nn.functional as F
torch.manual_seed(0)
g = torch.Generator().manual_seed(3)
X = torch.randn(64, 6, generator=g); Y = X @ torch.randn(6, 1, generator=g)
model = ctx.wrap(nn.Linear(6, 1))
opt = torch.optim.Adam(model.parameters(), lr=0.01)  # plain: dtwork knows it at its first ctx.step
for step, (x, y) in ctx.steps(ctx.loader(torch.utils.data.TensorDataset(X, Y)), max_steps=MAX, resume=RESUME):
    ctx.backward(F.mse_loss(model(x), y)); ctx.step(opt)
adam_steps = int(opt.state[model.module.weight]["step"])
"""


def test_a_plain_optimizer_made_in_the_resuming_cell_gets_the_checkpoints_state(
    cluster: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A fresh cell builds its model and a plain torch.optim.Adam and resumes: the Adam is unknown
    when the checkpoint loads, so its moments were silently left fresh; its first ctx.step now
    takes the checkpoint's state (Adam's own step count goes on from 10)."""
    cluster.configure({"global_batch_size": 8, "checkpoint": {"every": 10, "directory": str(tmp_path)}})
    cell = PLAIN.replace("MAX", "10").replace("RESUME", "False")
    assert cluster.run(cell, quiet=True).ok
    assert cluster.pull("adam_steps") == [10, 10]
    assert cluster.run(PLAIN.replace("MAX", "15").replace("RESUME", "True"), quiet=False).ok
    assert cluster.pull("adam_steps") == [15, 15]
    assert (
        "restored the checkpoint's optimizer state into Adam at its first ctx.step" in capsys.readouterr().out
    )
