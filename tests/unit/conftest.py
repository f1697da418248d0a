"""The unit tests' own setup: no engines here (tests/cluster/conftest.py holds the cluster fixtures)."""

from __future__ import annotations

import gc
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from dtwork.launch import registry


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what importing and collecting made (modules, test items, Hypothesis strategies) out of
    the collector's reach, so that a full ``gc.collect()`` in the code under test (a loop's start, a
    checkpoint) scans only what the tests themselves create."""
    gc.freeze()


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    """A live process a registry entry can name (an engine, a kernel that holds a cluster)."""
    proc = subprocess.Popen(["sleep", "120"])
    yield proc
    if proc.poll() is None:
        proc.kill()
    proc.wait()


@pytest.fixture
def dead_kernel() -> dict[str, Any]:
    """The process record of a kernel that has exited (dead on this host)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    rec = registry.proc_record(proc.pid)
    proc.wait()
    assert rec is not None
    return rec
