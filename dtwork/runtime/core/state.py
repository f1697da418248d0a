"""The rank's state: everything one rank keeps between cells, in one dataclass.

``ctx`` (``context.Context``) is the user's face over it; the runtime helpers beside it (train,
loop, checkpoint, optim, ddp, ...) take a ``RankState`` and read and write its public fields, so
no module reaches into another's private attributes and none of them imports ``Context``.
"""

from __future__ import annotations

import gc
import socket
import weakref
from dataclasses import dataclass, field
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Protocol

import torch
import torch.distributed as dist

from dtwork.config import ExperimentConfig
from dtwork.errors import DtworkError
from dtwork.runtime.core import control
from dtwork.runtime.core.group import peer_failure
from dtwork.runtime.core.payloads import Plain
from dtwork.runtime.core.publish import Publisher

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.optim.lr_scheduler import LRScheduler

    from dtwork.analysis.gns import GNSEstimator

KINDS = ("models", "optimizers", "schedulers")  # what a trial registers (and a checkpoint holds)


class RunningLoop(Protocol):
    """What ``ctx.backward``, ``ctx.step`` and ``ctx.log`` need of the running ``ctx.steps``."""

    k: int  # micro-batches per optimizer step
    is_last_micro: bool
    stepped: bool  # whether the last ``ctx.step`` stepped (the fp16 scaler may skip one)
    step: int  # optimizer steps taken
    epoch: int  # the current pass over the data
    memory_noted: bool  # whether this loop recorded what the rank holds
    # a resume's optimizer states no known optimizer took (checkpoint.trial.Waiting, a floor above)
    pending_optimizers: list[Any]

    def add_log(self, scalars: dict[str, object]) -> None: ...

    def before_backward(self) -> None: ...

    def after_backward(self, scale: float) -> None: ...


