"""A compact view of a cluster: ranks, hosts, devices, backend and state."""

from __future__ import annotations

import html
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    import ipywidgets as w


class ClusterFacts(Protocol):
    """What the view shows of a cluster (``dtwork.cluster.Cluster`` provides it)."""

    @property
    def cluster_id(self) -> str: ...
    @property
    def state(self) -> str: ...
    @property
    def n(self) -> int: ...
    @property
    def world_size(self) -> int: ...
    @property
    def backend(self) -> str: ...
    @property
    def start_seconds(self) -> float | None: ...
    @property
    def global_batch_size(self) -> int | None: ...
    @property
    def rank_info(self) -> Sequence[Mapping[str, object]]: ...


class Watched(ClusterFacts, Protocol):
    def on_change(self, fn: Callable[[ClusterFacts], None]) -> None: ...


_STATE_COLOURS = {"running": "#2e7d32", "starting": "#f9a825", "stopped": "#757575", "failed": "#c62828"}


def cluster_html(cluster: ClusterFacts) -> str:
    """Render a cluster as a small HTML table (also the body of the live widget)."""
    colour = _STATE_COLOURS.get(cluster.state, "#757575")
    head = (
        f"<b>dtwork cluster</b> <code>{html.escape(cluster.cluster_id)}</code> "
        f"<span style='color:{colour}'>● {html.escape(cluster.state)}</span> · "
        f"{cluster.world_size or cluster.n} rank(s) · backend <b>{html.escape(str(cluster.backend))}</b>"
    )
    if cluster.start_seconds:
        head += f" · ready in {cluster.start_seconds:.1f} s"
    if cluster.global_batch_size:
        head += f" · global batch {cluster.global_batch_size}"
    rows = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(v))}</td>"
            for v in (
                r.get("rank"),
                r.get("hostname"),
                r.get("local_rank"),
                r.get("device"),
                r.get("gpu_name") or "—",
                r.get("pid"),
            )
        )
        + "</tr>"
        for r in cluster.rank_info
    )
    table = (
        "<table style='font-size:12px'><tr><th>rank</th><th>host</th><th>local rank</th>"
        f"<th>device</th><th>GPU</th><th>pid</th></tr>{rows}</table>"
        if rows
        else ""
    )
    return f"<div class='dtwork-cluster'>{head}{table}</div>"


def cluster_widget(cluster: Watched) -> w.HTML:
    """An ipywidgets HTML view that follows the cluster's state."""
    import ipywidgets as w

    view = w.HTML(cluster_html(cluster))

    def refresh(c: ClusterFacts) -> None:
        view.value = cluster_html(c)

    cluster.on_change(refresh)
    return view
