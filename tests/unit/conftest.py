"""The unit tests' own setup: no engines here (tests/cluster/conftest.py holds the cluster fixtures)."""

from __future__ import annotations

import gc

import pytest


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what importing and collecting made (modules, test items, Hypothesis strategies) out of
    the collector's reach, so that a full ``gc.collect()`` in the code under test (a loop's start, a
    checkpoint) scans only what the tests themselves create."""
    gc.freeze()
