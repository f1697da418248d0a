"""Engine side of the analysis commands: time DDP training steps on a subset of the ranks.

``measure`` runs on EVERY rank. Ranks ``0 .. world-1`` form a process group (created
collectively, cached per world size) and train the model for ``warmup`` untimed and ``steps``
timed steps; the other ranks return None. The loss is ``output.float().mean()``: only the
speed matters here, not what the model learns.

Throughput T = samples / elapsed seconds; the elapsed time of a world is the slowest rank's
(all-reduced with MAX), so T(world) = world × per-slot batch × steps / elapsed.
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dtwork.runtime.loop.data import input_shape, shape_hint
from dtwork.runtime.measure.ddp_hooks import MeasureState, inner_hook, measure_hook
from dtwork.shared.timing import synchronize

_GROUPS: dict[int, Any] = {}


def _group(world: int) -> Any:
    """The process group of ranks 0..world-1 (every rank must call this, in the same order)."""
    if world not in _GROUPS:
        _GROUPS[world] = dist.new_group(ranks=list(range(world)))
    return _GROUPS[world]


def _user_ns() -> dict[str, Any]:
    from IPython import get_ipython

    shell = get_ipython()
    return shell.user_ns if shell is not None else {}


def _ctx() -> Any:
    import dtwork.runtime as rt

    return rt.current()


def _inputs(batch: Any) -> Any:
    """The model input of a batch: the first item of a tuple/list batch, else the batch."""
    if isinstance(batch, (tuple, list)):
        return batch[0]
    if isinstance(batch, dict):
        return next(iter(batch.values()))
    return batch


def _agree(ok: bool, group: Any, device: torch.device) -> bool:
    """True when every rank of ``group`` is ok (one all-reduce)."""
    flag = torch.tensor([0.0 if ok else 1.0], device=device)
    dist.all_reduce(flag, group=group)
    return float(flag.item()) == 0.0


def loader_facts(loader: Any) -> dict[str, Any]:
    """What the loader advice needs to know about a rank's loader (``analysis.loading.candidates``)."""
    data = getattr(loader, "dataset", None)
    return {
        "torch": isinstance(loader, torch.utils.data.DataLoader),
        "iterable": isinstance(data, torch.utils.data.IterableDataset),
        "num_workers": getattr(loader, "num_workers", 0),
        "prefetch_factor": getattr(loader, "prefetch_factor", None),
        "pin_memory": bool(getattr(loader, "pin_memory", False)),
        "persistent_workers": bool(getattr(loader, "persistent_workers", False)),
        "cores": torch.get_num_threads(),  # this rank's share of the host's cores (set at start)
        "cuda": torch.cuda.is_available(),
    }


def with_settings(loader: torch.utils.data.DataLoader, settings: dict[str, Any]) -> Any:
    """The same batches from the same dataset and sampler, loaded with ``settings`` changed."""
    kwargs: dict[str, Any] = {
        "num_workers": loader.num_workers,
        "collate_fn": loader.collate_fn,
        "pin_memory": loader.pin_memory,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
        "persistent_workers": loader.persistent_workers,
    }
    if loader.num_workers > 0:
        kwargs["prefetch_factor"] = loader.prefetch_factor
    if loader.batch_sampler is not None:
        kwargs["batch_sampler"] = loader.batch_sampler
    else:  # batching off: one sample at a time
        kwargs.update(batch_size=None, sampler=loader.sampler)
    kwargs.update(settings)
    if kwargs["num_workers"] == 0:  # these two need workers
        kwargs.pop("prefetch_factor", None)
        kwargs["persistent_workers"] = False
    return torch.utils.data.DataLoader(loader.dataset, **kwargs)


