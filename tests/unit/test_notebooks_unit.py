"""The walkthrough notebooks execute headlessly (nbclient, kernel python3) and say what they should.

Its tests that need no engines; the others are in tests/cluster/test_notebooks.py.
"""

from __future__ import annotations

import pytest

from tests.cluster.test_notebooks import EXPECTED, NOTEBOOKS


def test_notebooks_are_committed_without_outputs() -> None:
    nbformat = pytest.importorskip("nbformat")
    for name in [*EXPECTED, "quickstart.ipynb"]:
        nb = nbformat.read(NOTEBOOKS / name, as_version=4)
        assert all(not c.get("outputs") for c in nb.cells if c.cell_type == "code"), name
