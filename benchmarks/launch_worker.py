"""A stand-in notebook kernel for the launchers that fork their workers from it (Accelerate, Fabric).

``python -m benchmarks.launch_worker accelerate|fabric`` imports the launcher, answers ``BENCH
{"ok": ...}``, then answers one ``BENCH`` line per JSON spec read on stdin: ``throughput`` (one launch
measuring steps/s of each workload) or ``latency`` (one launch, one step: what a changed cell costs).
Every answer carries ``ready_s``, the seconds from the launch call to a ready process group.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import traceback
from typing import Any

from benchmarks import workload as W
from benchmarks.util import free_port


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write("BENCH " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _measure(
    spec: dict[str, Any], prepare: Any, backward: Any, barrier: Any, t_call: float
) -> dict[str, Any]:
    """Run the spec on this rank through the library's prepare/backward; what rank 0 reports."""
    ns: dict[str, Any] = {}
    exec(W.SOURCE, ns)
    torch, F = ns["torch"], ns["F"]
    torch.set_num_threads(1)  # one intra-op thread per rank, as torchrun gives its workers
    barrier()
    out: dict[str, Any] = {"ready_s": time.time() - t_call, "results": {}}
    for kind in spec["kinds"]:
        model = ns["make_model"](kind)
        model, opt = prepare(model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9))
        batches = ns["make_batches"](kind, torch.distributed.get_rank())

        def train(n: int, model: Any = model, opt: Any = opt, batches: Any = batches) -> None:
            for i in range(n):
                x, y = batches[i % len(batches)]
                loss = F.cross_entropy(model(x), y)
                opt.zero_grad(set_to_none=True)
                backward(loss)
                opt.step()

        if spec["mode"] == "latency":
            train(1)
            barrier()
            out["first_step_s"] = time.time() - t_call
        else:
            train(spec["warmup"][kind])
            barrier()
            t0 = time.perf_counter()
            train(spec["steps"][kind])
            barrier()
            out["results"][kind] = spec["steps"][kind] / (time.perf_counter() - t0)
    return out


def _accelerate_fn(spec: dict[str, Any], t_call: float, out_path: str) -> None:
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)
    out = _measure(spec, acc.prepare, acc.backward, acc.wait_for_everyone, t_call)
    if acc.process_index == 0:
        with open(out_path, "w") as f:
            json.dump(out, f)


def run_accelerate(spec: dict[str, Any]) -> dict[str, Any]:
    from accelerate import notebook_launcher

    fd, path = tempfile.mkstemp(prefix="bench-accelerate-", suffix=".json")
    os.close(fd)
    try:
        t_call = time.time()
        t0 = time.perf_counter()
        notebook_launcher(_accelerate_fn, (spec, t_call, path), num_processes=2, use_port=str(free_port()))
        wall = time.perf_counter() - t0
        with open(path) as f:
            out = json.load(f)
    finally:
        os.unlink(path)
    return {**out, "wall_s": wall}


def _fabric_fn(fabric: Any, spec: dict[str, Any], t_call: float) -> dict[str, Any]:
    return _measure(spec, fabric.setup, fabric.backward, fabric.barrier, t_call)


def run_fabric(spec: dict[str, Any]) -> dict[str, Any]:
    from lightning.fabric import Fabric

    os.environ.pop("MASTER_PORT", None)  # a fresh free port for every launch
    t_call = time.time()
    t0 = time.perf_counter()
    fabric = Fabric(accelerator="cpu", devices=2, strategy="ddp_notebook")
    out = fabric.launch(_fabric_fn, spec, t_call)
    wall = time.perf_counter() - t0
    return {**out, "wall_s": wall}


RUNNERS = {"accelerate": ("accelerate", run_accelerate), "fabric": ("lightning", run_fabric)}


def main(argv: list[str]) -> int:
    name = argv[0]
    package, run = RUNNERS[name]
    try:
        t0 = time.perf_counter()
        __import__(package)  # torch with it
        _say({"ok": True, "import_s": time.perf_counter() - t0})
    except Exception as exc:
        _say({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            _say({"ok": True, **run(json.loads(line))})
        except Exception as exc:
            _say({"ok": False, "error": f"{type(exc).__name__}: {exc}\n{traceback.format_exc()[-3000:]}"})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
