"""How fast a rank killed with SIGKILL during a background cell is named (2 gloo ranks, --timeout 60).

``python -m benchmarks.dead_rank [TRIALS]``: for each trial, a ``%%dtrain --bg`` cell trains; the
kernel kills rank 1's engine; the times from the kill to the "rank 1 failed" line (the watcher's
``dead``), to the background cell's end, and to ``%dtrain wait`` raising the failure naming it
are printed, then their medians. The cluster restarts between trials (the session replaces the dead
engines).
"""

from __future__ import annotations

import os
import signal
import statistics
import sys
import time

import dtwork
from dtwork.errors import RankFailure

CELL = """
import torch, torch.distributed as dist, time
t = torch.ones(1)
for i in range(100000):
    dist.all_reduce(t)  # gloo releases rank 0 when its peer's socket closes
    time.sleep(0.01)
"""
NEVER = """
import torch, torch.distributed as dist, time
t = torch.ones(1)
dist.all_reduce(t)
while True:
    time.sleep(0.05)  # as NCCL: the backend never releases rank 0
"""


def trial(cluster: dtwork.Cluster, cell: str) -> tuple[float, float, float]:
    session = cluster.session
    cluster.run(cell, quiet=True, bg=True)
    watcher = session.background
    assert watcher is not None
    time.sleep(1.0)  # the loop is under way
    pid = cluster.rank_info[1]["pid"]
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    named = ended = None
    while ended is None:
        now = time.monotonic() - t0
        if named is None and watcher.dead:
            named = now
        if watcher.done.is_set():
            ended = now
        time.sleep(0.01)
    try:
        session.wait_background()
    except RankFailure as exc:
        assert "rank 1" in str(exc), exc
    raised = time.monotonic() - t0
    return named if named is not None else float("nan"), ended, raised


def main() -> None:
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    with dtwork.start(n=2, backend="gloo", timeout=60) as cluster:
        cluster.session.live = False
        cluster.run("import torch, torch.distributed", quiet=True)
        for name, cell in (("released", CELL), ("never released", NEVER)):
            rows = []
            for i in range(trials):
                rows.append(trial(cluster, cell))
                print(
                    f"{name} trial {i + 1}: named {rows[-1][0]:.2f} s, cell ended {rows[-1][1]:.2f} s, "
                    f"%dtrain wait raised {rows[-1][2]:.2f} s",
                    flush=True,
                )
                cluster.run("import torch, torch.distributed", quiet=True)  # fresh engines ready
            med = [statistics.median(r[k] for r in rows) for k in range(3)]
            print(
                f"{name} median of {trials}: named {med[0]:.2f} s, ended {med[1]:.2f} s, raised {med[2]:.2f} s"
            )


if __name__ == "__main__":
    main()
