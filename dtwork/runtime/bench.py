"""Engine side of the analysis commands: time DDP training steps on a subset of the ranks.

``time_synthetic_steps`` and ``time_loader_steps`` run on EVERY rank with one ``BenchRequest``
(``dtwork.shared.bench``). Ranks ``0 .. world-1`` form a process group (created collectively,
cached per world size) and train the model for ``warmup`` untimed and ``steps`` timed steps, on
random batches or on the user's loader's; the other ranks return None. The loss is
``output.float().mean()``: only the speed matters here, not what the model learns.

Throughput T = samples / elapsed seconds; the elapsed time of a world is the slowest rank's
(all-reduced with MAX), so T(world) = world × per-slot batch × steps / elapsed.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from dtwork.runtime.loop.data import input_shape, shape_hint
from dtwork.runtime.measure.ddp_hooks import MeasureState, inner_hook, measure_hook
from dtwork.shared.bench import BenchFailure, BenchRequest, BenchResult, LoaderFacts
from dtwork.shared.timing import synchronize

__all__ = ["loader_facts", "time_loader_steps", "time_synthetic_steps", "with_settings"]

_GROUPS: dict[int, dist.ProcessGroup] = {}

Answer = BenchResult | BenchFailure | None  # None: a rank outside the timed world


def _group(world: int) -> dist.ProcessGroup:
    """The process group of ranks 0..world-1 (every rank must call this, in the same order)."""
    if world not in _GROUPS:
        group = dist.new_group(ranks=list(range(world)))
        assert group is not None  # every rank is in the default group, so each gets one
        _GROUPS[world] = group
    return _GROUPS[world]


def _user_ns() -> dict[str, object]:
    from IPython import get_ipython

    shell = get_ipython()
    return shell.user_ns if shell is not None else {}


def _inputs(batch: object) -> torch.Tensor:
    """The model input of a batch: the first item of a tuple/list batch, else the batch."""
    if isinstance(batch, (tuple, list)):
        return batch[0]  # type: ignore[no-any-return]
    if isinstance(batch, dict):
        return next(iter(batch.values()))  # type: ignore[no-any-return]
    return batch  # type: ignore[return-value]


def _agree(ok: bool, group: dist.ProcessGroup, device: torch.device) -> bool:
    """True when every rank of ``group`` is ok (one all-reduce)."""
    flag = torch.tensor([0.0 if ok else 1.0], device=device)
    dist.all_reduce(flag, group=group)
    return float(flag.item()) == 0.0


def loader_facts(loader: object) -> LoaderFacts:
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


def with_settings(
    loader: torch.utils.data.DataLoader[object], settings: Mapping[str, object]
) -> torch.utils.data.DataLoader[object]:
    """The same batches from the same dataset and sampler, loaded with ``settings`` changed."""
    kwargs: dict[str, object] = {
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
    return torch.utils.data.DataLoader(loader.dataset, **kwargs)  # type: ignore[arg-type]


# -- setting up: the expressions, evaluated on every rank and agreed on ------------------------------


@dataclass
class _Setup:
    """A rank of the timed world, with the user's model (on its device) and loader."""

    group: dist.ProcessGroup
    rank: int
    device: torch.device
    model: torch.nn.Module
    loader: object | None
    bucket_mb: float  # the config's tensor_fusion_threshold, unless the request names one


def _evaluate(request: BenchRequest) -> tuple[torch.nn.Module | None, object | None, str | None]:
    """The model and loader of the request's expressions, or the error as "Name: message"."""
    ns = _user_ns()
    try:
        model = eval(request.model_expr, ns)  # noqa: S307 - the user's own expression, on their engines
        if not isinstance(model, torch.nn.Module):
            raise TypeError(f"{request.model_expr} is a {type(model).__name__}, not a torch.nn.Module")
        loader = None
        if request.loader is not None:
            spec = request.loader
            loader = eval(spec.expr, ns)  # noqa: S307
            if spec.settings:
                if not isinstance(loader, torch.utils.data.DataLoader):
                    raise TypeError(f"{spec.expr} is a {type(loader).__name__}, not a DataLoader")
                loader = with_settings(loader, spec.settings)
    except Exception as exc:  # reported once, by the kernel
        return None, None, f"{type(exc).__name__}: {exc}"
    return model, loader, None


def _setup(request: BenchRequest) -> _Setup | BenchFailure | None:
    """This rank's setup, a failure every rank of the world agrees on, or None outside the world."""
    group = _group(request.world)
    rank = dist.get_rank()
    if rank >= request.world:
        return None
    import dtwork.runtime as rt

    ctx = rt.current()
    device = ctx.device
    model, loader, error = _evaluate(request)
    if not _agree(error is None, group, device):
        return {"error": error or "failed on another rank", "rank": rank}
    assert model is not None
    fusion = request.bucket_mb or ctx.config.optimizations.tensor_fusion_threshold
    return _Setup(group, rank, device, model.to(device), loader, fusion)


