"""The training workload: one source text that every launcher runs unchanged.

``SOURCE`` is plain PyTorch (an MLP on 1x28x28, a small convnet on 3x32x32, synthetic batches in
memory, a hand-written DDP loop) assuming only an initialised gloo group: dtwork runs it in a
``%%dtrain`` cell, raw ipyparallel in a ``%px`` cell, torchrun in a script; Accelerate and Fabric
train its models and data through their own API. Every launcher gets one intra-op thread per rank
(torchrun sets ``OMP_NUM_THREADS=1`` itself), so that the comparison is of launchers, not threads.
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


def setup(kind, **ddp):
    """(DDP model, optimizer, batches) of this rank."""
    model = DDP(make_model(kind), **ddp)
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

# The persistent engines (dtwork, raw ipyparallel) build each workload once; its state then lives on.
SETUP_CELL = SOURCE + PIN_THREADS + "W = {kind: setup(kind) for kind in ('mlp', 'convnet')}\n"
TIMED_CELL = "_sps = timed(*W[{kind!r}], {warmup}, {steps})\n"
TURNS_CELL = "serve_turns({port}, 'dtwork', W)\n"
# The autoreload's own check on a rank, as each cell pays it: before the cell, then after it.
RELOAD_CHECK_CELL = """
import os as _os
from dtwork.runtime.scripts import autoreload as _autoreload
_reload_check_s = []
for _ in range({reps}):
    _t0 = time.perf_counter()
    _autoreload.reload_changed(_os.getcwd())
    _autoreload.remember()
    _reload_check_s.append(time.perf_counter() - _t0)
"""
# The changed training cell of the iteration-latency measurement: a new learning rate, one step.
CHANGED_CELL = "for _g in W[{kind!r}][1].param_groups:\n    _g['lr'] = 0.02\ntrain(*W[{kind!r}], 1)\n"

# dtwork's idiom for the same training (ctx.wrap + ctx.steps + ctx.log), defined on dtwork's ranks only.
DTWORK_SOURCE = '''
def idiom(kind, gns=None):
    model = ctx.wrap(make_model(kind), gns=gns)
    return model, torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9), make_batches(kind, ctx.rank)


def train_steps(model, opt, batches, steps, timed_from=None):
    """``steps`` steps of ctx.steps; the steps/s of those after ``timed_from`` when given."""
    t0 = None
    for step, (x, y) in ctx.steps(batches, max_steps=steps):
        if step == timed_from and t0 is None:
            dist.barrier()
            t0 = time.perf_counter()
        loss = F.cross_entropy(model(x), y)
        ctx.backward(loss)
        ctx.step(opt)
        ctx.log(loss=loss)
    if t0 is not None:
        dist.barrier()
        return (steps - timed_from) / (time.perf_counter() - t0)
'''

# A fresh wrapped model per measurement, dropped after, so that ctx's bookkeeping sees only that one.
TIMED_STEPS_CELL = "_m = idiom({kind!r}, gns=False)\n_sps = train_steps(*_m, {total}, {warmup})\ndel _m\n"
LATENCY_STEPS_SETUP, LATENCY_STEPS_TEARDOWN = "_lat = idiom({kind!r})\n", "del _lat\n"
CHANGED_STEPS_CELL = "for _g in _lat[1].param_groups:\n    _g['lr'] = 0.02\ntrain_steps(*_lat, 1)\n"

# torchrun runs the same source in a script, measuring as the spec in its argument says.
SCRIPT_MAIN = """
def _main():
    spec = json.loads(sys.argv[1])
    dist.init_process_group("gloo")
    dist.barrier()
    out = {"ready_s": time.time() - float(os.environ["BENCH_T0"]), "results": {}}
    if spec["mode"] == "serve":  # train in turns with dtwork (benchmarks.turns) until told to stop
        serve_turns(spec["port"], spec["job"], {kind: setup(kind) for kind in spec["kinds"]})
    else:
        for kind in spec["kinds"]:
            state = setup(kind)
            if spec["mode"] == "latency":
                train(*state, 1)
                dist.barrier()
                out["first_step_s"] = time.time() - float(os.environ["BENCH_T0"])
            else:
                out["results"][kind] = timed(*state, spec["warmup"][kind], spec["steps"][kind])
    if dist.get_rank() == 0:
        print("BENCH " + json.dumps(out), flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    _main()
"""


def torchrun_script() -> str:
    return "import json\nimport os\nimport sys\n" + SOURCE + SCRIPT_MAIN
