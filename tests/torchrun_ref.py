"""torchrun as the reference run of a test: ``python -m torch.distributed.run`` with 2 CPU processes.

Now and then (3 of 28 launches of the DDP tutorial here, torch 2.13, none with the tests' own
arguments in 16) a rank of a finished run aborts at exit with "terminate called without an active
exception", after its outputs are written: torch's teardown, not the script. Such a launch is
run again, at most twice; any other failure fails the test at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
TEARDOWN_ABORT = "terminate called without an active exception"


def torchrun(script: Path, args: list[str], cwd: Path, timeout: float = 300) -> str:
    """Run ``script`` under torchrun; its stdout (fails the test on an error)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    for _ in range(3):
        proc = subprocess.run(
            [*TORCHRUN, str(script), *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
        )
        if proc.returncode == 0 or TEARDOWN_ABORT not in proc.stdout + proc.stderr:
            break
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout
