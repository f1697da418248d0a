"""What the ``/dtwork/`` routes answer about this machine: registered clusters (the registry) and GPUs
(NVML). Plain functions, run in a worker thread (psutil and NVML block)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import PurePath
from typing import Any, cast

import psutil

from dtwork.launch import registry
from dtwork.server.wire import (
    ClusterInfo,
    ClustersReply,
    GpuInfo,
    GpusReply,
    NotFound,
    RankInfo,
    StopReply,
    display_path,
    json_safe,
)
from dtwork.shared import telemetry

CLUSTER_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,127}")
CPU_MODE_REASON = "NVML sees no GPU (no NVIDIA driver or device): this machine runs in CPU mode"


def _rank(rank: Mapping[str, object]) -> RankInfo:
    keys = ("rank", "hostname", "local_rank", "device", "gpu_name", "pid", "engine_id")
    return cast(RankInfo, {k: rank.get(k) for k in keys})


async def session_notebooks(settings: Mapping[str, Any]) -> dict[int, str]:
    """The notebook (path relative to the root) of each kernel process this server runs, by PID, as
    its session names it now: a renamed notebook's session follows the rename, while a cluster's
    registry entry keeps the name its kernel was started with. Empty when the server cannot say."""
    sessions, kernels = settings.get("session_manager"), settings.get("kernel_manager")
    if sessions is None or kernels is None:
        return {}
    try:
        listed = await sessions.list_sessions()
    except Exception:  # the panel must list clusters even when sessions cannot be read
        return {}
    out: dict[int, str] = {}
    for session in listed:
        try:
            kernel = kernels.get_kernel(session["kernel"]["id"])
        except (KeyError, TypeError):
            continue
        pid = getattr(getattr(kernel, "provisioner", None), "pid", None)
        if isinstance(pid, int) and isinstance(session.get("path"), str):
            out[pid] = session["path"]
    return out


def _program(entry: Mapping[str, Any]) -> str | None:
    """The file a script cluster's process runs (``train.py``), or its executable's name."""
    kernel = entry.get("kernel") or {}
    if not entry.get("local") or not entry.get("kernel_alive") or not isinstance(kernel, dict):
        return None
    try:
        argv = psutil.Process(int(kernel["pid"])).cmdline()
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None
    script = next((a for a in argv[1:] if a.endswith(".py")), None)
    return PurePath(script or argv[0]).name if (script or argv) else None


def _cluster(entry: dict[str, Any], root_dir: str, sessions: Mapping[int, str]) -> ClusterInfo:
    """One registry entry (JSON from its file, validated) as the panel shows it (ClusterInfo): the
    notebook its kernel's session names now, else the one recorded at start; "script" when neither."""
    kernel = entry.get("kernel") or {}
    procs = [p.get("pid") for p in entry.get("processes") or [] if isinstance(p, dict)]
    pid = kernel.get("pid") if isinstance(kernel, dict) else None
    alive_here = entry.get("local") and entry.get("kernel_alive")  # a PID alone may be reused
    session = sessions.get(pid) if alive_here and isinstance(pid, int) else None
    notebook = session or display_path(entry.get("notebook"), root_dir)
    return {
        "id": entry["cluster_id"],  # validated by the registry: every entry has one
        "state": entry.get("state"),
        "n": entry.get("n"),
        "backend": entry.get("backend"),
        "profile": entry.get("profile"),
        "master": entry.get("master"),
        "kernel_pid": kernel.get("pid") if isinstance(kernel, dict) else None,
        "kernel_host": entry.get("kernel_host"),
        "kernel_alive": bool(entry.get("kernel_alive")),
        "notebook": notebook,
        "origin": "notebook" if notebook else "script",
        "program": None if notebook else _program(entry),
        "started_at": entry.get("started_at"),
        "ranks": [_rank(r) for r in entry.get("ranks") or [] if isinstance(r, dict)],
        "pids": [p for p in procs if isinstance(p, int)],
        "keep": entry.get("keep"),
        "keep_left": registry.time_left(entry),
    }


def list_clusters(root_dir: str, sessions: Mapping[int, str] | None = None) -> ClustersReply:
    """GET /dtwork/clusters; ``sessions``: :func:`session_notebooks`."""
    reply: ClustersReply = {"clusters": [_cluster(e, root_dir, sessions or {}) for e in registry.entries()]}
    return json_safe(reply)


def find_cluster(cluster_id: str) -> dict[str, Any]:  # the registry entry: JSON from its file
    if not CLUSTER_ID.fullmatch(cluster_id):
        raise NotFound(f"malformed cluster id {cluster_id[:40]!r}")
    for entry in registry.entries():
        if entry.get("cluster_id") == cluster_id:
            return entry
    raise NotFound(f"no cluster {cluster_id!r} is registered (it may have stopped already)")


def stop_cluster(cluster_id: str) -> StopReply:
    """POST /dtwork/clusters/<id>/stop: kill its processes, drop its registry entry."""
    killed = registry.end(find_cluster(cluster_id), "stopped from the sidebar")
    return {"stopped": cluster_id, "killed": sorted(set(killed))}


# -- GPUs --------------------------------------------------------------------------------------


def gpus() -> GpusReply:
    """GET /dtwork/gpus: inventory and one telemetry sample; never raises."""
    try:
        info = {g.index: g.to_dict() for g in telemetry.gpu_inventory()}
        samples = telemetry.sample(sorted(info)) if info else []
    except Exception as exc:  # a broken driver must not break the panel
        return {"available": False, "reason": f"NVML failed: {type(exc).__name__}", "gpus": []}
    if not info:
        return {"available": False, "reason": CPU_MODE_REASON, "gpus": []}
    out: list[GpuInfo] = []
    for s in samples:
        static = info.get(s.index, {})
        out.append(
            {
                "index": s.index,
                "name": static.get("name"),
                "uuid": static.get("uuid"),
                "driver": static.get("driver"),
                "utilization": s.utilization,
                "memory_used_mb": s.memory_used_mb,
                "memory_total_mb": s.memory_total_mb,
                "temperature_c": s.temperature_c,
                "power_w": s.power_w,
            }
        )
    reply: GpusReply = {"available": True, "reason": None, "gpus": out}
    return json_safe(reply)
