"""A cluster that outlives its kernel (``--keep``): find a kept one, claim it, give it back.

A kept cluster's registry entry names the kernel that drives it; when that kernel is gone the
reaper notes the time and ends the cluster once its keep time is up. A kernel attaches by writing
itself into the entry under the entry's lock (``claim``): one driver at a time, and never a
cluster the reaper is ending. What the ranks hold (namespaces, process group, ``ctx``, the run)
stays on the ranks; ``EngineGroup.attach`` and ``Session.resume`` take it up.
"""

from __future__ import annotations

import os
import time
from collections.abc import Mapping
from typing import Any

from dtwork.errors import DtworkError
from dtwork.kernel import calls
from dtwork.kernel import stacks as rank_stacks
from dtwork.kernel.spec import ClusterSpec
from dtwork.launch import registry
from dtwork.store.runs import RunStore

Entry = dict[str, Any]  # a validated registry entry (JSON; registry.problem checked its fields)


def driver(entry: Mapping[str, Any]) -> str:
    """Who drives a cluster, as a user knows it: its notebook, else its kernel's PID."""
    kernel = entry.get("kernel") or {}
    where = f"notebook {entry['notebook']}" if entry.get("notebook") else "a kernel"
    return f"{where} (kernel pid {kernel.get('pid')} on {entry.get('kernel_host')})"


def describe(entry: Mapping[str, Any]) -> str:
    """One line: a cluster's id, ranks, and whether it waits for a notebook (with its time left)."""
    ranks = len(entry.get("ranks") or []) or entry.get("n") or "?"
    what = f"{entry['cluster_id']}: {ranks} ranks, {entry.get('backend') or '?'}"
    pinned = [str(r["gpu"]) for r in entry.get("ranks") or [] if r.get("gpu") is not None]
    leased = (entry.get("gpus") or {}).get("uuids") or []  # held from before its ranks are pinned
    what += f" on GPU {', '.join(pinned)}" if pinned else f" holding {len(leased)} GPU(s)" if leased else ""
    keep = entry.get("keep")
    if entry.get("kernel_alive", True):
        kept = f", kept {registry.duration(keep)} after its kernel ends" if keep else ""
        return f"{what}, driven by {driver(entry)}{kept}"
    left = registry.time_left(entry)
    said = f"{registry.duration(left)} left" if left is not None else f"kept {registry.duration(keep or 0)}"
    return (
        f"{what}, waiting for a notebook to attach ({said}; last driven by {driver(entry)}){_training(entry)}"
    )


def _training(entry: Mapping[str, Any]) -> str:
    """Whether a kept cluster's ranks still train the cell its dead kernel started (asked on their side
    channels): a run that trains on is told from one whose cell ended."""
    where = entry.get("stacks")
    busy = rank_stacks.busy(rank_stacks.StackChannels.of_entry(where)) if isinstance(where, Mapping) else {}
    return "; its ranks still train the cell that kernel started (attach stores its records)" if busy else ""


def in_folder(folder: str | None = None) -> list[Entry]:
    """The kept clusters of this host waiting for a notebook, started from ``folder`` (the cwd)."""
    here = os.path.realpath(folder or os.getcwd())
    return [e for e in registry.orphans() if os.path.realpath(str(e.get("cwd") or "")) == here]


def _choose(cluster_id: str | None) -> Entry:
    mine = [e for e in registry.entries() if e["local"]]
    if cluster_id is not None:
        found = [e for e in mine if e["cluster_id"] == cluster_id]
        if not found:
            raise DtworkError(
                f"no cluster {cluster_id} on this host: `dtwork clusters list` shows the kept ones"
            )
        if not found[0].get("keep"):
            raise DtworkError(f"{cluster_id} is not kept: only a cluster started with --keep can be attached")
        return found[0]
    waiting = [e for e in mine if e.get("keep") and not e["kernel_alive"] and registry.waiting(e)]
    if len(waiting) == 1:
        return waiting[0]
    if waiting:
        ids = ", ".join(e["cluster_id"] for e in waiting)
        raise DtworkError(
            f"{len(waiting)} kept clusters wait for a notebook ({ids}): name one, %dtrain attach ID"
        )
    driven = [e for e in mine if e.get("keep")]
    if driven:
        raise _driven(driven[-1])
    raise DtworkError(
        "no kept cluster on this host to attach to: start one with %dtrain start --keep 2h "
        "(it then outlives this kernel for 2 h)"
    )


