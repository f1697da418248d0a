"""Security properties of a running cluster and of the /dtwork/ server routes.

Its tests that need no engines; the others are in tests/cluster/test_security.py.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dtwork.store.runs import RunStore


def test_a_store_folder_dtwork_makes_is_owner_only(tmp_path: Path) -> None:
    mask = os.umask(0o022)  # the usual umask: files 0644, folders 0755 unless dtwork says otherwise
    try:
        with RunStore(tmp_path / "work" / ".dtwork" / "runs.sqlite") as s:
            s.add_event(None, "start", "made")
        (tmp_path / "mine").mkdir()
        with RunStore(tmp_path / "mine" / "runs.sqlite") as s:
            s.add_event(None, "start", "made")
    finally:
        os.umask(mask)
    assert stat.S_IMODE((tmp_path / "work" / ".dtwork").stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "work").stat().st_mode) == 0o755  # a parent: the user's to set
    assert stat.S_IMODE((tmp_path / "mine").stat().st_mode) == 0o755  # the user's folder, left as it is
    for path in (tmp_path / "work" / ".dtwork" / "runs.sqlite", tmp_path / "mine" / "runs.sqlite"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
