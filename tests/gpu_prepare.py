"""benchmarks/gpu/prepare.sh run once per test session, begun as soon as its test is collected.

The step downloads ~57 MiB of wheels: mostly waiting on the network, so it runs beside the unit
tests (which run first and keep the CPU busy) instead of adding its whole time to the suite's.
"""

from __future__ import annotations

import atexit
import os
import signal
import subprocess
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TEST = "test_prepare_fetches_a_complete_set_of_what_the_gpu_machine_lacks"
_started: tuple[subprocess.Popen[str], Path] | None = None


def start() -> None:
    """Begin prepare.sh into a fresh folder (once per session)."""
    global _started
    if _started is not None:
        return
    folder = Path(tempfile.mkdtemp(prefix="dtwork-gpu-wheels-"))
    proc = subprocess.Popen(
        ["bash", "benchmarks/gpu/prepare.sh", str(folder)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,  # a hang is ended with everything it started
    )
    _started = (proc, folder)
    atexit.register(_end, proc)  # a session that ends before the test leaves nothing running


def _end(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)


def result(timeout: float) -> tuple[int, str, Path]:
    """prepare.sh's exit code, output and folder, started now if nothing started it earlier."""
    start()
    assert _started is not None
    proc, folder = _started
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGTERM)
        out, _ = proc.communicate(timeout=60)
        raise AssertionError(f"prepare.sh did not finish in {timeout:.0f} s:\n{out[-3000:]}") from None
    return proc.returncode, out, folder
