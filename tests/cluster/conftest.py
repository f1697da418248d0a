"""Fixtures of the tests that need engines: one real 2-rank gloo cluster for the whole session,
started by the first test that asks for it (tests/unit never does)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def cluster(state_dir: Path) -> Iterator[object]:
    """A real 2-rank CPU cluster (ipyparallel engines + gloo process group)."""
    import dtwork

    c = dtwork.start(n=2, backend="gloo", timeout=60)
    c.session.live = False
    yield c
    c.stop()


def _mend(c: Any) -> None:
    engines = set(c.client.ids) if c.client is not None else set()
    if c.state != "running" or not {r["engine_id"] for r in c.rank_info} <= engines:
        c.restart(force=True)


@pytest.fixture(autouse=True)
def _healthy_cluster(request: pytest.FixtureRequest) -> Iterator[None]:
    """Hand a test that uses the shared cluster a running one (a test before it may have stopped it
    to start its own), and mend it after a test that broke it (a killed rank...)."""
    uses = "cluster" in request.fixturenames
    if uses:
        _mend(request.getfixturevalue("cluster"))
    yield
    if uses:
        _mend(request.getfixturevalue("cluster"))


@pytest.fixture()
def no_cluster() -> Iterator[None]:
    """No running cluster in this process: for a test that starts its own with %dtrain start, which
    refuses to start a second (the shared one restarts before the next test that uses it)."""
    from dtwork import cluster as clusters

    clusters.stop_all()
    yield


@pytest.fixture()
def fresh_run(cluster: object) -> Iterator[object]:
    """Give each test its own run in the store and default config on every rank."""
    cluster.configure(None)  # type: ignore[attr-defined]
    yield cluster


@pytest.fixture()
def ip(cluster: Any) -> Iterator[Any]:
    """An IPython shell whose %dtrain drives the shared cluster."""
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "dtwork")
    yield shell
