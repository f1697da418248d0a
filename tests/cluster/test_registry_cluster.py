"""The cluster registry: private files, validated entries, per-host staleness, malformed files.

Its tests that need engines (a cluster, a kernel, a process group across processes); the others are
in tests/unit/test_registry.py.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import dtwork
from dtwork.errors import DtworkWarning
from dtwork.launch import registry
from tests.unit import test_registry as unit_tests
from tests.unit.test_registry import raw

home = unit_tests.home  # a fixture, used by name


def test_a_malformed_file_never_breaks_a_start(home: Path) -> None:
    raw(home, "broken.json", "{")
    with pytest.warns(DtworkWarning, match="skipping registry file .*broken.json"):
        with dtwork.start(n=1, backend="gloo", timeout=60) as c:
            assert c.run(lambda: 6 * 7) == [42]
            assert registry.entry_path(c.cluster_id).exists()
    assert (home / "clusters" / "broken.json").exists()
