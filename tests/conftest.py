"""Shared by tests/unit (no engines) and tests/cluster (engines, process groups, kernels, servers):
isolated state dirs, and tests/ on the import path for the helper modules kept here."""

from __future__ import annotations

import os
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

import pytest

# Isolate dtwork's per-user registry and the run store before anything imports dtwork.
_STATE = Path(tempfile.mkdtemp(prefix="dtwork-tests-"))
os.environ.setdefault("DTWORK_HOME", str(_STATE / "home"))
os.environ.setdefault("DTWORK_STORE", str(_STATE / "runs.sqlite"))
os.environ.setdefault("PYTHONWARNINGS", "ignore::DeprecationWarning")
# tests/background.py's jobs: made here in the first process, inherited by xdist's workers.
os.environ.setdefault("DTWORK_BACKGROUND_DIR", str(_STATE / "background"))

# torchrun_ref, slurm_fixtures, jupyter_server_fixtures and background live here, beside the two folders.
TESTS = Path(__file__).resolve().parent
UNIT = TESTS / "unit"
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))


# What a test shares with others in its lane: the session's 2-rank cluster, or a daemon of the machine.
SHARED = {"cluster", "slurm", "openmpi"}
# The files of the longest tests outside that lane, longest first (minutes, then the linters' ~1).
LONGEST = [
    "test_benchmarks_smoke.py",
    "test_notebooks.py",
]
# Tests that need extension/node_modules, which the browser job installs first: they come late, not waiting.
NODE = {"test_panel_lint.py", "test_panel_unit.py"}


@pytest.hookimpl(tryfirst=True)  # before xdist's own hook reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The quick tests/unit first; in tests/cluster the tests that stop every cluster (`no_cluster`)
    last, so the shared cluster starts once rather than again after each of them.

    With pytest-xdist (addopts: ``-n 2 --dist loadgroup``) the tests that use the shared cluster,
    Slurm, Open MPI or network namespaces run in one lane, in this order, on one worker; every other
    test (the unit tests, kernels, notebooks) is spread over the other workers; the browser suite, mypy
    and the GPU preparation run as background jobs beside them all (tests/background.py)."""

    import background

    spread = bool(os.environ.get("PYTEST_XDIST_WORKER"))

    def order(item: pytest.Item) -> tuple[int, bool, bool]:
        # xdist hands tests out in this order: the longest begin first, so none of them ends the run alone;
        # a test whose check runs in the background from the start comes last, when it has ended
        rank = LONGEST.index(item.path.name) if spread and item.path.name in LONGEST else len(LONGEST)
        rank += len(LONGEST) + 1 if item.path.name in NODE else 0
        rank += len(LONGEST) + 2 if item.name in background.JOBS else 0
        return rank, UNIT not in item.path.parents, "no_cluster" in getattr(item, "fixturenames", ())

    items.sort(key=order)
    for item in items:
        if SHARED & set(getattr(item, "fixturenames", ())) or item.get_closest_marker("netns"):
            item.add_marker(pytest.mark.xdist_group("shared"))


def pytest_collection_finish(session: pytest.Session) -> None:
    """Slow checks of their own processes (tests/background.py): begun now, they overlap the other tests."""
    if session.config.option.collectonly or os.environ.get("PYTEST_XDIST_WORKER"):
        return  # on xdist the controller starts them, once its workers have collected (below)
    _start_background(item.name for item in session.items)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_node_collection_finished(node: object, ids: list[str]) -> None:
    _start_background(nodeid.rpartition("::")[2] for nodeid in ids)


def _start_background(names: Iterable[str]) -> None:
    import background

    for name in set(names) & set(background.JOBS):
        background.start(name)  # once per session, whichever worker's list comes first


@pytest.fixture(scope="session")
def state_dir() -> Path:
    return _STATE
