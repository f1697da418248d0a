"""DDP communication hooks: compression, and a measuring wrapper (timing + GNS norms).

Each hook is a plain function ``(state, bucket) -> Future`` as torch.distributed expects.
``measure_hook`` wraps any inner hook (the default all-reduce or a compression hook): it
records the squared norm of this rank's local gradient before the exchange and, after it,
the squared norm of this rank's 1/world_size share of the reduced gradient (the reduced
gradient is the same on every rank, so the steps loop sums the shares in the all-reduce it
runs anyway instead of every rank reading the whole of it), and when the exchange finished.
It changes no gradient, so training with it is identical to training without it
(McCandlish et al. 2018 only need the two norms; no extra backward pass).

On a GPU the exchange's time is the compute stream's, not the CPU's: NCCL's future completes when
the all-reduce is queued, so a CPU clock around it reads microseconds whatever the network does.
There the last bucket is framed by two CUDA events (before its exchange; after the compute stream
waits for it), read once the device has passed them, without a synchronisation; and the hook adds
no Python callback unless the GNS norms need one (a callback per step cost a short step 0.3 ms on
an H100: docs/benchmarks.md).
"""

# No ``from __future__ import annotations`` here: DDP checks the hooks' annotations at runtime.
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

Hook = Any
MAX_EVENTS = 64  # steps whose exchange times a GPU may still owe


