"""A new user's first steps without engines: a default batch for ``ctx.loader``, the reference an
install ships (``dtwork help``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import tomllib
import torch
from torch.utils.data import TensorDataset

from dtwork import cli
from dtwork.commands.reference import INSTALLED, help_text, reference_path
from dtwork.config import load_config
from dtwork.errors import DtworkError
from dtwork.runtime.core.state import RankState
from dtwork.runtime.loop.data import DEFAULT_PER_SLOT, make_loader

ROOT = Path(__file__).resolve().parents[2]


def test_a_loader_with_no_batch_set_takes_the_default_and_says_so(capsys: pytest.CaptureFixture[str]) -> None:
    state = RankState(0, 2, 0, torch.device("cpu"), "gloo", load_config(None))
    loader = make_loader(state, TensorDataset(torch.arange(256.0)))
    assert loader.batch_size == DEFAULT_PER_SLOT == 32
    said = capsys.readouterr().out
    assert said.count("\n") == 1 and "32 per rank (global 64)" in said and "--global-batch-size" in said
    assert make_loader(state, TensorDataset(torch.arange(8.0)), batch_size=4).batch_size == 4


def test_the_wheel_ships_the_reference_where_dtwork_help_looks(tmp_path: Path) -> None:
    data_files = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["data-files"]
    assert data_files[str(INSTALLED.parent)] == ["docs/reference.md"]
    installed = tmp_path / INSTALLED  # as pip lays the data-files out under a prefix
    installed.parent.mkdir(parents=True)
    installed.write_text("### `ctx.loader`\n\nthe loader\n\n### `%dtrain start`\n\nstarts\n")
    assert reference_path([str(tmp_path)]) == installed
    assert reference_path([str(tmp_path / "empty")]) == ROOT / "docs" / "reference.md"  # a checkout
    assert "the loader" in help_text("loader", installed) and "starts" in help_text("start", installed)
    with pytest.raises(DtworkError, match=r"no section 'lodaer'.*did you mean ctx.loader"):
        help_text("lodaer", installed)


def test_dtwork_help_names_the_reference_and_prints_a_section(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["help"]) == 0
    assert str(reference_path()) in capsys.readouterr().out
    assert cli.main(["help", "ctx.loader"]) == 0
    assert "DistributedSampler" in capsys.readouterr().out
    assert cli.main(["help", "nothing-like-it"]) == 1
