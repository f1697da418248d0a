"""What joining an engine group's ranks decided, kept for as long as the group runs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dtwork.kernel.replies import EngineReply
from dtwork.kernel.stacks import StackChannels
from dtwork.launch import rendezvous

_PLAN = ("rank", "engine_id", "hostname", "local_rank", "gpu", "pid", "gpu_uuid")  # RankPlan's fields


@dataclass
class Joined:
    """What joining the ranks decided: their plan, what each engine and rank reported, rank 0's address."""

    ranks: list[rendezvous.RankPlan] = field(default_factory=list)
    rank_info: list[EngineReply] = field(default_factory=list)
    probes: dict[int, EngineReply] = field(default_factory=dict)  # by engine id
    master_addr: str | None = None
    master_port: int | None = None
    started_at: float | None = None
    start_seconds: float | None = None
    stacks: StackChannels = field(default_factory=StackChannels)  # where each rank serves its stacks
    lease: dict[str, Any] | None = None  # the GPUs of this host the ranks hold (launch.leases)

    @classmethod
    def of_entry(cls, entry: Mapping[str, Any]) -> Joined:
        """The ranks a registry entry records (a kept cluster's, taken up by an attaching kernel)."""
        infos = list(entry.get("ranks") or [])
        plans = [rendezvous.RankPlan(**{k: r[k] for k in _PLAN if k in r}) for r in infos]
        addr, _, port = str(entry.get("master") or "").rpartition(":")
        return cls(
            ranks=plans,
            rank_info=infos,
            master_addr=addr or None,
            master_port=int(port) if port.isdigit() else None,
            started_at=entry.get("started_at"),
            lease=entry.get("gpus"),
        )
