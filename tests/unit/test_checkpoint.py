"""Checkpoints per run: folders, pruning, resume targets, safe loading, RNG restore on any device.

The file-level tests use a real one-rank gloo group in this process; the scenario of two
experiments sharing one checkpoint directory runs on the shared 2-rank cluster.
"""

from __future__ import annotations

import os
import random
import stat
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist

from dtwork.config import load_config
from dtwork.errors import DtworkError, DtworkWarning
from dtwork.runtime.checkpoint import files, folders
from dtwork.runtime.checkpoint import trial as checkpoint
from dtwork.runtime.context import Context
from dtwork.runtime.core.state import RankState


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """A real gloo process group of one rank in this process."""
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def make_ctx(
    directory: Path, run_id: int | None = None, keep: int = 3, device: str = "cpu"
) -> tuple[RankState, torch.nn.Module, torch.optim.Optimizer]:
    """The rank state a ``ctx`` keeps (what the checkpoint functions take), with a trained model."""
    cfg = load_config({"checkpoint": {"directory": str(directory), "keep": keep}})
    ctx = Context(
        rank=0, world_size=1, local_rank=0, device=torch.device(device), backend="gloo", config=cfg
    ).state
    ctx.run_id = run_id
    torch.manual_seed(run_id or 0)
    model = torch.nn.Linear(4, 2).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    model(torch.randn(3, 4, device=device)).sum().backward()
    opt.step()
    ctx.register("models", model)
    ctx.register("optimizers", opt)
    return ctx, model, opt


def steps_in(folder: Path) -> list[int]:
    return [int(p.stem.split("-")[1]) for p in folders.checkpoints(folder)]


def save_at(ctx: RankState, *steps: int) -> None:
    for step in steps:
        checkpoint.save(ctx, {"step": step, "epoch": 0, "micro": 0})


def test_each_run_prunes_only_its_own_folder(group: None, tmp_path: Path) -> None:
    earlier, *_keep_a = make_ctx(tmp_path, run_id=1)
    save_at(earlier, 30, 40, 50)
    later, *_keep_b = make_ctx(tmp_path, run_id=2, keep=2)
    save_at(later, 10, 20)
    assert steps_in(tmp_path / "run-1") == [30, 40, 50]
    assert steps_in(tmp_path / "run-2") == [10, 20]
    save_at(later, 30)
    assert steps_in(tmp_path / "run-2") == [20, 30]
    assert steps_in(tmp_path / "run-1") == [30, 40, 50]
    assert sorted(os.listdir(tmp_path)) == ["run-1", "run-2"]  # no temp files left behind


def test_a_later_loop_of_the_same_run_is_newest_even_at_lower_steps(group: None, tmp_path: Path) -> None:
    ctx, *_keep = make_ctx(tmp_path, run_id=3)
    save_at(ctx, 30, 40, 50, 10, 20)
    assert steps_in(tmp_path / "run-3") == [50, 10, 20]
    assert folders.latest(ctx) == tmp_path / "run-3" / "step-00000020.pt"


def test_a_run_without_a_kernel_run_id_uses_the_config_name(group: None, tmp_path: Path) -> None:
    ctx, *_keep = make_ctx(tmp_path)
    assert folders.run_name(ctx) == "default"
    ctx.config = load_config({"name": "my exp/../x", "checkpoint": {"directory": str(tmp_path)}})
    assert folders.run_name(ctx) == "my-exp-..-x"
    save_at(ctx, 4)
    assert steps_in(tmp_path / "my-exp-..-x") == [4]


def test_resume_targets(group: None, tmp_path: Path) -> None:
    other, *_keep_a = make_ctx(tmp_path, run_id=7)
    save_at(other, 30, 40, 50)
    ctx, *_keep_b = make_ctx(tmp_path, run_id=8)
    assert folders.find(ctx, True) is None  # this run has none yet: start from step 0
    save_at(ctx, 10, 20)
    run7, run8 = tmp_path / "run-7", tmp_path / "run-8"
    assert folders.find(ctx, True) == run8 / "step-00000020.pt"
    for ref in (7, "7", "run-7", str(run7), run7, "run-7/"):
        assert folders.find(ctx, ref) == run7 / "step-00000050.pt", ref
    assert folders.find(ctx, run7 / "step-00000040.pt") == run7 / "step-00000040.pt"
    with pytest.raises(DtworkError, match=r"resume=9: no checkpoint in .*run-9; .*: run-7, run-8"):
        folders.find(ctx, 9)
    with pytest.raises(DtworkError, match="no checkpoint"):
        folders.find(ctx, str(tmp_path / "nowhere"))
    with pytest.raises(DtworkError, match="pass True"):
        folders.find(ctx, 1.5)


