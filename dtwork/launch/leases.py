"""GPU leases: which of this host's GPUs each live cluster holds, so that two notebooks never pin one.

A cluster's lease is the ``gpus`` field of its registry entry (``{"host": ..., "uuids": [...]}``), so
it ends with the entry however the cluster ends: ``stop``, the reaper, ``clean_stale`` after a dead
kernel. A kept cluster waiting for ``%dtrain attach`` keeps its GPUs (its engines still hold them).
A start reserves its GPUs and writes its entry under one lock per host before it launches anything,
so that two starts at once never take the same free GPUs (Determined's "never becomes active",
answered at once). GPUs are named by UUID, so ``CUDA_VISIBLE_DEVICES`` and MIG instances lease as
the devices CUDA would show; engines on other hosts (Slurm, MPI, SSH) are the scheduler's to share.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

from dtwork.errors import DtworkError
from dtwork.launch import registry
from dtwork.shared.devices import Device

__all__ = ["Lease", "free", "held", "refusal", "reserving", "restrict", "take", "usable"]

Lease = dict[str, Any]  # {"host": str, "uuids": [str, ...]}: a registry entry's ``gpus``


@contextlib.contextmanager
def reserving() -> Iterator[None]:
    """Hold this user's lease lock: read the leases, choose and write an entry as one step."""
    fd = os.open(registry.clusters_dir() / ".gpus.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock


def _holds(entry: Mapping[str, Any]) -> bool:
    """Whether a registered cluster still holds its GPUs: its kernel lives (another host's counts as
    alive), or it is kept and waits for a notebook."""
    return bool(entry["kernel_alive"] or registry.waiting(entry))


def held(host: str, exclude: str | None = None) -> dict[str, dict[str, Any]]:
    """{GPU uuid: the registry entry of the live cluster that holds it} on ``host``, but ``exclude``'s."""
    out: dict[str, dict[str, Any]] = {}
    for entry in registry.entries():
        lease = entry.get("gpus")
        if entry.get("cluster_id") == exclude or not isinstance(lease, Mapping) or lease.get("host") != host:
            continue
        uuids = lease.get("uuids")
        if isinstance(uuids, list) and _holds(entry):
            out.update((str(uuid), entry) for uuid in uuids)
    return out


def free(visible: Sequence[Device], host: str, exclude: str | None = None) -> list[Device]:
    """The devices of ``visible`` no other live cluster on ``host`` holds, in ``visible``'s order."""
    taken = held(host, exclude)
    return [d for d in visible if str(d.get("uuid")) not in taken]


def _label(d: Device) -> str:
    return f"{d['index']} (MIG {str(d['uuid'])[4:12]})" if d.get("mig") else str(d["index"])


def refusal(n: int | None, visible: Sequence[Device], host: str, exclude: str | None = None) -> DtworkError:
    """The one-line answer to a start that asks for more GPUs than are free: who holds the others."""
    taken = held(host, exclude)
    holders: dict[str, tuple[dict[str, Any], list[str]]] = {}
    for d in visible:
        entry = taken.get(str(d.get("uuid")))
        if entry is not None:
            holders.setdefault(entry["cluster_id"], (entry, []))[1].append(_label(d))
    who = "; ".join(f"{_holder(e)} holds GPU {', '.join(labels)}" for e, labels in holders.values())
    left = len(visible) - sum(len(labels) for _, labels in holders.values())
    asked = f"asked for {n} GPU ranks" if n is not None else "a start takes one rank per free GPU"
    stop = " or ".join(f"dtwork clusters stop {cid}" for cid in holders)
    fewer = f"use -n {left} or fewer, " if left else ""
    return DtworkError(
        f"{asked} but {left} of this machine's {len(visible)} GPUs are free: {who}; "
        f"{fewer}stop that cluster ({stop}), or use --backend gloo for CPU ranks"
    )


def _holder(entry: Mapping[str, Any]) -> str:
    kernel = entry.get("kernel") or {}
    notebook = entry.get("notebook")
    where = f"notebook {notebook}, " if notebook else ""
    if not entry["kernel_alive"]:
        return f"cluster {entry['cluster_id']} ({where}kept for %dtrain attach)"
    return f"cluster {entry['cluster_id']} ({where}kernel pid {kernel.get('pid')})"


def take(
    n: int, visible: Sequence[Device], host: str, cluster_id: str, write: Callable[[Lease], None]
) -> Lease:
    """Reserve the first ``n`` free devices for ``cluster_id`` and ``write`` its entry with them, under
    the lease lock; the one-line refusal when fewer are free now (another start took them)."""
    with reserving():
        mine = free(visible, host, cluster_id)
        if len(mine) < n:
            raise refusal(n, visible, host, cluster_id)
        lease: Lease = {"host": host, "uuids": [str(d["uuid"]) for d in mine[:n]]}
        write(lease)
        return lease


def restrict(probes: Mapping[int, Mapping[str, Any]], lease: Lease) -> dict[int, dict[str, Any]]:
    """The engines' probes with the lease host's GPU lists cut to the leased devices (for pinning)."""
    keep = set(lease["uuids"])
    return {
        eid: {**p, "gpus": [g for g in p.get("gpus", []) if g.get("uuid") in keep]}
        if p.get("hostname") == lease["host"]
        else dict(p)
        for eid, p in probes.items()
    }


def usable(visible: Sequence[Device], host: str, n: int | None, backend: str) -> int:
    """How many of ``visible`` a start may have: those no other live cluster holds. A start that
    would need GPUs others hold (more ranks than are free, or any GPU rank with none free) is
    refused at once, naming the holders, rather than pinned onto their GPUs or moved to CPU."""
    mine = free(visible, host)
    if backend != "gloo" and len(mine) < len(visible) and (not mine or (n is not None and n > len(mine))):
        raise refusal(n, visible, host)
    return len(mine)
