"""Kept clusters from the notebook and the shell: ``%dtrain attach``, the offer ``%dtrain start``
makes when one waits in the folder, their lines in ``%dtrain status``, ``dtwork clusters``."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dtwork.errors import DtworkError
from dtwork.kernel import kept
from dtwork.launch import registry

if TYPE_CHECKING:
    from dtwork.cluster import Cluster


def offer() -> bool:
    """Say, in one line, that a kept cluster waits in this folder for a notebook (True when one does)."""
    waiting = kept.in_folder()
    if waiting:
        cid = waiting[-1]["cluster_id"]
        print(
            f"dtwork: a kept cluster waits here for a notebook ({kept.describe(waiting[-1])}): "
            f"%dtrain attach {cid} takes it up; %dtrain start --new starts another"
        )
    return bool(waiting)


def attach(cluster_id: str | None) -> Cluster:
    """Attach to a kept cluster and say how long it took and which run goes on."""
    from dtwork.cluster import attach as attach_cluster

    cluster = attach_cluster(cluster_id)
    run = cluster.session.run_id
    goes_on = f"run #{run} goes on" if run is not None else "the next cell starts a run"
    print(f"dtwork: attached to {cluster.cluster_id} in {cluster.start_seconds or 0:.2f} s; {goes_on}")
    return cluster


def status_lines(cluster: Cluster | None) -> list[str]:
    """Whether this kernel's cluster is kept, and the kept clusters that wait for a notebook here."""
    lines = []
    keep = cluster.engines.spec.keep_seconds if cluster is not None else None
    if cluster is not None and keep and cluster.state == "running":
        lines.append(
            f"dtwork: kept {registry.duration(keep)} after this kernel ends (%dtrain attach takes it up)"
        )
    for entry in registry.orphans():
        lines.append(f"dtwork: kept {kept.describe(entry)}: %dtrain attach {entry['cluster_id']}")
    return lines


def clusters(action: str, cluster_id: str | None) -> str:
    """``dtwork clusters list`` (this user's clusters: who drives them, kept time left) and
    ``dtwork clusters stop ID`` (its processes, its jobs; its runs marked)."""
    found = registry.entries()
    if action == "list":
        if not found:
            return "no cluster is running (dtwork clusters list shows this user's clusters)"
        return "\n".join(kept.describe(e) for e in found)
    match = [e for e in found if e["cluster_id"] == cluster_id]
    if not match:
        ids = ", ".join(e["cluster_id"] for e in found) or "none"
        raise DtworkError(f"no cluster {cluster_id}: the clusters are {ids} (dtwork clusters list)")
    killed = registry.end(match[0], "stopped with dtwork clusters stop")
    return f"stopped {cluster_id}: {len(killed)} process(es) ended"
