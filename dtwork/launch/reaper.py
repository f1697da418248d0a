"""Reaper: a tiny process per cluster that kills the cluster's processes when its kernel dies.

Started detached by ``Cluster.start`` as ``python -m dtwork.launch.reaper ENTRY.json``. It exits
on its own when the entry file disappears (the cluster was stopped normally). A dead kernel's
scheduler jobs (Slurm) are cancelled with ``scancel``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from dtwork.launch import registry

POLL_SECONDS = 0.5


def watch(path: Path) -> int:
    """Wait until the kernel named in the entry dies or the entry is removed."""
    while True:
        data = registry.read(path)
        if data is None:
            return 0  # stopped normally (or removed by a cleaner)
        if not registry.alive(data.get("kernel")):
            registry.discard(data)  # its processes, its scheduler jobs, its files
            return 0
        time.sleep(POLL_SECONDS)


if __name__ == "__main__":
    sys.exit(watch(Path(sys.argv[1])))