def test_load_restores_model_optimizer_and_every_rng(group: None, tmp_path: Path) -> None:
    ctx, model, opt = make_ctx(tmp_path, run_id=1)
    random.seed(5)
    np.random.seed(6)
    save_at(ctx, 1)
    expected = (torch.rand(3), random.random(), np.random.rand(2))
    weights = {k: v.clone() for k, v in model.state_dict().items()}
    moments = opt.state_dict()["state"][0]["exp_avg"].clone()
    with torch.no_grad():
        model.weight.add_(1.0)
    model(torch.randn(3, 4)).sum().backward()
    opt.step()
    state = checkpoint.load(ctx, tmp_path / "run-1" / "step-00000001.pt")
    assert all(torch.equal(v, weights[k]) for k, v in model.state_dict().items())
    assert torch.equal(opt.state_dict()["state"][0]["exp_avg"], moments)
    assert state["step"] == 1 and state["rng"]["torch"].device.type == "cpu"
    checkpoint.restore_rng(state["rng"])
    again = (torch.rand(3), random.random(), np.random.rand(2))
    assert torch.equal(again[0], expected[0]) and again[1] == expected[1]
    assert np.array_equal(again[2], expected[2])


def test_a_checkpoint_with_cuda_rng_entries_restores(group: None, tmp_path: Path) -> None:
    """A GPU run's checkpoint (its CUDA RNG states, one per device index) restores its ranks."""
    ctx, *_keep = make_ctx(tmp_path, run_id=1)
    save_at(ctx, 2)
    expected = torch.rand(4)
    path = tmp_path / "run-1" / "step-00000002.pt"
    payload = torch.load(path, weights_only=True)
    cuda_states = {i: torch.arange(16, dtype=torch.uint8) + i for i in (0, 1)}  # Philox: seed, offset
    payload["rng"][0]["cuda"] = cuda_states
    torch.save(payload, path)
    torch.rand(10)
    state = checkpoint.load(ctx, path)
    assert {i: t.device.type for i, t in state["rng"]["cuda"].items()} == {0: "cpu", 1: "cpu"}
    checkpoint.restore_rng(state["rng"])
    assert torch.equal(torch.rand(4), expected)
    if torch.cuda.is_available():  # each device that exists got its own state
        assert torch.equal(torch.cuda.get_rng_state(0), cuda_states[0])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_resume_on_the_gpu_restores_cuda_rng_and_device_state(group: None, tmp_path: Path) -> None:
    ctx, model, opt = make_ctx(tmp_path, run_id=1, device="cuda:0")
    save_at(ctx, 1)
    expected = torch.rand(4, device="cuda:0")
    torch.rand(100, device="cuda:0")
    state = checkpoint.load(ctx, tmp_path / "run-1" / "step-00000001.pt")
    assert model.weight.device.type == "cuda"
    assert opt.state_dict()["state"][0]["exp_avg"].device.type == "cuda"
    checkpoint.restore_rng(state["rng"])
    assert torch.equal(torch.rand(4, device="cuda:0"), expected)


class _RunsCode:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.marker,))


def test_a_checkpoint_that_would_run_code_is_refused(group: None, tmp_path: Path) -> None:
    ctx, *_keep = make_ctx(tmp_path, run_id=1)
    marker = tmp_path / "pwned"
    folder = tmp_path / "run-1"
    folder.mkdir()
    torch.save({"format": files.FORMAT, "loop": _RunsCode(marker)}, folder / "step-00000005.pt")
    path = folders.find(ctx, True)
    assert path is not None
    with pytest.raises(DtworkError, match="weights_only loading refuses .*add_safe_globals"):
        checkpoint.load(ctx, path)
    assert not marker.exists()
    torch.save({"loop": {"step": 1}}, folder / "step-00000006.pt")
    with pytest.raises(DtworkError, match="not a dtwork checkpoint"):
        checkpoint.load(ctx, folder / "step-00000006.pt")


def test_a_run_folder_belongs_to_its_store(group: None, tmp_path: Path) -> None:
    """Two notebooks whose stores both have a run 7 and share one checkpoint directory: the second
    is refused (before it would prune or resume the first's), the first goes on."""
    first, *_keep_a = make_ctx(tmp_path, run_id=7)
    first.run_store = "/home/a/.dtwork/runs.sqlite"
    save_at(first, 10, 20)
    assert (tmp_path / "run-7" / folders.OWNER).exists()
    second, *_keep_b = make_ctx(tmp_path, run_id=7)
    second.run_store = "/home/b/.dtwork/runs.sqlite"
    refused = (
        r"checkpoint folder .*run-7 holds run run-7 of the run store /home/a/.*, not of this one \(/home/b/"
    )
    for attempt in (
        lambda: folders.check_owner(second),
        lambda: folders.find(second, True),
        lambda: folders.find(second, 7),
        lambda: folders.find(second, "run-7"),
    ):
        with pytest.raises(DtworkError, match=refused):
            attempt()
    assert folders.find(second, tmp_path / "run-7") == tmp_path / "run-7" / "step-00000020.pt"  # named
    folders.check_owner(first)
    save_at(first, 30)
    assert steps_in(tmp_path / "run-7") == [10, 20, 30]
    second.run_store = None  # no kernel store (a script of its own): the folder is anyone's
    folders.check_owner(second)


