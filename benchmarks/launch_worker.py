"""A stand-in notebook kernel for launchers that fork their workers from the notebook process.

``python -m benchmarks.launch_worker accelerate|fabric`` imports the launcher (never touching a
device: both fork), answers ``BENCH {"ok": ...}``, then reads one JSON spec per line on stdin and
answers one ``BENCH {...}`` line per spec:

- ``{"mode": "throughput", "kinds": [...], "warmup": {...}, "steps": {...}}``: one launch that
  measures steps/s of each workload inside the ranks (after a warmup)
- ``{"mode": "latency", "kinds": [kind]}``: one launch that builds the model and runs one step
  (what re-running a changed training cell costs with these launchers: every call is a launch)

Every answer carries ``ready_s``: seconds from the launch call to a ready process group.
The training code is ``benchmarks.workload.SOURCE``'s models and data, driven through each
library's own API (``accelerator.prepare`` / ``fabric.setup`` and their ``backward``).
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


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write("BENCH " + json.dumps(obj) + "\n")
    sys.stdout.flush()


def _workload_ns() -> dict[str, Any]:
    ns: dict[str, Any] = {}
    exec(W.SOURCE, ns)
    ns["torch"].set_num_threads(1)  # one intra-op thread per rank, as torchrun gives its workers
    return ns


def _measure(
    spec: dict[str, Any],
    ns: dict[str, Any],
    prepare: Any,
    backward: Any,
    barrier: Any,
    t_call: float,
    ready: float,
) -> dict[str, Any]:
    """Run the spec on this rank with the library's prepare/backward; return what rank 0 reports."""
    torch, F = ns["torch"], ns["F"]
    out: dict[str, Any] = {"ready_s": ready, "results": {}}
    for kind in spec["kinds"]:
        model = ns["make_model"](kind)
        opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
        model, opt = prepare(model, opt)
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


# -- Accelerate ----------------------------------------------------------------------------------------


def _accelerate_fn(spec: dict[str, Any], t_call: float, out_path: str) -> None:
    from accelerate import Accelerator

    ns = _workload_ns()
    acc = Accelerator(cpu=True)
    acc.wait_for_everyone()
    ready = time.time() - t_call
    out = _measure(spec, ns, acc.prepare, acc.backward, acc.wait_for_everyone, t_call, ready)
    if acc.process_index == 0:
        with open(out_path, "w") as f:
            json.dump(out, f)


def run_accelerate(spec: dict[str, Any]) -> dict[str, Any]:
    from accelerate import notebook_launcher

    from benchmarks.util import free_port

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


# -- Lightning Fabric ----------------------------------------------------------------------------------


def _fabric_fn(fabric: Any, spec: dict[str, Any], t_call: float) -> dict[str, Any]:
    ns = _workload_ns()
    fabric.barrier()
    ready = time.time() - t_call
    return _measure(spec, ns, fabric.setup, fabric.backward, fabric.barrier, t_call, ready)


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
        mod = __import__(package)
        import torch  # noqa: F401  (already imported by the package; named for clarity)

        _say({"ok": True, "version": getattr(mod, "__version__", None), "import_s": time.perf_counter() - t0})
    except Exception as exc:
        _say({"ok": False, "error": f"{type(exc).__name__}: {exc}"})
        return 1
    for line in sys.stdin:
        if not line.strip():
            continue
        try:
            _say({"ok": True, **run(json.loads(line))})
        except Exception as exc:
            _say(
                {
                    "ok": False,
                    "error": f"{type(exc).__name__}: {exc}",
                    "traceback": traceback.format_exc()[-3000:],
                }
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