def _driven(entry: Mapping[str, Any]) -> DtworkError:
    return DtworkError(
        f"{entry['cluster_id']} is driven by {driver(entry)}: one notebook drives a cluster at a time; "
        "stop or restart that kernel first (the cluster stays: it is kept)"
    )


def claim(cluster_id: str | None, notebook: str | None) -> tuple[Entry, Entry]:
    """Make this kernel the driver of a kept cluster whose kernel is gone; return the entry as it
    was (for ``release``) and as it is now. Refused, in one line, while another kernel drives it."""
    chosen = _choose(cluster_id)
    cid = chosen["cluster_id"]
    with registry.locked(cid):
        before = registry.read(registry.entry_path(cid))
        if before is None:
            raise DtworkError(f"{cid} is gone (its keep time ended, or it was stopped): start a cluster")
        if registry.alive(before["kernel"]):
            raise _driven(before)
        now = {k: v for k, v in before.items() if k != "orphaned_at"}
        now.update(kernel=calls.kernel_record(), kernel_host=registry.this_host(), notebook=notebook)
        registry.write(cid, now)
    return before, now


def release(before: Mapping[str, Any]) -> None:
    """Give a claimed cluster back as it was (an attach that failed): its keep time runs on."""
    cid = before["cluster_id"]
    with registry.locked(cid):
        if registry.read(registry.entry_path(cid)) is not None:
            registry.write(cid, before)


def spec_of(entry: Mapping[str, Any]) -> ClusterSpec:
    """The start request a kept cluster was made with, as far as attaching needs it."""
    return ClusterSpec(
        n=entry.get("n"),
        backend=str(entry.get("backend") or "auto"),
        timeout=float(entry.get("timeout") or ClusterSpec.timeout),
        interface=entry.get("interface"),
        profile=entry.get("profile"),
        launcher=None if entry.get("profile") else entry.get("launcher"),
        engine_timeout=int(entry.get("engine_timeout") or ClusterSpec.engine_timeout),
        store=entry.get("store"),
        keep=entry.get("keep"),
    )


def wait_idle(entry: Mapping[str, Any], poll: float = 1.0, say_every: float = 60.0) -> None:
    """Wait until the ranks end the cell the last kernel started: a cell goes on training when its
    kernel dies, and the ranks take no request until it ends. Ctrl-C stops waiting."""
    where = entry.get("stacks")
    if not isinstance(where, Mapping):
        return
    channels, said = rank_stacks.StackChannels.of_entry(where), -say_every
    if rank_stacks.busy(channels):
        rank_stacks.tell_driver(channels, entry["kernel"])  # the ranks' engines take no probe until then
    while busy := rank_stacks.busy(channels):
        if time.monotonic() - said >= say_every:
            doing = "; ".join(f"rank {r}: {what}" for r, what in sorted(busy.items()))
            print(
                f"dtwork: the ranks still run the cell the last kernel started ({doing}); attach waits for "
                "its end (the ranks keep its records: they are stored then); Ctrl-C stops waiting",
                flush=True,
            )
            said = time.monotonic()
        time.sleep(poll)


def resumable(store: RunStore, run_id: object, cluster_id: str) -> int | None:
    """The run a kept cluster's ranks train in, when it is this cluster's and still running; None:
    the next cell starts a new run (``journals.recover`` closes the cells a dead kernel left running)."""
    run = store.find_run(run_id) if isinstance(run_id, int) else None  # None: not in this store
    if run is None or run["status"] != "running" or run["cluster_id"] != cluster_id:
        return None
    return int(run["id"])
