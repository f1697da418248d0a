"""The loop's device path: the measuring DDP hook and the steps' sync.

The hook changes no gradient and times the exchange the way the device sees it; on a GPU, neither it
nor the sync makes the CPU wait for work queued before it. A real one-rank process group in this
process (gloo; NCCL for the tests marked ``gpu``). Work is made slow on purpose (an exchange that
completes late on the CPU, a sleep kernel queued on the GPU), and what is read back must cover it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

from dtwork.runtime.loop.sync import StepHead, StepSync
from dtwork.runtime.measure.ddp_hooks import MeasureState, allreduce, measure_hook

CUDA = torch.cuda.is_available()
needs_gpu = pytest.mark.skipif(not CUDA, reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def group(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A real process group of one rank in this process: NCCL with a GPU, else gloo."""
    backend = "nccl" if CUDA else "gloo"
    store = tmp_path_factory.mktemp("pg") / "store"
    dist.init_process_group(backend, init_method=f"file://{store}", rank=0, world_size=1)
    yield backend
    dist.destroy_process_group()


def _model(device: torch.device, hook: Any = None, state: Any = None) -> DDP:
    torch.manual_seed(0)
    # two buckets (bucket_cap_mb small): the first goes out during the backward pass, the last is waited for
    net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 4))
    ids = [device.index or 0] if device.type == "cuda" else None
    ddp = DDP(net.to(device), device_ids=ids, bucket_cap_mb=0.2)
    if hook is not None:
        ddp.register_comm_hook(state, hook)
    return ddp


def _train(ddp: DDP, device: torch.device, steps: int, after_step: Callable[[], None] = lambda: None) -> None:
    g = torch.Generator().manual_seed(1)
    # on the device before the loop: a copy from host memory would wait for the GPU at every step
    data = [
        (torch.randn(32, 64, generator=g).to(device), torch.randn(32, 4, generator=g).to(device))
        for _ in range(steps)
    ]
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    for x, y in data:
        opt.zero_grad(set_to_none=True)
        F.mse_loss(ddp(x), y).backward()
        opt.step()
        after_step()


def _same_training(device: torch.device, gns: bool) -> None:
    state = MeasureState(allreduce, None, gns=gns)
    plain, hooked = _model(device), _model(device, measure_hook, state)
    _train(plain, device, 4)
    norms: list[Any] = []
    _train(hooked, device, 4, lambda: norms.append(state.norms()))
    for a, b in zip(plain.parameters(), hooked.parameters(), strict=True):
        assert torch.equal(a, b)
    if gns:  # every step's norms, local and reduced, which agree on one rank
        assert all(n is not None and torch.allclose(n[0], n[1]) for n in norms), norms
    else:
        assert norms == [None] * 4


@pytest.mark.parametrize("gns", [False, True])
def test_the_hook_changes_no_gradient_on_the_cpu(group: str, gns: bool) -> None:
    _same_training(torch.device("cpu"), gns=gns)


def test_a_late_exchange_on_the_cpu_counts_as_exposed(group: str) -> None:
    delay = 0.05

    def late(_: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        fut: torch.futures.Future[torch.Tensor] = torch.futures.Future()
        threading.Timer(delay, fut.set_result, (bucket.buffer(),)).start()
        return fut

    state = MeasureState(late, None)
    seen: list[float] = []
    cpu = torch.device("cpu")
    _train(_model(cpu, measure_hook, state), cpu, 3, lambda: seen.append(state.exposed_comm()))
    assert all(delay * 0.9 <= s < delay + 5.0 for s in seen), seen


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("gns", [False, True])
def test_the_hook_changes_no_gradient_on_the_gpu(group: str, gns: bool) -> None:
    _same_training(torch.device("cuda", 0), gns=gns)


def _sleep_seconds(cycles: int) -> float:
    """How long ``torch.cuda._sleep(cycles)`` keeps the GPU, timed with events."""
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    torch.cuda._sleep(cycles)
    b.record()
    b.synchronize()
    return a.elapsed_time(b) / 1e3


@pytest.mark.gpu
@needs_gpu
def test_a_slow_exchange_on_the_gpu_counts_as_exposed_without_waiting(group: str) -> None:
    """NCCL's future completes when the all-reduce is queued: a CPU clock would read microseconds.
    The exposed time comes from the device, a step or two late, and adds up to the slow exchanges."""
    cycles = 40_000_000
    slow = _sleep_seconds(cycles)
    assert slow > 0.002, slow  # the clock makes the sleep long enough to tell apart

    def slow_allreduce(s: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
        if bucket.is_last():
            torch.cuda._sleep(cycles)  # on the compute stream, before the exchange: the wait grows by it
        return allreduce(s, bucket)

    device = torch.device("cuda", 0)
    state = MeasureState(slow_allreduce, None)
    read: list[float] = []
    t0 = time.perf_counter()
    _train(_model(device, measure_hook, state), device, 5, lambda: read.append(state.exposed_comm()))
    queued = time.perf_counter() - t0
    read.append(state.exposed_comm(wait=True))
    assert not state.events
    assert 5 * slow * 0.9 <= sum(read) < 5 * slow + 1.0, (read, slow)
    assert queued < 5 * slow, "the CPU waited for the device while timing it"

    fast = MeasureState(allreduce, None)  # the usual exchange: measured, small, and never negative
    got: list[float] = []
    _train(_model(device, measure_hook, fast), device, 5, lambda: got.append(fast.exposed_comm()))
    got.append(fast.exposed_comm(wait=True))
    assert 0.0 < sum(got) < 5 * slow, got


@pytest.mark.gpu
@needs_gpu
def test_the_sync_on_a_gpu_waits_only_for_the_step_it_reads(group: str) -> None:
    """Launching the steps' all-reduce returns while the step's work still runs; reading it waits for
    that step only, not for the work queued after it; the values are the logged ones."""
    device = torch.device("cuda", 0)
    cycles = 40_000_000
    slow = _sleep_seconds(cycles)
    sync = StepSync(device, 1)
    assert not sync.waits_now  # a GPU's sync is read a step later, whatever the step time
    for step in range(3):
        loss = torch.full((), float(step), device=device)
        torch.cuda._sleep(cycles)  # the step's work
        sync.add_log({"loss": loss * 2, "lr": 0.5})
        t0 = time.perf_counter()
        sync.record(step, StepHead(stop=1.0 if step == 2 else 0.0))
        sync.launch()
        launched = time.perf_counter() - t0
        torch.cuda._sleep(4 * cycles)  # the next step's work, queued before the read
        out = sync.drain()
        read = time.perf_counter() - t0
        assert launched < slow / 2, (launched, slow)
        assert read < 3 * slow, (read, slow)  # not the 5 sleeps queued
        assert [(o.step, dict(zip(o.local, o.logs, strict=True)), o.head.stop) for o in out] == [
            (step, {"loss": 2.0 * step, "lr": 0.5}, 1.0 if step == 2 else 0.0)
        ]
    torch.cuda.synchronize()
