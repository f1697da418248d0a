"""Trial groups: a search's ranks split into process groups of their own, one trial on each.

The groups are made once per search from the cluster's world (``dist.new_group`` on every rank, for
every group, in the same order). While a trial runs, its group *is* the rank's world: torch's default
group points at it, and the rank state says the rank and size within it, so everything that reads
the default group (DDP, the loop's all-reduces, checkpoints, ``DistributedSampler``) and everything
that reads ``ctx.rank`` / ``ctx.world_size`` (sharding, the records' ranks) is the group's. A cell
that fails on a rank aborts that group only (``group.scope``: its peers leave their collectives at
once, the other groups train on); the kernel then has the group made again, by its ranks alone.
"""

from __future__ import annotations

from typing import Any

import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

from dtwork.errors import DtworkError
from dtwork.runtime.core import group as world_group


class _Trials:
    """This rank's trial group: its ranks, its process group and sockets, and the world's settings."""

    def __init__(self) -> None:
        self.ranks: list[int] = []
        self.pg: dist.ProcessGroup | None = None
        self.sockets: set[tuple[int, Any, Any]] = set()
        # while a trial runs, the world's: default group, rank, size, failure scope
        self.world: tuple[Any, int, int, Any] | None = None


_trials = _Trials()


def active() -> bool:
    """Whether a trial runs on this rank's group now (its group is the default one)."""
    return _trials.world is not None


def make(groups: list[list[int]]) -> int:
    """Make every trial group (all ranks call it, groups in the same order); return this rank's
    group's index."""
    me, mine = dist.get_rank(), -1
    for i, ranks in enumerate(groups):
        if me in ranks:
            mine = i
            _new(ranks, local=False)
        else:
            dist.new_group(ranks)  # every rank takes part in every group's making
    if mine < 0:
        raise DtworkError(f"rank {me} is in no trial group of {groups}")
    return mine


def _new(ranks: list[int], *, local: bool) -> None:
    """Make this rank's group of ``ranks`` (``local``: by its ranks alone) and keep its sockets."""
    before = world_group.connections()
    _trials.pg = dist.new_group(ranks, use_local_synchronization=local)
    _trials.ranks = list(ranks)
    _trials.sockets = world_group.sockets_since(before)


def begin(rank: int, world_size: int, failed_key: str, *, rebuild: bool = False) -> tuple[int, int]:
    """Make the group the rank's world for a trial; return the rank and size within it (the rank
    state takes them). ``rank``, ``world_size``: the world's, given back by ``end``; ``failed_key``:
    where a failing rank of this trial says why (its peers leave with that); ``rebuild``: make the
    group again first, after a trial that failed on it left its sockets shut."""
    if _trials.pg is None:
        raise DtworkError("this rank has no trial group: the search makes them first")
    if active():
        raise DtworkError("a trial already runs on this rank's group")
    if rebuild:
        _new(_trials.ranks, local=True)
    pg = _trials.pg
    scoped = world_group.scope(failed_key, _trials.sockets)  # a failure aborts this group only
    _trials.world = (c10d._world.default_pg, rank, world_size, scoped)
    # torch has no public way to scope the default group, and DDP, every helper's collective and the
    # user's own ``dist.all_reduce(t)`` read it: pointing it at the group makes them all the group's.
    c10d._world.default_pg = pg
    return pg.rank(), pg.size()


def end() -> tuple[int, int] | None:
    """The cluster's world again (after a trial, or when the search stops); its rank and size, or
    None when no trial ran."""
    if _trials.world is None:
        return None
    default, rank, size, scoped = _trials.world
    c10d._world.default_pg = default
    world_group.scope(*scoped)
    _trials.world = None
    return rank, size


def forget() -> None:
    """The search ended: no trial group any more. The groups are not destroyed: a group made again
    by its ranks alone has a name hashed from them, which destroying would free for the next such
    group, whose rendezvous would then meet the old one's keys in the store."""
    _trials.pg, _trials.ranks, _trials.sockets = None, [], set()
