"""The training workload: one source text that every launcher runs unchanged.

``SOURCE`` defines plain PyTorch: two models (an MLP on 1x28x28 inputs, a small convnet on
3x32x32), synthetic batches kept in memory (so data loading costs nothing), and a hand-written
DDP training loop. It assumes only that a gloo process group is initialised. dtwork runs it in
a ``%%dtrain`` cell, raw ipyparallel in a ``%px`` cell, torchrun in a script: the code that trains
is the same text. Accelerate and Fabric take its models and data inside their launched function
and train them through their own API (``prepare``/``setup`` and ``backward``).

Thread count: the training source does not touch ``torch.set_num_threads``. torchrun gives each of
its workers one intra-op thread (it sets ``OMP_NUM_THREADS=1`` when it starts more than one
process); the persistent engines (dtwork, raw ipyparallel) and the forked workers (Accelerate,
Fabric) get ``PIN_THREADS`` (one thread per rank) from the cells and functions that drive them, so
that the launchers compare on equal threads. What the engines would use on their own is recorded
apart (``threads`` in the results).
"""

from __future__ import annotations

KINDS = ("mlp", "convnet")

SOURCE = '''
import time
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def make_model(kind):
    torch.manual_seed(0)
    if kind == "mlp":
        return nn.Sequential(
            nn.Flatten(), nn.Linear(784, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)
        )
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Linear(64 * 8 * 8, 128), nn.ReLU(), nn.Linear(128, 10),
    )


def make_batches(kind, rank, n=16):
    """Synthetic batches in memory: per rank 64 x 1x28x28 (MLP) or 32 x 3x32x32 (convnet)."""
    g = torch.Generator().manual_seed(1000 + rank)
    shape, b = ((1, 28, 28), 64) if kind == "mlp" else ((3, 32, 32), 32)
    return [(torch.randn(b, *shape, generator=g), torch.randint(0, 10, (b,), generator=g)) for _ in range(n)]


def setup(kind):
    """(DDP model, optimizer, batches) of this rank."""
    model = DDP(make_model(kind))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    return model, opt, make_batches(kind, dist.get_rank())


def train(model, opt, batches, steps):
    loss = None
    for i in range(steps):
        x, y = batches[i % len(batches)]
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return loss.item() if loss is not None else float("nan")


def serve_turns(port, job, states):
    """Train in turns with other jobs (benchmarks.turns): "RUN kind steps" -> train -> "DONE seconds".

    Between turns the rank blocks in a socket read (no CPU), so the job whose turn it is has the
    machine as it would alone. Ends at "STOP" or when the coordinator goes away.
    """
    import socket

    with socket.create_connection(("127.0.0.1", port), timeout=120) as sock:
        sock.settimeout(None)
        f = sock.makefile("rw")
        f.write(f"HELLO {job} {dist.get_rank()}\\n")
        f.flush()
        for line in f:
            cmd = line.split()
            if len(cmd) != 3 or cmd[0] != "RUN":
                break
            model, opt, batches = states[cmd[1]]
            t0 = time.perf_counter()
            train(model, opt, batches, int(cmd[2]))
            f.write(f"DONE {time.perf_counter() - t0!r}\\n")
            f.flush()


def timed(model, opt, batches, warmup, steps):
    """Steps per second of ``steps`` steps after ``warmup`` steps (start-up excluded)."""
    train(model, opt, batches, warmup)
    dist.barrier()
    t0 = time.perf_counter()
    train(model, opt, batches, steps)
    dist.barrier()
    return steps / (time.perf_counter() - t0)
'''

PIN_THREADS = "torch.set_num_threads(1)\n"

# The "changed training cell" of the iteration-latency measurement: a new learning rate, one step.
CHANGED_CELL = """
for _g in {state}[1].param_groups:
    _g["lr"] = 0.02
_first_loss = train(*{state}, 1)
"""


# The same change in dtwork's idiom: ``ctx.steps`` over a ``ctx.wrap``-ped model kept on the ranks.
CHANGED_STEPS_CELL = """
for _g in _lat_opt.param_groups:
    _g["lr"] = 0.02
for step, (x, y) in ctx.steps(_lat_batches, max_steps=1):
    loss = F.cross_entropy(_lat_model(x), y)
    ctx.backward(loss)
    ctx.step(_lat_opt)
    ctx.log(loss=loss)
"""

LATENCY_STEPS_SETUP = """
_lat_model = ctx.wrap(make_model({kind!r}))
_lat_opt = torch.optim.SGD(_lat_model.parameters(), lr=0.01, momentum=0.9)
_lat_batches = make_batches({kind!r}, ctx.rank)
"""

LATENCY_STEPS_TEARDOWN = "del _lat_model, _lat_opt, _lat_batches\n"


def state_name(kind: str) -> str:
    """The namespace variable holding ``setup(kind)`` in a persistent engine (dtwork, raw ipyparallel)."""
    return f"W_{kind}"


def setup_cell(kinds: tuple[str, ...] = KINDS) -> str:
    """The cell that defines the workload and builds each model once (state then lives on)."""
    return (
        SOURCE
        + "_default_threads = torch.get_num_threads()\n"
        + PIN_THREADS
        + "".join(f"{state_name(k)} = setup({k!r})\n" for k in kinds)
    )


def timed_cell(kind: str, warmup: int, steps: int, threads: str = "pinned") -> str:
    """A cell that measures steps/s into ``_sps``: one thread per rank, or the engine's default."""
    pin = "torch.set_num_threads(_default_threads)\n" if threads == "default" else PIN_THREADS
    return pin + f"_sps = timed(*{state_name(kind)}, {warmup}, {steps})\n" + PIN_THREADS


def turns_cell(port: int, job: str, kinds: tuple[str, ...] = KINDS) -> str:
    """The cell a persistent engine runs to train in turns (the states built by ``setup_cell``)."""
    states = "{" + ", ".join(f"{k!r}: {state_name(k)}" for k in kinds) + "}"
    return PIN_THREADS + f"serve_turns({port}, {job!r}, {states})\n"


def changed_cell(kind: str) -> str:
    return CHANGED_CELL.format(state=state_name(kind))


# -- torchrun: the same source in a script ---------------------------------------------------------

SCRIPT = '''"""Benchmark script for torchrun: the workload source, then measurements on demand."""
import json
import os
import sys
import time

_T_LAUNCH = float(os.environ["BENCH_T0"])
{source}

def _main():
    spec = json.loads(sys.argv[1])
    dist.init_process_group("gloo")
    dist.barrier()
    ready = time.time() - _T_LAUNCH
    out = {{"ready_s": ready, "default_threads": torch.get_num_threads(), "results": {{}}}}
    if spec["mode"] == "serve":  # train in turns with the other launchers (benchmarks.turns)
        serve_turns(spec["port"], spec.get("job", "torchrun"), {{kind: setup(kind) for kind in spec["kinds"]}})
        if dist.get_rank() == 0:
            print("BENCH " + json.dumps(out), flush=True)
        dist.destroy_process_group()
        return
    for kind in spec["kinds"]:
        state = setup(kind)
        if spec["mode"] == "latency":
            train(*state, 1)
            dist.barrier()
            out["first_step_s"] = time.time() - _T_LAUNCH
        else:
            out["results"][kind] = timed(*state, spec["warmup"][kind], spec["steps"][kind])
    if dist.get_rank() == 0:
        print("BENCH " + json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _main()
'''


def torchrun_script() -> str:
    return SCRIPT.format(source=SOURCE)
