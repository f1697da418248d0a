"""Which filesystem holds a path: SQLite's WAL journal works only on a local one.

WAL keeps its index in shared memory next to the database, which network filesystems (NFS,
SMB, sshfs...) do not share between hosts; there the store uses a rollback journal.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

MOUNTS = Path("/proc/mounts")
# Filesystem types where SQLite's WAL is unsafe: shared over a network (or a host boundary).
NETWORK_TYPES = frozenset(
    {
        "nfs", "nfs4", "cifs", "smb", "smb3", "smbfs", "sshfs", "fuse.sshfs", "9p", "afs", "ncpfs",
        "coda", "ceph", "fuse.ceph", "glusterfs", "fuse.glusterfs", "lustre", "gpfs", "beegfs",
        "ocfs2", "gfs2", "davfs", "fuse.davfs", "fuse.s3fs", "fuse.rclone", "fuse.gcsfuse",
        "fuse.juicefs", "fuse.weka",
    }
)  # fmt: skip
_said: set[str] = set()


def _unescape(field: str) -> str:
    """/proc/mounts writes a space in a mount point as \\040 (and tab, newline, backslash alike)."""
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def filesystem_type(path: str | os.PathLike[str], mounts: Path | None = None) -> str | None:
    """The type of the filesystem mounted where ``path`` lives (the longest matching mount point)."""
    try:
        lines = (mounts or MOUNTS).read_text().splitlines()
    except OSError:  # not Linux, or no /proc: nothing known
        return None
    target = os.path.realpath(path)
    best, kind = "", None
    for line in lines:
        fields = line.split()
        if len(fields) < 3:
            continue
        point = _unescape(fields[1])
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= len(best):
            best, kind = point, fields[2]
    return kind


def journal_mode(database: Path, mounts: Path | None = None) -> str:
    """``WAL`` for a database on a local filesystem, ``DELETE`` (a rollback journal) elsewhere.

    The first time a database gets a rollback journal this process says so, in one line.
    """
    kind = filesystem_type(database.parent, mounts)
    if kind is None or kind not in NETWORK_TYPES:
        return "WAL"
    if str(database) not in _said:
        _said.add(str(database))
        print(
            f"dtwork: the run store {database} is on a network filesystem ({kind}): it uses a rollback "
            "journal, as SQLite's WAL is unsafe there (a store on a local disk writes faster)",
            file=sys.stderr,
        )
    return "DELETE"