@dataclass(eq=False)
class RankState:  # the rank's state between cells, one field per thing kept; grouped by section below
    """One rank's identity, configuration and training state (the fields are public)."""

    # who the rank is, and what it trains with
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    backend: str
    config: ExperimentConfig
    hostname: str = field(default_factory=socket.gethostname)
    global_batch_size: int | None = None  # the effective one: per_slot_batch_size x world_size
    per_slot_batch_size: int | None = None
    gpu_index: int | None = None  # the physical GPU (NVML index) this rank samples
    publisher: Publisher = field(init=False, repr=False)
    # what the trial registered, and what the running cell used and called
    registered: dict[str, list[weakref.ref[Any]]] = field(
        default_factory=lambda: {k: [] for k in KINDS}, repr=False
    )
    cell: int = 0  # counts the cells this rank ran (pre_execute), to tell what a cell used
    used: weakref.WeakKeyDictionary[Any, int] = field(default_factory=weakref.WeakKeyDictionary, repr=False)
    calls: dict[str, tuple[int, dict[str, Plain]]] = field(
        default_factory=dict, repr=False
    )  # effective_args.py
    # training state kept between cells
    loop: RunningLoop | None = field(default=None, repr=False)  # the running ctx.steps, if any
    gns: float | None = None  # the latest B_simple estimate
    gns_state: GNSEstimator | None = None
    scaler: torch.amp.GradScaler | None = None  # the fp16 loss scaler of ctx.steps
    log_step: int = -1  # the step of the last ctx.log outside ctx.steps
    after_loop_step: int | None = None  # after a ctx.steps loop: its last step, where ctx.log goes
    fusion_tuned_for: ExperimentConfig | None = None  # the config the bucket size was tuned for
    mesh: DeviceMesh | None = None  # the DeviceMesh of the last ctx.mesh(), for ctx.wrap(tp_plan=...)
    adaptive: Any = None  # the AdaptiveBatch of the last ctx.loader(adaptive=True) (runtime.adaptive)
    # the run the rank trains in: its checkpoint folder, its step axis (runtime/core/run_axis.py)
    # True when the cluster restarts a failed trial; a run id when a search's promoted trial resumes it
    auto_resume: bool | int = False
    run_id: int | None = None  # the kernel's run (names its checkpoint folder), set per run
    run_store: str | None = None  # the kernel's store of that run (owns the folder)
    run_step: int = 0  # the steps the run's step axis holds so far (the next loop's first step)
    wrapped: list[weakref.ref[Any]] = field(default_factory=list, repr=False)  # ctx.wrap since the last loop
    run_models: list[weakref.ref[Any]] | None = None  # what the run trains (None: every live model)
    fresh_wrap: bool = False  # a ctx.wrap since the last training loop: the next one starts a new run
    # A loop that starts a new run mid-cell checkpoints into a pending folder until the kernel names
    # that run at the next cell: the run had a loop, the kernel's token, the folder.
    run_trained: bool = False
    pending_token: str | None = None
    pending_count: int = 0
    run_folder: str | None = None
    next_run: int | None = None  # the id the kernel gives the next run: ctx.run_id of a run begun mid-cell

    def __post_init__(self) -> None:
        self.publisher = Publisher(self.rank)

    # -- what the trial registered (weakly: a model the cell dropped is forgotten) ------------

    def live(self, kind: str) -> list[Any]:
        """The registered objects of ``kind`` still alive, oldest first."""
        refs = self.registered[kind]
        live = [r() for r in refs]
        self.registered[kind] = [r for r, obj in zip(refs, live, strict=True) if obj is not None]
        return [obj for obj in live if obj is not None]

    def forget_dropped(self) -> None:
        """Collect the models, optimizers and schedulers that earlier cells replaced (nn.Modules
        often sit in reference cycles), so a loop or checkpoint sees the live ones only; with
        nothing registered there is nothing to forget and the collection is skipped."""
        if any(self.registered.values()):
            gc.collect()

    def touch(self, obj: object) -> None:
        """Note that the running cell used ``obj`` (wrapped, created, stepped or trained)."""
        self.used[obj] = self.cell

    def used_now(self, kind: str) -> list[Any]:
        """The registered objects of ``kind`` that the last cell used, oldest first."""
        return [obj for obj in self.live(kind) if self.used.get(obj) == self.cell]

    def run_objects(self, kind: str) -> list[Any]:
        """What a checkpoint of the run holds, oldest first: the run's models, the optimizers over
        their parameters and those optimizers' schedulers; not a model an earlier run wrapped that a
        name still holds (every live one before a loop named the run's models)."""
        live = self.live(kind)
        if self.run_models is None:
            return live
        models = [m for ref in self.run_models if (m := ref()) is not None]
        if kind == "models":
            return [m for m in live if any(m is x for x in models)]
        params = {id(p) for m in models for p in m.parameters()}
        opts = [
            o
            for o in self.live("optimizers")
            if any(id(p) in params for group in o.param_groups for p in group["params"])
        ]
        if kind == "optimizers":
            return opts
        return [s for s in live if any(getattr(s, "optimizer", None) is o for o in opts)]

    def run_modules(self) -> list[torch.nn.Module]:
        """The run's models (``run_objects("models")``), typed."""
        return self.run_objects("models")

    def run_optimizers(self) -> list[torch.optim.Optimizer]:
        """The run's optimizers (``run_objects("optimizers")``), typed."""
        return self.run_objects("optimizers")

    def run_schedulers(self) -> list[LRScheduler]:
        """The run's schedulers (``run_objects("schedulers")``), typed."""
        return self.run_objects("schedulers")

    def register(self, kind: str, obj: object) -> None:
        self.touch(obj)
        refs = self.registered[kind]
        if refs and refs[-1]() is obj:  # the common case: ctx.step(opt) on every step
            return
        if obj not in self.live(kind):
            self.registered[kind].append(weakref.ref(obj))

    @property
    def models(self) -> list[torch.nn.Module]:
        return self.live("models")

    @property
    def optimizers(self) -> list[torch.optim.Optimizer]:
        return self.live("optimizers")

    @property
    def schedulers(self) -> list[LRScheduler]:
        return self.live("schedulers")

    def batch_size(self, default: int = 32) -> int:
        """The per-slot batch size, or ``default`` when no global batch was set."""
        return self.per_slot_batch_size or default

    # -- collectives ---------------------------------------------------------------------------

    @property
    def cell_ranks(self) -> list[int]:
        """The ranks the running cell runs on (``%%dtrain --ranks``): all unless the kernel said."""
        return control.cell_ranks() or list(range(self.world_size))

    def require_all_ranks(self, what: str, *, arrive_seconds: float | None = None) -> None:
        """Refuse a collective that would wait for ranks that never come: in a cell that runs on some
        ranks only, at once; with ``arrive_seconds``, also when another rank does not reach it (a call
        under ``if ctx.rank == 0:``) within that time instead of the group's whole timeout."""
        ranks = self.cell_ranks
        if len(ranks) < self.world_size:
            raise DtworkError(
                f"{what} needs every rank (a collective), but this cell runs on rank(s) "
                f"{', '.join(map(str, ranks))} of {self.world_size}: run it on every rank (%%dtrain without --ranks)"
            )
        if (
            arrive_seconds is None or self.world_size < 2 or self.backend != "gloo"
        ):  # a monitored barrier is gloo's
            return
        try:
            dist.monitored_barrier(timeout=timedelta(seconds=arrive_seconds), wait_all_ranks=True)
        except RuntimeError as exc:
            peer = peer_failure(exc)  # a rank failed before it reached this: its error is the cause
            if peer is not None:
                raise peer from None
            raise DtworkError(
                f"{what} needs every rank, but not all reached it in {arrive_seconds:.0f} s "
                f"({str(exc).strip()}): call it on every rank, not under `if ctx.rank == ...`"
            ) from None
