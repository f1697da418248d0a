"""A feature on and off in windows alternating inside one loop: the live view, GNS, the hand loop's views.

Whole loops taken in turn are seconds apart, and this machine's speed drifts by several percent
over seconds; windows of one loop, each cycle one on and one off window in a random order, put the
two arms of a cycle within a second of each other.

``python -m benchmarks --live MINUTES [--ranks N]`` (``live_long``) takes the live view's runs for
MINUTES from a real ipykernel (where its widget messages are sent, read here as a notebook server
would), with A/A runs between them (both windows on: the control); ``DIR/live.json`` keeps them pooled.
"""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks.stats import interleaved_summary, pool
from benchmarks.util import ROOT, Kernel, git_commit, log, machine, now, versions
from benchmarks.workload import KINDS

if TYPE_CHECKING:
    from benchmarks.runners import DtworkRunner


class LiveSwitch:
    """The kernel's end of ``live_windows``: sets ``session.live`` as rank 0 says, and reads the kernel's
    CPU seconds at every switch (a thread blocked in a socket read, so it costs nothing meanwhile)."""

    def __init__(self, session: Any) -> None:
        self.session, self.switches, self.cpu = session, 0, list[float]()
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


def _summary(runner: DtworkRunner, call: str) -> tuple[dict[str, Any], list[Any]]:
    """Run ``call`` on the ranks, which answer (window seconds, arms, steps per window, ...)."""
    runner.run(f"_res = {call}\n")
    res = runner.pull("_res")
    return interleaved_summary([r[0] for r in res], res[0][1]) | {"steps_per_window": res[0][2]}, res


def hand(runner: DtworkRunner, kind: str, cycles: int, window: int, arm: str, seed: int = 0) -> dict:
    """The hand loop's steps/s with ``arm`` ÷ plain, live view on (as under ``%%dtrain``)."""
    return _summary(runner, f"hand_windows({kind!r}, {cycles}, {window}, {seed}, {arm!r})")[0]


def gns(runner: DtworkRunner, kind: str, warmup: int, cycles: int, seed: int = 0) -> dict[str, Any]:
    """GNS measurement on ÷ off, live view on and ctx.log every step in both arms."""
    return _summary(runner, f"gns_windows({kind!r}, {warmup}, {cycles}, {seed})")[0]


def live(
    runner: DtworkRunner, kind: str, warmup: int, cycles: int, window: int, seed: int = 0, aa: bool = False
) -> dict[str, Any]:
    """Live view + run store on ÷ off (``aa``: on ÷ on, the control), in wall-clock and CPU seconds."""
    assert runner.cluster is not None
    with LiveSwitch(runner.cluster.session) as switch:
        call = f"live_windows({kind!r}, {warmup}, {cycles}, {window}, {switch.port}, {seed}, {aa})"
        out, res = _summary(runner, call)
    out.update(switches=switch.switches, aa=aa)
    arms, kernel = res[0][1], [b - a for a, b in zip(switch.cpu, switch.cpu[1:], strict=False)]
    if len(kernel) == len(arms):  # the same cycles in CPU seconds, every rank's and the kernel's
        ranks = [sum(ws) for ws in zip(*(r[3] for r in res), strict=True)]
        out["cpu"] = interleaved_summary([[a + b for a, b in zip(ranks, kernel, strict=True)]], arms)
    return out


# windows of about 2 s, runs of about 60 s (MLP) and 40 s (convnet)
WINDOW, CYCLES, WARMUP = {"mlp": 180, "convnet": 44}, {"mlp": 15, "convnet": 10}, {"mlp": 30, "convnet": 8}


def take_runs(runner: DtworkRunner, minutes: float, window: Any, cycles: Any, warmup: Any) -> list[Any]:
    """Rounds of one run per workload for ``minutes``: at least one round; every third round is A/A."""
    t0, runs, rnd = time.perf_counter(), [], 0
    while rnd == 0 or time.perf_counter() - t0 < minutes * 60:
        for kind in KINDS:
            res = live(runner, kind, warmup[kind], cycles[kind], window[kind], rnd, aa=rnd % 3 == 2)
            runs.append({**res, "kind": kind, "round": rnd})
            log(f"{'A/A' if res['aa'] else 'A/B'} {kind}: {res['ratio']:.3f} ({res['cycles']} cycles)")
        rnd += 1
    return runs


def take_runs_here(minutes: float, ranks: int) -> list[dict[str, Any]]:
    """``take_runs`` on a fresh cluster of this process (the kernel's side of ``main``)."""
    from benchmarks.runners import DtworkRunner

    runner = DtworkRunner(ranks)
    try:
        runner.start()
        runner.setup()
        return take_runs(runner, minutes, WINDOW, CYCLES, WARMUP)
    finally:
        runner.stop()


def _brief(p: dict[str, Any]) -> dict[str, Any]:
    """A pooled reading without its cycles, as live.json keeps it."""
    out = {k: v for k, v in p.items() if k != "pair_ratios"}
    return out | ({"cpu": _brief(p["cpu"])} if "cpu" in p else {})


def live_long(minutes: float, ranks: int, out: Path, command: str) -> dict[str, Any]:
    """``take_runs_here`` in a fresh ipykernel, whose messages this process reads; writes out/live.json."""
    code = "import json\nfrom benchmarks.windows import take_runs_here\n"
    code += f"print('RESULT', json.dumps(take_runs_here({minutes!r}, {ranks!r})))\n"
    started, t0, cpu0 = now(), time.perf_counter(), time.process_time()
    with Kernel(ROOT) as kernel:
        runs, counts = kernel.run(code, timeout=minutes * 60 + 900)
    seconds = time.perf_counter() - t0
    result = dict(command=command, started=started, duration_s=seconds, dtwork_commit=git_commit())
    result |= {"ranks": ranks, "machine": machine(), "versions": versions()}
    cpu = (time.process_time() - cpu0) / seconds
    result["kernel"] = dict(messages=counts, seconds=seconds, client_cpu_share=cpu)
    result["plan"] = {"window_steps": WINDOW, "cycles_per_run": CYCLES, "warmup": WARMUP}
    modes = ("ab", "aa")
    by = {(k, m): [r for r in runs if (r["kind"], r["aa"]) == (k, m == "aa")] for k in KINDS for m in modes}
    result["pooled"] = {k: {m: _brief(pool(by[k, m])) for m in ("ab", "aa") if by[k, m]} for k in KINDS}
    out.mkdir(parents=True, exist_ok=True)
    (out / "live.json").write_text(json.dumps(result, indent=1) + "\n")
    return result
