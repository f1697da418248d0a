"""FSDP checkpoints through torch.distributed.checkpoint: written sharded by 2 real gloo ranks,
resumed on 2 ranks and on 1 (a one-rank gloo group in this process), exported to one file.

Its tests that need no engines; the others are in tests/cluster/test_fsdp_checkpoint.py.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch.distributed as dist

from dtwork.errors import DtworkWarning
from dtwork.runtime.checkpoint import files, folders
from dtwork.runtime.checkpoint import trial as checkpoint
from tests.cluster.test_fsdp_checkpoint import _cell, _on_one_rank


@pytest.fixture()
def one_rank(tmp_path: Path) -> Iterator[None]:
    """A real gloo process group of one rank in this process."""
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def test_a_damaged_newest_dcp_folder_is_skipped_for_the_one_before(one_rank: None, tmp_path: Path) -> None:
    ns = _on_one_rank(tmp_path, _cell(4, False), every=2)
    (run,) = [p for p in tmp_path.iterdir() if p.is_dir() and p.name != "pg"]
    assert [p.name for p in folders.checkpoints(run)] == ["step-00000002.dcp", "step-00000004.dcp"]
    newest = run / "step-00000004.dcp"
    shard = newest / "__0_0.distcp"
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # torn on disk
    with pytest.warns(
        DtworkWarning, match=r"step-00000004\.dcp cannot be read .*the one before, .*step-00000002"
    ):
        found = checkpoint.resume_from(ns["ctx"].state, True)
    assert found is not None and found[1]["step"] == 2
    (newest / ".metadata").unlink()
    with pytest.raises(files.UnreadableCheckpoint, match=r"no \.metadata"):
        checkpoint.resume_from(ns["ctx"].state, newest)
    shutil.rmtree(newest)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DtworkWarning)
        assert checkpoint.resume_from(ns["ctx"].state, True)[1]["step"] == 2  # type: ignore[index]
