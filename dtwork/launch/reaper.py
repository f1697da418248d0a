"""Reaper: a tiny process per cluster that kills the cluster's processes when its kernel dies.

Started detached by ``Cluster.start`` as ``python -m dtwork.launch.reaper ENTRY.json``. It exits
on its own when the entry file disappears (the cluster was stopped normally). A dead kernel's
scheduler jobs (Slurm) are cancelled with ``scancel``. A kept cluster (``--keep``) outlives its
kernel: the reaper notes when the kernel went, keeps watching, follows a kernel that attaches
(``%dtrain attach`` writes itself into the entry), and ends the cluster when the keep time is up.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from dtwork.launch import registry

POLL_SECONDS = 0.5


def watch(path: Path) -> int:
    """Wait until the kernel named in the entry dies (a kept cluster: its keep time after) or the
    entry is removed."""
    cluster_id = path.stem
    while True:
        with registry.locked(cluster_id):  # an attaching kernel decides under the same lock
            data = registry.read(path)
            if data is None:
                return 0  # stopped normally (or removed by a cleaner)
            if not registry.alive(data.get("kernel")):
                if not data.get("keep"):
                    registry.discard(data)  # its processes, its scheduler jobs, its files
                    return 0
                if data.get("orphaned_at") is None:
                    registry.write(cluster_id, {**data, "orphaned_at": time.time()})
                elif registry.time_left(data) == 0:
                    registry.discard(data, why=registry.ended_why(data))
                    return 0
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    sys.exit(watch(Path(sys.argv[1])))