# -- timing -------------------------------------------------------------------------------------------


def _time_steps(setup: _Setup, request: BenchRequest, next_batch: Callable[[], torch.Tensor]) -> BenchResult:
    """Wrap the model in DDP, train ``warmup`` then ``steps`` timed steps; the world's numbers."""
    group, device = setup.group, setup.device
    kwargs: dict[str, object] = {"process_group": group, "bucket_cap_mb": setup.bucket_mb}
    if device.type == "cuda":
        kwargs["device_ids"] = [device.index or 0]
    ddp = DDP(setup.model, **kwargs)  # type: ignore[arg-type]
    hook, _ = inner_hook("none")
    state = MeasureState(inner=hook, inner_state=group)
    ddp.register_comm_hook(state, measure_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)

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

    for _ in range(request.warmup):
        one_step()
    dist.barrier(group=group)
    t0 = time.perf_counter()
    step_times, comm_times, samples = [], [], 0
    for _ in range(request.steps):
        st, ct, n = one_step()
        step_times.append(st)
        comm_times.append(ct)
        samples += n
    synchronize(device)
    elapsed = time.perf_counter() - t0
    dist.barrier(group=group)
    world_elapsed, world_samples = _world_numbers(elapsed, samples, group, device)
    return {
        "world": request.world,
        "rank": setup.rank,
        "per_slot": request.per_slot,
        "shape": list(request.shape) if request.shape is not None else None,
        "samples_per_s": samples / elapsed if elapsed > 0 else 0.0,
        "world_samples_per_s": world_samples / world_elapsed if world_elapsed > 0 else 0.0,
        "step_time": sum(step_times) / max(1, len(step_times)),
        "comm_time": sum(comm_times) / max(1, len(comm_times)),
        "elapsed": world_elapsed,
        "loader": loader_facts(setup.loader) if setup.loader is not None else None,
    }


def _world_numbers(
    elapsed: float, samples: int, group: dist.ProcessGroup, device: torch.device
) -> tuple[float, float]:
    """The slowest rank's elapsed seconds and the samples of all ranks (two all-reduces)."""
    stats = torch.tensor([elapsed, float(samples)], dtype=torch.float64, device=device)
    slowest = stats[:1].clone()
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX, group=group)
    total = stats[1:].clone()
    dist.all_reduce(total, group=group)
    return float(slowest.item()), float(total.item())


# -- the two callers: random batches, the loader's batches -------------------------------------------


def time_synthetic_steps(request: BenchRequest) -> Answer:
    """Time ``request`` on random batches of ``(per_slot, *shape)``, the same every step.

    With a loader, its first batch sets the shape (unless given) and the per-slot batch. The shape
    otherwise comes from the model's first layer; a model whose shape is unknown, or that refuses
    the batch, fails in one line naming ``--shape``.
    """
    setup = _setup(request)
    if not isinstance(setup, _Setup):
        return setup
    shape, per_slot = request.shape, request.per_slot
    if setup.loader is not None:
        first = _inputs(next(iter(setup.loader)))  # type: ignore[call-overload]
        if shape is None:
            shape = tuple(first.shape[1:])
        per_slot = int(first.shape[0])
    if shape is None:
        shape = input_shape(setup.model)
        if shape is None:
            return {"error": shape_hint(setup.model), "rank": setup.rank}
    gen = torch.Generator().manual_seed(setup.rank)
    x = torch.randn((per_slot, *shape), generator=gen).to(setup.device)
    # A forward outside DDP (no collectives) finds a wrong shape on every rank alike, in one line.
    try:
        with torch.no_grad():
            setup.model(x)
    except Exception as exc:
        said = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        return {"error": shape_hint(setup.model, tuple(shape), said), "rank": setup.rank}
    return _time_steps(setup, replace(request, shape=shape, per_slot=per_slot), lambda: x)


def time_loader_steps(request: BenchRequest) -> Answer:
    """Time ``request`` on the batches of its loader, starting the loader over when it runs out."""
    setup = _setup(request)
    if not isinstance(setup, _Setup):
        return setup
    loader = setup.loader
    assert loader is not None, "time_loader_steps needs a request with a loader"
    it = iter(loader)  # type: ignore[call-overload]
    waiting = [_inputs(next(it))]  # taken now, so workers fill their queue while DDP is set up

    def next_batch() -> torch.Tensor:
        nonlocal it
        if waiting:
            return waiting.pop().to(setup.device)
        try:
            return _inputs(next(it)).to(setup.device)
        except StopIteration:
            it = iter(loader)  # type: ignore[call-overload]
            return _inputs(next(it)).to(setup.device)

    warmup = request.warmup
    workers = getattr(loader, "num_workers", 0)
    if workers > 0:
        # Workers fill their queue while the model is set up: time the steady state, not that.
        warmup = max(warmup, workers * (getattr(loader, "prefetch_factor", None) or 2) + 1)
    return _time_steps(setup, replace(request, warmup=warmup), next_batch)
