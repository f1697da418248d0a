"""Slow checks that need no engines, begun as soon as their tests are collected.

In one process (``pytest -n 0``) pytest runs the unit tests first, on one core; a check that waits
on the network (the GPU preparation step: ~57 MiB of wheels) or runs in a process of its own (mypy
over the package) runs beside them on the other core, and its test only waits for the end and
reads the result. On xdist's workers (the default) each job starts at its test's turn instead.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# a test's name -> the command it checks ("{dir}": a fresh folder of the job's own)
JOBS: dict[str, list[str]] = {
    "test_prepare_fetches_a_complete_set_of_what_the_gpu_machine_lacks": [
        "bash",
        "benchmarks/gpu/prepare.sh",
        "{dir}",
    ],
    "test_mypy_finds_nothing_in_the_package": [sys.executable, "-m", "mypy", "dtwork"],
}
_started: dict[str, tuple[subprocess.Popen[str], Path]] = {}


def start(test: str) -> None:
    """Begin ``test``'s command (once per session)."""
    if test in _started:
        return
    folder = Path(tempfile.mkdtemp(prefix="dtwork-background-"))
    proc = subprocess.Popen(
        [arg.replace("{dir}", str(folder)) for arg in JOBS[test]],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a hang is ended with everything it started
    )
    _started[test] = (proc, folder)
    atexit.register(_end, proc)  # a session that ends before the test leaves nothing running


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)


def result(test: str, timeout: float) -> tuple[int, str, Path]:
    """The command's exit code, output and folder, started now if nothing started it earlier."""
    start(test)
    proc, folder = _started[test]
    out = wait(proc, timeout)
    return proc.returncode, out, folder


def wait(proc: subprocess.Popen[str], timeout: float) -> str:
    """``proc``'s output once it ends; past ``timeout`` its whole process group is ended (it runs
    in a session of its own) and the test fails with the output's tail."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        raise AssertionError(f"{proc.args!r:.80} did not finish in {timeout:.0f} s:\n{out[-3000:]}") from None
    return out
