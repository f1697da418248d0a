"""A feature on and off in windows alternating inside one ``ctx.steps`` loop: the live view, GNS.

Whole loops taken in turn are seconds apart, and this machine's speed drifts by several percent
over seconds; windows of one loop, each cycle one on and one off window in a random order, put the
two arms of a cycle within a second of each other.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from typing import TYPE_CHECKING, Any

from benchmarks.stats import interleaved_summary

if TYPE_CHECKING:
    from benchmarks.runners import DtworkRunner

# Runs on dtwork's ranks, after the workload's SOURCE.
ENGINE_SOURCE = '''
import random
from dtwork.runtime.ddp import measure_state


def in_windows(kind, warmup, cycles, window, seed, tops, arms, cpus):
    """Yield (x, y, arm): after ``warmup`` steps, windows on and off (arm None but at a window's first
    step); each window's start time and CPU time go to ``tops`` and ``cpus``, a last one closing it."""
    rng = random.Random(seed)  # the same order on every rank
    on_first = [rng.random() < 0.5 for _ in range(cycles)]
    end = warmup + 2 * cycles * window
    for step, (x, y) in ctx.steps(make_batches(kind, ctx.rank), max_steps=end + 1):
        arm = None
        if step >= warmup and (step - warmup) % window == 0:
            w = (step - warmup) // window
            if w == 0:
                dist.barrier()
            tops.append(time.perf_counter())
            cpus.append(time.process_time())
            if step == end:
                return
            arm = on_first[w // 2] != bool(w % 2)
            arms.append(arm)
        yield x, y, arm


def gns_windows(kind, warmup, cycles, seed):
    """GNS measured in on windows, not in off windows, of whole measuring periods (8 steps or more)."""
    every = ctx.config.gns.every
    window = every * max(2, 8 // every)
    model = ctx.wrap(make_model(kind), gns=True)
    state = measure_state(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    tops, cpus, arms = [], [], []
    for x, y, arm in in_windows(kind, -(-warmup // every) * every, cycles, window, seed, tops, arms, cpus):
        if arm is not None:
            state.gns = arm
        loss = F.cross_entropy(model(x), y)
        ctx.backward(loss)
        ctx.step(opt)
        ctx.log(loss=loss)
    return [b - a for a, b in zip(tops, tops[1:])], arms, window


def live_windows(kind, warmup, cycles, window, port, seed, aa):
    """On: ctx.log every step, the kernel drawing; off: neither (aa: both on). Rank 0 tells the kernel."""
    import socket

    model = ctx.wrap(make_model(kind), gns=False)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    sock = socket.create_connection(("127.0.0.1", port)) if ctx.rank == 0 else None
    tops, cpus, arms = [], [], []
    log = True  # the warmup logs, so that the view builds its widgets before the windows
    try:
        for x, y, arm in in_windows(kind, warmup, cycles, window, seed, tops, arms, cpus):
            if arm is not None:
                log = arm or aa
                if sock is not None:
                    sock.sendall(b"1\\n" if log else b"0\\n")
            loss = F.cross_entropy(model(x), y)
            ctx.backward(loss)
            ctx.step(opt)
            if log:
                ctx.log(loss=loss)
    finally:
        if sock is not None:
            sock.close()
    return [b - a for a, b in zip(tops, tops[1:])], arms, window, [b - a for a, b in zip(cpus, cpus[1:])]
'''


class LiveSwitch:
    """The kernel's end of ``live_windows``: sets ``session.live`` as rank 0 says, and reads the kernel's
    CPU seconds at every switch (a thread blocked in a socket read, so it costs nothing meanwhile)."""

    def __init__(self, session: Any) -> None:
        self.session = session
        self.switches = 0
        self.cpu: list[float] = []
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._server.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        with contextlib.suppress(OSError):
            conn, _ = self._server.accept()
            with conn, conn.makefile("r") as lines:
                for line in lines:
                    self.session.live = line.strip() == "1"
                    self.switches += 1
                    self.cpu.append(time.process_time())
                self.cpu.append(time.process_time())  # rank 0 hung up: the last window ended

    def __enter__(self) -> LiveSwitch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._server.close()
        self._thread.join(5.0)
        self.session.live = True


def gns(runner: DtworkRunner, kind: str, warmup: int, cycles: int, seed: int = 0) -> dict[str, Any]:
    """GNS measurement on ÷ off, live view on and ctx.log every step in both arms."""
    runner.run(f"_res = gns_windows({kind!r}, {warmup}, {cycles}, {seed})\n")
    res = runner.pull("_res")
    return {**interleaved_summary([r[0] for r in res], res[0][1]), "steps_per_window": res[0][2]}


def live(
    runner: DtworkRunner, kind: str, warmup: int, cycles: int, window: int, seed: int = 0, aa: bool = False
) -> dict[str, Any]:
    """Live view + run store on ÷ off (``aa``: on ÷ on, the control), in wall-clock and CPU seconds."""
    assert runner.cluster is not None
    with LiveSwitch(runner.cluster.session) as switch:
        runner.run(
            f"_res = live_windows({kind!r}, {warmup}, {cycles}, {window}, {switch.port}, {seed}, {aa})\n"
        )
    res = runner.pull("_res")
    arms, steps = res[0][1], res[0][2]
    out = interleaved_summary([r[0] for r in res], arms)
    out.update(steps_per_window=steps, switches=switch.switches, aa=aa)
    kernel = [b - a for a, b in zip(switch.cpu, switch.cpu[1:], strict=False)]
    if len(kernel) == len(
        arms
    ):  # the same cycles in CPU seconds (every rank and the kernel): blind to preemption
        ranks = [sum(ws) for ws in zip(*(r[3] for r in res), strict=True)]
        out["cpu"] = interleaved_summary([[a + b for a, b in zip(ranks, kernel, strict=True)]], arms)
    return out