def allreduce(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket over ranks (DDP's default behaviour)."""
    return default_hooks.allreduce_hook(state, bucket)


def fp16_compress(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Exchange the bucket in float16, then cast back."""
    return default_hooks.fp16_compress_hook(state, bucket)


def bf16_compress(state: Any, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Exchange the bucket in bfloat16, then cast back."""
    return default_hooks.bf16_compress_hook(state, bucket)


def inner_hook(kind: str, rank: int = 1, start_iter: int = 10) -> tuple[Hook, object]:
    """Return ``(hook, state)`` for a gradient_compression setting."""
    if kind == "none":
        return allreduce, None
    if kind == "fp16":
        return fp16_compress, None
    if kind == "bf16":
        return bf16_compress, None
    if kind == "powersgd":
        state = powersgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=rank, start_powerSGD_iter=max(2, start_iter)
        )
        return powersgd.powerSGD_hook, state
    raise ValueError(f"unknown gradient_compression {kind!r}")


@dataclass
class MeasureState:
    """What ``measure_hook`` collects during one exchange (reset by the steps loop)."""

    inner: Hook
    inner_state: Any
    gns: bool = False
    measuring: bool = True  # with gns: measure this step (the steps loop samples every Nth)
    rank: int = 0
    world_size: int = 1
    local_sq: list[torch.Tensor] = field(default_factory=list)
    reduced_sq: list[torch.Tensor] = field(default_factory=list)
    last_launch: float = 0.0
    last_done: float = 0.0
    buckets: int = 0
    forwards: int = 0  # training forward passes since the last reset
    samples: int = 0  # their examples
    comm_seconds: float = 0.0  # FSDP: the all-gathers' and reduce-scatters' time, which nothing hides
    # CUDA: (before, after) events framing each step's last exchange, not yet read (survive reset)
    events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = field(default_factory=list)

    def reset(self) -> None:
        self.local_sq.clear()
        self.reduced_sq.clear()
        self.buckets = 0
        self.forwards = self.samples = 0
        self.last_launch = self.last_done = 0.0
        self.comm_seconds = 0.0

    def add_comm(self, start: float, end: float) -> None:
        """Count one blocking collective of ``end - start`` seconds (FSDP's comms)."""
        self.comm_seconds += end - start
        self.last_launch, self.last_done = start, end

    def exposed_comm(self, wait: bool = False) -> float:
        """Seconds between launching the last bucket and its result (communication not hidden);
        for FSDP, every collective's time since the last reset. On a GPU: the exchanges the device
        has finished since the last call (a step or two late; ``wait``: all of them, waiting)."""
        if self.comm_seconds:
            return self.comm_seconds
        if self.events:
            return self._device_seconds(wait)
        return max(0.0, self.last_done - self.last_launch) if self.buckets else 0.0

    def _device_seconds(self, wait: bool) -> float:
        total, left = 0.0, []
        # past MAX_EVENTS the oldest pair is waited for: a CPU far ahead of its GPU holds few events
        wait_for = len(self.events) - MAX_EVENTS
        for i, (before, after) in enumerate(self.events):
            if wait or i < wait_for or after.query():
                after.synchronize()  # at once when the device has passed it (query() was true)
                total += before.elapsed_time(after) / 1e3  # milliseconds
            else:
                left.append((before, after))
        self.events = left
        return total

    def norms(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(local |g|^2, this rank's share of the reduced |g|^2) of the last exchange as 0-d
        float64 tensors on the gradients' device (not read here: reading waits for the device),
        or None when not measured; the shares of all ranks add up to the reduced |g|^2."""
        if not self.gns or not self.local_sq or len(self.reduced_sq) != len(self.local_sq):
            return None
        return torch.stack(self.local_sq).double().sum(), torch.stack(self.reduced_sq).double().sum()


def attach_measure(model: torch.nn.Module, state: MeasureState) -> None:
    """Keep ``state`` on the wrapped model, where the steps loop and the hand loop find it."""
    model._dtwork_measure = state  # type: ignore[assignment]


def measure_state(model: torch.nn.Module) -> MeasureState | None:
    """The measuring state ``ctx.wrap`` attached to ``model``, or None for a model it did not wrap."""
    return getattr(model, "_dtwork_measure", None)


def sq_norm(t: torch.Tensor, part: int = 0, parts: int = 1) -> torch.Tensor:
    """|t|^2 (of its ``part``-th of ``parts`` contiguous slices) in float32 or wider, without a
    full-size temporary for float32 buffers."""
    flat = t.detach().reshape(-1)
    if parts > 1:
        n = flat.numel()
        flat = flat[n * part // parts : n * (part + 1) // parts]
    if flat.dtype not in (torch.float32, torch.float64):
        flat = flat.float()
    return torch.dot(flat, flat)


def count_forward(state: MeasureState, args: tuple[object, ...]) -> None:
    """Count a training forward pass and its examples (the first tensor's first dimension)."""
    if not torch.is_grad_enabled():
        return
    state.forwards += 1
    first = next((a for a in args if isinstance(a, torch.Tensor)), None)
    state.samples += int(first.shape[0]) if first is not None and first.dim() else 1


def measure_hook(state: MeasureState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Time the exchange and (with ``gns``, on a measured step) record the squared norms."""
    gns = state.gns and state.measuring
    if bucket.index() == 0:  # a new exchange: drop the norms of one no optimizer step used
        state.local_sq.clear()
        state.reduced_sq.clear()
    if gns:
        state.local_sq.append(sq_norm(bucket.buffer()))
    state.buckets += 1
    on_cpu = not bucket.buffer().is_cuda
    if not on_cpu and bucket.is_last():
        return _last_on_device(state, bucket, gns)
    if on_cpu:  # a GPU's earlier buckets go out untimed: the last one's wait is what shows
        state.last_launch = time.perf_counter()
    fut: torch.futures.Future[torch.Tensor] = state.inner(state.inner_state, bucket)
    if not (gns or on_cpu):
        return fut

    def done(f: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        out = _tensor(f.value())
        if gns:
            state.reduced_sq.append(sq_norm(out, state.rank, state.world_size))
        if on_cpu:
            state.last_done = time.perf_counter()
        return out

    return fut.then(done)


def _last_on_device(
    state: MeasureState, bucket: dist.GradBucket, gns: bool
) -> torch.futures.Future[torch.Tensor]:
    """A GPU's last bucket, waited for on the compute stream between two events: no overlap is lost
    (every gradient exists by then) and no callback is needed."""
    before, after = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    before.record()
    fut: torch.futures.Future[torch.Tensor]
    if state.inner is allreduce:  # torch's allreduce_hook, without its callback
        group = state.inner_state if state.inner_state is not None else dist.group.WORLD
        out = bucket.buffer().div_(dist.get_world_size(group))
        dist.all_reduce(out, group=group)  # the compute stream waits for it; the CPU does not
        fut = torch.futures.Future()
        fut.set_result(out)
    else:
        fut = state.inner(state.inner_state, bucket)
        out = _tensor(fut.wait())  # the compute stream waits for the exchange (and its decompression)
    after.record()
    state.events.append((before, after))
    if gns:
        state.reduced_sq.append(sq_norm(out, state.rank, state.world_size))
    return fut


def _tensor(value: torch.Tensor | list[torch.Tensor]) -> torch.Tensor:
    """A hook future's value: torch's hooks give a tensor, a process group's work a list of one."""
    return value[0] if isinstance(value, list) else value
