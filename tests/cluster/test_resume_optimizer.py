"""One rule for a checkpoint's optimizer state, whatever the strategy: a plain optimizer made in the
resuming cell (unknown when the checkpoint loads) gets its saved state at its first ``ctx.step``,
before its update, from a ``.pt`` file (DDP) and a ``.dcp`` folder (FSDP) alike; the resumed steps
equal the uninterrupted run's. On 2 real gloo ranks (the shared cluster, its namespace reset) and
on 1 (a one-rank gloo group in this process, a fresh ``ctx``)."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F

from dtwork.config import load_config
from dtwork.runtime.checkpoint import folders
from dtwork.runtime.context import Context
from tests.cluster.test_fsdp import MODEL

# AdamW made in the cell, plain: dtwork knows it only at its first ctx.step(opt)
TRAIN = """
model = ctx.wrap(net)  # the strategy from the config
opt = torch.optim.AdamW(model.parameters(), lr=0.01)
g = torch.Generator().manual_seed(1)
data = [(torch.randn(4, 6, generator=g), torch.randn(4, 2, generator=g)) for _ in range(12)]
losses = {}
for step, (x, y) in ctx.steps(data, max_steps=MAX, resume=RESUME):
    loss = F.mse_loss(model(x), y)
    losses.setdefault(step, []).append(loss.item())
    ctx.backward(loss)
    ctx.step(opt)
"""
PLAIN_STEP = (
    "    if len(losses[step]) == 2:\n        opt.step(); opt.zero_grad()\n"  # at the last micro-batch
)
RESET = "del net, model, opt, data, losses\nimport gc; gc.collect()\n"  # nothing of the first run is left
# the case at half length (10, 20, 30 passes too): checkpoints at 5 and 10, the resume loads
# step 10 and trains steps 10-14 (moments dropped show from the first step after it)
EVERY, SAVED, RESUMED = 5, 10, 15


def _cell(max_steps: int, resume: object) -> str:
    return MODEL + TRAIN.replace("MAX", str(max_steps)).replace("RESUME", repr(resume))


def _config(strategy: str, directory: Path) -> dict[str, Any]:
    return {
        "optimizations": {"strategy": strategy, "aggregation_frequency": 2},
        "checkpoint": {"every": EVERY, "directory": str(directory)},
    }


def _drop_the_last(folder: Path) -> None:
    """Leave the uninterrupted run's checkpoints up to step SAVED (its newest is at RESUMED)."""
    last = folders.checkpoints(folder)[-1]
    assert last.name.startswith(f"step-{RESUMED:08d}")
    if last.is_dir():
        shutil.rmtree(last)
    else:
        last.unlink()


def _same_steps(resumed: dict[int, list[float]], straight: dict[int, list[float]]) -> None:
    assert sorted(resumed) == list(range(SAVED, RESUMED))
    for step in range(SAVED, RESUMED):
        assert resumed[step] == pytest.approx(straight[step], abs=1e-5), step


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_a_plain_optimizer_made_in_the_resuming_cell_resumes_exactly_on_two_ranks(
    cluster: Any, tmp_path: Path, strategy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    cluster.configure(_config(strategy, tmp_path))
    assert cluster.run(_cell(RESUMED, False), quiet=True).ok
    run = cluster.session.run_id
    straight = cluster.pull("losses")[0]
    _drop_the_last(tmp_path / f"run-{run}")
    capsys.readouterr()
    assert cluster.run(RESET + _cell(RESUMED, f"run-{run}"), quiet=False).ok
    out = capsys.readouterr().out
    _same_steps(cluster.pull("losses")[0], straight)
    _same_steps(cluster.pull("losses")[1], straight)
    assert f"step-{SAVED:08d}" in out
    assert out.count("restored the checkpoint's optimizer state into AdamW at its first ctx.step") == 1
    assert "no optimizer of this run took" not in out


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A real gloo process group of one rank in this process, on one thread (a rank's share of a
    busy 2-core machine: a tiny model's ops otherwise wait on spinning threads)."""
    store = tmp_path_factory.mktemp("pg") / "store"
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()
    torch.set_num_threads(threads)


def _on_one_rank(strategy: str, directory: Path, cell: str) -> dict[str, Any]:
    """Run ``cell`` as the single rank of this process's group with a fresh ``ctx`` (run 7)."""
    cfg = load_config(_config(strategy, directory))
    ctx = Context(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo", config=cfg)
    ctx.state.run_id = 7
    ns: dict[str, Any] = {"ctx": ctx, "F": F, "torch": torch}
    exec(cell, ns)
    return ns


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_a_plain_optimizer_made_in_the_resuming_cell_resumes_exactly_on_one_rank(
    one_rank: None, tmp_path: Path, strategy: str, capsys: pytest.CaptureFixture[str]
) -> None:
    straight = _on_one_rank(strategy, tmp_path, _cell(RESUMED, False))["losses"]
    _drop_the_last(tmp_path / "run-7")
    capsys.readouterr()
    resumed = _on_one_rank(strategy, tmp_path, _cell(RESUMED, "run-7"))["losses"]
    _same_steps(resumed, straight)
    out = capsys.readouterr().out
    assert "restored the checkpoint's optimizer state into AdamW at its first ctx.step" in out

    _drop_the_last(tmp_path / "run-7")  # the resumed run's step 30
    plain = _cell(SAVED + 1, "run-7").replace("    ctx.step(opt)\n", PLAIN_STEP)  # ctx.step never sees opt
    _on_one_rank(strategy, tmp_path, plain)
    out = capsys.readouterr().out
    assert "1 optimizer state(s) wait for their optimizer's first ctx.step" in out
    assert (
        f"step-{SAVED:08d}" in out
        and "no optimizer of this run took, so those optimizers started fresh" in out
    )
