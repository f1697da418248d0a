"""Slow checks that need no engines of the tests' own, begun as soon as their tests are collected.

A check that waits on the network (the GPU preparation step: ~57 MiB of wheels), runs in a process
of its own (mypy over the package) or drives a server and browser of its own (the sidebar's
Playwright suite, ten minutes of mostly waiting) runs beside the tests from the start, and its test
only waits for the end and reads the result. Under xdist the controller starts the jobs once every
worker has collected (``pytest_xdist_node_collection_finished``), so no worker's lane holds them;
the jobs' files (``out``, ``rc``, ``pid``) lie in a folder every worker shares
(``DTWORK_BACKGROUND_DIR``, made by tests/conftest.py before the workers start).
"""

from __future__ import annotations

import atexit
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _browser_wanted() -> bool:
    """As tests/cluster/test_panel_browser.py decides: opted in, with node and jlpm on PATH."""
    return (
        os.environ.get("DTWORK_BROWSER_TESTS") == "1"
        and shutil.which("node") is not None
        and shutil.which("jlpm") is not None
    )


# a test's name -> the command it checks ("{dir}": a fresh folder of the job's own) and whether it runs here
JOBS: dict[str, tuple[list[str], Callable[[], bool]]] = {
    "test_prepare_fetches_a_complete_set_of_what_the_gpu_machine_lacks": (
        ["bash", "benchmarks/gpu/prepare.sh", "{dir}"],
        lambda: True,
    ),
    "test_mypy_finds_nothing_in_the_package": ([sys.executable, "-m", "mypy", "dtwork"], lambda: True),
    "test_panel_in_browser": (["bash", "extension/ui-tests/run.sh"], _browser_wanted),
}
_mine: list[int] = []  # process groups this process started, ended if the session ends first


def _folder(test: str) -> Path:
    shared = os.environ.get("DTWORK_BACKGROUND_DIR")
    if not shared:
        raise RuntimeError("DTWORK_BACKGROUND_DIR is unset: tests/conftest.py sets it before any test")
    return Path(shared) / test


def start(test: str) -> None:
    """Begin ``test``'s command once per session (whichever process gets here first)."""
    command, wanted = JOBS[test]
    folder = _folder(test)
    try:
        folder.mkdir(parents=True)  # atomic: one process starts the job
    except FileExistsError:
        return
    if not wanted():
        (folder / "rc").write_text("skipped")
        return
    work = folder / "work"
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    # The shell writes the exit code once the command ends, whichever process waits for it.
    script = '"$@" > "$OUT_FILE" 2>&1; echo $? > "$RC_FILE.tmp"; mv "$RC_FILE.tmp" "$RC_FILE"'
    proc = subprocess.Popen(
        ["bash", "-c", script, "job", *[arg.replace("{dir}", str(work)) for arg in command]],
        cwd=ROOT,
        env={**env, "OUT_FILE": str(folder / "out"), "RC_FILE": str(folder / "rc")},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # a hang is ended with everything it started
    )
    (folder / "pid").write_text(str(proc.pid))
    _mine.append(proc.pid)


@atexit.register
def _end_mine() -> None:
    for pid in _mine:
        try:
            os.killpg(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def result(test: str, timeout: float) -> tuple[int, str, Path]:
    """The command's exit code, output and folder, started now if nothing started it earlier. Past
    ``timeout`` (from now) its process group is ended and the test fails with the output's tail."""
    start(test)
    folder = _folder(test)
    rc, deadline = folder / "rc", time.monotonic() + timeout
    while not rc.exists() and time.monotonic() < deadline:
        time.sleep(0.5)
    out = (folder / "out").read_text(errors="replace") if (folder / "out").exists() else ""
    if not rc.exists():
        try:
            os.killpg(int((folder / "pid").read_text()), signal.SIGTERM)
        except (OSError, ValueError):
            pass
        raise AssertionError(f"{JOBS[test][0]!r:.80} did not finish in {timeout:.0f} s:\n{out[-3000:]}")
    code = rc.read_text().strip()
    if code == "skipped":
        raise AssertionError(f"{test}: its background job was not wanted here; the test should have skipped")
    return int(code), out, folder / "work"


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
