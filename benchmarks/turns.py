"""Launchers training in turns: short windows of the same code, alternating, inside long-lived jobs.

The ranks of each job (dtwork's in a ``%%dtrain`` cell, torchrun's in a launch) run ``serve_turns``: they
connect to ``Turns`` here and block in a socket read (no CPU) until told to train a window. A cycle holds
one window of each job in a random order; a window's time is the slower rank's, timed inside the ranks.
"""

from __future__ import annotations

import contextlib
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any


def rotate(items: list[Any], rep: int) -> list[Any]:
    """``items`` in the order of repetition ``rep``: each takes the lead in turn."""
    return items[rep % len(items) :] + items[: rep % len(items)]


class Turns:
    """The coordinator: a listening socket on 127.0.0.1; every rank of every job connects once."""

    def __init__(self, jobs: dict[str, int], timeout: float = 180.0) -> None:
        self.jobs, self.timeout = dict(jobs), timeout  # job name -> number of ranks
        self.server = socket.create_server(("127.0.0.1", 0), backlog=sum(self.jobs.values()) + 4)
        self.port: int = self.server.getsockname()[1]
        self.conns: dict[str, dict[int, Any]] = {j: {} for j in self.jobs}
        self._socks: list[socket.socket] = []

    def wait_for_jobs(self, alive: Callable[[], bool]) -> None:
        """Accept connections until every rank of every job said hello; give up when ``alive()`` is False."""
        deadline = time.monotonic() + self.timeout
        self.server.settimeout(0.5)
        while any(len(self.conns[j]) < n for j, n in self.jobs.items()):
            if time.monotonic() > deadline or not alive():
                raise RuntimeError(f"not every rank connected (within {self.timeout:.0f} s): {self.conns}")
            try:
                sock, _ = self.server.accept()
            except TimeoutError:
                continue
            sock.settimeout(self.timeout)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._socks.append(sock)
            f = sock.makefile("rw")
            hello = f.readline().split()
            if len(hello) != 3 or hello[0] != "HELLO" or hello[1] not in self.jobs:
                raise RuntimeError(f"unexpected hello {hello!r}")
            self.conns[hello[1]][int(hello[2])] = f

    def window(self, job: str, kind: str, steps: int) -> float:
        """Let ``job`` train ``steps`` steps of ``kind``; its slower rank's seconds."""
        for f in self.conns[job].values():
            f.write(f"RUN {kind} {steps}\n")
            f.flush()
        times = []
        for r, f in self.conns[job].items():
            reply = f.readline().split()
            if len(reply) != 2 or reply[0] != "DONE":
                raise RuntimeError(f"{job} rank {r} answered {reply!r} (did its training fail?)")
            times.append(float(reply[1]))
        return max(times)

    def cycles(self, kind: str, steps: int, cycles: int, seed: int, warmup_cycles: int = 2) -> dict[str, Any]:
        """``cycles`` cycles of one window per job, each cycle in a random order; the windows' seconds."""
        rng = random.Random(seed)
        for _ in range(warmup_cycles):
            for j in self.jobs:
                self.window(j, kind, steps)
        out: dict[str, list[float]] = {j: [] for j in self.jobs}
        orders = []
        for _ in range(cycles):
            orders.append(rng.sample(list(self.jobs), len(self.jobs)))
            for j in orders[-1]:
                out[j].append(self.window(j, kind, steps))
        return {"seconds": out, "orders": orders, "steps": steps}

    def stop(self) -> None:
        """Tell every connected rank to leave its loop, then close everything."""
        for f in [f for ranks in self.conns.values() for f in ranks.values()]:
            with contextlib.suppress(OSError, ValueError):
                f.write("STOP\n")
                f.flush()
        for sock in [*self._socks, self.server]:
            sock.close()
        self.conns = {j: {} for j in self.jobs}


def run_in_turns(turns: Turns, plan: dict[str, Any], seed: int, alive: Callable[[], bool]) -> tuple[Any, Any]:
    """Drive ``turns`` in a thread while the caller runs a job's blocking cell; ``plan``: kind -> (steps per
    window, cycles). The dict returned fills in with each kind's cycles, or ``error``; ``stop`` ends it."""
    out: dict[str, Any] = {}

    def go() -> None:
        try:
            turns.wait_for_jobs(alive)
            for i, (kind, (steps, n)) in enumerate(plan.items()):
                out[kind] = turns.cycles(kind, steps, n, seed=seed + i)
        except Exception as exc:  # reported by the caller; the jobs are released below
            out["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            turns.stop()

    (t := threading.Thread(target=go, daemon=True)).start()
    return t, out
