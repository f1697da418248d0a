"""The process group's life on a rank: join it, abort it when this rank fails, rejoin it.

A rank that fails while the others wait in a collective would leave them waiting for the
group's whole timeout, and gloo has no abort that wakes a peer. So the failing rank writes why
into the rendezvous store, then shuts down its own group sockets: the peers' wait fails at
once ("connection closed by peer"). The kernel then asks every rank to ``repair``: a new group
on the same store (under a new key prefix); the DDP models follow at their next forward. The
engines, their namespaces and the cluster stay as they were.
"""

from __future__ import annotations

import socket
from datetime import timedelta
from typing import Any

import psutil
import torch
import torch.distributed as dist

from dtwork.errors import DtworkError
from dtwork.runtime.core.payloads import RankSpec

_Conn = tuple[int, Any, Any]  # (fd, local address, remote address) of an established TCP socket


class PeerFailure(DtworkError):
    """This rank left a collective because another rank failed (the kernel shows that rank's error)."""


class _Group:
    """What this rank needs to abort and rebuild its group: the store, the spec, the sockets."""

    def __init__(self) -> None:
        self.store: dist.Store | None = None
        self.spec: RankSpec | None = None
        self.generation = 0
        self.sockets: set[_Conn] = set()
        self.models: dist.ProcessGroup | None = None  # see models_group
        self.failed_key: str | None = None  # a search's trial group's own (see scope)


_group = _Group()


def _connections() -> set[_Conn]:
    conns = psutil.Process().net_connections(kind="tcp")
    return {(c.fd, c.laddr, c.raddr) for c in conns if c.fd != -1 and c.status == psutil.CONN_ESTABLISHED}


def join(store: dist.Store, spec: RankSpec, device: torch.device) -> None:
    """Join the default group on ``store`` and prove it with one all-reduce; keep its sockets."""
    _group.store, _group.spec = store, spec
    before = _connections()
    timeout = timedelta(seconds=spec["timeout"])
    nccl: dict[str, Any] = {"device_id": device} if spec["backend"] == "nccl" else {}
    dist.init_process_group(
        backend=spec["backend"],
        store=dist.PrefixStore(f"dtwork/g{_group.generation}", store),
        rank=spec["rank"],
        world_size=spec["world_size"],
        timeout=timeout,
        **nccl,
    )
    probe = torch.ones(1, device=device)
    dist.all_reduce(probe)
    if int(probe.item()) != spec["world_size"]:
        raise RuntimeError(f"process group check failed: all_reduce gave {probe.item()}")
    _group.sockets = sockets_since(before)


def connections() -> set[_Conn]:
    """This process's established TCP connections now (to tell a group's own sockets by difference)."""
    return _connections()


def sockets_since(before: set[_Conn]) -> set[_Conn]:
    """The connections made since ``before``, less the rendezvous store's own (not a group's)."""
    spec = _group.spec
    port = int(spec["master_port"]) if spec is not None else -1
    return {c for c in _connections() - before if port not in (c[1].port, c[2].port)}


def shut(sockets: set[_Conn]) -> None:
    """Shut the group sockets still open among ``sockets``: peers waiting on them wake at once."""
    for fd, _, _ in sockets & _connections():  # still the group's: not closed and reused
        try:
            sock = socket.socket(fileno=fd)
        except OSError:  # gloo closed it meanwhile (the peer went first)
            continue
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        finally:
            sock.detach()  # gloo owns the descriptor


def _failed_key() -> str:
    return _group.failed_key or f"dtwork/failed/{_group.generation}"


def scope(failed_key: str | None, sockets: set[_Conn]) -> tuple[str | None, set[_Conn]]:
    """Make a search's trial group the one a failure aborts (``failed_key``: where its ranks say why,
    ``sockets``: its own), or the world again (None); return what was in use, to give back."""
    before = (_group.failed_key, _group.sockets)
    _group.failed_key, _group.sockets = failed_key, sockets
    return before


def failed() -> str | None:
    """Why the group is being torn down (the first failing rank's error), or None."""
    store = _group.store
    if store is None or not store.check([_failed_key()]):
        return None
    return store.get(_failed_key()).decode()


def abort(reason: str) -> None:
    """Tell the other ranks why (first writer wins), then wake any of them waiting on this rank."""
    store = _group.store
    if store is None or not dist.is_initialized() or dist.get_world_size() < 2:
        return
    store.compare_set(_failed_key(), "", reason)
    if _group.spec is not None and _group.spec["backend"] == "nccl":
        dist.distributed_c10d._get_default_group().abort()
        return
    shut(_group.sockets)
    _group.sockets = set()


def on_cell_error(error: BaseException, step: int | None) -> None:
    """A cell failed on this rank: abort the group unless another rank already did."""
    if _group.spec is None:  # not joined yet
        return
    rank = dist.get_rank() if _group.failed_key else _group.spec["rank"]  # a trial's: its group's
    if failed() is not None:
        abort("")  # passes the teardown on to ranks that wait on this one
        return
    where = f"rank {rank}" + (f" at step {step}" if step is not None else "")
    abort(f"{where}: {type(error).__name__}: {error}")


def peer_failure(error: BaseException) -> PeerFailure | None:
    """The error to raise instead of ``error`` when a collective failed because a peer failed."""
    reason = failed()
    if reason is None:
        return None
    return PeerFailure(f"left with {reason} ({type(error).__name__} in a collective)")


def repair() -> str | None:
    """After a cell failed: if a rank aborted the group, every rank joins a new one (the wrapped
    models follow at their next forward, see ``ddp.rebind``); return why, else None."""
    reason = failed()
    if reason is None or _group.store is None or _group.spec is None:
        return None
    _rejoin()
    return reason


def check_collectives(on: bool) -> None:
    """Join a new group whose collectives are checked (``on``) or not: with torch's DETAIL debug
    level every collective first compares its op, shapes and dtypes across the ranks, so that a
    mismatch fails on every rank at once, naming both, instead of hanging or corrupting."""
    if _group.store is None or _group.spec is None:
        raise DtworkError("this rank has not joined a process group yet")
    dist.set_debug_level(dist.DebugLevel.DETAIL if on else dist.DebugLevel.OFF)
    _rejoin()


def models_group() -> dist.ProcessGroup | None:
    """The group wrapped models use: the default one (None) unless collectives are checked."""
    return _group.models


def _rejoin() -> None:
    """Leave the default group and join a new one on the same store (the wrapped models follow)."""
    assert _group.store is not None and _group.spec is not None
    if dist.is_initialized():
        dist.destroy_process_group()
    _group.generation += 1
    spec = _group.spec
    join(_group.store, spec, torch.device("cuda", 0) if spec["backend"] == "nccl" else torch.device("cpu"))
    _group.models = None
    if dist.get_debug_level() == dist.DebugLevel.DETAIL:
        # DDP's constructor crashes (SIGSEGV) on torch's checking wrapper group: models use a
        # plain group of the same ranks (their gradients' buckets match by construction).
        dist.set_debug_level(dist.DebugLevel.OFF)
        try:
            _group.models = dist.new_group(backend=spec["backend"])
        finally:
            dist.set_debug_level(dist.DebugLevel.DETAIL)
