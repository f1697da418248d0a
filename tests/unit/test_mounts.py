"""The run store uses SQLite's WAL on a local filesystem only, a rollback journal elsewhere."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from dtwork.store import mounts
from dtwork.store.runs import RunStore


def _mounts(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "mounts"
    path.write_text("".join(f"{line} 0 0\n" for line in lines))
    return path


def test_the_longest_mount_point_that_holds_the_path_names_its_type(tmp_path) -> None:
    table = _mounts(
        tmp_path,
        [
            "overlay / overlay rw",
            "server:/export /mnt/shared nfs4 rw,vers=4.2",
            "/dev/sdb1 /mnt/my\\040disk ext4 rw",
        ],
    )
    assert mounts.filesystem_type("/mnt/shared/lab/runs.sqlite", table) == "nfs4"
    assert mounts.filesystem_type("/mnt/shared", table) == "nfs4"
    assert mounts.filesystem_type("/mnt/sharedother/x", table) == "overlay"  # not a folder of it
    assert mounts.filesystem_type("/mnt/my disk/x", table) == "ext4"
    assert mounts.filesystem_type("/x", tmp_path / "missing") is None


def _journal(path: Path) -> str:
    conn = sqlite3.connect(path)
    try:
        return str(conn.execute("PRAGMA journal_mode").fetchone()[0])
    finally:
        conn.close()


def test_a_store_on_a_local_filesystem_uses_wal(tmp_path, capsys) -> None:
    with RunStore(tmp_path / "runs.sqlite") as s:
        s.add_event(None, "x", "y")
    assert _journal(tmp_path / "runs.sqlite") == "wal"
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("kind", ["nfs", "cifs", "fuse.sshfs"])
def test_a_store_on_a_network_filesystem_uses_a_rollback_journal_said_once(
    tmp_path, monkeypatch, capsys, kind
) -> None:
    folder = tmp_path / "shared"
    folder.mkdir()
    table = _mounts(tmp_path, ["overlay / overlay rw", f"server:/x {folder.resolve()} {kind} rw"])
    monkeypatch.setattr(mounts, "MOUNTS", table)
    path = folder / "runs.sqlite"
    for _ in range(2):
        with RunStore(path) as s:
            s.add_event(None, "x", "y")
    assert _journal(path) == "delete"
    with RunStore(path, readonly=True) as s:
        assert len(s.events(None)) == 2
    said = capsys.readouterr().err.splitlines()
    assert len(said) == 1 and f"({kind})" in said[0] and "rollback journal" in said[0]