def measure(
    model_expr: str,
    world: int,
    per_slot: int,
    steps: int,
    warmup: int,
    shape: tuple[int, ...] | None,
    loader_expr: str | None,
    synthetic: bool,
    bucket_mb: float | None,
    loader_settings: dict[str, Any] | None = None,
) -> dict[str, Any] | None:
    """Time ``steps`` DDP steps of ``eval(model_expr)`` on ranks 0..world-1.

    Returns (ranks < world) ``{"world", "rank", "samples_per_s" (this rank), "world_samples_per_s",
    "step_time", "comm_time", "per_slot", "shape", "loader" (its facts)}`` or ``{"error": "Name:
    message"}`` when the model (or loader) expression fails on some rank; ranks >= world return
    None. ``loader_settings`` rebuilds the loader with those DataLoader arguments changed.
    """
    group = _group(world)
    rank = dist.get_rank()
    if rank >= world:
        return None
    ctx = _ctx()
    device = ctx.device
    ns = _user_ns()
    error = None
    model = loader = None
    try:
        model = eval(model_expr, ns)  # noqa: S307 - the user's own expression, on their engines
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{model_expr} is a {type(model).__name__}, not a torch.nn.Module")
        if loader_expr:
            loader = eval(loader_expr, ns)  # noqa: S307
            if loader_settings:
                if not isinstance(loader, torch.utils.data.DataLoader):
                    raise TypeError(f"{loader_expr} is a {type(loader).__name__}, not a DataLoader")
                loader = with_settings(loader, loader_settings)
    except Exception as exc:  # reported once, by the kernel
        error = f"{type(exc).__name__}: {exc}"
    if not _agree(error is None, group, device):
        return {"error": error or "failed on another rank", "rank": rank}
    assert model is not None
    model = model.to(device)

    batches: list[Any] | None = None
    it = None
    if loader is not None:
        it = iter(loader)
        first = _inputs(next(it))
        if synthetic:
            if shape is None:
                shape = tuple(first.shape[1:])
            per_slot = int(first.shape[0])
            it = None
        else:
            batches = [first]
    if it is None:
        if shape is None:
            shape = input_shape(model)
            if shape is None:
                return {"error": shape_hint(model), "rank": rank}
        gen = torch.Generator().manual_seed(rank)
        x = torch.randn((per_slot, *shape), generator=gen).to(device)
        # A forward outside DDP (no collectives) finds a wrong shape on every rank alike, in one line.
        try:
            with torch.no_grad():
                model(x)
        except Exception as exc:
            said = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
            return {"error": shape_hint(model, tuple(shape), said), "rank": rank}

    kwargs: dict[str, Any] = {"process_group": group}
    kwargs["bucket_cap_mb"] = bucket_mb if bucket_mb else ctx.config.optimizations.tensor_fusion_threshold
    if device.type == "cuda":
        kwargs["device_ids"] = [device.index or 0]
    ddp = DDP(model, **kwargs)
    hook, _ = inner_hook("none")
    state = MeasureState(inner=hook, inner_state=group)
    ddp.register_comm_hook(state, measure_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)

    def next_batch() -> Any:
        nonlocal it
        if it is None:
            return x
        assert batches is not None and loader is not None
        if batches:
            return batches.pop().to(device)
        try:
            return _inputs(next(it)).to(device)
        except StopIteration:
            it = iter(loader)
            return _inputs(next(it)).to(device)

    def one_step() -> tuple[float, float, int]:
        inp = next_batch()
        state.reset()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = ddp(inp).float().mean()
        loss.backward()
        opt.step()
        synchronize(device)
        return time.perf_counter() - t0, state.exposed_comm(), int(inp.shape[0])

    if loader is not None and not synthetic and getattr(loader, "num_workers", 0) > 0:
        # Workers fill their queue while the model is set up: time the steady state, not that.
        warmup = max(warmup, loader.num_workers * (loader.prefetch_factor or 2) + 1)
    for _ in range(warmup):
        one_step()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    step_times, comm_times, samples = [], [], 0
    for _ in range(steps):
        st, ct, n = one_step()
        step_times.append(st)
        comm_times.append(ct)
        samples += n
    synchronize(device)
    elapsed = time.perf_counter() - t0
    dist.barrier(group=group)
    stats = torch.tensor([elapsed, float(samples)], dtype=torch.float64, device=device)
    slowest = stats[:1].clone()
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    total = stats[1:].clone()
    dist.all_reduce(total, group=group)
    world_elapsed = float(slowest.item())
    return {
        "world": world,
        "rank": rank,
        "per_slot": per_slot,
        "shape": list(shape) if shape is not None else None,
        "samples_per_s": samples / elapsed if elapsed > 0 else 0.0,
        "world_samples_per_s": float(total.item()) / world_elapsed if world_elapsed > 0 else 0.0,
        "step_time": sum(step_times) / max(1, len(step_times)),
        "comm_time": sum(comm_times) / max(1, len(comm_times)),
        "elapsed": world_elapsed,
        "loader": loader_facts(loader) if loader is not None else None,
    }
