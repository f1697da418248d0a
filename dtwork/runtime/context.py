"""``ctx``: what a ``%%dtrain`` cell sees on every rank.

Identity (rank, world size, device, ...) and batch sizes come from the kernel at start;
the helpers (``wrap``, ``loader``, ``steps``, ``log`` ...) hand the distributed details to
the modules beside this one, so that plain PyTorch stays in the researcher's hands. What a rank
keeps lives in ``ctx.state`` (``state.RankState``), which those modules take.
"""

from __future__ import annotations

import random
import warnings
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import numpy as np
import torch
import torch.distributed as dist

from dtwork.config import ExperimentConfig, load_config
from dtwork.errors import DtworkError, DtworkWarning
from dtwork.runtime.core import args as _args
from dtwork.runtime.core import control
from dtwork.runtime.core import effective_args as _called
from dtwork.runtime.core.publish import Publisher
from dtwork.runtime.core.state import RankState, RunningLoop
from dtwork.runtime.loop import options as _options
from dtwork.runtime.loop import step_calls as _train
from dtwork.runtime.loop import steps as _loop
from dtwork.shared import batch as _batch

if TYPE_CHECKING:
    import os
    from collections.abc import Mapping

    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.tensor.parallel import ParallelStyle
    from torch.optim.optimizer import ParamsT
    from torch.utils.data import DataLoader

    from dtwork.analysis.gns import GNSEstimator
    from dtwork.runtime.loop.adaptive import AdaptiveLoader
    from dtwork.runtime.loop.data import Shape

    ConfigSource = str | os.PathLike[str] | Mapping[str, object] | ExperimentConfig | None
    Dataset = torch.utils.data.Dataset[object]  # a map-style dataset of the user's examples


RANKS_ARRIVE_SECONDS = 60.0  # how long ctx.wrap, ctx.steps and ctx.evaluate wait for every rank

T = TypeVar("T")


