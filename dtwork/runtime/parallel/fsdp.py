"""``ctx.wrap(model, strategy="fsdp")``: the model sharded over the warm ranks with torch's FSDP2.

Each block is sharded with ``fully_shard`` (its parameters all-gathered for its forward and
backward only), then the root, over a 1-D DeviceMesh of every rank. Blocks are the modules of
the classes given, else the children of the model's largest ModuleList, else the root's
children holding at least ``BLOCK_SHARE`` of the parameters.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import ParallelStyle, parallelize_module

from dtwork.errors import DtworkError
from dtwork.runtime.measure import fsdp_hooks, handloop
from dtwork.runtime.measure.ddp_hooks import MeasureState, attach_measure, count_forward

if TYPE_CHECKING:
    from dtwork.runtime.core.state import RankState

STRATEGIES = ("ddp", "fsdp")
BLOCK_SHARE = 0.1  # a root child with this share of the parameters is worth a shard of its own


def check_strategy(strategy: str) -> None:
    """Refuse an unknown ``strategy`` with the choices."""
    if strategy not in STRATEGIES:
        raise DtworkError(f"unknown strategy {strategy!r}: use one of {', '.join(STRATEGIES)}")


def _count(module: torch.nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def find_blocks(
    model: torch.nn.Module, classes: Sequence[type[torch.nn.Module]] = ()
) -> list[torch.nn.Module]:
    """The submodules to shard one by one, innermost first (``fully_shard`` wants children first)."""
    if classes:
        found = [m for m in model.modules() if m is not model and isinstance(m, tuple(classes))]
        if not found:
            names = ", ".join(c.__name__ for c in classes)
            raise DtworkError(
                f"fsdp_blocks={names} matches no submodule of {type(model).__name__}: pass a class it holds"
            )
        return found[::-1]
    lists = [m for m in model.modules() if isinstance(m, torch.nn.ModuleList) and _count(m)]
    if lists:
        return [b for b in max(lists, key=_count) if _count(b)]
    total = max(1, _count(model))
    return [m for m in model.children() if _count(m) >= BLOCK_SHARE * total]


def make_mesh(state: RankState, dp: int | None, tp: int) -> DeviceMesh:
    """A (dp, tp) DeviceMesh over every rank, named ``"dp"`` and ``"tp"``; kept for ``ctx.wrap``."""
    world = state.world_size
    dp = dp if dp is not None else max(1, world // max(1, tp))
    if dp < 1 or tp < 1 or dp * tp != world:
        raise DtworkError(
            f"ctx.mesh(dp={dp}, tp={tp}) needs dp x tp = {world} (the world size): pick factors of {world}"
        )
    mesh: DeviceMesh = init_device_mesh(state.device.type, (dp, tp), mesh_dim_names=("dp", "tp"))
    state.mesh = mesh
    return mesh


def mixed_precision(precision: str) -> MixedPrecisionPolicy:
    """bf16: parameters gathered in bf16 for forward and backward; gradients reduced in fp32 (fp16
    computes under autocast over fp32 parameters, as with DDP, its loss scaled by ctx.steps)."""
    param = torch.bfloat16 if precision == "bf16" else None
    return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=torch.float32)


def shard_model(
    state: RankState,
    model: torch.nn.Module,
    *,
    blocks: Sequence[type[torch.nn.Module]] = (),
    reshard_after_forward: bool = True,
    offload: bool = False,
    tp_plan: dict[str, ParallelStyle] | None = None,
    gns: bool | None = None,
) -> torch.nn.Module:
    """Start every rank from rank 0's weights, then shard each block and the root with ``fully_shard``;
    its collectives timed, and with ``gns`` (or the config's) the noise scale's norms measured."""
    use_gns = state.config.gns.enabled if gns is None else bool(gns)
    if use_gns and state.config.optimizations.aggregation_frequency > 1:  # micro-gradients stay unsharded
        raise DtworkError(
            "the gradient noise scale is not measured under strategy='fsdp' with aggregation_frequency > 1 "
            "yet: use gns=False, aggregation_frequency 1, or ddp"
        )
    model = model.to(state.device)
    if state.world_size > 1:
        with torch.no_grad():  # DDP broadcasts rank 0's weights at wrap; fully_shard keeps each rank's own
            for t in [*model.parameters(), *model.buffers()]:
                dist.broadcast(t, src=0)
    if tp_plan:
        if state.mesh is None:
            raise DtworkError(
                "ctx.wrap(tp_plan=...) shards over ctx.mesh: call ctx.mesh(dp=..., tp=...) first"
            )
        parallelize_module(model, state.mesh["tp"], tp_plan)
        mesh = state.mesh["dp"]
    else:
        mesh = init_device_mesh(state.device.type, (state.world_size,))
    kwargs: dict[str, Any] = {
        "mesh": mesh,
        "reshard_after_forward": reshard_after_forward,
        "mp_policy": mixed_precision(state.config.mixed_precision),
    }
    if offload:  # pinned memory needs an accelerator: a CPU-only host fails at wrap with it
        kwargs["offload_policy"] = CPUOffloadPolicy(pin_memory=torch.cuda.is_available())
    for block in find_blocks(model, blocks):
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)  # changes the model's class in place to an FSDPModule subclass
    model.register_forward_pre_hook(_refuse_old_group(dist.group.WORLD), prepend=True)
    measuring = MeasureState(
        inner=None, inner_state=None, gns=use_gns, rank=state.rank, world_size=state.world_size
    )
    fsdp_hooks.attach(model, measuring)
    model.register_forward_pre_hook(lambda _module, args: count_forward(measuring, args))
    attach_measure(model, measuring)
    state.gns, state.gns_state = None, None  # a new wrap starts a new estimate
    handloop.attach(state)
    return model


def _refuse_old_group(group: object) -> Callable[[torch.nn.Module, tuple[object, ...]], None]:
    """A forward pre-hook refusing to run after a failed cell rebuilt the group: the shards'
    mesh is bound to the old one (DDP models rebind; FSDP ones do not yet)."""

    def hook(_module: torch.nn.Module, _args: tuple[object, ...]) -> None:
        if dist.group.WORLD is not group:
            raise DtworkError(
                "this FSDP model was sharded over a process group that a failed cell replaced: "
                "rerun the cell that builds and wraps the model (its weights on the old group are lost)"
            )

    return hook
