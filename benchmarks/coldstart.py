"""One fresh "notebook kernel" process per sample: cold start, then resident memory.

``python -m benchmarks.coldstart dtwork|raw OUT.json [--steps N]`` starts a 2-rank cluster in a
process that has done nothing else (imports are timed apart), then measures resident memory
(psutil RSS) of this kernel process and of each engine:

- ``fresh``: right after the start
- ``idle``:  after a setup cell built the model and the synthetic data on every rank
- ``train``: the peak while a training cell runs (sampled every 20 ms from a thread)

dtwork: ``dtwork.start(n=2, backend="gloo")`` (engines + process group ready); the training
cell is the idiomatic one (``ctx.wrap`` + ``ctx.steps`` + ``ctx.log``, live dashboard and run
store on). raw: ``ipyparallel.Cluster(n=2).start_and_connect_sync()`` (timed alone: raw
ipyparallel's own start) then the hand-written DDP setup (timed to a ready process group);
its training cell is the hand-written loop. Both train the same model on the same data.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import threading
import time
from typing import Any

T_PROCESS = time.perf_counter()

KIND = "mlp"


def _rss_mb(pid: int) -> float | None:
    import psutil

    try:
        return psutil.Process(pid).memory_info().rss / (1024.0 * 1024.0)
    except psutil.Error:
        return None


def _sample(pids: list[int]) -> dict[str, Any]:
    return {"kernel_mb": _rss_mb(os.getpid()), "engines_mb": [_rss_mb(p) for p in pids]}


class PeakSampler:
    """Peak RSS of the kernel and each engine while something runs."""

    def __init__(self, pids: list[int], interval: float = 0.02) -> None:
        self.pids = pids
        self.interval = interval
        self.peak = _sample(pids)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.is_set():
            s = _sample(self.pids)
            if (s["kernel_mb"] or 0) > (self.peak["kernel_mb"] or 0):
                self.peak["kernel_mb"] = s["kernel_mb"]
            for i, v in enumerate(s["engines_mb"]):
                if (v or 0) > (self.peak["engines_mb"][i] or 0):
                    self.peak["engines_mb"][i] = v
            self._stop.wait(self.interval)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


DTWORK_SETUP = """
model = ctx.wrap(make_model({kind!r}))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
batches = make_batches({kind!r}, ctx.rank)
"""

DTWORK_TRAIN = """
for step, (x, y) in ctx.steps(batches, max_steps={steps}):
    loss = F.cross_entropy(model(x), y)
    ctx.backward(loss)
    ctx.step(opt)
    ctx.log(loss=loss)
"""


def run_dtwork(steps: int) -> dict[str, Any]:
    from benchmarks import workload as W
    from benchmarks.runners import DtworkRunner
    from benchmarks.util import silenced

    t0 = time.perf_counter()
    import dtwork  # noqa: F401
    import dtwork.cluster  # noqa: F401

    out: dict[str, Any] = {"import_s": time.perf_counter() - t0}
    r = DtworkRunner()
    try:
        out["start_s"] = r.start()
        pids = r.engine_pids()
        out["memory_fresh"] = _sample(pids)
        r.run(W.SOURCE + W.PIN_THREADS + DTWORK_SETUP.format(kind=KIND))
        out["memory_idle"] = _sample(pids)
        with PeakSampler(pids) as peak, silenced():
            r.run(DTWORK_TRAIN.format(steps=steps))
        out["memory_train"] = peak.peak
    finally:
        t1 = time.perf_counter()
        r.stop()
        out["stop_s"] = time.perf_counter() - t1
    return out


def run_raw(steps: int) -> dict[str, Any]:
    from benchmarks import workload as W
    from benchmarks.runners import RawIpyparallelRunner

    t0 = time.perf_counter()
    import ipyparallel  # noqa: F401

    out: dict[str, Any] = {"import_s": time.perf_counter() - t0}
    r = RawIpyparallelRunner()
    try:
        r.start(ddp=False)
        out["engines_s"] = r.engines_s
        pids = r.engine_pids()
        out["memory_fresh"] = _sample(pids)
        t1 = time.perf_counter()
        r.join_process_group()
        out["start_s"] = r.engines_s + (time.perf_counter() - t1)  # engines + hand DDP setup
        r.run(W.SOURCE + W.PIN_THREADS + f"W = setup({KIND!r})\n")
        out["memory_idle"] = _sample(pids)
        with PeakSampler(pids) as peak:
            r.run(f"train(*W, {steps})")
        out["memory_train"] = peak.peak
    finally:
        t1 = time.perf_counter()
        r.stop()
        out["stop_s"] = time.perf_counter() - t1
    return out


def main(argv: list[str]) -> int:
    from benchmarks.util import exit_on_sigterm

    exit_on_sigterm()
    which, path = argv[0], argv[1]
    steps = int(argv[argv.index("--steps") + 1]) if "--steps" in argv else 100
    store_dir = None
    if which == "dtwork" and not os.environ.get("DTWORK_STORE"):
        # the run store of this throwaway kernel goes to a temporary place
        store_dir = tempfile.mkdtemp(prefix="dtwork-bench-store-")
        os.environ["DTWORK_STORE"] = os.path.join(store_dir, "runs.sqlite")
    try:
        out = run_dtwork(steps) if which == "dtwork" else run_raw(steps)
    finally:
        if store_dir:
            shutil.rmtree(store_dir, ignore_errors=True)
    out["process_s"] = time.perf_counter() - T_PROCESS
    with open(path, "w") as f:
        json.dump(out, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
