"""``python -m benchmarks.widget_messages [--redraws N] [--out DIR]``: what a live-dashboard redraw
costs in a real Jupyter kernel, against the plain process the other benchmarks run in.

The suite and ``python -m benchmarks.live`` drive dtwork from a plain Python process. There,
ipywidgets has no kernel to talk to: every widget message goes to a comm that drops it, so
their windows count the dashboard's Python work but not the sending of its messages (JSON,
signing, the kernel's IOPub thread). This builds the same dashboard (2 ranks, logged loss every
step, per-rank throughput and step-time records, progress bars), feeds it the records of a few
thousand steps, then times ``N`` full redraws in process CPU seconds (every thread of the
process, the IOPub thread included) twice: in this process, and inside an ipykernel started
with jupyter_client, whose client counts the widget messages each redraw sends. Writes
``DIR/widget_messages.json`` (default ``benchmarks/results/``); ``python -m benchmarks
--report-only`` adds it to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

# Runs in either process; leaves its result in ``_widget_cost``.
CODE = r"""
import time
from dtwork.widgets.dashboard import Dashboard

def _records(s0, s1):
    out = [{"kind": "log", "step": s, "rank": 0, "time": s * 0.01, "values": {"loss": 1.0 / (s + 1)}}
           for s in range(s0, s1)]
    for r in (0, 1):
        for s in range(s0, s1, 8):
            out.append({"kind": "perf", "step": s, "rank": r, "time": s * 0.01,
                        "values": {"samples_per_s": 1000.0 + s + r, "step_time": 0.01, "data_time": 0.001,
                                   "comm_time": 0.002, "compute_time": 0.007}})
    return out

def _build(warm_steps=3000, per_redraw=48):
    # the dashboard with warm_steps steps drawn: what a redraw then sends is a running cell's
    global _dash, _step
    _dash = Dashboard(1, [0, 1], min_interval=1e9, trailing=False)
    _step = 0
    while _step < warm_steps:
        _dash.feed(_records(_step, _step + per_redraw)); _step += per_redraw
    _dash.flush()

def _measure(redraws, per_redraw=48):
    global _step
    feed = draw = 0.0
    for _ in range(redraws):
        c = time.process_time()
        _dash.feed(_records(_step, _step + per_redraw))
        _dash.progress({r: {"step": _step + per_redraw, "total": 10 ** 6, "time": _step * 0.01} for r in (0, 1)})
        feed += time.process_time() - c
        _step += per_redraw
        c = time.process_time()
        _dash.flush()
        time.sleep(0.005)  # the IOPub thread sends what the redraw queued (its CPU time is counted)
        draw += time.process_time() - c
    return {"redraws": redraws, "feed_ms": 1000 * feed / redraws, "redraw_ms": 1000 * draw / redraws}
"""


def in_this_process(redraws: int) -> dict[str, Any]:
    scope: dict[str, Any] = {}
    exec(CODE, scope)
    scope["_build"]()
    return scope["_measure"](redraws)


def in_a_kernel(redraws: int) -> dict[str, Any]:
    """The same in a fresh ipykernel; the client counts the comm messages of the timed redraws."""
    from benchmarks.util import Kernel

    with Kernel(ROOT) as kernel:
        kernel.run(CODE + "\n_build()\nprint('RESULT null')\n", timeout=120)
        res, counts = kernel.run(
            f"import json; print('RESULT', json.dumps(_measure({redraws})))", timeout=600
        )
    res["messages"] = counts.get("comm_msg", 0)
    res["widgets_opened"] = counts.get("comm_open", 0)
    return res


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m benchmarks.widget_messages",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("--redraws", type=int, default=200, help="timed redraws on each side (default 200)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results", help="where the json goes")
    args = ap.parse_args(argv)
    if args.redraws < 1:
        ap.error("--redraws must be at least 1")
    from benchmarks.util import save_result

    started = time.strftime("%Y-%m-%d %H:%M:%S %z")
    plain = in_this_process(args.redraws)
    kernel = in_a_kernel(args.redraws)
    path = save_result(
        args.out,
        "widget_messages.json",
        "python -m benchmarks.widget_messages",
        argv,
        started,
        {"plain": plain, "kernel": kernel},
    )
    print(
        f"redraw: {plain['redraw_ms']:.2f} ms of CPU in a plain process, {kernel['redraw_ms']:.2f} ms in a kernel "
        f"(~{kernel['messages'] / args.redraws:.1f} widget messages a redraw); feeding: {plain['feed_ms']:.2f} / "
        f"{kernel['feed_ms']:.2f} ms"
    )
    print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
