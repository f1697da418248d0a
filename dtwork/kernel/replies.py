"""What the kernel side hands on of the engines' replies, typed where their shape is known.

Replies come through ipyparallel from ``dtwork.runtime.entry`` (``probe``, ``init_rank``,
``set_config``): JSON-like dicts that the launch and widget code read by key.
"""

from __future__ import annotations

from typing import Any, TypedDict

# One engine's reply as ipyparallel hands it over (JSON from a message): read by key where used.
EngineReply = dict[str, Any]


class ClusterStatus(TypedDict):
    """``Cluster.status()``: what a cluster is and where it stands."""

    cluster_id: str
    state: str
    world_size: int
    backend: str
    master: str | None  # rank 0's address:port
    start_seconds: float | None
    ranks: list[EngineReply]  # each rank's plan and what it reported when it joined
    global_batch_size: int | None
