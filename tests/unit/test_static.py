"""The code passes its own linters: ruff (lint and format) on the tree, mypy on the package (pyproject.toml)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import background

ROOT = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600
    )


def test_ruff_finds_nothing() -> None:
    proc = _run("ruff", "check", ".")
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]


def test_the_tree_is_formatted() -> None:
    proc = _run("ruff", "format", "--check", ".")
    assert proc.returncode == 0, "run `ruff format .`:\n" + proc.stdout[-4000:] + proc.stderr[-2000:]


def test_mypy_finds_nothing_in_the_package() -> None:
    # begun at collection beside the other unit tests (tests/background.py): a minute cold
    code, out, _ = background.result("test_mypy_finds_nothing_in_the_package", timeout=900)
    assert code == 0, out[-6000:]
    assert "Success" in out
