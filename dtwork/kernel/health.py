"""Rank health: which ranks' engines are gone, and why (by PID on this host, by heartbeat elsewhere)."""

from __future__ import annotations

import signal
import socket
from collections.abc import Mapping
from typing import Protocol

import psutil

from dtwork.kernel.replies import EngineReply


class EngineFacts(Protocol):
    """What rank health reads of the engine group (``engines.EngineGroup`` provides it)."""

    @property
    def rank_info(self) -> list[EngineReply]: ...

    @property
    def probes(self) -> Mapping[int, EngineReply]: ...

    def registered_ids(self) -> set[int] | None: ...

    def engine_exit_code(self, pid: int) -> int | None: ...


class RankHealth:
    """Which ranks' engines are gone, and why: by PID on this host, by lost heartbeat elsewhere."""

    def __init__(self, engines: EngineFacts) -> None:
        self.engines = engines
        self._procs: dict[int, psutil.Process] = {}  # engine PID -> its process, identity checked once

    def reset(self) -> None:
        """Forget the engines' processes (after a restart: fresh engines)."""
        self._procs.clear()

    def dead_ranks(self, ranks: list[int]) -> dict[int, str]:
        """The ranks among ``ranks`` whose engine is gone, with why."""
        host = socket.gethostname()
        out = {}
        registered = self.engines.registered_ids()
        for rank in ranks:
            info = self.engines.rank_info[rank]
            if info.get("hostname") != host:
                if registered is not None and info["engine_id"] not in registered:
                    out[rank] = (
                        f"engine {info['engine_id']} on {info.get('hostname')} lost "
                        "(no heartbeat: host or network down)"
                    )
                continue
            if not self._alive(info):
                out[rank] = (
                    f"engine process {info['pid']} on {info.get('hostname')} died{self._exit_reason(info)}"
                )
        return out

    def _alive(self, info: EngineReply) -> bool:
        pid = info["pid"]
        try:
            known = self._procs.get(pid)
            if known is None:  # once per engine: is this PID still the engine that was probed?
                probe = self.engines.probes.get(info["engine_id"], {})
                proc = psutil.Process(pid)
                if probe and abs(proc.create_time() - probe["create_time"]) > 0.01:
                    raise psutil.NoSuchProcess(pid)
                known = self._procs[pid] = proc
            # Later checks only read its state: a dead engine is a zombie until its launcher reaps
            # it, and a reaped PID is not handed out again before the system's PIDs wrap around.
            if known.status() == psutil.STATUS_ZOMBIE:
                raise psutil.NoSuchProcess(pid)
        except psutil.NoSuchProcess:
            self._procs.pop(pid, None)
            return False
        return True

    def _exit_reason(self, info: EngineReply) -> str:
        code = self.engines.engine_exit_code(info["pid"])
        if code is None:
            return ""
        if code < 0:
            try:
                return f" (signal {signal.Signals(-code).name})"
            except ValueError:
                return f" (signal {-code})"
        return f" (exit code {code})"
