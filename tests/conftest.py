"""Shared by tests/unit (no engines) and tests/cluster (engines, process groups, kernels, servers):
isolated state dirs, and tests/ on the import path for the helper modules kept here."""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

import pytest

# Isolate dtwork's per-user registry and the run store before anything imports dtwork.
_STATE = Path(tempfile.mkdtemp(prefix="dtwork-tests-"))
os.environ.setdefault("DTWORK_HOME", str(_STATE / "home"))
os.environ.setdefault("DTWORK_STORE", str(_STATE / "runs.sqlite"))
os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")

# torchrun_ref, slurm_fixtures, jupyter_server_fixtures and background live here, beside the two folders.
TESTS = Path(__file__).resolve().parent
UNIT = TESTS / "unit"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The quick tests/unit first; in tests/cluster the tests that stop every cluster (`no_cluster`)
    last, so the shared cluster starts once rather than again after each of them."""

    def order(item: pytest.Item) -> tuple[bool, bool]:
        return UNIT not in item.path.parents, "no_cluster" in getattr(item, "fixturenames", ())

    items.sort(key=order)


def pytest_collection_finish(session: pytest.Session) -> None:
    """Slow checks of their own processes (tests/background.py): begun now, they overlap the unit tests."""
    import background

    if session.config.option.collectonly:
        return
    for item in session.items:
        if item.name in background.JOBS:
            background.start(item.name)


@pytest.fixture(scope="session")
def state_dir() -> Path:
    return _STATE
