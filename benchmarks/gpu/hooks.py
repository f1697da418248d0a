"""``python -m benchmarks.gpu.hooks [--steps N] [--reps R]``: what DDP's communication hook costs a short step.

One process, a one-rank group (NCCL on a GPU, gloo on the CPU), the suite's MLP at batch 256, fused AdamW.
Variants train in turns, best of ``R`` windows of ``N`` steps each: the bare model; DDP with no hook (its
C++ all-reduce); DDP with torch's Python ``allreduce_hook``; DDP with dtwork's measuring hook around it
(what ``ctx.wrap`` registers), with and without the GNS norms; a hook timing with one callback; a hook
waiting for its all-reduce and returning a completed future. Prints one JSON line; torch alone is needed.
"""

# No ``from __future__ import annotations``: DDP checks the hooks' annotations at runtime.

import argparse
import json
import os
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP

from dtwork.runtime.measure.ddp_hooks import MeasureState, allreduce, measure_hook


def _mlp(dev: torch.device) -> nn.Module:
    torch.manual_seed(0)
    layers = [
        nn.Flatten(),
        nn.Linear(784, 512),
        nn.ReLU(),
        nn.Linear(512, 512),
        nn.ReLU(),
        nn.Linear(512, 10),
    ]
    return nn.Sequential(*layers).to(dev)


def variants(dev: torch.device) -> dict[str, Callable[[], nn.Module]]:
    ids = [dev.index or 0] if dev.type == "cuda" else None

    def ddp(hook: Any = None, state: Any = None) -> Callable[[], nn.Module]:
        def make() -> nn.Module:
            m = DDP(_mlp(dev), device_ids=ids)
            if hook is not None:
                m.register_comm_hook(state, hook)
            return m

        return make

    def one_then(state: MeasureState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        state.last_launch = time.perf_counter()
        fut = dist.all_reduce(bucket.buffer().div_(1), async_op=True).get_future()

        def done(f: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            state.last_done = time.perf_counter()
            return f.value()[0]

        return fut.then(done)

    def no_then(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        dist.all_reduce(bucket.buffer(), async_op=False)
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        fut.set_result(bucket.buffer())
        return fut

    return {
        "bare": lambda: _mlp(dev),
        "ddp": ddp(),
        "ddp_torch_py_hook": ddp(default_hooks.allreduce_hook, None),
        "ddp_dtwork_hook": ddp(measure_hook, MeasureState(inner=allreduce, inner_state=None)),
        "ddp_one_then": ddp(one_then, MeasureState(inner=allreduce, inner_state=None)),
        "ddp_sync_no_then": ddp(no_then, None),
        "ddp_dtwork_hook_gns": ddp(measure_hook, MeasureState(inner=allreduce, inner_state=None, gns=True)),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks.gpu.hooks", description=__doc__)
    ap.add_argument("--steps", type=int, default=1000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("nccl" if cuda else "gloo", rank=0, world_size=1)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    g = torch.Generator().manual_seed(1)
    batches = [
        (torch.randn(256, 1, 28, 28, generator=g).to(dev), torch.randint(0, 10, (256,), generator=g).to(dev))
        for _ in range(8)
    ]
    jobs = {}
    for name, make in variants(dev).items():
        m = make()
        jobs[name] = (m, torch.optim.AdamW(m.parameters(), lr=1e-4, fused=cuda))
    secs: dict[str, list[float]] = {k: [] for k in jobs}
    for rep in range(args.reps + 1):  # the first round warms up
        for name, (m, opt) in jobs.items():
            sync()
            t0 = time.perf_counter()
            for i in range(args.steps):
                x, y = batches[i % 8]
                loss = F.cross_entropy(m(x), y)
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
            sync()
            if rep:
                secs[name].append(time.perf_counter() - t0)
    best = {k: min(v) for k, v in secs.items()}
    out = {
        "device": torch.cuda.get_device_name(0) if cuda else "cpu",
        "torch": torch.__version__,
        "steps": args.steps,
        "seconds": secs,
        "steps_per_s": {k: args.steps / v for k, v in best.items()},
        "us_per_step_over_bare": {k: 1e6 * (v - best["bare"]) / args.steps for k, v in best.items()},
    }
    print("HOOKS " + json.dumps(out), flush=True)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