def test_checkpoints_are_owner_only_and_no_temp_file_stays(group: None, tmp_path: Path) -> None:
    ctx, *_keep = make_ctx(tmp_path / "ckpt", run_id=4)
    ctx.run_store = "/some/runs.sqlite"
    old = os.umask(0o022)
    try:
        save_at(ctx, 1, 2)
    finally:
        os.umask(old)
    folder = tmp_path / "ckpt" / "run-4"
    for path in (tmp_path / "ckpt", folder):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    for path in folder.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    assert sorted(p.name for p in folder.iterdir()) == [
        folders.OWNER,
        "step-00000001.pt",
        "step-00000002.pt",
    ]


@pytest.fixture()
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A real 1 MiB tmpfs (root only): a disk that fills during a checkpoint."""
    mount = tmp_path / "small"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {done.stderr.decode().strip() or done.returncode}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)  # lazy: a file left open cannot keep it


def test_a_full_disk_removes_the_temp_file_and_says_no_space(group: None, small_disk: Path) -> None:
    ctx, *_keep = make_ctx(small_disk, run_id=2)
    big = torch.nn.Linear(512, 1024)  # 2 MiB of weights: more than the disk holds
    ctx.register("models", big)
    with pytest.raises(
        DtworkError, match=r"no space left in .*run-2 \(it needs about 2\.\d MiB, \d\.\d MiB free\)"
    ):
        save_at(ctx, 1)
    assert list((small_disk / "run-2").iterdir()) == []  # no temp file left on the full disk


def test_a_truncated_newest_checkpoint_is_skipped_for_the_one_before(group: None, tmp_path: Path) -> None:
    ctx, *_keep = make_ctx(tmp_path, run_id=5)
    save_at(ctx, 1, 2)
    newest = tmp_path / "run-5" / "step-00000002.pt"
    newest.write_bytes(newest.read_bytes()[: newest.stat().st_size // 2])  # torn mid-write
    with pytest.warns(
        DtworkWarning, match=r"step-00000002\.pt cannot be read .*the one before, .*step-00000001\.pt"
    ):
        found = checkpoint.resume_from(ctx, True)
    assert found is not None and found[0].name == "step-00000001.pt" and found[1]["step"] == 1
    with pytest.raises(DtworkError, match=r"checkpoint .*step-00000002\.pt cannot be read"):
        checkpoint.resume_from(ctx, newest)  # a file named on purpose is not swapped for another
    rewritten = tmp_path / "run-5" / "step-00000001.pt"
    rewritten.write_bytes(b"")  # now the newest, and empty
    # Written order is modification time, which two writes within one clock tick can share.
    later = newest.stat().st_mtime_ns + 1_000_000
    os.utime(rewritten, ns=(later, later))
    with warnings.catch_warnings(), pytest.raises(DtworkError, match=r"step-00000002\.pt cannot be read"):
        warnings.simplefilter("ignore", DtworkWarning)
        checkpoint.resume_from(ctx, True)  # none readable: the oldest one's error


# -- two experiments sharing one checkpoint directory, on the 2-rank cluster ------------------


def test_a_pending_folder_loads_by_its_name_and_adopt_keeps_a_run_folder_there(group, tmp_path) -> None:
    ctx, _, _ = make_ctx(tmp_path, run_id=3)
    ctx.run_store, ctx.run_folder = "store.sqlite", "pending-abc-1"  # a run a loop began mid-cell
    checkpoint.save(ctx, {"step": 5, "epoch": 0, "micro": 0})
    pending = tmp_path / "pending-abc-1"
    # a kernel that died before the next cell: the folder keeps its name, and loads by it
    assert folders.find(ctx, "pending-abc-1") == pending / "step-00000005.pt"
    assert not (tmp_path / "run-3").exists()
    (tmp_path / "run-4").mkdir()  # a folder of that run already there: neither is touched
    with pytest.warns(DtworkWarning, match="resume='pending-abc-1' loads them"):
        folders.adopt(ctx, "pending-abc-1", 4)
    assert steps_in(pending) == [5] and steps_in(tmp_path / "run-4") == []
    folders.adopt(ctx, "pending-abc-1", 5)
    assert steps_in(tmp_path / "run-5") == [5] and not pending.exists()
    assert '"run": "run-5"' in (tmp_path / "run-5" / "run.json").read_text()
