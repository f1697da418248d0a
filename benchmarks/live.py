"""The live view + run store on ÷ off (issue 3), in windows inside one loop: the suite's runs, and longer.

``python -m benchmarks --live MINUTES [--ranks N]`` takes runs of each workload in turn for MINUTES
on one cluster, driven from a real ipykernel as a notebook drives dtwork (there the live view's
widget messages are sent, and this process reads them as a notebook server would), with A/A runs
between them (both windows of every cycle on: the control, which should read 1.0). The cycles of
each kind of run are pooled; ``DIR/live.json`` keeps the pooled readings.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from benchmarks import windows
from benchmarks.stats import pool
from benchmarks.util import ROOT, Kernel, git_commit, log, machine, now, versions
from benchmarks.workload import KINDS

if TYPE_CHECKING:
    from benchmarks.runners import DtworkRunner

# windows of about 2 s, runs of about 60 s (MLP) and 40 s (convnet)
WINDOW, CYCLES, WARMUP = {"mlp": 180, "convnet": 44}, {"mlp": 15, "convnet": 10}, {"mlp": 30, "convnet": 8}


def take_runs(
    runner: DtworkRunner,
    minutes: float,
    window: dict[str, int],
    cycles: dict[str, int],
    warmup: dict[str, int],
) -> list[dict[str, Any]]:
    """Rounds of one run per workload for ``minutes``: at least one round; every third round is A/A."""
    t0 = time.perf_counter()
    runs: list[dict[str, Any]] = []
    rnd = 0
    while rnd == 0 or time.perf_counter() - t0 < minutes * 60:
        for kind in KINDS:
            res = windows.live(
                runner, kind, warmup[kind], cycles[kind], window[kind], seed=rnd, aa=rnd % 3 == 2
            )
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
    return {k: v for k, v in p.items() if k != "pair_ratios"} | (
        {"cpu": _brief(p["cpu"])} if p.get("cpu") else {}
    )


def main(minutes: float, ranks: int, out: Path, command: str) -> dict[str, Any]:
    """``take_runs_here`` in a fresh ipykernel, whose messages this process reads; writes out/live.json."""
    code = "import json\nfrom benchmarks.live import take_runs_here\n"
    code += f"print('RESULT', json.dumps(take_runs_here({minutes!r}, {ranks!r})))\n"
    started, t0, cpu0 = now(), time.perf_counter(), time.process_time()
    with Kernel(ROOT) as kernel:
        runs, counts = kernel.run(code, timeout=minutes * 60 + 900)
    seconds = time.perf_counter() - t0
    result: dict[str, Any] = {
        "command": command,
        "started": started,
        "duration_s": seconds,
        "dtwork_commit": git_commit(),
        "ranks": ranks,
        "machine": machine(),
        "versions": versions(),
        "kernel": {
            "messages": counts,
            "seconds": seconds,
            "client_cpu_share": (time.process_time() - cpu0) / seconds,
        },
        "plan": {"window_steps": WINDOW, "cycles_per_run": CYCLES, "warmup": WARMUP},
        "pooled": {
            kind: {
                mode: _brief(pool(rs))
                for mode in ("ab", "aa")
                if (rs := [r for r in runs if r["kind"] == kind and r["aa"] == (mode == "aa")])
            }
            for kind in KINDS
        },
    }
    out.mkdir(parents=True, exist_ok=True)
    (out / "live.json").write_text(json.dumps(result, indent=1) + "\n")
    return result
