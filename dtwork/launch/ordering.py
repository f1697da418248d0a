"""Ranks in the scheduler's order: Slurm and MPI give each task a rank and a local rank; follow them."""

from __future__ import annotations

import os
from dataclasses import replace
from typing import Any

import ipyparallel as ipp

from dtwork.launch.rendezvous import RankPlan
from dtwork.shared import devices


def scheduler_rank() -> tuple[int, int] | None:
    """(global rank, local rank) from the scheduler's environment on an engine, if it set them."""
    env = os.environ
    for rank, local in (
        ("SLURM_PROCID", "SLURM_LOCALID"),
        ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"),
        ("PMI_RANK", "MPI_LOCALRANKID"),
    ):
        if rank in env and local in env:
            return int(env[rank]), int(env[local])
    return None


def order_ranks(
    client: ipp.Client, plans: list[RankPlan], probes: dict[int, dict[str, Any]], use_gpus: bool
) -> list[RankPlan]:
    """Follow the scheduler's ranks and local ranks (Slurm, MPI) when every engine has them
    (``probes``: each engine's probe, JSON from the engines)."""
    ids = [p.engine_id for p in plans]
    found = dict(zip(ids, client[ids].apply_sync(scheduler_rank), strict=True))
    if any(v is None for v in found.values()):
        return plans
    return scheduler_plans(plans, found, probes, use_gpus)


def scheduler_plans(
    plans: list[RankPlan],
    found: dict[int, tuple[int, int]],
    probes: dict[int, dict[str, Any]],
    use_gpus: bool,
) -> list[RankPlan]:
    """Ranks in the scheduler's order (``found``: engine id -> (rank, local rank)); GPUs by local rank."""
    ordered = sorted(plans, key=lambda p: found[p.engine_id])
    pinned: dict[int, devices.Device] = {}
    for host in dict.fromkeys(p.hostname for p in ordered) if use_gpus else []:
        mine = sorted((p for p in ordered if p.hostname == host), key=lambda p: found[p.engine_id][1])
        lists = [probes[p.engine_id].get("gpus", []) for p in mine]
        got = devices.pin(host, lists, [found[p.engine_id][1] for p in mine])  # each task's own binding
        pinned.update((p.engine_id, d) for p, d in zip(mine, got, strict=True))
    out = []
    for rank, p in enumerate(ordered):
        dev = pinned.get(p.engine_id)
        gpu, uuid = (dev["index"], dev.get("uuid")) if dev else (None, None)
        out.append(replace(p, rank=rank, local_rank=found[p.engine_id][1], gpu=gpu, gpu_uuid=uuid))
    return out
