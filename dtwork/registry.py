"""Where running clusters register themselves, so that they can be found and cleaned.

Each cluster writes one JSON file ``$DTWORK_HOME/clusters/<cluster_id>.json`` (default
``~/.dtwork``) naming its kernel and every process it owns (PID + create time, so a reused
PID is never killed by mistake). The server extension lists these files; ``start`` cleans
the entries whose kernel is gone; a small reaper process per cluster kills the processes
the moment the kernel dies, however it died.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil


def home() -> Path:
    """Return dtwork's per-user state directory (``$DTWORK_HOME`` or ``~/.dtwork``)."""
    return Path(os.environ.get("DTWORK_HOME") or Path.home() / ".dtwork")


def clusters_dir() -> Path:
    path = home() / "clusters"
    path.mkdir(parents=True, exist_ok=True)
    return path


def entry_path(cluster_id: str) -> Path:
    return clusters_dir() / f"{cluster_id}.json"


def proc_record(pid: int) -> dict[str, Any] | None:
    """Return ``{"pid", "create_time"}`` for a live process, None when it is gone."""
    try:
        return {"pid": pid, "create_time": psutil.Process(pid).create_time()}
    except psutil.Error:
        return None


def _matching(record: dict[str, Any]) -> psutil.Process | None:
    """Return the live process a record names, only if it is the same process (not a reused PID)."""
    try:
        proc = psutil.Process(int(record["pid"]))
        if abs(proc.create_time() - float(record["create_time"])) > 0.01:
            return None
        return proc
    except (psutil.Error, KeyError, TypeError, ValueError):
        return None


def alive(record: dict[str, Any] | None) -> bool:
    return record is not None and _matching(record) is not None


def write(cluster_id: str, data: dict[str, Any]) -> Path:
    """Write (atomically) the registry entry of a cluster."""
    path = entry_path(cluster_id)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps({**data, "cluster_id": cluster_id, "updated_at": time.time()}, indent=1))
    os.replace(tmp, path)
    return path


def read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def remove(cluster_id: str) -> None:
    entry_path(cluster_id).unlink(missing_ok=True)


def entries() -> list[dict[str, Any]]:
    """Return every registered cluster, with ``kernel_alive`` filled in."""
    out = []
    for path in sorted(clusters_dir().glob("*.json")):
        data = read(path)
        if data is not None:
            data["kernel_alive"] = alive(data.get("kernel"))
            out.append(data)
    return out


def kill_processes(records: Iterable[dict[str, Any]], grace: float = 3.0) -> list[int]:
    """Terminate the named processes and their children; SIGKILL what is left after ``grace`` s.

    Return the PIDs that were signalled.
    """
    procs: list[psutil.Process] = []
    for rec in records:
        proc = _matching(rec)
        if proc is None:
            continue
        try:
            procs.extend(proc.children(recursive=True))
        except psutil.Error:
            pass
        procs.append(proc)
    for proc in procs:
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, left = psutil.wait_procs(procs, timeout=grace)
    for proc in left:
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(left, timeout=grace)
    return [p.pid for p in procs]


def clean_stale() -> list[str]:
    """Kill the processes of clusters whose kernel is gone and drop their entries.

    Return the ids of the clusters cleaned.
    """
    cleaned = []
    for data in entries():
        if data["kernel_alive"]:
            continue
        kill_processes(data.get("processes", []))
        for extra in data.get("files", []):
            Path(extra).unlink(missing_ok=True)
        remove(data["cluster_id"])
        cleaned.append(data["cluster_id"])
    return cleaned
