"""What every launcher is: the options ``%dtrain start`` gives it and the base class it fills in.

A launcher checks the environment before anything starts (errors say what to do), builds
ipyparallel's launcher configuration for ``ipyparallel.Cluster`` and watches the start: a batch
job's queue wait is shown and bounded, a launcher that fails fails the start with its reason.
"""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypedDict

import ipyparallel as ipp
import psutil
from traitlets.config import Config

from dtwork.errors import DtworkError
from dtwork.launch.rendezvous import LOOPBACK, interface_address

PROGRESS_SECONDS = 15.0  # how often a queue wait is reported


class ClusterKwargs(TypedDict, total=False):
    """What a launcher adds to ``ipyparallel.Cluster``'s keyword arguments."""

    engine_launcher_class: type | str  # a launcher class, or the name ipyparallel knows it by
    config: Config
    controller_ip: str
    controller_location: str


@dataclass(frozen=True)
class LaunchOptions:
    """What ``%dtrain start`` says about where engines run (scheduler options may stay unset)."""

    partition: str | None = None
    time: str | None = None
    account: str | None = None
    gpus_per_node: int | None = None
    nodes: int | None = None
    hosts: str | None = None  # ssh: "host1:4,host2:4"


OPTION_NAMES = ("partition", "time", "account", "gpus_per_node", "nodes", "hosts")


class Launcher:
    """How one kind of launcher starts engines: ``check`` the environment, give the ``cluster_kwargs``,
    and ``connect``; the other hooks say what a scheduler knows (hosts, jobs, failure, progress)."""

    name: ClassVar[str] = "local"
    remote: ClassVar[bool] = False  # engines may run on other hosts: this host's GPUs say nothing

    def __init__(self, options: LaunchOptions | None = None) -> None:
        self.options = options or LaunchOptions()

    def check(self, n: int) -> None:
        """Raise a DtworkError saying what to do when this launcher cannot start ``n`` engines here."""

    def cluster_kwargs(self, interface: str | None) -> ClusterKwargs:
        """The keyword arguments for ``ipyparallel.Cluster`` beyond n, cluster_id and timeouts."""
        return {}

    def other_hosts(self) -> str | None:
        """Why engines may start on other hosts than this one (None: all start here)."""
        return None

    def jobs(self, cluster: ipp.Cluster) -> list[str]:
        """The scheduler job ids this cluster holds (cancelled on stop and by the reaper)."""
        return []

    def failure(self, cluster: ipp.Cluster) -> str | None:
        """Why the engines will never come (the launcher ended or was refused), or None."""
        for es in cluster.engines.values():
            if es.state == "after" or exited(getattr(es, "process", None)):
                out = tail(es.get_output(remove=False)) if hasattr(es, "get_output") else ""
                said = f": {out.rstrip(':')}" if out else ""
                return (
                    f"{self.name} launcher exited{said}; ask for fewer ranks or change the launcher's options"
                )
        return None

    def progress(self, cluster: ipp.Cluster, waited: float) -> str | None:
        """A line for the user while engines are awaited (None: nothing to say)."""
        return None

    def check_reach(self, interface: str | None) -> None:
        """Refuse, before anything starts, engines on other hosts with no ``--interface``: the
        controller then listens on loopback only, where they could never register."""
        why = None if interface else self.other_hosts()
        if why:
            raise DtworkError(
                f"--launcher {self.name}: {why}, and the controller listens on loopback unless told "
                "otherwise: name the network interface those hosts reach this one on with --interface "
                "(e.g. --interface eth0; `ip -brief addr` lists them)"
            )

    def connect(
        self, cluster: ipp.Cluster, n: int, timeout: float, submitted: Callable[[], None] = lambda: None
    ) -> ipp.Client:
        """Start the controller and engines, wait (bounded) for ``n`` to register; return a client.

        ``submitted`` runs once the launcher has started (so a job id is known before the wait).
        """
        try:
            cluster.start_cluster_sync(n)
        except subprocess.CalledProcessError as exc:
            raise DtworkError(f"{self.name} launcher failed: {tail(exc.output)}") from None
        submitted()
        client = cluster.connect_client_sync()
        t0 = time.monotonic()
        said = t0 - PROGRESS_SECONDS
        while len(client.ids) < n:
            why = self.failure(cluster)
            if why:
                raise DtworkError(f"the engines cannot start: {why}")
            waited = time.monotonic() - t0
            if waited > timeout:
                now = self.progress(cluster, waited)
                raise DtworkError(
                    f"only {len(client.ids)} of {n} engines registered within {timeout:.0f} s"
                    f"{f' ({now})' if now else ''}: ask for fewer ranks, or pass a longer engine_timeout"
                )
            if time.monotonic() - said >= PROGRESS_SECONDS:
                line = self.progress(cluster, waited)
                if line:
                    print(f"dtwork: {line}", flush=True)
                said = time.monotonic()
            try:
                client.wait_for_engines(n, timeout=1.0, block=True, interactive=False)
            except TimeoutError:
                pass
        return client


def controller_kwargs(interface: str | None) -> ClusterKwargs:
    """Listen on the named interface, where engines on other hosts can reach the controller;
    else on loopback only (``check_reach`` refused a launch that needs other hosts)."""
    if interface:
        return {
            "controller_ip": interface_address(interface),
            "controller_location": interface_address(interface),
        }
    return {"controller_ip": LOOPBACK, "controller_location": LOOPBACK}


def host_names(hosts: str | None) -> list[str]:
    """The host names of a ``host1:4,host2`` list."""
    return [h for item in (hosts or "").split(",") if (h := item.strip().partition(":")[0])]


def this_host(name: str) -> bool:
    """Whether a host name (or address) is this machine."""
    here = socket.gethostname()
    return name in ("localhost", "127.0.0.1", "::1", here) or name.split(".")[0] == here.split(".")[0]


def exited(proc: psutil.Process | None) -> bool:
    """Whether a launcher's local process has ended; no event loop needed."""
    if proc is None:
        return False
    try:
        return bool(proc.status() == "zombie")
    except Exception:  # psutil.NoSuchProcess: reaped already
        return True


def tail(text: str | bytes | None, lines: int = 3) -> str:
    """The message of a tool's output: the first paragraph of an MPI-style ``-----`` block, else the last lines."""
    if isinstance(text, bytes):
        text = text.decode("utf8", "replace")
    rows = str(text or "").strip().splitlines()
    starts = [i for i, r in enumerate(rows) if r.startswith("-----")]
    if starts:
        para = []
        for r in rows[starts[0] + 1 :]:
            if not r.strip():
                break
            para.append(r.strip())
        if para:
            return " ".join(para)
    rows = [r for r in rows if r.strip()]
    return " | ".join(rows[-lines:])
