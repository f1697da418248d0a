"""A kernel killed (SIGKILL) at any moment of ``%dtrain start`` leaves no process of that start.

Real kernels through jupyter_client, each killed at a point of its start seen from outside (the
registry entry, the controller's process, the engines', their nannies', the ranks' plan), never
at a fixed time; then the test waits for "none left", bounded by the 30 s the issue allows. The
kernels are started together, before the first test, so that their start-ups overlap.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from real_kernel import start_kernel

from dtwork.launch import registry

LEFT_WITHIN = 30.0  # the bound on a killed start's processes
POINT_WITHIN = 90.0  # how long a start may take to reach a point on a busy 2-core machine


def start_processes(kernel_pid: int) -> list[psutil.Process]:
    """The live processes a start of this kernel made: those carrying its clusters' mark, and their
    reapers (named by their entry's file)."""
    prefix = f"dtwork-{kernel_pid}-"
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmd = " ".join(proc.info["cmdline"] or ())
            if "ipyparallel" not in cmd and "dtwork.launch.reaper" not in cmd and "mpiexec" not in cmd:
                continue
            mine = prefix in cmd or str(proc.environ().get(registry.MARK, "")).startswith(prefix)
            if mine and proc.status() != psutil.STATUS_ZOMBIE:  # a zombie has ended: only unreaped
                found.append(proc)
        except psutil.Error:
            continue
    return found


def role(proc: psutil.Process) -> str:
    try:
        cmd = " ".join(proc.cmdline())
    except psutil.Error:
        return "gone"
    for name, part in (
        ("nanny", "ipyparallel.engine.nanny"),
        ("engine", "ipyparallel.engine"),
        ("controller", "ipyparallel.controller"),
        ("reaper", "dtwork.launch.reaper"),
    ):
        if part in cmd:
            return name
    return cmd[:60]


def _entries(home: Path, kernel_pid: int) -> list[dict[str, object]]:
    out = []
    for path in (home / "clusters").glob(f"dtwork-{kernel_pid}-*.json"):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):  # being replaced
            continue
    return out


def _count(procs: list[psutil.Process], name: str) -> int:
    return sum(role(p) == name for p in procs)


# The points of a start, in the order it reaches them, each a condition seen from outside.
POINTS: dict[str, Callable[[Path, int], bool]] = {
    "registered": lambda home, pid: bool(_entries(home, pid)) and _count(start_processes(pid), "reaper") >= 1,
    "controller": lambda home, pid: _count(start_processes(pid), "controller") >= 1,
    "engine": lambda home, pid: _count(start_processes(pid), "engine") >= 1,
    "nannies": lambda home, pid: _count(start_processes(pid), "nanny") >= 2,
    "joining": lambda home, pid: any(e.get("ranks") for e in _entries(home, pid)),
}


def wait_for(condition: Callable[[], bool], within: float, poll: float = 0.02) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(poll)
    return condition()


class Kernel:
    """A real IPython kernel loading dtwork, with its own registry home, started through jupyter_client
    (``ready`` waits for it: kernels started together load at once)."""

    def __init__(self, home: Path) -> None:
        self.home = home
        self.km, self.kc = start_kernel(home)
        self.pid = int(self.km.provisioner.pid)
        self.loading = self.kc.execute("%load_ext dtwork")

    def ready(self) -> Kernel:
        # Not wait_for_ready: it drops the shell replies it is not waiting for, this one included.
        while True:
            reply = self.kc.get_shell_msg(timeout=120)
            if reply["parent_header"].get("msg_id") == self.loading:
                assert reply["content"]["status"] == "ok", reply["content"]
                return self

    def start(self, magic: str = "%dtrain start -n 2 --backend gloo") -> None:
        self.kc.execute(magic)  # not waited for: the kernel dies during it

    def kill(self) -> None:
        os.kill(self.pid, signal.SIGKILL)

    def close(self) -> None:
        self.kc.stop_channels()
        try:
            self.km.shutdown_kernel(now=True)
        except Exception:  # already dead: only its resources are left to free
            self.km.cleanup_resources()
        for proc in start_processes(self.pid):  # a failed test leaves nothing to the next
            proc.kill()


@pytest.fixture(scope="module")
def kernels(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Kernel]]:
    """One kernel per point, all started at once (their start-up overlaps), each with its own home."""
    started = {point: Kernel(tmp_path_factory.mktemp(f"start-kill-{point}")) for point in POINTS}
    yield started
    for k in started.values():
        k.close()


@pytest.mark.parametrize("point", list(POINTS))
def test_a_kernel_killed_during_a_start_leaves_no_process(point: str, kernels: dict[str, Kernel]) -> None:
    """However far the start got (nothing launched yet, a controller only, engines still importing,
    engines up but unregistered, ranks joining), its processes are ended once the kernel dies."""
    kernel = kernels[point].ready()
    kernel.start()
    reached = POINTS[point]
    assert wait_for(lambda: reached(kernel.home, kernel.pid), POINT_WITHIN, poll=0.05), (
        f"the start never reached {point}"
    )
    kernel.kill()
    seen = start_processes(kernel.pid)
    t0 = time.monotonic()
    gone = wait_for(lambda: not start_processes(kernel.pid), LEFT_WITHIN, poll=0.2)
    left = start_processes(kernel.pid)
    assert gone, (
        f"killed at {point!r} ({len(seen)} processes then), {len(left)} left after {LEFT_WITHIN:.0f} s: "
        f"{sorted(role(p) for p in left)}"
    )
    print(
        f"\n[start-kill] {point}: {len(seen)} processes at the kill, none left after {time.monotonic() - t0:.1f} s"
    )
    assert not _entries(kernel.home, kernel.pid)  # the reaper removed the entry too
