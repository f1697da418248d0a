"""``python -m benchmarks.rank_log [--rounds N] [--steps S] [--out DIR]``: what ``ctx.log`` costs a rank.

The rank's side of issue 3's live-dashboard target, alone and without noise from other processes:
one process, one CPU rank (world size 1, no process group), the benchmark's MLP trained by
``ctx.steps`` for ``--rounds`` rounds of two windows of ``--steps`` steps, one with
``ctx.log(loss=loss)`` every step and one without, in an order drawn per round. Each window is
timed in this thread's CPU seconds and in wall-clock seconds; the cost is the median over rounds
of (with - without), per step, and the throughput ratio off ÷ on. What the kernel does with the
records (store, dashboard) is not here: ``python -m benchmarks.live --kernel`` measures the whole.
Writes ``DIR/rank_log.json`` (default ``benchmarks/results/``).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def measure(rounds: int, steps: int, seed: int = 0) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    from benchmarks.workload import SOURCE
    from dtwork.runtime.context import Context

    torch.set_num_threads(1)
    scope: dict[str, Any] = {}
    exec(SOURCE, scope)  # make_model, make_batches: the workload every launcher trains
    ctx = Context(rank=0, world_size=1, local_rank=0, device=torch.device("cpu"), backend="gloo")
    model = scope["make_model"]("mlp")
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    batches = scope["make_batches"]("mlp", 0)

    def data() -> Any:
        i = 0
        while True:
            yield batches[i % len(batches)]
            i += 1

    def window(log: bool, n: int) -> tuple[float, float]:
        cpu, wall = time.thread_time(), time.perf_counter()
        for _, (x, y) in ctx.steps(data(), max_steps=n):
            loss = F.cross_entropy(model(x), y)
            ctx.backward(loss)
            ctx.step(opt)
            if log:
                ctx.log(loss=loss)
        return (time.thread_time() - cpu) / n, (time.perf_counter() - wall) / n

    window(True, steps)  # warm both paths
    window(False, steps)
    rng = random.Random(seed)
    on: list[tuple[float, float]] = []
    off: list[tuple[float, float]] = []
    for _ in range(rounds):
        for log in rng.sample([True, False], 2):
            (on if log else off).append(window(log, steps))
    cpu_diff = [1e6 * (a[0] - b[0]) for a, b in zip(on, off, strict=True)]
    wall_diff = [1e6 * (a[1] - b[1]) for a, b in zip(on, off, strict=True)]
    return {
        "rounds": rounds,
        "steps_per_window": steps,
        "off_us_per_step": 1e6 * statistics.median(c for c, _ in off),
        "on_us_per_step": 1e6 * statistics.median(c for c, _ in on),
        "ctx_log_cpu_us": statistics.median(cpu_diff),
        "ctx_log_wall_us": statistics.median(wall_diff),
        "cpu_ratio": statistics.median(b[0] / a[0] for a, b in zip(on, off, strict=True)),
        "wall_ratio": statistics.median(b[1] / a[1] for a, b in zip(on, off, strict=True)),
        "cpu_diff_us": cpu_diff,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.rank_log",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--rounds", type=int, default=60, help="on/off window pairs (default 60)")
    ap.add_argument("--steps", type=int, default=200, help="steps per window (default 200)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="where the json goes")
    args = ap.parse_args(argv)
    if args.rounds < 1 or args.steps < 1:
        ap.error("--rounds and --steps must be at least 1")
    from benchmarks.util import save_result

    started = time.strftime("%Y-%m-%d %H:%M:%S %z")
    res = measure(args.rounds, args.steps)
    path = save_result(args.out, "rank_log.json", "python -m benchmarks.rank_log", argv, started, res)
    print(
        f"ctx.log every step: +{res['ctx_log_cpu_us']:.1f} us of CPU a step (+{res['ctx_log_wall_us']:.1f} us wall) "
        f"on a {res['off_us_per_step']:.0f} us step: throughput ratio {res['wall_ratio']:.4f} "
        f"(CPU {res['cpu_ratio']:.4f}), {res['rounds']} rounds"
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