class _Shared(Generic[T]):
    """An attribute of ``ctx`` that is the rank state's field of the same name (read and written)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, ctx: Context, owner: type | None = None) -> T:
        return getattr(ctx.state, self.name)  # type: ignore[no-any-return]

    def __set__(self, ctx: Context, value: T) -> None:
        setattr(ctx.state, self.name, value)


class Context:  # wide: 17 of its attributes are the public ctx names, views of one RankState's fields
    """Per-rank context; one instance per engine, named ``ctx`` in the cell namespace.

    Its attributes are the fields of ``state`` (a ``RankState``), which the runtime helpers take.
    """

    rank: _Shared[int] = _Shared()
    world_size: _Shared[int] = _Shared()
    local_rank: _Shared[int] = _Shared()
    device: _Shared[torch.device] = _Shared()
    backend: _Shared[str] = _Shared()
    hostname: _Shared[str] = _Shared()
    config: _Shared[ExperimentConfig] = _Shared()
    global_batch_size: _Shared[int | None] = _Shared()
    per_slot_batch_size: _Shared[int | None] = _Shared()
    publisher: _Shared[Publisher] = _Shared()
    loop: _Shared[RunningLoop | None] = _Shared()  # the running ctx.steps, if any
    gns: _Shared[float | None] = _Shared()
    gns_state: _Shared[GNSEstimator | None] = _Shared()
    gpu_index: _Shared[int | None] = _Shared()
    auto_resume: _Shared[bool | int] = _Shared()  # a restarted trial (True), a promoted one (a run)
    run_id: _Shared[int | None] = _Shared()  # the kernel's run (names its checkpoint folder), set per run
    run_store: _Shared[str | None] = _Shared()  # the kernel's store of that run (owns the folder)

    def __init__(
        self,
        *,
        rank: int,
        world_size: int,
        local_rank: int,
        device: torch.device,
        backend: str,
        config: ExperimentConfig | None = None,
        global_batch_size: int | None = None,
    ) -> None:
        self.state = RankState(
            rank=rank,
            world_size=world_size,
            local_rank=local_rank,
            device=device,
            backend=backend,
            config=config or load_config(None),
        )
        self._set_batch(global_batch_size)
        self._seed()
        control.install()

    @classmethod
    def from_spec(cls, spec: dict[str, Any], device: torch.device) -> Context:
        ctx = cls(
            rank=spec["rank"],
            world_size=spec["world_size"],
            local_rank=spec["local_rank"],
            device=device,
            backend=spec["backend"],
            config=load_config(spec.get("config")),
            global_batch_size=spec.get("global_batch_size"),
        )
        ctx.gpu_index = spec.get("gpu")
        return ctx

    @property
    def cell_ranks(self) -> list[int]:
        """The ranks the running cell runs on (``%%dtrain --ranks``): all unless the kernel said."""
        return self.state.cell_ranks

    def require_all_ranks(self, what: str, *, arrive: bool = False) -> None:
        """Refuse a collective that would wait for ranks that never come: in a cell that runs on some
        ranks only, at once; with ``arrive``, also when another rank does not reach it (a call under
        ``if ctx.rank == 0:``) within ``RANKS_ARRIVE_SECONDS`` instead of the group's whole timeout."""
        self.state.require_all_ranks(what, arrive_seconds=RANKS_ARRIVE_SECONDS if arrive else None)

    def __repr__(self) -> str:
        return (
            f"<dtwork ctx rank={self.rank}/{self.world_size} local_rank={self.local_rank} "
            f"device={self.device} backend={self.backend} host={self.hostname} "
            f"batch={self.per_slot_batch_size}/{self.global_batch_size}>"
        )

    # -- what the trial registered (weakly: a model the cell dropped is forgotten) ------------

    def register(self, kind: str, obj: object) -> None:
        self.state.register(kind, obj)

    @property
    def models(self) -> list[torch.nn.Module]:
        return self.state.models

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return self.state.optimizers

    @property
    def schedulers(self) -> list[torch.optim.lr_scheduler.LRScheduler]:
        return self.state.schedulers

    def forget_dropped(self) -> None:
        """Collect models/optimizers that earlier cells replaced, so checkpoints hold the live ones."""
        self.state.forget_dropped()

    # -- configuration ---------------------------------------------------------------------

    def configure(self, config: ConfigSource, global_batch_size: int | None = None) -> None:
        """Load an experiment config (dict, YAML or ExperimentConfig); the batch follows it."""
        self.config = load_config(config)
        self._set_batch(global_batch_size or self.config.global_batch_size or self.global_batch_size)
        self._seed()

    @property
    def hparams(self) -> dict[str, Any]:
        """The config's ``hyperparameters`` (Determined's, constants only)."""
        return self.config.hyperparameters

    @property
    def rank_seed(self) -> int:
        """``seed + rank``: for randomness that must differ between ranks (e.g. augmentation)."""
        return self.config.seed + self.rank

    def _seed(self) -> None:
        # The same seed on every rank, so models start equal and a run repeats.
        seed = self.config.seed
        random.seed(seed)
        np.random.seed(seed)
        torch.manual_seed(seed)

    def _set_batch(self, global_batch_size: int | None) -> None:
        if global_batch_size is None:
            self.global_batch_size = self.per_slot_batch_size = None
            return
        per_slot, dropped = _batch.split(global_batch_size, self.world_size)  # refuses fewer than slots
        effective = _batch.effective(global_batch_size, self.world_size)
        if dropped and self.rank == 0:
            warnings.warn(
                f"global batch {global_batch_size} does not divide over {self.world_size} slots: "
                f"{per_slot} per slot, {dropped} example(s) per step dropped "
                f"(effective global batch {effective})",
                DtworkWarning,
                stacklevel=3,
            )
        self.per_slot_batch_size = per_slot
        self.global_batch_size = effective

    def batch_size(self, default: int = 32) -> int:
        """Return the per-slot batch size, or ``default`` when no global batch was set."""
        return self.state.batch_size(default)

    # -- helpers (implemented beside this module) --------------------------------------------

    def wrap(
        self,
        model: torch.nn.Module,
        *,
        gns: bool | None = None,
        strategy: str | None = None,
        fsdp_blocks: tuple[type[torch.nn.Module], ...] = (),
        reshard_after_forward: bool = True,
        offload: bool = False,
        tp_plan: dict[str, ParallelStyle] | None = None,
        **ddp_kwargs: object,
    ) -> torch.nn.Module:
        """Move ``model`` to this rank's device and wrap it as the config asks: in DDP, or with
        ``strategy="fsdp"`` (or ``optimizations.strategy: fsdp``) sharded with FSDP2 (``fsdp_blocks``:
        the block classes to shard one by one; ``offload``: parameters and optimizer state on the CPU;
        ``tp_plan``: a tensor-parallel plan applied on ``ctx.mesh``'s tp dimension, FSDP on its dp)."""
        from torch.nn.parallel import DistributedDataParallel

        from dtwork.runtime.loop.bucket_tuning import tune_before_wrap
        from dtwork.runtime.parallel.ddp import wrap_model
        from dtwork.runtime.parallel.fsdp import check_strategy, shard_model
        from dtwork.runtime.parallel.strategy import strategy_of

        if isinstance(model, DistributedDataParallel) or strategy_of(model).sharded:
            raise DtworkError(
                "ctx.wrap got a model that is already wrapped (DistributedDataParallel or FSDP): "
                "use it as it is, or wrap the plain model (model.module) once"
            )
        if not isinstance(model, torch.nn.Module):
            raise DtworkError(f"ctx.wrap takes a torch.nn.Module, got {type(model).__name__}")
        self.require_all_ranks("ctx.wrap", arrive=True)
        how = strategy or ("fsdp" if tp_plan else self.state.config.optimizations.strategy)
        check_strategy(how)
        if tp_plan and how != "fsdp":
            raise DtworkError(
                "tp_plan shards with FSDP over ctx.mesh's dp dimension: use strategy='fsdp' with it"
            )
        if how == "fsdp":
            if ddp_kwargs:
                raise DtworkError(
                    f"strategy='fsdp' takes no DDP options ({', '.join(sorted(ddp_kwargs))}): drop them"
                )
            wrapped = shard_model(
                self.state,
                model,
                blocks=fsdp_blocks,
                reshard_after_forward=reshard_after_forward,
                offload=offload,
                tp_plan=tp_plan,
                gns=gns,
            )
        else:
            tune_before_wrap(self.state, model)  # optimizations.auto_tune_tensor_fusion, once per config
            wrapped = wrap_model(self.state, model, gns=gns, **ddp_kwargs)
        self.register("models", wrapped)
        _called.note(self.state, "ctx.wrap", gns=gns, strategy=how, offload=offload or None, **ddp_kwargs)
        self.state.fresh_wrap = True  # a new model: its first training loop starts a new run
        self.state.wrapped.append(weakref.ref(wrapped))
        return wrapped

    def mesh(self, dp: int | None = None, tp: int = 1) -> DeviceMesh:
        """A (dp, tp) DeviceMesh over the warm ranks (dims named "dp", "tp"); ``ctx.wrap(model,
        tp_plan={...})`` then splits layers over tp and shards with FSDP over dp."""
        from dtwork.runtime.parallel.fsdp import make_mesh

        self.require_all_ranks("ctx.mesh", arrive=True)
        return make_mesh(self.state, dp, tp)

    def loader(
        self, dataset: Dataset, batch_size: int | None = None, adaptive: bool = False, **kwargs: Any
    ) -> DataLoader[object] | AdaptiveLoader:
        """DataLoader over this rank's shard (DistributedSampler) with the per-slot batch size.

        ``adaptive=True``: a loader whose batch ``ctx.steps(loader, adaptive=True)`` or ``ctx.step``
        changes by goodput (``runtime/loop/adaptive.py``; options ``max_global_batch``,
        ``min_per_slot_batch``, ``decide_every``, ``lr_rule`` as in ``ctx.steps``)."""
        if adaptive:
            from dtwork.runtime.loop.adaptive import make_adaptive_loader

            return make_adaptive_loader(self.state, dataset, batch_size=batch_size, **kwargs)
        from dtwork.runtime.loop.data import make_loader

        return make_loader(self.state, dataset, batch_size=batch_size, **kwargs)

    @property
    def accumulation(self) -> int:
        """Micro-batches per optimizer step now (an adaptive batch changes it)."""
        loop = self.state.loop
        return loop.k if loop is not None else self.config.optimizations.aggregation_frequency

    @property
    def epoch(self) -> int:
        """The current pass over the data: the running loop's, else the adaptive loader's, else 0."""
        if self.state.loop is not None:
            return self.state.loop.epoch
        return self.state.adaptive.loader.epoch if self.state.adaptive is not None else 0

    def synthetic(self, *shapes: Shape, size: int = 1024, **kwargs: Any) -> Dataset:
        """A synthetic dataset of given shapes (see ``runtime.data.SyntheticDataset``)."""
        from dtwork.runtime.loop.data import SyntheticDataset

        return SyntheticDataset(*shapes, size=size, **kwargs)

    def optimizer(self, params: ParamsT, **overrides: object) -> torch.optim.Optimizer:
        """The configured optimizer with the scaled learning rate."""
        from dtwork.runtime.loop.optim import make_optimizer

        if isinstance(params, torch.nn.Module):
            raise DtworkError(
                f"ctx.optimizer takes parameters, got a model ({type(params).__name__}): "
                "use ctx.optimizer(model.parameters())"
            )
        opt = make_optimizer(self.state, params, **overrides)
        self.register("optimizers", opt)
        return opt

    def scheduler(
        self, optimizer: torch.optim.Optimizer, **overrides: object
    ) -> torch.optim.lr_scheduler.LambdaLR:
        """The configured warmup + decay schedule as a LambdaLR (stepped by ``ctx.step``)."""
        from dtwork.runtime.loop.optim import make_scheduler

        sched = make_scheduler(self.state, optimizer, **overrides)
        self.register("schedulers", sched)
        return sched

    def steps(
        self, loader: Iterable[object] | Dataset, max_steps: int | None = None, **kwargs: object
    ) -> Iterator[tuple[int, Any]]:  # the batches are the user's to unpack
        """Iterate ``(step, batch)``: accumulation, AMP, checkpoints, metrics and a consistent stop.

        ``step`` counts optimizer steps; with ``aggregation_frequency`` k each step yields k
        micro-batches (call ``ctx.backward(loss)`` and ``ctx.step(opt)`` on each: they step at the
        last one only). Every rank leaves at the same step: at ``max_steps``, at the end of
        ``max_epochs``, or on an interrupt. Every rank must enter it: one that does not within
        ``RANKS_ARRIVE_SECONDS`` fails the cell. A dataset given instead of a loader is iterated
        through ``ctx.loader(dataset)``, with a note.

        Options (keywords; an unknown one is refused with "did you mean"):

        - ``max_steps``: optimizer steps to take (default: the config's ``max_steps``, else its
          ``searcher.max_length``, else one epoch).
        - ``max_epochs``: passes over the loader (default: the config's; one when neither is set).
        - ``checkpoint_every``: write a checkpoint every N steps and when the loop ends (default:
          the config's ``checkpoint.every`` or ``min_checkpoint_period``; 0: none), into
          ``<checkpoint.directory>/run-<id>/``, keeping the newest ``checkpoint.keep`` of this run.
        - ``resume``: ``True`` continues from this run's newest checkpoint (from step 0 when it has
          none); ``7`` or ``"run-7"`` from run 7's newest; ``"path/step-00000040.pt"`` (or a run
          folder) from that file. A named checkpoint that is missing is an error.
        - ``validate``: a function called every ``validate_every`` steps (default: the config's
          ``min_validation_period``); the dict it returns is logged at that step, like ``ctx.log``.

        - ``check_replicas_every``: compare the replicas every N steps too (one all-reduce each), to
          name the first step where they differ.
        - ``new_run``: the run's one step axis. By default (None) a loop after a new ``ctx.wrap``
          starts a new run at step 0, and a loop over the same wrapped model goes on from the run's
          last step (``max_steps`` more); True starts a new run anyway, False goes on anyway;
          ``resume=True`` goes on with the run it resumes.

        At the loop's end the ranks compare a checksum of the wrapped models' weights: replicas that
        differ (a plain ``opt.step()``, a rank that skipped a step) fail the cell, naming the step.
        """
        options, adaptive = _options.steps_options(max_steps, kwargs)
        if isinstance(loader, torch.utils.data.Dataset) and not isinstance(loader, Iterable):
            if self.per_slot_batch_size is None:
                raise DtworkError(
                    "ctx.steps got a dataset, not a loader: pass ctx.loader(dataset) "
                    "(with a global batch set, or ctx.loader(dataset, batch_size=B))"
                )
            if self.rank == 0:
                warnings.warn(
                    f"ctx.steps got a dataset: iterating ctx.loader(dataset) (batches of "
                    f"{self.per_slot_batch_size} per rank, sharded); pass ctx.loader(...) yourself to choose",
                    DtworkWarning,
                    stacklevel=2,
                )
            loader = self.loader(loader)
        if self.world_size > 1:
            self.require_all_ranks("ctx.steps", arrive=True)
        return iter(_loop.StepLoop(self.state, loader, options, adaptive))

    def backward(self, loss: torch.Tensor) -> None:
        """Backward pass with loss scaling (fp16) and accumulation averaging."""
        _train.backward(self.state, loss)  # imported at the top: an import per step costs a training loop

    def step(self, optimizer: torch.optim.Optimizer) -> bool:
        """Optimizer step at the last micro-batch of a step; return whether it stepped."""
        return _train.optimizer_step(self.state, optimizer)

    def memory(self) -> dict[str, float]:
        """Bytes this rank holds now: parameters, gradients, optimizer state (local shards under
        FSDP), and ``peak_bytes`` on a GPU."""
        from dtwork.runtime.measure.memory import held

        return held(self.state.models, self.state.optimizers, self.state.device)

    def clip_grad_norm(self, model: torch.nn.Module, max_norm: float, **kwargs: Any) -> torch.Tensor | None:
        """Clip ``model``'s gradients to ``max_norm`` (unscaled first with fp16); return their norm."""
        from dtwork.runtime.loop.optim import clip_grad_norm

        return clip_grad_norm(self.state, model, max_norm, **kwargs)

    def log(self, **scalars: object) -> None:
        """Log scalars: averaged over ranks (average_training_metrics; every rank logs the same
        names, else the cell fails naming each rank's) or rank 0's."""
        loop = self.loop
        if loop is not None and "step" not in scalars:  # inside ctx.steps, every step: the short way
            loop.add_log(scalars)
        else:
            _train.log_scalars(self.state, scalars)

    def evaluate(
        self,
        model: torch.nn.Module,
        loader_or_dataset: DataLoader[object] | Dataset,
        metric_fn: Callable[..., object] | None = None,
        **kw: Any,
    ) -> Any:
        """Distributed evaluation: each rank its shard, gathered once, no padded duplicates."""
        from dtwork.runtime.loop.evaluate import evaluate

        if not isinstance(model, torch.nn.Module) and isinstance(loader_or_dataset, torch.nn.Module):
            raise DtworkError(
                "ctx.evaluate takes the model first: ctx.evaluate(model, dataset_or_loader, metric_fn)"
            )
        _args.check_keywords("ctx.evaluate", kw, _args.keyword_names(evaluate)[4:])
        self.require_all_ranks("ctx.evaluate", arrive=True)
        return evaluate(self.state, model, loader_or_dataset, metric_fn, **kw)

    # -- collectives users often want --------------------------------------------------------

    def barrier(self) -> None:
        self.require_all_ranks("ctx.barrier")
        dist.barrier()

    def all_reduce_mean(self, value: float | torch.Tensor) -> float:
        self.require_all_ranks("ctx.all_reduce_mean")
        t = torch.as_tensor(value, dtype=torch.float64, device=self.device).detach().clone()
        dist.all_reduce(t)
        return float(t.item()) / self.world_size
